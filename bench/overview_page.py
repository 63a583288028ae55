"""The admin Overview's cost on a big request history: fills a fresh database with N rows over 30 days
(a steady mix of bands and models, waits and job times, some model loads and reorders) and times the
page for each preset window, end to end through Django's test client as a logged-in superuser.

    python bench/overview_page.py [--rows 1000000] [--database-url postgres://…]

Without --database-url it uses a SQLite file in a temporary directory, removed at the end; with it, give an
empty database (the rows stay there)."""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SPAN = timedelta(days=30)
BANDS = (("interactive", 100), ("normal", 0), ("batch", -100))
MODELS = ("alpha", "beta", "gamma", "delta")
COLUMNS = ("id", "model", "requested_model", "method", "path", "stream", "client", "origin", "route", "priority",
           "band", "serial_band", "state", "scheduler", "arrived_at", "dispatched_at", "finished_at", "error", "explanation",
           "waited_because", "changed_by_aging", "changed_by_affinity", "needed_swap", "duration_ms", "peer",
           "selector")


def rows(count: int, end: datetime):
    """Rows as the recorder leaves them, arrivals spread evenly over the SPAN before `end`."""
    chance = random.Random(7)
    gap = SPAN / count
    for n in range(count):
        arrived = end - SPAN + gap * n
        band, priority = chance.choice(BANDS)
        wait = timedelta(milliseconds=chance.expovariate(1 / 3000))
        run = timedelta(milliseconds=chance.expovariate(1 / 8000))
        cancelled = chance.random() < 0.02
        yield (n + 1, chance.choice(MODELS), "", "POST", "/v1/chat/completions", False, "", "", "chat", priority,
               band, band, "cancelled" if cancelled else "completed", "serial", arrived,
               None if cancelled else arrived + wait, arrived + wait + (timedelta() if cancelled else run), "", "",
               "", chance.random() < 0.05, chance.random() < 0.03, chance.random() < 0.1,
               None if cancelled else int(run.total_seconds() * 1000), "", "")


def fill(count: int, end: datetime) -> None:
    from django.db import connection, transaction

    table = "scheduling_queuedrequest"
    sql = f"INSERT INTO {table} ({', '.join(COLUMNS)}) VALUES ({', '.join(['%s'] * len(COLUMNS))})"
    batch: list[tuple] = []
    with transaction.atomic(), connection.cursor() as cursor:
        for row in rows(count, end):
            batch.append(row)
            if len(batch) == 20_000:
                cursor.executemany(sql, batch)
                batch.clear()
        if batch:
            cursor.executemany(sql, batch)
    with connection.cursor() as cursor:  # the planner's statistics, as a long-running service would have them
        cursor.execute(f"ANALYZE {table}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--database-url", default="")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="overview-bench-") as data:  # the SQLite file: half a GB at 1M rows
        os.environ.update(LLAMASWAP_DATA_DIR=data, DATABASE_URL=args.database_url,
                          DJANGO_SETTINGS_MODULE="llamaswap_site.settings")
        measure(args)


def measure(args) -> None:
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    call_command("migrate", verbosity=0)
    end = datetime.now(timezone.utc).replace(microsecond=0)
    started = time.perf_counter()
    fill(args.rows, end)
    print(f"{connection.vendor}: {args.rows:,} rows over {SPAN.days} days written in {time.perf_counter() - started:.1f} s")
    admin = User.objects.create_superuser("bench", password="bench-password-1")
    client = Client()
    client.force_login(admin)
    for window in ("1h", "24h", "7d", "30d"):
        times = []
        for _ in range(args.repeat):
            with CaptureQueriesContext(connection) as queries:
                started = time.perf_counter()
                response = client.get("/admin/overview/", {"window": window}, SERVER_NAME="localhost")
                times.append(time.perf_counter() - started)
            assert response.status_code == 200, response.status_code
        in_window = args.rows * min(1, {"1h": 1 / 720, "24h": 1 / 30, "7d": 7 / 30, "30d": 1}[window])
        print(f"window {window:>3} (~{in_window:,.0f} rows): page {statistics.median(times) * 1000:,.0f} ms "
              f"(median of {args.repeat}; best {min(times) * 1000:,.0f} ms), {len(queries)} queries")


if __name__ == "__main__":
    main()
