"""The service's own endpoints: plain Django views, /api/queue, /api/events and /metrics."""
