"""WebSockets passed through to the model servers: framing, the upstream client, the consumer."""
