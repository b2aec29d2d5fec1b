"""service.logwriter: request lines in batches of at most max_bytes, within max_seconds, all of them at exit."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from service.runtime.logwriter import PIPE_BUF, LineWriter

LINE = b"x" * 29 + b"\n"  # 30 bytes


@pytest.fixture
def pipe():
    read, write = os.pipe()
    os.set_blocking(read, False)
    yield read, write
    os.close(read)
    os.close(write)


def pending(read: int) -> bytes:
    """What has been written to the pipe so far."""
    try:
        return os.read(read, 1 << 20)
    except BlockingIOError:
        return b""


def test_lines_wait_until_the_next_would_overfill_the_batch(pipe):
    read, write = pipe
    writer = LineWriter(write, max_bytes=100, max_seconds=60)
    for _ in range(3):
        writer.write(LINE)
    assert pending(read) == b""
    writer.write(LINE)  # 120 bytes would not fit: the first three go out together
    assert pending(read) == LINE * 3
    writer.flush()
    assert pending(read) == LINE


def test_a_line_longer_than_a_batch_goes_alone_and_whole(pipe):
    read, write = pipe
    writer = LineWriter(write, max_bytes=100, max_seconds=60)
    writer.write(LINE)
    long = b"y" * 250 + b"\n"
    writer.write(long)
    assert pending(read) == LINE
    writer.write(LINE)
    assert pending(read) == long
    writer.flush()
    assert pending(read) == LINE


def test_without_a_buffer_every_line_is_written_at_once(pipe):
    read, write = pipe
    writer = LineWriter(write, max_bytes=0)
    writer.write(LINE)
    assert pending(read) == LINE


def test_no_interval_writes_every_line_at_once(pipe):
    read, write = pipe
    LineWriter(write, max_bytes=PIPE_BUF, max_seconds=0).write(LINE)
    assert pending(read) == LINE


@pytest.mark.parametrize("max_bytes", [0, PIPE_BUF])
def test_a_failed_write_loses_its_lines_says_so_and_the_writer_goes_on(caplog, max_bytes):
    read, write = os.pipe()
    os.close(read)  # nobody reads: every write fails with EPIPE
    writer = LineWriter(write, max_bytes=max_bytes, max_seconds=60)
    try:
        writer.write(LINE)
        writer.flush()
        writer.write(LINE)
        writer.flush()
    finally:
        os.close(write)
    lost = [record for record in caplog.records if "request log lines lost" in record.getMessage()]
    assert len(lost) == 2 and all(record.levelname == "ERROR" for record in lost)


def test_an_idle_writer_writes_its_lines_within_max_seconds(pipe):
    read, write = pipe
    writer = LineWriter(write, max_bytes=PIPE_BUF, max_seconds=0.2)
    writer.write(LINE)
    started, got = time.monotonic(), b""
    while not got and time.monotonic() - started < 5:
        time.sleep(0.05)
        got = pending(read)
    assert got == LINE and time.monotonic() - started < 2


def test_a_forked_child_starts_with_nothing_pending(pipe):
    read, write = pipe
    writer = LineWriter(write, max_bytes=PIPE_BUF, max_seconds=60)
    writer.write(b"parent\n")
    child = os.fork()
    if child == 0:  # the child: its own line only
        writer.write(b"child\n")
        writer.flush()
        os._exit(0)
    os.waitpid(child, 0)
    assert pending(read) == b"child\n"
    writer.flush()
    assert pending(read) == b"parent\n"


def test_every_pending_line_is_written_at_exit():
    code = ("from service.runtime.logwriter import LineWriter\n"
            "writer = LineWriter(1, max_bytes=4096, max_seconds=60)\n"
            "for i in range(50): writer.write(b'%d\\n' % i)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=30, check=True).stdout
    assert out.split() == [b"%d" % i for i in range(50)]




