"""Every queued and dispatched request is a row, so operators can answer "why did this take 20 minutes?"."""

from __future__ import annotations

from django.db import models


class RequestState(models.TextChoices):
    QUEUED = "queued"
    DISPATCHED = "dispatched"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REJECTED = "rejected"
    INTERRUPTED = "interrupted"


TERMINAL_STATES = (
    RequestState.COMPLETED,
    RequestState.FAILED,
    RequestState.CANCELLED,
    RequestState.REJECTED,
    RequestState.INTERRUPTED,
)


class BandChoice(models.TextChoices):
    INTERACTIVE = "interactive"
    NORMAL = "normal"
    BATCH = "batch"


class QueuedRequest(models.Model):
    """One model request, from arrival to its terminal state, with the scheduler's decision.

    The primary key is the scheduler's ticket id, so the write-behind recorder can
    update a row without looking it up first. Request bodies are never stored.
    """

    id = models.BigIntegerField(primary_key=True)
    model = models.CharField(max_length=255)
    requested_model = models.CharField(max_length=255, blank=True)
    method = models.CharField(max_length=10, default="POST")
    path = models.CharField(max_length=500)
    stream = models.BooleanField(default=False)
    client = models.CharField(max_length=100, blank=True)
    priority = models.BigIntegerField(default=0)
    band = models.CharField(max_length=12, choices=BandChoice.choices, default=BandChoice.NORMAL)
    state = models.CharField(max_length=12, choices=RequestState.choices, default=RequestState.QUEUED)
    scheduler = models.CharField(max_length=10, blank=True)

    arrived_at = models.DateTimeField()
    dispatched_at = models.DateTimeField(null=True, blank=True)
    first_byte_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    status_code = models.IntegerField(null=True, blank=True)
    error = models.TextField(blank=True)

    # The dispatch decision (activity-log keys from the spec, plus the terms behind the score).
    serial_priority = models.BigIntegerField(null=True, blank=True)
    serial_band = models.CharField(max_length=12, blank=True)
    serial_score = models.FloatField(null=True, blank=True)
    serial_queue_wait_ms = models.BigIntegerField(null=True, blank=True)
    fifo_priority = models.BigIntegerField(null=True, blank=True)
    score_priority = models.FloatField(null=True, blank=True)
    score_affinity = models.FloatField(null=True, blank=True)
    score_aging = models.FloatField(null=True, blank=True)
    runner_up_id = models.BigIntegerField(null=True, blank=True)
    runner_up_score = models.FloatField(null=True, blank=True)
    changed_by_aging = models.BooleanField(null=True, blank=True)
    changed_by_affinity = models.BooleanField(null=True, blank=True)
    needed_swap = models.BooleanField(null=True, blank=True)
    explanation = models.TextField(blank=True)

    # Token counts and speeds, parsed from the upstream's usage/timings like llama-swap's activity log.
    input_tokens = models.IntegerField(null=True, blank=True)
    output_tokens = models.IntegerField(null=True, blank=True)
    cache_tokens = models.IntegerField(null=True, blank=True)
    prompt_per_second = models.FloatField(null=True, blank=True)
    tokens_per_second = models.FloatField(null=True, blank=True)
    duration_ms = models.BigIntegerField(null=True, blank=True)
    response_bytes = models.BigIntegerField(null=True, blank=True)

    class Meta:
        ordering = ("-id",)
        indexes = [
            models.Index(fields=["-arrived_at"], name="qr_arrived_desc"),
            models.Index(fields=["model", "-arrived_at"], name="qr_model_arrived"),
            models.Index(fields=["state", "arrived_at"], name="qr_state_arrived"),
            models.Index(fields=["band", "-arrived_at"], name="qr_band_arrived"),
        ]

    def __str__(self) -> str:
        return f"#{self.id} {self.model} {self.path} ({self.state})"


class ModelProcessRecord(models.Model):
    """A model process this service started, kept so a restart after a crash can find and stop it."""

    model = models.CharField(max_length=255)
    pid = models.IntegerField()
    pgid = models.IntegerField()
    cmdline = models.JSONField(default=list)
    started_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.model} pid={self.pid}"
