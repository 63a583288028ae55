"""The dispatch record operators read: explain() and the activity-log keys."""

from scheduling.core import Band, Decision, ScoreTerms


def serial_decision(**changes):
    fields = dict(
        ticket_id=900,
        model="qwen",
        scheduler="serial",
        priority=100,
        band=Band.INTERACTIVE,
        score=104.2,
        terms=ScoreTerms(priority=100, affinity=0, aging=4.2),
        queue_wait_s=252.0,
        runner_up_id=812,
        runner_up_score=92.0,
        changed_by_aging=True,
        changed_by_affinity=False,
        needs_swap=True,
        fifo_priority=None,
    )
    fields.update(changes)
    return Decision(**fields)


def test_score_terms_add_up():
    assert ScoreTerms(priority=-100, affinity=10, aging=2.5).total == -87.5


def test_explain_spells_out_the_score_and_the_runner_up():
    assert serial_decision().explain() == (
        "dispatched at score 104.2 = 100 priority + 0 affinity + 4.2 aging, ahead of #812 at 92.0;"
        " aging changed the pick"
    )


def test_explain_when_nothing_else_was_waiting():
    decision = serial_decision(runner_up_id=None, runner_up_score=None, changed_by_aging=False)
    assert decision.explain().endswith("4.2 aging, nothing else was waiting")


def test_explain_names_every_term_that_changed_the_pick():
    both = serial_decision(changed_by_affinity=True)
    assert both.explain().endswith("; aging and swap affinity changed the pick")
    only_affinity = serial_decision(changed_by_aging=False, changed_by_affinity=True)
    assert only_affinity.explain().endswith("ahead of #812 at 92.0; swap affinity changed the pick")
    neither = serial_decision(changed_by_aging=False)
    assert neither.explain().endswith("ahead of #812 at 92.0")


def test_explain_for_fifo_gives_the_effective_priority():
    decision = serial_decision(
        scheduler="fifo",
        priority=-100,
        band=Band.BATCH,
        score=-90.0,
        terms=ScoreTerms(-90, 0, 0.0),
        runner_up_id=None,
        runner_up_score=None,
        changed_by_aging=False,
        fifo_priority=-90,
    )
    assert decision.explain() == "dispatched in fifo order at effective priority -90 (model priority + header)"


def test_activity_metadata_uses_the_documented_keys():
    assert serial_decision().activity_metadata() == {
        "serial_priority": "100",
        "serial_band": "interactive",
        "serial_score": "104.200",
        "serial_queue_wait_ms": "252000",
    }
    fifo = serial_decision(scheduler="fifo", fifo_priority=-90)
    assert fifo.activity_metadata() == {"fifo_priority": "-90"}
