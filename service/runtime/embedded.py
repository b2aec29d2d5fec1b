"""Job workers beside gunicorn's web workers: ATTENTION_EMBEDDED_WORKERS [1; 0: none] processes of
``python -m service.jobs.worker`` (Huey consumers) that gunicorn's master starts when it is ready, restarts when
one dies and stops when it exits. They are not gunicorn workers: WEB_CONCURRENCY counts only those. A dead worker
is seen within POLL_SECONDS and started again at most once a second; while each dies at once the wait doubles, up
to MAX_GAP_SECONDS.

Each runs in a session and process group of its own: one signal reaches whatever it forked, and a Ctrl-C on the
terminal reaches the master only, which then stops them. The environment is passed on unchanged.

Hooks (service/gunicorn.conf.py): ``when_ready`` starts them and wraps two methods of that arbiter: its reaping of
children (gunicorn's ``waitpid(-1)`` would reap these too and keep their exit statuses to itself) and its shutdown,
which now signals them when it signals the web workers, so that both finish their work within one
GUNICORN_GRACEFUL_TIMEOUT. ``on_exit`` waits out what is left of it, then sends SIGKILL to each group.

A SIGHUP reload reads the config again in the same master: the running supervisor is kept (``at_config_load``).
An upgrade in place (USR2) execs a new master, which starts its own; the old master's ``on_exit`` stops the old
ones. Only the process that started them stops them: never a child forked from the master (a web worker, or the
USR2 child if its exec fails and it falls back into the arbiter's loop). A master killed by SIGKILL runs no hook:
its workers live on until its container or service manager ends them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gunicorn.arbiter import Arbiter

COMMAND = (sys.executable, "-m", "service.jobs.worker")
POLL_SECONDS = 0.5  # how soon a dead worker is noticed
FIRST_GAP_SECONDS = 1.0  # the least time between two starts of one worker
MAX_GAP_SECONDS = 10.0  # one that keeps dying at once (its queue unreachable, say) is started at most this seldom
STEADY_SECONDS = 10.0  # one that ran this long had started well: whatever ended it, the gap is the first again
KILLED_WAIT_SECONDS = 5.0  # a SIGKILLed process is gone at once, unless stuck in the kernel: never wait for ever

_running: EmbeddedWorkers | None = None  # the supervisor started in this process, which a SIGHUP's reload keeps


def describe(returncode: int) -> str:
    """A child's end as Popen reports it: a negative code is the signal that killed it."""
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-returncode).name}"
        return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


@dataclass
class Slot:
    """One worker's place: its process (None while it waits to be started again), and when to start the next."""

    number: int
    process: subprocess.Popen | None = None
    started: float = 0.0
    due: float = 0.0
    gap: float = FIRST_GAP_SECONDS  # between this start and the next, should this one die at once


class EmbeddedWorkers:
    """``count`` worker processes running ``command``, restarted when one dies, stopped by :meth:`stop`."""

    def __init__(self, count: int, graceful_timeout: float, command: Sequence[str] = COMMAND,
                 log: logging.Logger | None = None) -> None:
        self.count, self.graceful_timeout, self.command = count, graceful_timeout, list(command)
        self.log = log or logging.getLogger(__name__)
        self.slots = [Slot(number) for number in range(1, count + 1)]
        self.pid: int | None = None  # of the process that started them: only it may stop them
        self._lock = threading.Lock()  # between the monitor's restarts and the stop
        self._stopping = threading.Event()
        self._interrupted: float | None = None  # when the stop signal went out

    @classmethod
    def at_config_load(cls, count: int, graceful_timeout: float) -> EmbeddedWorkers:
        """This master's supervisor: the one already running here when a SIGHUP reloads the config (its workers
        go on; a new ATTENTION_EMBEDDED_WORKERS takes a restart), else a new one of ``count`` workers."""
        if _running is not None and _running.pid == os.getpid():
            return _running
        return cls(count, graceful_timeout)

    def when_ready(self, server: Arbiter) -> None:
        """gunicorn's hook in the master, its sockets open, before it forks the first web worker."""
        if not self.count:
            return
        self.log = server.log
        reap, halt = server.reap_workers, server.stop

        def reap_workers() -> None:
            # Ours first, so that gunicorn's waitpid(-1) finds none of them (bar one dying in between, whose status
            # Popen then reports as 0) and their exit statuses stay the supervisor's to log.
            self.poll()
            reap()

        def stop(graceful: bool = True) -> None:
            self.interrupt(graceful)  # ours finish their tasks while the web workers finish their requests
            halt(graceful)

        server.reap_workers, server.stop = reap_workers, stop
        self.start()

    def on_exit(self, server: Arbiter) -> None:
        """gunicorn's hook as the master exits, its web workers gone."""
        self.stop()

    def start(self) -> None:
        """Start every worker, and the thread that restarts those that die."""
        global _running
        self.pid, _running = os.getpid(), self
        with self._lock:
            for slot in self.slots:
                self._start(slot)
        # A daemon thread: only the thread that forks survives in a child, so web workers never run it.
        threading.Thread(target=self._watch, name="embedded-workers", daemon=True).start()

    def poll(self) -> None:
        """Reap the workers that have exited (their statuses stay with their Popen, for the monitor to log)."""
        for slot in self.slots:
            if (process := slot.process) is not None:
                process.poll()

    def pids(self) -> list[int]:
        """The process ids of the workers running now."""
        self.poll()
        return [slot.process.pid for slot in self.slots if slot.process and slot.process.returncode is None]

    def interrupt(self, graceful: bool = True) -> None:
        """Ask each worker's group to stop, once, and start none after: SIGINT, Huey's graceful stop (its running
        task finishes), or SIGTERM, Huey's immediate stop, when gunicorn shuts down quickly (SIGINT, SIGQUIT)."""
        if os.getpid() != self.pid:
            return
        with self._lock:
            if self._interrupted is not None:
                return  # a second SIGINT would turn Huey's graceful stop into an immediate one
            self._interrupted = time.monotonic()
            self._stopping.set()
            for slot in self.slots:
                if slot.process is not None and slot.process.poll() is None:
                    signal_group(slot.process, signal.SIGINT if graceful else signal.SIGTERM)

    def stop(self) -> None:
        """Interrupt the workers, wait for them until GUNICORN_GRACEFUL_TIMEOUT has passed since, then SIGKILL each
        group (with whatever a worker forked and left in it), and log how each ended."""
        global _running
        if os.getpid() != self.pid:
            return
        self.interrupt()
        deadline = self._interrupted + self.graceful_timeout
        for slot in self.slots:
            if (process := slot.process) is None:
                continue
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.log.warning("job worker %d (pid %d) still running %s s after the stop signal: SIGKILL",
                                 slot.number, process.pid, self.graceful_timeout)
            signal_group(process, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=KILLED_WAIT_SECONDS)
            if process.returncode is not None:
                self.log.info("job worker %d (pid %d) %s", slot.number, process.pid, describe(process.returncode))
        if _running is self:
            _running = None

    def _watch(self) -> None:
        while not self._stopping.wait(POLL_SECONDS):
            self._check()

    def _check(self) -> None:
        """Note the workers that have died, and start those that are due."""
        with self._lock:
            if self._stopping.is_set():
                return
            now = time.monotonic()
            for slot in self.slots:
                if slot.process is not None and slot.process.poll() is not None:
                    self._schedule(slot, now)
                    self.log.warning("job worker %d (pid %d) %s; starting another in %.1f s", slot.number,
                                     slot.process.pid, describe(slot.process.returncode), max(0.0, slot.due - now))
                    slot.process = None
                if slot.process is None and now >= slot.due:
                    self._start(slot)

    def _schedule(self, slot: Slot, now: float) -> None:
        """When to start the slot's next worker: at once if the last one ran steadily, else ``gap`` after its start,
        the gap doubling with each worker that dies at once (a broken worker must not fork at full speed)."""
        if now - slot.started < STEADY_SECONDS:
            slot.due, slot.gap = slot.started + slot.gap, min(2 * slot.gap, MAX_GAP_SECONDS)
        else:
            slot.due, slot.gap = now, FIRST_GAP_SECONDS

    def _start(self, slot: Slot) -> None:
        slot.started = time.monotonic()
        try:
            slot.process = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as error:  # no memory or processes left to fork, say: the monitor tries again later
            self._schedule(slot, slot.started)
            self.log.error("could not start job worker %d (%s): %s", slot.number, " ".join(self.command), error)
            return
        self.log.info("job worker %d started (pid %d): %s", slot.number, slot.process.pid, " ".join(self.command))


def signal_group(process: subprocess.Popen, sig: signal.Signals) -> None:
    """``sig`` to the process group that ``process`` leads (the group outlives its leader while members remain)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)
