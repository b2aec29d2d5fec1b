"""service/gunicorn.conf.py read without starting gunicorn: its settings from the environment, the malloc hooks,
the master's fold of exited workers' metrics files (real servers: tests/live/test_gunicorn.py)."""

from __future__ import annotations

import logging
import os
import subprocess
import threading
from types import SimpleNamespace

import pytest
from prometheus_client.mmap_dict import MmapedDict

from service.runtime import cpus, metrics
from service.runtime.malloc import TRIM_AFTER_BYTES
from service.runtime.metrics_dir import metrics_file
from service.settings import current
from tests.conftest import ROOT


def load_conf(monkeypatch, **env: str) -> dict:
    import runpy

    settings = ("HOST", "GUNICORN_TIMEOUT", "GUNICORN_GRACEFUL_TIMEOUT", "GUNICORN_MAX_REQUESTS",
                "GUNICORN_MAX_REQUESTS_JITTER", "GUNICORN_PRELOAD", "GUNICORN_MALLOC_KEEP_MB")
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "WEB_CONCURRENCY", "PORT",
                 "PROMETHEUS_MULTIPROC_DIR", *settings):
        monkeypatch.setenv(name, "")  # recorded, so what the conf sets is undone after the test
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    current.cache_clear()  # a config load in a fresh master reads the environment (the environ fixture: again after)
    return runpy.run_path(str(ROOT / "service" / "gunicorn.conf.py"))


def test_gunicorn_defaults(environ):
    conf = load_conf(environ)
    assert conf["worker_class"] == "sync" and conf["bind"] == "127.0.0.1:8000"
    assert conf["workers"] == cpus.default_workers()  # the cgroup's CPU quota, else one per core
    assert os.environ["OPENBLAS_NUM_THREADS"] == os.environ["OMP_NUM_THREADS"] == "1"
    # docs/configuration.md's figures: timeout 30 s, graceful 20 s, recycling after 10000 requests, jitter 1000
    assert (conf["timeout"], conf["graceful_timeout"], conf["max_requests"], conf["max_requests_jitter"]) == (
        30, 20, 10000, 1000)
    assert conf["preload_app"] is True                # a recycled worker forks from the loaded app
    assert conf["control_socket_disable"] is True     # no admin socket shared by every instance of the user
    assert load_conf(environ, GUNICORN_PRELOAD="0")["preload_app"] is False


def test_gunicorn_settings_follow_the_environment(environ):
    conf = load_conf(environ, PORT="9123", WEB_CONCURRENCY="3", GUNICORN_TIMEOUT="60",
                     GUNICORN_GRACEFUL_TIMEOUT="7", GUNICORN_MAX_REQUESTS="500", GUNICORN_MAX_REQUESTS_JITTER="9",
                     OPENBLAS_NUM_THREADS="2", HOST="0.0.0.0")
    assert conf["bind"] == "0.0.0.0:9123" and conf["workers"] == 3 and conf["timeout"] == 60
    assert conf["graceful_timeout"] == 7 and conf["max_requests"] == 500 and conf["max_requests_jitter"] == 9
    assert os.environ["OPENBLAS_NUM_THREADS"] == "2"


def test_the_worker_count_comes_from_the_cpu_quota_unless_web_concurrency_is_set(environ):
    environ.setattr(cpus, "default_workers", lambda: 5)  # as a 4.5-CPU quota on a larger node
    assert load_conf(environ)["workers"] == 5
    assert load_conf(environ, WEB_CONCURRENCY="7")["workers"] == 7


def test_workers_keep_freed_buffers_unless_told_not_to(environ):
    conf = load_conf(environ)
    assert conf["_hooks"].malloc.keep_mb == 64
    conf["post_fork"](None, None)  # mallopt in this process: must not raise (skipped off glibc)

    class Answer:
        sent = TRIM_AFTER_BYTES

    conf["post_request"](None, None, {}, Answer())  # malloc_trim in this process, after a large answer
    assert load_conf(environ, GUNICORN_MALLOC_KEEP_MB="0")["_hooks"].malloc.keep_mb == 0


def _exited_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    with subprocess.Popen(["true"]) as process:
        process.wait()
    return process.pid


def test_a_fold_never_waits_long_for_scrapes_and_takes_what_it_left_at_the_next_exit(environ, tmp_path):
    """The master's loop is what times out stuck workers: a scrape holding the lock (a worker stopped mid-scrape)
    must not stop it. What a fold leaves stays counted, and the next fold takes it."""
    conf = load_conf(environ, PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    exited = tmp_path / f"counter_{_exited_pid()}.db"
    exited.write_bytes(metrics_file({'["x", "x_total", {}, "help"]': [2.0, 0.0]}))
    with metrics._scrape_lock(str(tmp_path)):  # a scrape reading
        # a thread: a regression fails, it does not hang the suite
        fold = threading.Thread(target=conf["_hooks"].metrics.fold_exited_workers, daemon=True)
        fold.start()
        fold.join(5)
        assert not fold.is_alive() and exited.exists()
    conf["_hooks"].metrics.fold_exited_workers()
    assert not exited.exists()
    [(key, value, _, _)] = MmapedDict.read_all_values_from_file(str(tmp_path / "counter_exited.db"))
    assert (key, value) == ('["x", "x_total", {}, "help"]', 2.0)


def test_a_stray_file_named_past_any_pid_does_not_stop_the_folds(environ, tmp_path):
    conf = load_conf(environ, PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    (tmp_path / "counter_99999999999999999999.db").write_bytes(b"")  # os.kill raised OverflowError on it
    exited = tmp_path / f"counter_{_exited_pid()}.db"
    exited.write_bytes(metrics_file({'["x", "x_total", {}, "help"]': [1.0, 0.0]}))
    conf["_hooks"].metrics.fold_exited_workers()
    assert not exited.exists() and (tmp_path / "counter_exited.db").exists()


def test_a_fold_that_cannot_write_changes_nothing_and_the_master_goes_on(environ, tmp_path, caplog):
    conf = load_conf(environ, PROMETHEUS_MULTIPROC_DIR=str(tmp_path))
    worker = SimpleNamespace(pid=_exited_pid())
    exited = tmp_path / f"histogram_{worker.pid}.db"
    exited.write_bytes(metrics_file({'["h", "h_sum", {}, "help"]': [3.0, 0.0]}))
    (tmp_path / ".exited.partial").mkdir()  # writing the new total fails, as on a full disk
    conf["child_exit"](SimpleNamespace(log=logging.getLogger("gunicorn.error")), worker)
    assert "could not tidy" in caplog.text
    assert exited.exists() and not (tmp_path / "histogram_exited.db").exists()  # still counted, once


def test_a_bad_setting_stops_the_config_load_in_one_line(environ, capsys):
    with pytest.raises(SystemExit) as stopped:
        load_conf(environ, GUNICORN_TIMEOUT="soon")
    assert stopped.value.code == 2
    assert capsys.readouterr().err == "attention-service: GUNICORN_TIMEOUT must be a positive integer, got 'soon'\n"


def test_at_exit_the_metrics_directory_goes(environ):
    conf = load_conf(environ)
    assert "when_ready" not in conf  # the batch jobs' workers run beside gunicorn, not under it (attention-serve)
    server = SimpleNamespace(log=logging.getLogger("gunicorn.error"), master_pid=0, reexec_pid=0)
    conf["on_exit"](server)  # the metrics hook removes this master's own directory
    assert not os.path.exists(conf["_hooks"].metrics.path)
