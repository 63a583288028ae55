import sqlite3
import struct
from pathlib import Path

import pytest
import websocket  # websocket-client: a client that shares no code with the passthrough


def db_rows(data_dir: Path, where: str = "1=1", params: tuple = ()) -> list[dict]:
    """Rows of the served instance's request table, read straight from its SQLite file."""
    path = data_dir / "llamaswap.sqlite3"
    if not path.exists():
        return []
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    con.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in con.execute(f"SELECT * FROM scheduling_queuedrequest WHERE {where} ORDER BY id", params)]
    except sqlite3.OperationalError:
        return []
    finally:
        con.close()


@pytest.fixture
def rows():
    return db_rows


def close_frame(ws: websocket.WebSocket) -> tuple[int, str]:
    """The code and reason of the close frame the server sends next (pings aside). Read as a raw frame,
    not answered: a server may drop the connection right after its close frame, and answering it then
    fails with a reset although the frame arrived."""
    frame = ws.recv_frame()
    while frame.opcode in (websocket.ABNF.OPCODE_PING, websocket.ABNF.OPCODE_PONG):
        frame = ws.recv_frame()
    assert frame.opcode == websocket.ABNF.OPCODE_CLOSE, (frame.opcode, frame.data[:100])
    return struct.unpack("!H", frame.data[:2])[0], frame.data[2:].decode()
