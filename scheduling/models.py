"""Every queued and dispatched request is a row, so operators can answer "why did this take 20 minutes?"."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.utils import timezone

from scheduling.core import SerialSettings, serial_settings_problems
from scheduling.core.priority import INT64_MAX, INT64_MIN
from scheduling.keys.scope import NO_ROW_LABELS, globs_from_text
from scheduling.tickets import TERMINAL_STATES, RequestState


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
    method = models.CharField(max_length=32, default="POST")
    path = models.TextField()
    stream = models.BooleanField(default=False)
    client = models.CharField(max_length=100, blank=True)
    # In distributed mode, the front end's key for the request (its reply channel, "#", a number) and
    # the route label of its metrics: a worker that takes over rebuilds the queue from these rows and
    # answers the front end that still holds the client's connection.
    origin = models.CharField(max_length=200, blank=True)
    route = models.CharField(max_length=40, blank=True)
    # The caller's X-LlamaSwap-Max-Wait, so a worker that takes the queue over keeps enforcing it.
    max_wait_s = models.FloatField(null=True, blank=True)
    # The selector (a virtual model ID) that picked `model`, as llama-swap's activity key `selector`.
    selector = models.CharField(max_length=255, blank=True)
    # A peer's requests are relayed to another server, never queued: its ID (`model` is then `<peer>/<model>`).
    peer = models.CharField(max_length=255, blank=True)
    priority = models.BigIntegerField(default=0)  # the applied one: the key's maximum and default are in it
    # The API key row's name ("" for a config file apiKey or none) and the header's priority before the
    # key's clamp (null: no header). Never the secret.
    api_key = models.CharField(max_length=100, blank=True)
    asked_priority = models.BigIntegerField(null=True, blank=True)
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
    changed_by_fairness = models.BooleanField(null=True, blank=True)  # sent by its key's turn before an older equal one
    needed_swap = models.BooleanField(null=True, blank=True)
    explanation = models.TextField(blank=True)
    # Which of the model's job slots (1-based) the request ran on, and why it waited although
    # part of the hardware was idle ("" when it did not).
    slot = models.PositiveIntegerField(null=True, blank=True)
    waited_because = models.TextField(blank=True)

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
        verbose_name = "request"
        verbose_name_plural = "request history"
        indexes = [
            models.Index(fields=["-arrived_at"], name="qr_arrived_desc"),
            models.Index(fields=["model", "-arrived_at"], name="qr_model_arrived"),
            models.Index(fields=["state", "arrived_at"], name="qr_state_arrived"),
            models.Index(fields=["band", "-arrived_at"], name="qr_band_arrived"),
            # A key's requests: the history's key filter, `/api/activity?key=`, a key's usage page.
            models.Index(fields=["api_key", "-arrived_at"], name="qr_key_arrived"),
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
    # Identify the process even after a wrapper or interpreter changed its command line: the kernel's
    # start time of the group leader (clock ticks since boot) and a marker set in its environment.
    start_ticks = models.BigIntegerField(null=True, blank=True)
    marker = models.CharField(max_length=64, blank=True)

    def __str__(self) -> str:
        return f"{self.model} pid={self.pid}"


class WaitingRequest(QueuedRequest):
    """The requests waiting for the GPU right now: the admin's live queue page.

    The page ranks from the running scheduler, not from the rows, which lag
    behind it; this proxy gives the page a place, and permissions, in the admin.
    """

    class Meta:
        proxy = True
        verbose_name = "waiting request"
        verbose_name_plural = "queue"


class ConfiguredModel(models.Model):
    """A model from the config file, shown with its process state on the admin's models page.

    Configured models live in the config file, not in the database; this
    unmanaged model has no table and exists so the page has an entry and
    permissions in the admin index.
    """

    class Meta:
        managed = False
        verbose_name = "model"
        verbose_name_plural = "models"


class SchedulerSettings(models.Model):
    """Operator overrides of `routing.scheduler.settings.serial`, one row (pk 1).

    A blank field means "not overridden": the config file's value applies.
    """

    aging_divisor = models.FloatField(
        "agingDivisor",
        null=True,
        blank=True,
        help_text="Seconds of waiting per priority point; 0 disables aging. Blank: the config file value.",
    )
    swap_affinity_bonus = models.IntegerField(
        "swapAffinityBonus",
        null=True,
        blank=True,
        help_text="Bonus for a request needing no model swap, 0 to 99; 0 disables it. Blank: the config file value.",
    )

    slots = models.JSONField(
        "slots",
        null=True,
        blank=True,
        help_text="Concurrent jobs per model ({model: N}; a model not listed has 1). Blank: the config file value.",
    )
    fairness = models.CharField(
        "fairness",
        max_length=8,
        null=True,
        blank=True,
        choices=(("keys", "keys: API keys take turns among equal requests"), ("off", "off: arrival order")),
        help_text="keys: requests for the same model at the same priority go by their API keys' weighted turns. "
                  "Blank: the config file value.",
    )

    class Meta:
        verbose_name = "scheduler settings"
        verbose_name_plural = "scheduler settings"
        constraints = [models.CheckConstraint(condition=models.Q(pk=1), name="scheduler_settings_singleton")]

    # The llama-swap config names, which the validation messages and the audit use.
    CONFIG_NAMES = {"aging_divisor": "agingDivisor", "swap_affinity_bonus": "swapAffinityBonus", "slots": "slots",
                    "fairness": "fairness"}

    def __str__(self) -> str:
        return "Scheduler settings"

    @classmethod
    def load(cls) -> SchedulerSettings:
        settings, _ = cls.objects.get_or_create(pk=1)
        return settings

    def save(self, *args, **kwargs) -> None:
        self.pk = 1
        super().save(*args, **kwargs)

    def clean(self) -> None:
        # Check only the overridden values; the defaults stand in for the rest and are valid.
        defaults = SerialSettings()
        problems = serial_settings_problems(
            defaults.aging_divisor if self.aging_divisor is None else _as_typed(self.aging_divisor),
            defaults.swap_affinity_bonus if self.swap_affinity_bonus is None else self.swap_affinity_bonus,
            self.slots,  # which models exist is the form's to check: it knows the config
            defaults.fairness if self.fairness is None else self.fairness,
        )
        errors = {field: problems[name] for field, name in self.CONFIG_NAMES.items() if name in problems}
        if errors:
            raise ValidationError(errors)

    def overrides(self) -> dict[str, float | int | dict[str, int]]:
        """The fields an operator has set, by model field name."""
        return {field: getattr(self, field) for field in self.CONFIG_NAMES if getattr(self, field) is not None}


def _as_typed(value: float) -> float | int:
    """60.0 as 60, so a message quotes the value the way the operator wrote it."""
    return int(value) if value.is_integer() else value


class SettingsChange(models.Model):
    """One audited edit of a scheduler setting. Append-only; None means "the config file value"."""

    changed_at = models.DateTimeField(db_index=True)
    changed_by = models.CharField(max_length=150)
    setting = models.CharField(max_length=40)
    # Text, not a short string: a `slots` value names every model it sets.
    old_value = models.TextField(null=True, blank=True)
    new_value = models.TextField(null=True, blank=True)

    class Meta:
        ordering = ("-changed_at", "-id")
        verbose_name = "settings change"

    def __str__(self) -> str:
        return f"{self.setting}: {self.shown(self.old_value)} → {self.shown(self.new_value)} by {self.changed_by}"

    @staticmethod
    def shown(value: str | None) -> str:
        return "config file value" if value is None else value


class ActiveProfile(models.Model):
    """The profile an operator switched on (`PUT /api/profiles/active`), empty for none. One row, in
    the database every front end reads, so a switch holds whichever process a request reaches."""

    name = models.CharField(max_length=255, blank=True)
    changed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "active profile"


class ModelLease(models.Model):
    """`POST /api/leases`: keep `model` loaded until `expires_at` — it is not stopped to make room for another
    (placement by memory) nor unloaded by its TTL. A row, so it holds across restarts and a worker takeover;
    deleting it (the API or the admin) revokes it."""

    model = models.CharField(max_length=255)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField(db_index=True)

    class Meta:
        verbose_name = "model lease"
        ordering = ("expires_at",)

    def __str__(self) -> str:
        return f"lease #{self.pk} on {self.model}"


def _limit(help_text: str) -> models.BigIntegerField:
    """A quota field: a whole number from 1, or blank for none."""
    return models.BigIntegerField(null=True, blank=True, help_text=help_text,
                                  validators=[MinValueValidator(1), MaxValueValidator(2**53 - 1)])


def _priority(help_text: str) -> models.BigIntegerField:
    return models.BigIntegerField(null=True, blank=True, help_text=help_text,
                                  validators=[MinValueValidator(INT64_MIN), MaxValueValidator(INT64_MAX)])


def _not_a_label_of_no_row(name: str) -> None:
    if name.lower() in NO_ROW_LABELS:
        raise ValidationError(f"'{name}' is taken: /metrics labels requests without a key row "
                              f"{', '.join(repr(label) for label in NO_ROW_LABELS)}; choose another name")


class ApiKey(models.Model):
    """An API key: its secret is shown once when it is made and stored only hashed (`scheduling.keys.secrets`);
    `prefix` names it in lists. Disabling one (or its expiry) refuses it on every front end within 2 s.

    rpm, tpm and concurrency are its quotas (`scheduling.keys.quota`); weight is its share of turns among keys
    (`scheduling.core.fairness`)."""

    name = models.CharField(max_length=100, unique=True, validators=[RegexValidator(
        r"\A[A-Za-z0-9][A-Za-z0-9._@-]*\Z", "letters, digits and . _ @ - (starting with a letter or digit)"),
        _not_a_label_of_no_row])
    prefix = models.CharField(max_length=16, editable=False)
    secret_hash = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    enabled = models.BooleanField(default=True, help_text="Untick to revoke the key.")
    expires_at = models.DateTimeField(null=True, blank=True, help_text="Refused from then on. Blank: never.")
    allowed_models = models.TextField(
        "models", blank=True, help_text="Model ID globs (* ? [..]), one per line; blank: every model.")
    operator = models.BooleanField(
        default=False, help_text="May unload, cancel, switch profiles, take leases, read /logs and captures.")
    read_only = models.BooleanField(default=False, help_text="Reads /api/*, /running and /metrics; sends no inference.")
    max_priority = _priority("The highest X-LlamaSwap-Priority its requests get (a higher header is lowered). Blank: no limit.")
    default_priority = _priority("The priority of its requests that send no header. Blank: 0.")
    rpm = _limit("At most this many requests in any 60 s (over it: 429 with Retry-After). Blank: no limit.")
    tpm = _limit("Tokens per minute: a request is admitted while the last 60 s's prompt and completion tokens "
                 "are under it (else 429). Blank: no limit.")
    concurrency = _limit("At most this many requests at once; more wait for one to end. Blank: no limit.")
    weight = models.PositiveIntegerField(default=1, help_text="Its share of turns among keys with fairness: keys "
                                                              "(2: twice the turns of a key of 1).",
                                         validators=[MinValueValidator(1), MaxValueValidator(1_000_000)])

    class Meta:
        verbose_name = "API key"
        ordering = ("name",)

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    def model_globs(self) -> tuple[str, ...]:
        return globs_from_text(self.allowed_models)

    def clean(self) -> None:
        self.allowed_models = "\n".join(self.model_globs())
        if (self.max_priority is not None and self.default_priority is not None
                and self.default_priority > self.max_priority):
            raise ValidationError({"default_priority": f"the default priority {self.default_priority} is above "
                                                       f"the maximum {self.max_priority}"})
        if self.operator and self.read_only:
            raise ValidationError({"read_only": "an operator key changes things: it cannot be read-only too"})


class KeyRefusals(models.Model):
    """How many of a key's requests were refused at the door (403 outside its scope, 429 over its quota) in one
    minute: such a request never reaches the scheduler, so it has no `QueuedRequest` row. Front ends add their
    counts every second or so (`scheduling.keys.refusals`); the key's usage page charts them."""

    api_key = models.CharField(max_length=100)
    minute = models.DateTimeField()
    status = models.PositiveSmallIntegerField()
    count = models.PositiveIntegerField(default=0)

    class Meta:
        verbose_name = "key refusals"
        verbose_name_plural = "key refusals"
        constraints = [models.UniqueConstraint(fields=["api_key", "minute", "status"], name="key_refusals_once")]


class BatchFile(models.Model):
    """A file of OpenAI's Files API (a batch's input, output or errors); its bytes lie under the data dir
    (`proxy.batches.storage`), named by its id."""

    id = models.CharField(primary_key=True, max_length=40)
    filename = models.CharField(max_length=255)
    purpose = models.CharField(max_length=20)  # batch (uploaded), batch_output (written by a batch)
    bytes = models.BigIntegerField()
    # The API key row that uploaded it (or whose batch wrote it); "" for a config file's key or an open server.
    # Only that key and operator keys see it.
    owner = models.CharField(max_length=100, blank=True, default="", db_index=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]


class Batch(models.Model):
    """A batch of OpenAI's Batch API: its input file's lines (`BatchRequest`) run through the scheduler at
    `priority`, at most `max_in_flight` at a time. One serving process runs it at a time: the one whose
    claim (`runner`, until `runner_until`) holds."""

    id = models.CharField(primary_key=True, max_length=40)
    endpoint = models.CharField(max_length=40)
    input_file_id = models.CharField(max_length=40)
    model = models.CharField(max_length=255, blank=True)  # the first line's, once validated
    completion_window = models.CharField(max_length=10, default="24h")
    status = models.CharField(max_length=12, default="validating")
    priority = models.BigIntegerField(default=-100)
    # The API key that created it (its name, never the secret) and the model globs it allowed then: its lines
    # run with those rights.
    api_key = models.CharField(max_length=100, blank=True)
    key_models = models.JSONField(default=list, blank=True)
    metadata = models.JSONField(null=True, blank=True)
    errors = models.JSONField(null=True, blank=True)  # OpenAI's {"object": "list", "data": [...]}
    output_file_id = models.CharField(max_length=40, blank=True)
    error_file_id = models.CharField(max_length=40, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    in_progress_at = models.DateTimeField(null=True, blank=True)
    finalizing_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(null=True, blank=True)
    cancelling_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    runner = models.CharField(max_length=100, blank=True)
    runner_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "batches"

    def __str__(self) -> str:
        return f"{self.id} ({self.status})"


class BatchRequest(models.Model):
    """One line of a batch: where it lies in the input file, and, once it ended, its line of the output or
    error file (`result`), written once: only by the runner that claimed it (`runner`)."""

    batch = models.ForeignKey(Batch, on_delete=models.CASCADE, related_name="requests")
    line = models.PositiveIntegerField()  # from 1
    custom_id = models.CharField(max_length=255)
    offset = models.BigIntegerField()
    length = models.PositiveIntegerField()
    state = models.CharField(max_length=10, default="pending")  # pending, running, succeeded, failed
    runner = models.CharField(max_length=100, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    result = models.TextField(blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["batch", "line"], name="batch_request_line")]
        indexes = [models.Index(fields=["batch", "state", "line"], name="batch_request_state")]
