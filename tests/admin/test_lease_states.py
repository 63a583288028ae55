"""The admin lease list's state column: each state the scheduler answers (`ModelLeases.states`) in words."""

from __future__ import annotations

import pytest

from scheduling.admin.leases import state_in_words


@pytest.mark.parametrize(("state", "words"), [
    ({"state": "loaded"}, "loaded"),
    ({"state": "loading"}, "loading"),
    ({"state": "waiting", "blocked_by": ["chat (lease #3)", "code (busy)"]},
     "waiting: blocked by chat (lease #3), code (busy)"),
    ({"state": "waiting", "retry_in_s": 4.0, "last_error": "model 'chat' exited with code 1"},
     "waiting: its load failed (model 'chat' exited with code 1); tried again in 4 s"),
    ({"state": "waiting", "retry_in_s": 0.5}, "waiting: tried again in 0.5 s"),
    ({"state": "waiting", "blocked_by": []}, "waiting"),
    ({"state": "cannot_fit", "why": "model big needs 30720 MiB; the largest GPU has 24576 MiB"},
     "cannot fit: model big needs 30720 MiB; the largest GPU has 24576 MiB"),
    (None, "unknown: no scheduler has read it yet"),
])
def test_each_state_reads_as_what_the_lease_waits_on_or_why_it_cannot_be_kept(state, words):
    assert state_in_words(state) == words
