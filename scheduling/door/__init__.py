"""The front door: the port the HTTP side reaches the scheduler through, in one process or over Redis."""
