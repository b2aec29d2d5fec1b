"""service.runtime.metrics_dir: the multiprocess directory's lifecycle in gunicorn's master, and the fold."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client.mmap_dict import MmapedDict

from service.runtime import metrics
from service.runtime.metrics_dir import (
    MARK,
    MetricsDirectory,
    fold,
    lock_within,
    metrics_file,
    partner_alive,
    pid_exists,
)

KEY_A, KEY_B = '["a", "a_total", {}, "help"]', '["b", "b_sum", {"l": "é"}, "help"]'


@pytest.fixture
def env(monkeypatch, tmp_path):
    """A master's environment with none of the variables set; $TMPDIR is tmp_path/tmp."""
    for name in ("PROMETHEUS_MULTIPROC_DIR", MARK, "GUNICORN_PID"):
        monkeypatch.setenv(name, "")  # recorded: what the code sets is undone after the test
        monkeypatch.delenv(name)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    return monkeypatch


def exited_pid() -> int:
    with subprocess.Popen(["true"]) as process:
        process.wait()
    return process.pid


def values(path: Path) -> dict[str, tuple[float, float]]:
    return {key: (value, stamp) for key, value, stamp, _ in MmapedDict.read_all_values_from_file(str(path))}


# --- the file layout ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("length", range(10))  # every padding to 8-byte alignment
def test_metrics_file_reads_back_through_prometheus_client(tmp_path, length):
    written = {"k" * length: [1.5, 2.0], KEY_B: [-3.0, 4.0], "漢字": [1e300, 0.0]}
    (tmp_path / "x.db").write_bytes(metrics_file(written))
    assert values(tmp_path / "x.db") == {key: tuple(pair) for key, pair in written.items()}


def test_metrics_file_is_the_prefix_of_the_file_prometheus_client_writes(tmp_path):
    written = {KEY_A: [2.0, 1.0], KEY_B: [0.25, 3.0]}
    theirs = MmapedDict(str(tmp_path / "theirs.db"))
    for key, (value, stamp) in written.items():
        theirs.write_value(key, value, stamp)
    theirs.close()
    ours, raw = metrics_file(written), (tmp_path / "theirs.db").read_bytes()
    assert raw[:len(ours)] == ours and not raw[len(ours):].strip(b"\0")


# --- the fold -------------------------------------------------------------------------------------------------

def test_fold_adds_key_by_key_into_the_total_and_removes_the_files(tmp_path):
    total = tmp_path / "counter_exited.db"
    total.write_bytes(metrics_file({KEY_A: [1.0, 5.0]}))
    (tmp_path / "counter_1.db").write_bytes(metrics_file({KEY_A: [2.0, 7.0], KEY_B: [0.5, 1.0]}))
    (tmp_path / "counter_2.db").write_bytes(metrics_file({KEY_A: [4.0, 6.0]}))
    (tmp_path / "counter_3.db").write_bytes(b"")  # created, never sized: holds nothing
    fold(str(total), [str(tmp_path / f"counter_{pid}.db") for pid in (1, 2, 3)])
    assert values(total) == {KEY_A: (7.0, 7.0), KEY_B: (0.5, 1.0)}  # sums, the latest timestamp
    assert sorted(path.name for path in tmp_path.iterdir()) == ["counter_exited.db"]


def test_fold_makes_the_total_when_there_is_none(tmp_path):
    (tmp_path / "histogram_9.db").write_bytes(metrics_file({KEY_B: [3.0, 0.0]}))
    fold(str(tmp_path / "histogram_exited.db"), [str(tmp_path / "histogram_9.db")])
    assert values(tmp_path / "histogram_exited.db") == {KEY_B: (3.0, 0.0)}


def test_a_fold_that_cannot_write_changes_nothing(tmp_path):
    total, worker = tmp_path / "counter_exited.db", tmp_path / "counter_1.db"
    total.write_bytes(before := metrics_file({KEY_A: [1.0, 0.0]}))
    worker.write_bytes(metrics_file({KEY_A: [2.0, 0.0]}))
    (tmp_path / ".exited.partial").mkdir()  # the new total cannot be written, as on a full disk
    with pytest.raises(IsADirectoryError):
        fold(str(total), [str(worker)])
    assert total.read_bytes() == before and worker.exists()  # still counted, once


def test_fold_exited_workers_takes_dead_pids_files_only(tmp_path):
    directory = MetricsDirectory(str(tmp_path), own="")
    dead, live = exited_pid(), os.getpid()
    for name in (f"counter_{dead}.db", f"counter_{live}.db", f"histogram_{dead}.db"):
        (tmp_path / name).write_bytes(metrics_file({KEY_A: [1.0, 0.0]}))
    (tmp_path / f"gauge_livesum_{dead}.db").write_bytes(b"")  # not a counter or histogram: mark_process_dead's
    (tmp_path / "counter_99999999999999999999.db").write_bytes(b"")  # past any pid: someone else's
    directory.fold_exited_workers()
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        ["counter_exited.db", "histogram_exited.db", f"counter_{live}.db", f"gauge_livesum_{dead}.db",
         "counter_99999999999999999999.db"])


def test_the_fold_waits_for_no_scrape_and_the_next_fold_takes_the_rest(tmp_path):
    directory = MetricsDirectory(str(tmp_path), own="")
    worker = tmp_path / f"counter_{exited_pid()}.db"
    worker.write_bytes(metrics_file({KEY_A: [2.0, 0.0]}))
    started = time.monotonic()
    with metrics._scrape_lock(str(tmp_path)):  # the lock every scrape shares
        directory.fold_exited_workers()
    assert time.monotonic() - started < 2 and worker.exists()
    directory.fold_exited_workers()
    assert not worker.exists() and values(tmp_path / "counter_exited.db") == {KEY_A: (2.0, 0.0)}


def test_lock_within_gives_up_after_its_time_and_takes_a_free_lock(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        with metrics._scrape_lock(str(tmp_path)):
            started = time.monotonic()
            assert lock_within(fd, 0.05) is False
            assert time.monotonic() - started >= 0.05
        assert lock_within(fd, 0.05) is True
    finally:
        os.close(fd)


def test_pid_exists():
    assert pid_exists(os.getpid())
    assert not pid_exists(exited_pid())
    assert pid_exists(99999999999999999999)  # no pid at all: not ours to fold


# --- the lifecycle --------------------------------------------------------------------------------------------

def operators() -> str | None:
    """The directory the operator named, as service.settings reads it at a master's start."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR")


def stale_files(directory: Path) -> None:
    directory.mkdir(exist_ok=True)
    (directory / "counter_12345.db").write_bytes(b"a dead pid's")
    (directory / "keep.txt").write_text("the operator's")


def test_the_first_load_makes_and_empties_an_own_directory(env, tmp_path):
    own = tmp_path / "tmp" / f"attention-metrics-{os.getpid()}"
    stale_files(own)
    directory = MetricsDirectory.at_config_load(operators())
    assert directory.path == directory.own == str(own) == os.environ["PROMETHEUS_MULTIPROC_DIR"]
    assert os.environ[MARK] == f"{os.getpid()}:{own}"
    assert sorted(path.name for path in own.iterdir()) == ["keep.txt"]


def test_a_named_directory_is_made_and_emptied_of_db_files_only(env, tmp_path):
    env.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "named" / "deeper"))
    stale_files(tmp_path / "named")
    stale_files(tmp_path / "named" / "deeper")
    directory = MetricsDirectory.at_config_load(operators())
    assert directory.path == str(tmp_path / "named" / "deeper") != directory.own
    assert sorted(path.name for path in (tmp_path / "named" / "deeper").iterdir()) == ["keep.txt"]
    assert (tmp_path / "named" / "counter_12345.db").exists()


def test_a_reload_in_the_same_master_keeps_the_live_workers_files(env, tmp_path):
    env.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "named"))
    MetricsDirectory.at_config_load(operators())
    stale_files(tmp_path / "named")  # the live workers' now
    MetricsDirectory.at_config_load(operators())  # SIGHUP
    assert (tmp_path / "named" / "counter_12345.db").exists()


def test_the_new_master_of_an_upgrade_keeps_a_named_directory_but_empties_its_own(env, tmp_path):
    env.setenv("GUNICORN_PID", "1")
    env.setenv(MARK, f"1:{tmp_path / 'named'}")  # the old master's
    env.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "named"))
    stale_files(tmp_path / "named")
    MetricsDirectory.at_config_load(operators())
    assert (tmp_path / "named" / "counter_12345.db").exists()  # the old master's workers still write there
    env.delenv("PROMETHEUS_MULTIPROC_DIR")
    env.delenv(MARK)
    stale_files(own := tmp_path / "tmp" / f"attention-metrics-{os.getpid()}")
    MetricsDirectory.at_config_load(operators())
    assert not (own / "counter_12345.db").exists()


def test_pre_exec_gives_the_new_master_its_own_mark_and_its_own_directory():
    directory = MetricsDirectory("/tmp/attention-metrics-1", own="/tmp/attention-metrics-1")
    server = SimpleNamespace(cfg=SimpleNamespace(env_orig={MARK: "1:x", "PROMETHEUS_MULTIPROC_DIR": directory.own,
                                                           "OTHER": "kept"}))
    directory.pre_exec(server)
    assert server.cfg.env_orig == {"OTHER": "kept"}
    named = {MARK: "1:/srv/metrics", "PROMETHEUS_MULTIPROC_DIR": "/srv/metrics"}
    server.cfg.env_orig = dict(named)
    MetricsDirectory("/srv/metrics", own="/tmp/attention-metrics-1").pre_exec(server)
    assert server.cfg.env_orig == {"PROMETHEUS_MULTIPROC_DIR": "/srv/metrics"}


def no_partner() -> SimpleNamespace:
    return SimpleNamespace(master_pid=0, reexec_pid=0)


def test_on_exit_removes_an_own_directory_whole(tmp_path):
    stale_files(own := tmp_path / "own")
    MetricsDirectory(str(own), own=str(own)).on_exit(no_partner())
    assert not own.exists()


def test_on_exit_empties_a_named_directory_unless_the_other_master_runs(tmp_path):
    stale_files(named := tmp_path / "named")
    directory = MetricsDirectory(str(named), own=str(tmp_path / "own"))
    directory.on_exit(SimpleNamespace(master_pid=os.getppid(), reexec_pid=0))  # the old master, our parent
    assert (named / "counter_12345.db").exists()
    directory.on_exit(no_partner())
    assert sorted(path.name for path in named.iterdir()) == ["keep.txt"]


def test_partner_alive_follows_the_processes_not_gunicorn_s_marks():
    assert partner_alive(SimpleNamespace(master_pid=os.getppid(), reexec_pid=0))
    assert not partner_alive(SimpleNamespace(master_pid=os.getppid() + 1, reexec_pid=0))  # the old one left
    with subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE) as child:
        assert partner_alive(SimpleNamespace(master_pid=0, reexec_pid=child.pid))  # the new master runs
        child.stdin.close()
        deadline = time.monotonic() + 10
        while partner_alive(SimpleNamespace(master_pid=0, reexec_pid=child.pid)):  # reaped once it exits
            assert time.monotonic() < deadline, "an exited new master still counted as running"
            time.sleep(0.01)
        assert not partner_alive(SimpleNamespace(master_pid=0, reexec_pid=child.pid))  # not our child any more
    assert not partner_alive(no_partner())


def test_child_exit_marks_the_worker_dead_and_folds_its_files(tmp_path):
    worker = SimpleNamespace(pid=exited_pid())
    (tmp_path / f"gauge_livesum_{worker.pid}.db").write_bytes(metrics_file({KEY_A: [1.0, 0.0]}))
    (tmp_path / f"counter_{worker.pid}.db").write_bytes(metrics_file({KEY_A: [3.0, 0.0]}))
    MetricsDirectory(str(tmp_path), own="").child_exit(SimpleNamespace(log=logging.getLogger("test")), worker)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["counter_exited.db"]
    assert values(tmp_path / "counter_exited.db") == {KEY_A: (3.0, 0.0)}


def test_child_exit_logs_a_failed_fold_and_the_master_goes_on(tmp_path, caplog):
    worker = SimpleNamespace(pid=exited_pid())
    (tmp_path / f"counter_{worker.pid}.db").write_bytes(metrics_file({KEY_A: [3.0, 0.0]}))
    (tmp_path / ".exited.partial").mkdir()
    MetricsDirectory(str(tmp_path), own="").child_exit(SimpleNamespace(log=logging.getLogger("test")), worker)
    assert "could not tidy" in caplog.text and (tmp_path / f"counter_{worker.pid}.db").exists()
