import sqlite3
from pathlib import Path

import pytest


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
