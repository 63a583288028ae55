"""An outage is logged once when it begins and once when it ends, however many tries fail between."""

from __future__ import annotations

import logging

from scheduling.outage_log import OutageLog


def test_many_failed_tries_make_one_line_and_the_first_that_works_another(caplog):
    outage = OutageLog(logging.getLogger("llamaswap.test"), "sending heartbeats")
    with caplog.at_level(logging.WARNING, "llamaswap.test"):
        outage.worked()  # nothing to say while all is well
        for _ in range(50):
            outage.failed(ConnectionError("Error 111 connecting"))
        outage.worked()
        outage.worked()
        outage.failed(TimeoutError("again"))
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 3, lines
    assert lines[0] == "sending heartbeats failed (ConnectionError: Error 111 connecting); trying again until it works"
    assert lines[1].startswith("sending heartbeats works again after ") and lines[1].endswith(" s")
    assert lines[2].startswith("sending heartbeats failed (TimeoutError: again)")
