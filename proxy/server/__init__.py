"""What runs before the ASGI application: daphne as `llamaswap serve` runs it, TLS, request bodies spooled to a
file and handed on a piece at a time, and the limit on a body's size."""
