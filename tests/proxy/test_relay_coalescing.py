"""The relay forwards a slow stream chunk by chunk and batches a fast one."""

import asyncio

import pytest

from proxy.upstream.relay import _coalesced


async def source(chunks, gate: asyncio.Event | None = None, fail: Exception | None = None):
    for chunk in chunks:
        if gate is not None:
            await gate.wait()
            gate.clear()
        yield chunk
    if fail is not None:
        raise fail


async def test_each_chunk_is_forwarded_as_soon_as_it_arrives_when_the_writer_keeps_up():
    gate = asyncio.Event()
    batches = _coalesced(source([b"a", b"b", b"c"], gate))
    seen = []
    for _ in range(3):
        gate.set()
        seen.append(await anext(batches))
    assert seen == [[b"a"], [b"b"], [b"c"]]
    await batches.aclose()


async def test_chunks_that_arrive_while_the_writer_is_busy_come_as_one_batch():
    batches = [batch async for batch in _coalesced(source([b"%d" % i for i in range(100)]))]
    assert [chunk for batch in batches for chunk in batch] == [b"%d" % i for i in range(100)]
    assert len(batches) < 10  # a reader that never waits is forwarded in a few writes, not 100


async def test_an_upstream_error_reaches_the_writer_after_the_data_before_it():
    batches = _coalesced(source([b"a"], fail=ConnectionError("gone")))
    got = []
    with pytest.raises(ConnectionError):
        async for batch in batches:
            got += batch
    assert got == [b"a"]
