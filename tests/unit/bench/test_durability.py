"""`bench durability --pg-url` of a PostgreSQL server that refuses: one line, at once."""

from __future__ import annotations

import time

from tests.unit.support.clirun import run_cli
from tests.webhook import closed_port


def test_a_refused_pg_url_is_one_line_at_once() -> None:
    # Before, the checkpointer's pool waited 30 s for a connection, retried, and ended in a
    # PoolClosed traceback: every other command's first read says it in one line.
    started = time.monotonic()
    done = run_cli("bench", "durability", "--runs", "1", "--pg-url",
                   f"postgresql://nobody:secret@127.0.0.1:{closed_port()}/x")
    assert time.monotonic() - started < 10
    assert done.code != 0 and "Traceback" not in done.stderr
    assert len(done.error_lines) == 1, done.stderr
    assert done.error_lines[0].startswith("error: cannot reach database postgresql://nobody:***@")
    assert "refused" in done.error_lines[0] and "secret" not in done.stderr
