"""The Channels HTTP consumers of the model routes, and what guards them before they serve (hosts, CORS)."""
