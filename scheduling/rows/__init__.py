"""The request rows: written as requests go, read back for the activity log, recovery and the forecast."""
