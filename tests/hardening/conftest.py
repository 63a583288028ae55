"""The application in-process for a whole module, with a real service and a fake model server behind it."""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio

from tests.hardening.inprocess import InProcess, inprocess_config


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def app(tmp_path_factory, django_db_setup, django_db_blocker):
    """One service for the module, its model already started by a first ordinary request."""
    from proxy.service import get_service, prepare, reset_service

    tmp = tmp_path_factory.mktemp("inprocess")
    with django_db_blocker.unblock():  # the recorder thread writes rows for the whole module
        reset_service()
        events = tmp / "events.jsonl"
        await asyncio.to_thread(prepare, inprocess_config(tmp, events))
        service = get_service()
        client = InProcess(service, events)
        try:
            warm = await client.chat()
            assert warm.status == 200, warm.body
            yield client
        finally:
            await service.shutdown(drain_seconds=1)
            reset_service()


@pytest.fixture(scope="module")
def case_counts():
    """How many generated cases each property ran, printed when the module is done (`pytest -s` shows it)."""
    counts: dict[str, int] = {}
    yield counts
    total = sum(counts.values())
    print(f"\nhypothesis cases run: {total} ({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))})")
