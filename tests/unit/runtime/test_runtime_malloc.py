"""service.runtime.malloc: the glibc settings each worker applies, and the trim after a large answer."""

from __future__ import annotations

import ctypes
import subprocess
import sys
from types import SimpleNamespace

import pytest

from service.runtime.malloc import TRIM_AFTER_BYTES, MallocTuning

MIB = 1024 * 1024


class FakeLibc:
    """Records mallopt and malloc_trim calls instead of changing this process's heap."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        fake = self

        class Trim:
            argtypes = None

            def __call__(self, pad: int) -> int:
                fake.calls.append(("malloc_trim", pad))
                return 1

        self.malloc_trim = Trim()

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append(("mallopt", param, value))
        return 1


@pytest.fixture
def libc(monkeypatch) -> FakeLibc:
    fake = FakeLibc()
    monkeypatch.setattr(ctypes, "CDLL", lambda name: fake if name == "libc.so.6" else None)
    return fake


def answer(sent: int) -> SimpleNamespace:
    return SimpleNamespace(sent=sent)


def test_post_fork_keeps_freed_blocks_up_to_keep_mb(libc):
    tuning = MallocTuning(64)
    tuning.post_fork(None, None)
    # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD (twice the kept size), M_TOP_PAD
    assert libc.calls == [("mallopt", -3, 64 * MIB), ("mallopt", -1, 128 * MIB), ("mallopt", -2, 64 * MIB)]
    assert libc.malloc_trim.argtypes == [ctypes.c_size_t]


def test_post_request_trims_only_after_a_large_answer(libc):
    tuning = MallocTuning(8)
    tuning.post_fork(None, None)
    del libc.calls[:]
    tuning.post_request(None, None, {}, answer(TRIM_AFTER_BYTES - 1))
    assert libc.calls == []
    tuning.post_request(None, None, {}, answer(TRIM_AFTER_BYTES))
    assert libc.calls == [("malloc_trim", 8 * MIB)]  # the kept top stays mapped


@pytest.mark.parametrize("keep_mb", [0, -1])
def test_keep_zero_or_less_leaves_glibc_alone(monkeypatch, keep_mb):
    def no_libc(name):
        raise AssertionError("libc loaded with the tuning off")

    monkeypatch.setattr(ctypes, "CDLL", no_libc)
    tuning = MallocTuning(keep_mb)
    tuning.post_fork(None, None)
    tuning.post_request(None, None, {}, answer(10 * TRIM_AFTER_BYTES))
    assert tuning.applied is None


def test_off_glibc_the_hooks_do_nothing(monkeypatch):
    def missing(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", missing)
    tuning = MallocTuning(64)
    tuning.post_fork(None, None)
    tuning.post_request(None, None, {}, answer(TRIM_AFTER_BYTES))
    assert tuning.applied is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc")
def test_the_real_glibc_takes_the_settings_and_the_trim():
    code = ("from types import SimpleNamespace\n"
            "from service.runtime.malloc import TRIM_AFTER_BYTES, MallocTuning\n"
            "tuning = MallocTuning(64)\n"
            "tuning.post_fork(None, None)\n"
            "tuning.post_request(None, None, {}, SimpleNamespace(sent=TRIM_AFTER_BYTES))\n"
            "print(tuning.applied is not None)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "True"
