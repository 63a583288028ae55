"""A TCP relay between one process and a server (PostgreSQL, Redis) that a test can cut, stall or slow.

Each process under test reaches a shared server through its own relay, so a fault can hit one
process's path alone (a partition) without restarting the servers every test shares. Faults:

- `cut()`: the server is down. Open connections are reset and new ones refused (the listening
  socket is closed), as when the server process dies; `restore()` listens again on the same port.
- `stall()`: the network is partitioned. Connections stay open and new ones are accepted, but no
  byte moves either way until `restore()`, which delivers what was held, as TCP does once a
  partition heals within its retransmission time.
- `delay(seconds)`: every chunk is held this long before it is passed on (latency), kept in order.
- `forget()`: the server loses every open connection without telling its clients (its machine rebooted, a
  firewall or NAT forgot them): a client learns it only when it next writes, from a reset. New connections
  are served as usual.

The relay runs its own event loop in a daemon thread, so a synchronous test drives it directly.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from dataclasses import dataclass, field

from tests.served import model_ports


@dataclass(eq=False)  # held in a set by identity
class _Pipe:
    """One relayed connection: the client's side and the server's."""

    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    tasks: list[asyncio.Task] = field(default_factory=list)
    forgotten: bool = False  # the server's side is gone; the client's is reset when it next writes

    def close(self) -> None:
        for writer in (self.client, self.server):
            transport = writer.transport
            sock = transport.get_extra_info("socket")
            if sock is not None:
                try:  # an RST, not a FIN: the peer sees its connection reset, as when a server dies
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                except OSError:
                    pass
            transport.abort()
        for task in self.tasks:
            task.cancel()


class Relay:
    """Listens on 127.0.0.1:`port` and relays each connection to `target`.

    The default port is a free one below the kernel's ephemeral range: while a cut has it closed, no
    outgoing connection of this machine can take it, so `restore()` can listen on it again."""

    def __init__(self, target_host: str, target_port: int, *, port: int | None = None, name: str = "relay") -> None:
        self.target = (target_host, target_port)
        self.name = name
        self.port = model_ports(1) if port is None else port
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"relay-{name}", daemon=True)
        self._server: asyncio.Server | None = None
        self._pipes: set[_Pipe] = set()
        self._flowing = asyncio.Event()  # cleared while stalled
        self._delay = 0.0
        self.connections = 0  # how many connections it accepted, for tests that check a client reconnected

    # -- the test's side (any thread) -------------------------------------------------------------
    def start(self) -> Relay:
        self._thread.start()
        self._call(self._listen)
        return self

    @property
    def url_host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cut(self) -> None:
        self._call(self._cut)

    def stall(self) -> None:
        self._call(self._stall)

    def delay(self, seconds: float) -> None:
        self._call(self._set_delay, seconds)

    def forget(self) -> None:
        self._call(self._forget)

    def restore(self) -> None:
        """Back to normal from any fault: listening, bytes flowing, no delay."""
        self._call(self._restore)

    def close(self) -> None:
        """Cut every connection and end every task before the loop stops and closes. A task left pending
        would be destroyed later by the garbage collector, wherever it happens to run: inside pytest's
        assertion rewriter that crashed CPython 3.11 after a run whose every test passed."""
        if self._thread.is_alive():
            self._call(self._shut)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
        if not self._loop.is_closed():
            self._loop.close()

    def __enter__(self) -> Relay:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, function, *args):
        async def run():
            return await function(*args)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    # -- the loop's side ----------------------------------------------------------------------------
    async def _listen(self) -> None:
        self._flowing.set()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _cut(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for pipe in list(self._pipes):
            pipe.close()
        self._pipes.clear()
        self._flowing.set()  # nothing left to hold

    async def _shut(self) -> None:
        await self._cut()
        # the cut pumps, and connections still being accepted (which would start pumps after the cut)
        tasks = asyncio.all_tasks() - {asyncio.current_task()}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _stall(self) -> None:
        self._flowing.clear()

    async def _forget(self) -> None:
        for pipe in self._pipes:
            pipe.forgotten = True
            pipe.server.transport.abort()

    async def _set_delay(self, seconds: float) -> None:
        self._delay = seconds

    async def _restore(self) -> None:
        self._delay = 0.0
        self._flowing.set()
        if self._server is None:
            await self._listen()

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self._flowing.wait()  # a stalled network completes no handshake with the server either
            server_reader, server_writer = await asyncio.open_connection(*self.target)
        except (OSError, asyncio.CancelledError):  # refused, or the relay closing: the client is reset
            client_writer.transport.abort()  # (a connection handler that ends cancelled is logged as an error)
            return
        pipe = _Pipe(client_writer, server_writer)
        self._pipes.add(pipe)
        pipe.tasks = [
            asyncio.create_task(self._pump(client_reader, server_writer, pipe)),
            asyncio.create_task(self._pump(server_reader, client_writer, pipe)),
        ]

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pipe: _Pipe) -> None:
        try:
            while chunk := await reader.read(65536):
                if pipe.forgotten:
                    break  # a write to a server that forgot the connection: reset
                if self._delay:
                    await asyncio.sleep(self._delay)
                await self._flowing.wait()
                writer.write(chunk)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            if pipe.forgotten and writer is pipe.client:
                return  # the server's side ended: its client is not told until it writes
            if pipe in self._pipes:
                self._pipes.discard(pipe)
                pipe.close()
