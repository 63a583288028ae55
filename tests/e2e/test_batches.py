"""OpenAI's Files and Batch APIs end to end: the real `openai` client against a real `llamaswap serve`, the
lines answered by the fake model server, each line's order told by the model's own events."""

from __future__ import annotations

import json
import sqlite3
from contextlib import ExitStack
from pathlib import Path
import textwrap
import threading

import httpx
import openai
import pytest

from tests.e2e.conftest import db_rows
from tests.e2e.test_distributed import distributed  # noqa: F401 - the fixture, for the distributed backend
from tests.served import Served, Worker, fake_cmd, model_ports, read_events, wait_until

pytestmark = pytest.mark.e2e
DONE = {"completed", "failed", "expired", "cancelled"}


def config(events, slots: int = 1) -> str:
    return f"""
        healthCheckTimeout: 20
        maxBatchFileBytes: 2000000
        models:
          chat:
            cmd: {fake_cmd("chat", events, "--tps", "0", "--tokens", "2", "--parallel", str(slots))}
        routing:
          scheduler:
            use: serial
            settings:
              serial: {{slots: {{chat: {slots}}}}}
    """


class Backend:
    """Where the batch's rows live: SQLite (the default), PostgreSQL, or distributed mode (PostgreSQL, Redis, a
    worker running the model, the service a front end)."""

    def __init__(self, kind: str, tmp_path: Path, request, stack: ExitStack) -> None:
        self.kind, self.tmp, self.stack = kind, tmp_path, stack
        self.env: dict = {}
        self.psycopg = None
        self.url = ""
        if kind == "postgresql":
            self.url, self.psycopg = request.getfixturevalue("postgres")
            self.env = {"DATABASE_URL": self.url}
        elif kind == "distributed":
            env, self.psycopg = request.getfixturevalue("distributed")
            self.url = env["DATABASE_URL"]
            self.env = {name: value for name, value in env.items() if name != "LLAMASWAP_DATA_DIR"}
        self.worker: Worker | None = None

    def serve(self, text: str) -> Served:
        """The service (not started); in distributed mode its worker is started first, once."""
        if self.kind == "distributed" and self.worker is None:
            text = f"startPort: {model_ports(8)}\n" + textwrap.dedent(text)
            worker_env = {**self.env, "LLAMASWAP_DATA_DIR": str(self.tmp / "worker-data")}
            self.worker = self.stack.enter_context(Worker(self.tmp / "worker", text, worker_env))
        return Served(self.tmp, self.worker.config_path.read_text() if self.worker else text, env=self.env)

    def rows(self, served: Served) -> list[dict]:
        """The request rows."""
        if self.psycopg is None:
            return db_rows(served.data_dir)
        with self.psycopg.connect(self.url) as connection:
            cursor = connection.execute("SELECT * FROM scheduling_queuedrequest ORDER BY id")
            names = [column.name for column in cursor.description]
            return [dict(zip(names, row)) for row in cursor.fetchall()]

    def let_claims_lapse(self) -> None:
        """Distributed mode: a killed front end's claims on its batches run out (30 s later, here at once)."""
        if self.kind == "distributed":
            with self.psycopg.connect(self.url) as connection:
                connection.execute("UPDATE scheduling_batch SET runner_until = now() - interval '1 hour'")


@pytest.fixture(params=["sqlite", "postgresql", "distributed"])
def backend(request, tmp_path):
    with ExitStack() as stack:
        yield Backend(request.param, tmp_path, request, stack)


def client(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.base + "/v1", api_key="unused", max_retries=0)


def jsonl(count: int, *, delay: float = 0.0, url: str = "/v1/chat/completions", prefix: str = "line") -> bytes:
    return b"".join(json.dumps({
        "custom_id": f"{prefix}-{n}", "method": "POST", "url": url,
        "body": {"model": "chat", "messages": [{"role": "user", "content": "hi"}],
                 "fake": {"id": f"{prefix}-{n}", "delay": delay}},
    }).encode() + b"\n" for n in range(count))


def submit(api: openai.OpenAI, content: bytes, **create):
    uploaded = api.files.create(file=("in.jsonl", content), purpose="batch")
    return api.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h",
                              **create)


def finished(api: openai.OpenAI, batch_id: str, timeout: float = 60.0):
    return wait_until(lambda: (b := api.batches.retrieve(batch_id)).status in DONE and b, timeout, 0.1,
                      f"batch {batch_id} to end")


def lines_of(api: openai.OpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(line) for line in api.files.content(file_id).read().splitlines()]


def start_events(events) -> list[dict]:
    """The fake model's "start" events, in the order its requests began."""
    return [e for e in read_events(events) if e["event"] == "start"]


def batch_starts(events) -> list[str]:
    return [e["id"] for e in start_events(events)]


def test_upload_create_poll_download(tmp_path, backend):
    events = tmp_path / "events.jsonl"
    with backend.serve(config(events)) as served:
        api = client(served)
        content = jsonl(5)
        uploaded = api.files.create(file=("in.jsonl", content), purpose="batch")
        assert (uploaded.object, uploaded.purpose, uploaded.bytes, uploaded.filename) == ("file", "batch", len(content),
                                                                                          "in.jsonl")
        assert api.files.retrieve(uploaded.id).id == uploaded.id
        assert uploaded.id in [f.id for f in api.files.list()]
        assert api.files.content(uploaded.id).read() == content

        batch = api.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                   completion_window="24h", metadata={"job": "nightly"})
        assert batch.status == "validating" and batch.metadata == {"job": "nightly"}
        done = finished(api, batch.id)
        assert done.status == "completed" and done.error_file_id is None
        assert done.request_counts.model_dump() == {"total": 5, "completed": 5, "failed": 0}
        assert done.in_progress_at and done.finalizing_at and done.completed_at
        output = lines_of(api, done.output_file_id)
        assert [line["custom_id"] for line in output] == [f"line-{n}" for n in range(5)]
        assert all(line["response"]["status_code"] == 200 and line["error"] is None for line in output)
        assert output[0]["response"]["body"]["object"] == "chat.completion"
        assert api.files.retrieve(done.output_file_id).purpose == "batch_output"
        assert [b.id for b in api.batches.list(limit=5)] == [batch.id]
        # Each line was a request through the scheduler at batch priority, with its row.
        mine = wait_until(lambda: (found := [r for r in backend.rows(served) if r["client"] == "batch"])
                          and {r["state"] for r in found} == {"completed"} and found, 10, 0.05, "the rows to end")
        assert len(mine) == 5 and {r["priority"] for r in mine} == {-100}
        assert {str(r["id"]) for r in mine} == {line["response"]["request_id"] for line in output}

        more = [api.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                   completion_window="24h").id for _ in range(2)]
        first_page = api.batches.list(limit=2)
        assert [b.id for b in first_page.data] == more[::-1] and first_page.has_more
        assert [b.id for b in api.batches.list(limit=2, after=more[0]).data] == [batch.id]
        for later in more:
            finished(api, later)

        api.files.delete(uploaded.id)
        with pytest.raises(openai.NotFoundError):
            api.files.retrieve(uploaded.id)


def test_a_bad_line_is_refused_naming_it(tmp_path):
    with Served(tmp_path, config(tmp_path / "events.jsonl")) as served:
        api = client(served)
        content = jsonl(2) + b'{"custom_id": "x", "method": "POST"\n' + jsonl(1, prefix="after")
        with pytest.raises(openai.BadRequestError, match="line 3: not valid JSON"):
            api.files.create(file=("in.jsonl", content), purpose="batch")
        with pytest.raises(openai.BadRequestError, match="line 2: custom_id 'line-0' is used by an earlier line"):
            api.files.create(file=("in.jsonl", jsonl(1) + jsonl(1)), purpose="batch")
        too_large = jsonl(20_000)
        assert len(too_large) > 2_000_000
        with pytest.raises(openai.APIStatusError, match="maxBatchFileBytes") as refused:
            api.files.create(file=("in.jsonl", too_large), purpose="batch")
        assert refused.value.status_code == 413
        assert list(api.files.list()) == []
        assert [p.name for p in (served.data_dir / "files").iterdir()] == []  # nothing kept of the refused files


def test_an_upload_over_the_limit_by_its_length_is_refused_unkept_and_a_chunked_one_is_asked_for_a_length(tmp_path):
    """Twisted would spool a body whole to a file before the service saw it: one whose Content-Length is over the
    limit is dropped as it arrives and answered 413. A chunked upload (no length) gets 411, not 'no file field'."""
    with Served(tmp_path, config(tmp_path / "events.jsonl")) as served:
        form = b'--x\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--x\r\n' \
               b'Content-Disposition: form-data; name="file"; filename="in.jsonl"\r\n\r\n'
        body = form + jsonl(60_000) + b"\r\n--x--\r\n"
        assert len(body) > 3 * 2_000_000
        headers = {"Content-Type": "multipart/form-data; boundary=x"}
        refused = httpx.post(served.base + "/v1/files", content=body, headers=headers, timeout=60)
        assert refused.status_code == 413, refused.text
        error = refused.json()["error"]
        assert error["code"] == "file_too_large" and f"the request body is {len(body)} bytes" in error["message"]
        assert "maxBatchFileBytes" in error["message"]

        def chunked():
            yield form
            yield jsonl(2) + b"\r\n--x--\r\n"

        asked = httpx.post(served.base + "/v1/files", content=chunked(), headers=headers, timeout=60)
        assert asked.status_code == 411 and asked.json()["error"]["code"] == "length_required", asked.text
        assert client(served).files.create(file=("in.jsonl", jsonl(2)), purpose="batch").bytes == len(jsonl(2))
        assert len(list(client(served).files.list())) == 1


@pytest.mark.parametrize("slots", [1, 3])
def test_cancel_stops_sending_and_keeps_what_ran(tmp_path, slots):
    """With several slots, a batch keeps one line at the model per slot (the model's own count shows it)."""
    events = tmp_path / "events.jsonl"
    with Served(tmp_path, config(events, slots)) as served:
        api = client(served)
        batch = submit(api, jsonl(20, delay=0.2))
        wait_until(lambda: len(batch_starts(events)) >= 2, 30, what="two lines to start")
        assert api.batches.cancel(batch.id).status == "cancelling"
        done = finished(api, batch.id)
        assert done.status == "cancelled" and done.cancelled_at
        ran, never = lines_of(api, done.output_file_id), lines_of(api, done.error_file_id)
        assert len(ran) + len(never) == 20 and 2 <= len(ran) < 20
        assert {line["error"]["code"] for line in never} == {"batch_cancelled"}
        assert sorted(line["custom_id"] for line in ran) == sorted(set(batch_starts(events)))
        assert done.request_counts.model_dump() == {"total": 20, "completed": len(ran), "failed": len(never)}
        assert max(e["in_flight"] for e in read_events(events) if e["event"] == "start") == slots


def test_a_batch_survives_kill_9_and_each_line_is_answered_once(tmp_path, backend):
    events = tmp_path / "events.jsonl"
    served = backend.serve(config(events)).start()
    try:
        api = client(served)
        batch = submit(api, jsonl(8, delay=0.3))
        # Killed while the third line is at the model (one line at a time, each 0.3 s): it runs again after the restart.
        wait_until(lambda: len(batch_starts(events)) >= 3, 30, what="three lines to start")
        at_kill = batch_starts(events)
        served.kill()
    finally:
        served.kill()
    backend.let_claims_lapse()
    with backend.serve(config(events)) as again:
        done = finished(client(again), batch.id)
        output = lines_of(client(again), done.output_file_id)
    assert done.status == "completed" and done.request_counts.model_dump() == {"total": 8, "completed": 8, "failed": 0}
    ids = [line["custom_id"] for line in output]
    assert sorted(ids) == sorted(f"line-{n}" for n in range(8))  # each once: none lost, none twice
    starts = batch_starts(events)
    assert {i for i in ids if starts.count(i) > 1} == {at_kill[-1]} and starts.count(at_kill[-1]) == 2, starts


def test_an_interactive_request_waits_for_at_most_one_batch_line(tmp_path, backend):
    events = tmp_path / "events.jsonl"
    with backend.serve(config(events)) as served:
        api = client(served)
        batch = submit(api, jsonl(10, delay=0.3))
        wait_until(lambda: len(batch_starts(events)) >= 2, 30, what="the batch to be running")
        before = len(batch_starts(events))
        answer: list[httpx.Response] = []
        asking = threading.Thread(target=lambda: answer.append(httpx.post(
            served.base + "/v1/chat/completions", timeout=30, headers={"X-LlamaSwap-Priority": "interactive"},
            json={"model": "chat", "messages": [], "fake": {"id": "interactive"}})))
        asking.start()
        while asking.is_alive():  # the batch keeps one line at a time in the queue, waiting or running
            entries = httpx.get(served.base + "/api/queue", timeout=10).json()["data"]
            assert len([e for e in entries if e["band"] == "batch"]) <= 1, entries
            asking.join(0.05)
        assert answer and answer[0].status_code == 200
        starts = batch_starts(events)
        # At most one batch line reached the model after the interactive request was sent and before it did.
        assert starts.index("interactive") - before <= 1, starts
        # One request at the model at a time: each start comes after the previous request's end.
        order = [e["event"] for e in read_events(events) if e["event"] in ("start", "end")]
        assert order == (["start", "end"] * len(order))[:len(order)], order
        assert finished(api, batch.id).status == "completed"


def test_a_ten_thousand_line_file_is_accepted(tmp_path, backend):
    with backend.serve(config(tmp_path / "events.jsonl")) as served:
        api = client(served)
        content = b"".join(b'{"custom_id":"%d","method":"POST","url":"/v1/embeddings","body":{"model":"chat",'
                           b'"input":"x"}}\n' % n for n in range(10_000)) + b"\r\n\n"  # blank lines may end it
        uploaded = api.files.create(file=("many.jsonl", content), purpose="batch")
        batch = api.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
        running = wait_until(lambda: (b := api.batches.retrieve(batch.id)).request_counts.total and b, 60, 0.1,
                             "the lines to be read")
        assert running.request_counts.total == 10_000
        api.batches.cancel(batch.id)
        done = finished(api, batch.id)
        assert done.status == "cancelled" and done.request_counts.total == 10_000


def test_a_line_for_another_endpoint_fails_the_batch_naming_it(tmp_path):
    with Served(tmp_path, config(tmp_path / "events.jsonl")) as served:
        api = client(served)
        batch = submit(api, jsonl(2) + jsonl(1, url="/v1/embeddings", prefix="other"))
        done = finished(api, batch.id)
        assert done.status == "failed" and done.failed_at and done.output_file_id is None
        assert [(e.line, e.param) for e in done.errors.data] == [(3, "url")]
        assert "is not the batch's endpoint /v1/chat/completions" in done.errors.data[0].message


def test_after_its_window_a_batch_expires_keeping_the_results_so_far(tmp_path):
    events = tmp_path / "events.jsonl"
    with Served(tmp_path, config(events)) as served:
        api = client(served)
        batch = submit(api, jsonl(30, delay=0.1))
        wait_until(lambda: len(batch_starts(events)) >= 2, 30, what="two lines to start")
        with sqlite3.connect(served.data_dir / "llamaswap.sqlite3", timeout=10) as db:  # 24 hours later
            db.execute("UPDATE scheduling_batch SET expires_at = '2000-01-01 00:00:00' WHERE id = ?", (batch.id,))
        done = finished(api, batch.id)
        assert done.status == "expired" and done.expired_at
        ran, never = lines_of(api, done.output_file_id), lines_of(api, done.error_file_id)
        assert 2 <= len(ran) < 30 and len(ran) + len(never) == 30
        assert {line["error"]["code"] for line in never} == {"batch_expired"}
        assert sorted(line["custom_id"] for line in ran) == sorted(set(batch_starts(events)))


def test_a_batch_stopped_with_sigterm_carries_on_after_the_restart(tmp_path):
    events = tmp_path / "events.jsonl"
    with Served(tmp_path, config(events)) as served:
        api = client(served)
        batch = submit(api, jsonl(6, delay=0.3))
        wait_until(lambda: len(batch_starts(events)) >= 2, 30, what="two lines to start")
    with Served(tmp_path, config(events)) as again:
        done = finished(client(again), batch.id)
        output = lines_of(client(again), done.output_file_id)
    assert done.status == "completed" and sorted(line["custom_id"] for line in output) == [f"line-{n}" for n in range(6)]


def test_a_large_upload_is_never_held_whole_in_memory(tmp_path):
    with Served(tmp_path, config(tmp_path / "events.jsonl").replace("2000000", "100000000")) as served:
        api = client(served)
        api.files.list()  # the service has served a request: its memory is what serving takes

        def peak() -> int:
            status = (Path("/proc") / str(served.proc.pid) / "status").read_text()
            return int(status.split("VmHWM:")[1].split()[0]) * 1024

        before = peak()
        content = b"".join(b'{"custom_id":"%d","method":"POST","url":"/v1/embeddings","body":{"model":"chat",'
                           b'"input":"%s"}}\n' % (n, b"x" * 1900) for n in range(30_000))
        assert api.files.create(file=("large.jsonl", content), purpose="batch").bytes == len(content)
        assert peak() - before < len(content) / 4, (peak() - before, len(content))


def test_a_batch_runs_with_its_keys_rights(tmp_path, rows):
    from tests.e2e.test_api_keys import new_key

    events = tmp_path / "events.jsonl"
    text = config(events).replace("    routing:", f"""      other:
            cmd: {fake_cmd("other", events, "--tps", "0")}
        routing:""")
    with Served(tmp_path, text) as served:
        scoped = new_key(served, "scoped", "--models", "chat", "--max-priority", "normal")
        reader = new_key(served, "reader", "--read-only")
        with pytest.raises(openai.PermissionDeniedError):
            openai.OpenAI(base_url=served.base + "/v1", api_key=reader, max_retries=0).files.create(
                file=("in.jsonl", jsonl(1)), purpose="batch")
        api = openai.OpenAI(base_url=served.base + "/v1", api_key=scoped, max_retries=0)
        content = jsonl(2) + jsonl(1, prefix="other").replace(b'"model": "chat"', b'"model": "other"')
        batch = submit(api, content, extra_headers={"X-LlamaSwap-Priority": "interactive"})
        reading = openai.OpenAI(base_url=served.base + "/v1", api_key=reader, max_retries=0)
        with pytest.raises(openai.PermissionDeniedError):  # a read-only key deletes nothing
            reading.files.delete(batch.input_file_id)
        done = finished(api, batch.id)
        assert done.request_counts.model_dump() == {"total": 3, "completed": 2, "failed": 1}
        [refused] = lines_of(api, done.error_file_id)
        assert (refused["custom_id"], refused["response"]["status_code"]) == ("other-0", 403)
        assert refused["response"]["body"]["error"]["code"] == "model_not_allowed"
        mine = [r for r in rows(served.data_dir) if r["client"] == "batch"]
        assert [(r["model"], r["priority"], r["api_key"]) for r in mine] == [("chat", 0, "scoped")] * 2


def test_an_unreadable_upload_is_refused_and_nothing_is_kept(tmp_path):
    with Served(tmp_path, config(tmp_path / "events.jsonl")) as served:
        broken = httpx.post(served.base + "/v1/files", timeout=10, content=b"--x\r\nno end",
                            headers={"Content-Type": "multipart/form-data; boundary=x"})
        assert broken.status_code == 400, broken.text
        elsewhere = httpx.post(served.base + "/v1/files", timeout=10, data={"purpose": "assistants"},
                               files={"file": ("in.jsonl", jsonl(1))})
        assert elsewhere.status_code == 400 and "purpose=batch" in elsewhere.json()["error"]["message"]
        assert not list((served.data_dir / "files").iterdir())


def test_a_batch_of_a_revoked_key_stops_sending_its_lines(tmp_path):
    from tests.e2e.test_api_keys import keys, new_key

    events = tmp_path / "events.jsonl"
    with Served(tmp_path, config(events)) as served:
        owner = new_key(served, "owner")
        watcher = openai.OpenAI(base_url=served.base + "/v1", api_key=new_key(served, "watcher", "--operator"),
                                max_retries=0)
        batch = submit(openai.OpenAI(base_url=served.base + "/v1", api_key=owner, max_retries=0),
                       jsonl(40, delay=0.2))
        wait_until(lambda: len(batch_starts(events)) >= 2, 30, what="two lines to start")
        keys(served, "revoke", "owner")
        done = finished(watcher, batch.id)
        ran, refused = lines_of(watcher, done.output_file_id), lines_of(watcher, done.error_file_id)
        assert len(ran) + len(refused) == 40 and 2 <= len(ran) < 30, (len(ran), len(refused))
        assert {(line["response"]["status_code"], line["response"]["body"]["error"]["code"]) for line in refused} == {
            (401, "invalid_api_key")}
        assert "the API key 'owner' is revoked" in refused[0]["response"]["body"]["error"]["message"]
        assert sorted(line["custom_id"] for line in ran) == sorted(set(batch_starts(events)))


def test_a_keys_files_and_batches_are_its_own_and_operators(tmp_path):
    from tests.e2e.test_api_keys import new_key

    events = tmp_path / "events.jsonl"
    with Served(tmp_path, config(events)) as served:
        def api(*args: str) -> openai.OpenAI:
            return openai.OpenAI(base_url=served.base + "/v1", api_key=new_key(served, *args), max_retries=0)

        alice, bob, operator = api("alice"), api("bob"), api("boss", "--operator")
        batch = submit(alice, jsonl(2))
        done = finished(alice, batch.id)
        output = done.output_file_id
        assert {f.id for f in alice.files.list()} == {batch.input_file_id, output}
        assert list(bob.files.list()) == [] and list(bob.batches.list()) == []
        for attempt in (lambda: bob.files.retrieve(output), lambda: bob.files.content(output),
                        lambda: bob.files.delete(batch.input_file_id), lambda: bob.batches.retrieve(batch.id),
                        lambda: bob.batches.cancel(batch.id)):
            with pytest.raises(openai.NotFoundError):
                attempt()
        with pytest.raises(openai.BadRequestError):  # another key's file is no input of yours
            bob.batches.create(input_file_id=batch.input_file_id, endpoint="/v1/chat/completions",
                               completion_window="24h")
        assert {f.id for f in operator.files.list()} >= {batch.input_file_id, output}
        assert [b.id for b in operator.batches.list()] == [batch.id]
        assert len(lines_of(operator, output)) == 2
        assert operator.files.delete(batch.input_file_id).deleted


def test_a_keys_files_stay_within_max_batch_storage_bytes(tmp_path):
    from tests.e2e.test_api_keys import new_key

    one = jsonl(10)  # about 2 KB
    text = textwrap.dedent(config(tmp_path / "events.jsonl")) + f"maxBatchStorageBytes: {2 * len(one) + 100}\n"
    with Served(tmp_path, text) as served:
        full, other = (openai.OpenAI(base_url=served.base + "/v1", api_key=new_key(served, name), max_retries=0)
                       for name in ("fills-up", "another"))
        kept = [full.files.create(file=("in.jsonl", one), purpose="batch") for _ in range(2)]
        with pytest.raises(openai.APIStatusError, match="over the room the API key 'fills-up' has left") as refused:
            full.files.create(file=("in.jsonl", one), purpose="batch")
        assert refused.value.status_code == 413 and "maxBatchStorageBytes" in str(refused.value)
        assert other.files.create(file=("in.jsonl", one), purpose="batch").bytes == len(one)  # its own allowance
        full.files.delete(kept[0].id)
        assert full.files.create(file=("in.jsonl", one), purpose="batch").bytes == len(one)  # room again
        assert sorted(p.name for p in (served.data_dir / "files").iterdir()) == sorted(
            f.id for api in (full, other) for f in api.files.list())  # nothing kept of the refused upload


def test_text_a_database_cannot_keep_is_refused_or_escaped_never_jams_a_batch(tmp_path):
    """A lone surrogate or a NUL (which UTF-8 or PostgreSQL cannot keep) in a custom_id is refused at upload; in
    what a line's answer echoes (a model name), it is kept as an escape and the batch ends."""
    with Served(tmp_path, config(tmp_path / "events.jsonl")) as served:
        api = client(served)
        with pytest.raises(openai.BadRequestError, match="line 2: custom_id holds a NUL or a lone surrogate"):
            api.files.create(file=("in.jsonl", jsonl(1) + jsonl(1, prefix="\ud800")), purpose="batch")
        odd = json.dumps({"custom_id": "odd", "method": "POST", "url": "/v1/chat/completions",
                          "body": {"model": "\ud800\x00", "messages": []}}).encode() + b"\n"
        batch = submit(api, jsonl(2) + odd + jsonl(2, prefix="after"))
        done = finished(api, batch.id)
        assert (done.status, done.request_counts.completed, done.request_counts.failed) == ("completed", 4, 1)
        [error] = lines_of(api, done.error_file_id)
        assert error["custom_id"] == "odd" and error["response"]["status_code"] == 404
        assert "\ud800\x00" in error["response"]["body"]["error"]["message"]  # the escapes read back as sent


def test_a_batchs_input_file_cannot_be_deleted_until_it_ends_and_bad_names_and_priorities_are_refused(tmp_path):
    with Served(tmp_path, config(tmp_path / "events.jsonl")) as served:
        api = client(served)
        batch = submit(api, jsonl(20, delay=0.2))
        with pytest.raises(openai.ConflictError, match=f"is the input of batch '{batch.id}', which has not ended"):
            api.files.delete(batch.input_file_id)
        api.batches.cancel(batch.id)
        finished(api, batch.id)
        assert api.files.delete(batch.input_file_id).deleted
        with pytest.raises(openai.BadRequestError, match="the file's name must be at most 255 characters"):
            api.files.create(file=("n" * 256 + ".jsonl", jsonl(1)), purpose="batch")
        assert list(api.files.list()) == [] or all(f.purpose == "batch_output" for f in api.files.list())
        kept = {f.id for f in api.files.list()}
        assert {p.name for p in (served.data_dir / "files").iterdir()} == kept  # nothing of the refused upload
        uploaded = api.files.create(file=("in.jsonl", jsonl(1)), purpose="batch")
        for typo in ("garbage", "1e3", "9" * 30):
            refused = httpx.post(served.base + "/v1/batches", headers={"X-LlamaSwap-Priority": typo}, timeout=10,
                                 json={"input_file_id": uploaded.id, "endpoint": "/v1/chat/completions",
                                       "completion_window": "24h"})
            assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_priority", refused.text
        assert api.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h",
                                  extra_headers={"X-LlamaSwap-Priority": "normal"}).id
