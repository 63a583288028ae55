"""Why a request was dispatched: the record that answers "why did my request wait"."""

from __future__ import annotations

from dataclasses import dataclass

from .priority import Band


@dataclass(frozen=True)
class ScoreTerms:
    """The three parts of a serial score: priority + swap affinity + aging."""

    priority: int
    affinity: float
    aging: float

    @property
    def total(self) -> float:
        return self.priority + self.affinity + self.aging


def _term(value: float) -> str:
    """A score term as operators read it: whole numbers bare, otherwise one decimal."""
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.1f}"


@dataclass(frozen=True)
class Decision:
    """One dispatch, recorded when the request was picked.

    `changed_by_aging` / `changed_by_affinity`: the pick with that term removed
    would have been a different request. `fifo_priority` is the effective
    priority (model priority + header) under the fifo scheduler, else None.
    `slot` is the 1-based job slot of its model the request took (serial), and
    `waited_because` says why it waited although the GPU was partly idle ("" if
    it never did, or waited only for a fully busy GPU). `fair_turn` says how fair
    share between API keys chose it over an older equal request ("" when it did not).
    `made_room` names the idle models its model's start stopped for their memory, each with its
    eviction cost and the formula's terms ("" when none was). Other models are named in them, and in
    `explain()`, as mentions (`mentions`), told to each reader as far as it may see them.
    """

    ticket_id: int
    model: str
    scheduler: str
    priority: int
    band: Band
    score: float
    terms: ScoreTerms
    queue_wait_s: float
    runner_up_id: int | None
    runner_up_score: float | None
    changed_by_aging: bool
    changed_by_affinity: bool
    needs_swap: bool
    fifo_priority: int | None
    slot: int | None = None
    waited_because: str = ""
    fair_turn: str = ""
    made_room: str = ""

    @property
    def changed_by_fairness(self) -> bool:
        return bool(self.fair_turn)

    def explain(self) -> str:
        """The sentence shown next to the dispatch (to operators, and to the request's key as `mentions.told`)."""
        if self.scheduler == "fifo":
            return f"dispatched in fifo order at effective priority {self.fifo_priority} (model priority + header)"
        text = (
            f"dispatched at score {self.score:.1f} = {self.terms.priority} priority"
            f" + {_term(self.terms.affinity)} affinity + {_term(self.terms.aging)} aging"
        )
        if self.runner_up_id is None:
            text += ", nothing else was waiting"
        else:
            text += f", ahead of #{self.runner_up_id} at {self.runner_up_score:.1f}"
        changed = [
            term
            for term, flag in (("aging", self.changed_by_aging), ("swap affinity", self.changed_by_affinity))
            if flag
        ]
        if changed:
            text += f"; {' and '.join(changed)} changed the pick"
        if self.fair_turn:
            text += f"; fair share between API keys: {self.fair_turn}"
        if self.made_room:
            text += f"; {self.made_room}"
        return text

    def activity_metadata(self) -> dict[str, str]:
        """The activity-log keys llama-swap users know: serial_* for serial, fifo_priority for fifo."""
        if self.scheduler == "fifo":
            return {"fifo_priority": str(self.fifo_priority)}
        return {
            "serial_priority": str(self.priority),
            "serial_band": str(self.band),
            "serial_score": f"{self.score:.3f}",
            "serial_queue_wait_ms": str(round(self.queue_wait_s * 1000)),
        }
