"""One fault run: start a topology, send the planned clients while the nemesis strikes, heal
everything, let the rows settle, and gather the `History` the checker judges."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.faults.checker import TERMINAL, Violation, check
from tests.faults.cluster import MODEL, Cluster
from tests.faults.history import History, ModelEvent, Row
from tests.faults.nemesis import Nemesis, Planned, schedule
from tests.faults.workload import Clients, plan
from tests.served import Served, read_events, wait_until

SETTLE_S = 120.0  # after the last fault: every client answered and every row ended within this


@dataclass
class Outcome:
    history: History
    violations: list[Violation]
    problems: list[str] = field(default_factory=list)  # the run itself went wrong (not an invariant)

    def report(self, topology: str, seed: int) -> str:
        answers = self.history.answers
        statuses: dict = {}
        for answer in answers:
            statuses[answer.status] = statuses.get(answer.status, 0) + 1
        lines = [f"{topology} run, seed {seed}: {len(answers)} requests, statuses {statuses}, "
                 f"{len(self.history.faults)} faults, {len(self.history.rows)} rows"]
        lines += [f"  fault {f.kind} {f.process} {f.path} for {f.end - f.start:.1f} s" for f in self.history.faults]
        lines += [f"  PROBLEM {p}" for p in self.problems]
        lines += [f"  {v}" for v in self.violations]
        return "\n".join(lines)


def fault_run(tmp: Path, topology: str, database_url: str, redis_url: str | None, *, seed: int,
              seconds: float, count: int, faults: list[Planned] | None = None) -> Outcome:
    """A run of `count` requests over `seconds`; the faults are drawn from `seed` unless given."""
    cluster = Cluster(tmp, topology, database_url, redis_url).start()
    problems: list[str] = []
    try:
        bases = {p.name: p.handle.base for p in cluster.front_ends}
        planned = plan(seed, count, seconds, list(bases))
        nemesis = Nemesis(cluster, schedule(seed, seconds, topology) if faults is None else faults).start()
        clients = Clients(planned, bases.__getitem__).start()
        clients.wait_sent(seconds + 60)
        nemesis.stop()
        cluster.heal()
        waiting = clients.join(SETTLE_S)
        if waiting:
            problems.append(f"{len(waiting)} clients still waiting {SETTLE_S} s after the faults ended: {waiting[:10]}")
        problems += nemesis.errors
        rows = _settled_rows(database_url, problems)
        for process in cluster.front_ends:
            problems += _probe(process.name, process.handle)
        history = History(
            answers=[answer for _, answer in planned], faults=nemesis.faults,
            events=[ModelEvent(e["event"], str(e.get("id")), e["t"]) for e in read_events(cluster.events)
                    if "id" in e],
            rows=rows, byte_path_processes=frozenset(cluster.worker_names),
        )
        outcome = Outcome(history, check(history), problems)
        if outcome.violations or problems:
            outcome.problems.append("logs:\n" + cluster.logs())
        return outcome
    finally:
        cluster.close()


def read_rows(database_url: str) -> list[Row]:
    import psycopg

    with psycopg.connect(database_url, connect_timeout=5) as connection:
        found = connection.execute(
            "SELECT id, client, state, status_code, output_tokens, priority, extract(epoch FROM arrived_at),"
            " extract(epoch FROM dispatched_at), error FROM scheduling_queuedrequest ORDER BY id"
        ).fetchall()
    return [Row(r[0], r[1], r[2], r[3], r[4], r[5], float(r[6]), None if r[7] is None else float(r[7]), r[8])
            for r in found]


def _settled_rows(database_url: str, problems: list[str]) -> list[Row]:
    def settled():
        rows = read_rows(database_url)
        return rows if all(row.state in TERMINAL for row in rows) else None

    try:
        return wait_until(settled, SETTLE_S, 0.5, "every row to end")
    except AssertionError as exc:
        problems.append(str(exc))
        return read_rows(database_url)


def _probe(name: str, served: Served) -> list[str]:
    """After the run each front end is settled (`Served.check_settled`): every row ended, and an ordinary
    request is answered again and recorded."""
    try:
        served.check_settled(MODEL, 60, id=f"probe-{name}", tokens=2)
    except (AssertionError, httpx.HTTPError) as exc:
        return [f"{name} did not settle after the run: {exc!r}"[:600]]
    return []
