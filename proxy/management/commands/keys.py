"""`llamaswap keys create NAME [--models GLOB …] [--max-priority N] [--default-priority N] [--rpm N] [--tpm N]
[--concurrency N] [--weight N] [--operator] [--read-only] [--expires ISO]`, `llamaswap keys list` and
`llamaswap keys revoke NAME`: the API key rows (`scheduling.keys`). `create` prints the secret as its last line,
the only time it is shown, after a note that keys put every route but /health behind a key; every front end takes a
new or revoked key within 2 s."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connection
from django.utils import timezone

from scheduling.core import PRIORITY_ALIASES
from scheduling.keys.store import make_key, revoke_key
from scheduling.models import ApiKey


# What a first key changes for every client, said where a key is made: a server without keys is open.
KEYS_ARE_ON = ("note: while any API key exists (in this table, even revoked, or the config's apiKeys), every API "
               "route but /health and /wol-health needs one (/metrics only with metricsRequireApiKey: true): a client "
               "that sends none, or api_key=\"unused\", gets 401. Send it as `Authorization: Bearer <secret>` (the "
               "openai SDK's api_key) or `x-api-key: <secret>`.")


def priority(text: str) -> int:
    """A whole number, or one of the priority header's names (interactive, normal, batch)."""
    named = PRIORITY_ALIASES.get(text.strip().lower())
    if named is not None:
        return named
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{text!r} is neither a whole number nor one of {', '.join(PRIORITY_ALIASES)}") from None


def moment(text: str) -> datetime:
    """An ISO 8601 time; without a zone, the server's."""
    value = datetime.fromisoformat(text)
    return timezone.make_aware(value) if timezone.is_naive(value) else value


def require_key_table() -> None:
    """One line, not a traceback, when the database has no key table yet (never migrated); a SQLite file that is
    not there is not created empty by asking."""
    database = settings.DATABASES["default"]
    if database["ENGINE"].endswith("sqlite3"):
        where = f"the database {database['NAME']} (in LLAMASWAP_DATA_DIR)"
        present = Path(database["NAME"]).exists()
    else:
        where = f"the database '{database['NAME']}' on {database['HOST'] or 'localhost'} (DATABASE_URL)"
        present = True
    try:
        present = present and ApiKey._meta.db_table in connection.introspection.table_names()
    except DatabaseError as exc:
        raise CommandError(f"cannot read {where}: {exc}") from None
    if not present:
        raise CommandError(f"{where} has no API key table yet: run `llamaswap migrate`, or start `llamaswap serve` "
                           "once (it migrates the database), then try again")


class Command(BaseCommand):
    help = "Create, list and revoke API keys (see docs/operating.md, API keys)."

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, parser_class=type(parser))
        create = actions.add_parser("create", help="make a key and print its secret (the last line), once",
                                    called_from_command_line=parser.called_from_command_line)
        create.add_argument("name")
        create.add_argument("--models", nargs="+", action="extend", default=[], metavar="GLOB",
                            help="model ID globs the key may use (default: every model)")
        create.add_argument("--max-priority", type=priority, help="the highest priority its requests get")
        create.add_argument("--default-priority", type=priority, help="the priority of its requests without a header")
        for limit, meaning in (("rpm", "requests per minute (over it: 429)"),
                               ("tpm", "tokens per minute, from usage (over it: 429)"),
                               ("concurrency", "requests at once (more wait for one to end)")):
            create.add_argument(f"--{limit}", type=int, help=f"at most this many {meaning}; default: no limit")
        create.add_argument("--weight", type=int, default=1, help="its share of turns among keys with fairness: keys "
                                                                     "(2: twice the turns of a key of 1)")
        create.add_argument("--operator", action="store_true", help="may unload, cancel, switch profiles, take "
                                                                    "leases, read /logs and captures")
        create.add_argument("--read-only", action="store_true", help="reads only: no inference")
        create.add_argument("--expires", type=moment, help="refused from then on (ISO 8601)")
        actions.add_parser("list", help="every key, without secrets",
                           called_from_command_line=parser.called_from_command_line)
        revoke = actions.add_parser("revoke", help="refuse the key from now on (within 2 s everywhere)",
                                    called_from_command_line=parser.called_from_command_line)
        revoke.add_argument("name")

    def handle(self, *args, action: str, **options) -> None:
        require_key_table()
        getattr(self, f"_{action}")(**options)

    def _create(self, name: str, models: list[str], max_priority, default_priority, rpm, tpm, concurrency,
                weight: int, operator: bool, read_only: bool, expires, **_) -> None:
        if any(not glob.strip() for glob in models):
            raise CommandError("--models was given an empty glob: name the models the key may use, or leave --models "
                               "out for every model")
        if ApiKey.objects.filter(name=name).exists():
            raise CommandError(f"a key called '{name}' exists already (`llamaswap keys list`)")
        row = ApiKey(name=name, allowed_models="\n".join(models), max_priority=max_priority,
                     default_priority=default_priority, rpm=rpm, tpm=tpm, concurrency=concurrency, weight=weight,
                     operator=operator, read_only=read_only, expires_at=expires)
        try:
            secret = make_key(row)
        except ValidationError as exc:
            raise CommandError("; ".join(f"{field}: {' '.join(errors)}"
                                         for field, errors in exc.message_dict.items())) from None
        if expires is not None and expires <= timezone.now():
            self.stderr.write(f"warning: --expires {expires.isoformat(timespec='seconds')} has passed: "
                              "the key is refused from the start")
        self.stderr.write(KEYS_ARE_ON)
        self.stdout.write(f"Created key '{name}' ({row.prefix}…). Its secret, shown only now:")
        self.stdout.write(secret)

    def _list(self, **_) -> None:
        for row in ApiKey.objects.all():
            state = "enabled" if row.enabled else "revoked"
            if row.enabled and row.expires_at is not None and row.expires_at <= timezone.now():
                state = "expired"
            kind = "operator" if row.operator else "read-only" if row.read_only else "inference"
            limits = " ".join(f"{field}={value}" for field in ("max_priority", "default_priority", "rpm", "tpm",
                                                               "concurrency", "weight")
                              if (value := getattr(row, field)) is not None)
            used = row.last_used_at.isoformat(timespec="seconds") if row.last_used_at else "never"
            self.stdout.write(f"{row.name}\t{row.prefix}…\t{state}\t{kind}\tmodels={','.join(row.model_globs()) or '*'}"
                              f"\t{limits}\tcreated={row.created_at.isoformat(timespec='seconds')}\tused={used}"
                              + (f"\texpires={row.expires_at.isoformat(timespec='seconds')}" if row.expires_at else ""))

    def _revoke(self, name: str, **_) -> None:
        if not revoke_key(name):
            known = ApiKey.objects.filter(name=name).exists()
            raise CommandError(f"the key '{name}' is revoked already" if known else f"no key is called '{name}'")
        self.stdout.write(f"Revoked key '{name}': every front end refuses it within 2 s.")
