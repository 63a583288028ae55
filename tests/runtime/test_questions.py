"""The front door stays narrow: the request port plus `ask`, and each question has exactly one
answering function, which the wire carries to a worker and back unchanged."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pytest

from scheduling.door import questions
from scheduling.core import Band, SerialSettings
from scheduling.core.durations import JobKind
from scheduling.door.frontdoor import FrontDoor
from scheduling.door.in_process import InProcessFrontDoor
from scheduling.door.questions import ANSWERS, Question, answers
from scheduling.door.remote import ChannelLayerFrontDoor
from scheduling.tickets import Outcome, TicketRequest
from scheduling.door.wire import Answer, Ask, from_message, to_message
from tests.core.test_purity import imported_modules

ROOT = Path(__file__).resolve().parents[2]
PORT = {"submit", "release", "refuse_key", "begin_relayed", "end_relayed", "ask", "ask_now", "close"}


def public_methods(cls: type) -> set[str]:
    return {name for name, member in vars(cls).items() if callable(member) and not name.startswith("_")}


def test_the_front_door_has_at_most_eight_methods():
    assert public_methods(FrontDoor) == PORT
    assert len(PORT) <= 8


@pytest.mark.parametrize("door", [InProcessFrontDoor, ChannelLayerFrontDoor])
def test_each_front_door_offers_the_port_and_nothing_more(door):
    assert public_methods(door) == PORT


def question_types() -> set[type]:
    return {cls for cls in vars(questions).values()
            if isinstance(cls, type) and issubclass(cls, Question) and dataclasses.is_dataclass(cls)}


def test_every_question_has_exactly_one_answering_function():
    assert set(ANSWERS) == question_types()
    with pytest.raises(ValueError, match="already has an answer"):
        answers(questions.Logs)(lambda question, runtime, fleet: "")


SAMPLES = [
    questions.Snapshot(), questions.Waiting(), questions.BusyModels(), questions.Queue(), questions.Progress(7),
    questions.Progress("front#3"), questions.Processes(), questions.RunningProcesses(), questions.Logs(),
    questions.LogsSince({"worker a": "12"}, "a"), questions.Cancel((7,), running=True), questions.Cancel((1, 2)),
    questions.RefuseKey("app", "the API key 'app' is revoked"),
    questions.Reprioritize((3,), 100), questions.Unload(("a",), wait=False), questions.Unload(),
    questions.Retune(SerialSettings(30, 5, {"a": 2})),
    questions.BeginRelayed(TicketRequest("m", "/v1/chat/completions", 0, client="c"), "box", 1.5, "relayed"),
    questions.EndRelayed(7, Outcome("completed", 200, usage={"__tuple__": [1], "n": {"k": 1}}), 2.0, None),
    questions.StillGranted("front#3"),
    questions.Placement(), questions.CanLoad("a"), questions.NeverFits("a"), questions.KeepLeases(),
    questions.RunTime(JobKind("a", "/v1/chat/completions", False, "normal"), 3, 1),
]


def test_the_samples_cover_every_question():
    assert {type(sample) for sample in SAMPLES} == question_types()


@pytest.mark.parametrize("question", SAMPLES, ids=lambda q: type(q).__name__)
def test_a_question_crosses_the_wire_unchanged(question):
    assert from_message(to_message(Ask("key", "reply", question))) == Ask("key", "reply", question)


def test_an_answer_with_enum_keys_and_nested_dataclasses_crosses_the_wire_unchanged():
    snapshot = questions.merged_snapshot([])
    busy = [questions.BusyModel("a", 2, (questions.RunningEntry(1, 0, 0, 1.5), questions.RunningEntry(2, 0, None, None)))]
    leases = {3: {"state": "waiting", "blocked_by": ["b (lease #2)"]}}
    for value in (snapshot, busy, {"a": "ready"}, {"w a": questions.LogText("a", "text", "3")}, None, True, [1, 2], leases):
        assert from_message(to_message(Answer("key", value))).value == value
    assert set(from_message(to_message(Answer("key", snapshot))).value.depth_by_band) == set(Band)


def test_the_wire_refuses_a_type_outside_the_scheduler():
    body = to_message(Answer("key", questions.Logs()))
    body["value"]["__dataclass__"] = "os:PathLike"
    with pytest.raises(ValueError, match="does not carry"):
        from_message(body)


MODE_TESTS = re.compile(r"\.runs_scheduler\b|isinstance\([^)]*(ChannelLayerFrontDoor|InProcessFrontDoor)")


def test_only_the_composition_root_tells_the_modes_apart():
    sources = [*(ROOT / "proxy").rglob("*.py"), *(ROOT / "scheduling").rglob("*.py")]
    testing = sorted(str(path.relative_to(ROOT)) for path in sources if MODE_TESTS.search(path.read_text()))
    assert testing == ["proxy/service.py"]


def test_a_question_is_answered_by_a_plain_function_of_the_runtime_and_the_fleet():
    for function in ANSWERS.values():
        assert list(inspect.signature(function).parameters)[1:] == ["runtime", "fleet"]


def test_a_front_end_reads_the_questions_without_the_engine():
    """remote.py and wire.py import the questions, so their module must not bring the runtime in."""
    source = (ROOT / "scheduling" / "door" / "questions.py").read_text()
    assert "scheduling.runtime" not in imported_modules(source, "scheduling")
