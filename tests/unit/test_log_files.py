"""A log a supervisor appends to is cut at its cap while the writer goes on (a node whose
aggregator was down wrote 3-4.7 MB a minute into a node.log that was never cut)."""

from __future__ import annotations

import os
from pathlib import Path

from core.logs import rotate_log


def test_a_log_over_its_cap_is_cut_and_the_writer_goes_on_at_its_start(tmp_path: Path) -> None:
    path = tmp_path / "node.log"
    # the child's end of it, as QProcess opens it: O_APPEND
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, b"old line\n" * 1000)
        assert not rotate_log(path, max_bytes=100_000)  # under the cap: untouched
        assert rotate_log(path, max_bytes=1000)
        assert (tmp_path / "node.log.1").read_bytes() == b"old line\n" * 1000
        assert path.stat().st_size == 0
        os.write(fd, b"new line\n")
        assert path.read_bytes() == b"new line\n"  # no hole of zeros before it
        os.write(fd, b"x" * 2000)
        assert rotate_log(path, max_bytes=1000)  # the older copy is replaced
        assert (tmp_path / "node.log.1").read_bytes().startswith(b"new line\n")
    finally:
        os.close(fd)
    assert not rotate_log(tmp_path / "missing.log")
