"""The service's own endpoints: plain Django views, /api/queue, /api/events and /metrics, their JSON errors, and the
503 a route answers when the scheduler or the database is away."""
