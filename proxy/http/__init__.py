"""Receiving requests: the consumers of the model routes, and what guards and reads each request."""
