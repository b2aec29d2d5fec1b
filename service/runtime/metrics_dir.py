"""prometheus-client's multiprocess directory, as gunicorn's master keeps it: chosen, made and emptied when the
config loads (before anything imports prometheus_client), kept apart from the other master of an upgrade in place
(USR2), tidied when workers exit. The scrape side is service.runtime.metrics.

Each worker writes its own files there; stale files of dead pids would be summed, so a directory is emptied of
``*.db`` at the first config load in a master (a SIGHUP reload must not wipe live workers' files). A directory the
operator names (PROMETHEUS_MULTIPROC_DIR) is never removed, and the two masters of a USR2 upgrade share it: the
new master (GUNICORN_PID set) keeps its files, and a master leaves them at exit while the other still runs.
Exited workers' counter and histogram files are folded into ``<kind>_exited.db``: a scrape reads every file.

Only the standard library here, and prometheus-client inside the hooks: with GUNICORN_PRELOAD=0 the master must
not import the app (a SIGHUP would no longer reload it).
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import re
import shutil
import struct
import tempfile
import time

MARK = "ATTENTION_METRICS_MASTER"  # "<master pid>:<directory>" once this master has emptied it
PER_PROCESS = re.compile(r"(counter|histogram)_(\d+)\.db")
FOLD_WAIT_SECONDS = 0.5  # the master's loop also times out stuck workers: never wait long for the lock


class MetricsDirectory:
    """The directory of one gunicorn master, and its hooks (``pre_exec``, ``child_exit``, ``on_exit``)."""

    def __init__(self, path: str, own: str) -> None:
        self.path, self.own = path, own

    @classmethod
    def at_config_load(cls, named: str | os.PathLike | None) -> MetricsDirectory:
        """Choose (``named``: PROMETHEUS_MULTIPROC_DIR as the operator set it, else a fresh one under $TMPDIR),
        make, and empty it if this is the first load in this master and the directory is its own or no older
        master shares it. prometheus-client reads where it is from the environment: set there."""
        own = os.path.join(tempfile.gettempdir(), f"attention-metrics-{os.getpid()}")
        path = os.environ["PROMETHEUS_MULTIPROC_DIR"] = os.fspath(named) if named else own
        os.makedirs(path, exist_ok=True)
        if os.environ.get(MARK) != f"{os.getpid()}:{path}":
            os.environ[MARK] = f"{os.getpid()}:{path}"
            if path == own or "GUNICORN_PID" not in os.environ:
                remove_metrics_files(path)
        return cls(path, own)

    def pre_exec(self, server) -> None:
        """In the new master of a USR2 upgrade, before it execs: it makes its own mark, and its own directory
        unless the operator named one (after a SIGHUP the environment it gets holds this master's)."""
        server.cfg.env_orig.pop(MARK, None)
        if server.cfg.env_orig.get("PROMETHEUS_MULTIPROC_DIR") == self.own:
            del server.cfg.env_orig["PROMETHEUS_MULTIPROC_DIR"]

    def child_exit(self, server, worker) -> None:
        """After a worker exited (recycled, killed, timed out): its in-flight gauge stops counting, files fold."""
        from prometheus_client import multiprocess

        try:
            multiprocess.mark_process_dead(worker.pid, self.path)
            self.fold_exited_workers()
        except Exception:  # e.g. a full disk: the files stay, still counted, and the master goes on
            server.log.exception("could not tidy exited workers' metrics files")

    def on_exit(self, server) -> None:
        if self.path == self.own:
            shutil.rmtree(self.path, ignore_errors=True)  # nobody else's
        elif not partner_alive(server):  # else the other master's workers still write there
            remove_metrics_files(self.path)

    def fold_exited_workers(self) -> None:
        """Fold the files of every process that no longer exists (this exited worker's, and any a busy lock left)
        under an exclusive flock on the directory, which scrapes share: each value is seen once."""
        fd = os.open(self.path, os.O_RDONLY)
        try:
            if not lock_within(fd, FOLD_WAIT_SECONDS):
                return  # scrapes are reading: the next worker exit folds these too
            exited: dict[str, list[str]] = {}
            for name in os.listdir(self.path):
                if (match := PER_PROCESS.fullmatch(name)) and not pid_exists(int(match[2])):
                    exited.setdefault(match[1], []).append(os.path.join(self.path, name))
            for kind, paths in exited.items():
                fold(os.path.join(self.path, f"{kind}_exited.db"), paths)
        finally:
            os.close(fd)  # and with it the lock


def remove_metrics_files(directory: str) -> None:
    for stale in glob.glob(os.path.join(directory, "*.db")):
        os.remove(stale)


def partner_alive(server) -> bool:
    """Whether the other master of an upgrade in place still runs. gunicorn's own marks lag: master_pid stays set
    until the loop notices the old master left, reexec_pid until the new one is reaped. (Both masters stopped at
    once each see the other alive: the files stay until the next start empties them.)"""
    if server.master_pid and server.master_pid == os.getppid():  # the old master, our parent, is still there
        return True
    if server.reexec_pid:  # the new master, our child: running unless waitpid reaps it now
        try:
            return os.waitpid(server.reexec_pid, os.WNOHANG) == (0, 0)
        except ChildProcessError:
            return False
    return False


def lock_within(fd: int, seconds: float) -> bool:
    """An exclusive flock on ``fd`` if one is had within ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)


def pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # someone else's, or no pid at all (a stray file): not ours to fold
        pass
    return True


def fold(total_path: str, paths: list[str]) -> None:
    """Add the values in ``paths`` into the file at ``total_path``, key by key, then remove them. All or nothing:
    the new total is written with plain writes (a full disk raises; prometheus-client's mmap writes would kill
    the master with SIGBUS) and swapped in whole before any file goes."""
    from prometheus_client.mmap_dict import MmapedDict

    totals: dict[str, list[float]] = {}
    for path in (total_path, *paths):
        if os.path.exists(path) and os.path.getsize(path):  # an empty one (killed while creating it) holds nothing
            for key, value, timestamp, _ in MmapedDict.read_all_values_from_file(path):
                total = totals.setdefault(key, [0.0, 0.0])
                total[0] += value
                total[1] = max(total[1], timestamp)
    partial = os.path.join(os.path.dirname(total_path), ".exited.partial")  # not *.db: no scrape lists it
    try:
        with open(partial, "wb") as out:
            out.write(metrics_file(totals))
        os.replace(partial, total_path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(partial)
    for path in paths:
        os.remove(path)


def metrics_file(values: dict[str, list[float]]) -> bytes:
    """prometheus-client's file layout (see MmapedDict): the bytes used (int32) and 4 padding bytes, then per key
    its length (int32), the UTF-8 key padded with spaces to 8-byte alignment, the value and timestamp (doubles)."""
    entries = []
    for key, (value, timestamp) in values.items():
        encoded = key.encode()
        padded = encoded + b" " * (8 - (len(encoded) + 4) % 8)
        entries.append(struct.pack(f"i{len(padded)}sdd", len(encoded), padded, value, timestamp))
    body = b"".join(entries)
    return struct.pack("ii", 8 + len(body), 0) + body
