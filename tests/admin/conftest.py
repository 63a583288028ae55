import textwrap

import pytest


@pytest.fixture(autouse=True)
def _settings_warnings_logged_afresh(monkeypatch):
    """Each test sees the warnings about stored values it causes, though the process logged them before."""
    monkeypatch.setattr("scheduling.operating.settings_store._logged", set())


@pytest.fixture
def config_file(tmp_path, settings):
    """A two-model config with serial settings agingDivisor 30 / swapAffinityBonus 5 / slots beta: 2,
    named by LLAMASWAP_CONFIG."""
    path = tmp_path / "config.yaml"
    path.write_text(textwrap.dedent("""
        models:
          alpha:
            cmd: /bin/true --port ${PORT}
            proxy: http://127.0.0.1:${PORT}
            aliases: [first]
          beta:
            cmd: /bin/true --port ${PORT}
            proxy: http://127.0.0.1:${PORT}
        routing:
          scheduler:
            use: serial
            settings:
              serial: {agingDivisor: 30, swapAffinityBonus: 5, slots: {beta: 2}}
    """))
    settings.LLAMASWAP_CONFIG = str(path)
    return path


@pytest.fixture
def make_request():
    """Create request rows like the recorder writes them; ids count up from 1 unless given."""
    from datetime import datetime, timedelta, timezone

    from scheduling.models import QueuedRequest

    start = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)
    made = []

    def make(**fields):
        ticket_id = fields.pop("id", len(made) + 1)
        arrived = fields.pop("arrived_at", start + timedelta(minutes=ticket_id))
        values = {"model": "alpha", "path": "/v1/chat/completions", "state": "completed", "scheduler": "serial"}
        values.update(fields)
        row = QueuedRequest.objects.create(id=ticket_id, arrived_at=arrived, **values)
        made.append(row)
        return row

    return make

