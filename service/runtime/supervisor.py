"""``attention-serve`` (``make serve``): gunicorn and the batch jobs' workers, started side by side, stopped together.

gunicorn serves the API (service/gunicorn.conf.py); beside it run ATTENTION_EMBEDDED_WORKERS [1; 0: none] processes
of ``python -m service.jobs.worker`` (Huey consumers), restarted when one dies. A small supervisor, not a gunicorn
hook: gunicorn has no hook for "shutdown starts" (stopping job workers in ``on_exit`` stops them after the web
workers, past a pod's grace period), and none for reaping children that are not its workers. Compose and
Kubernetes run gunicorn and ``attention-worker`` as processes of their own and do without it.

- Every child runs in a session and process group of its own: a terminal's Ctrl-C reaches the supervisor only, and
  one signal to a group reaches whatever that child forked.
- SIGTERM (a container's stop, a pod's deletion) goes at once to gunicorn (its graceful stop: requests finish
  within GUNICORN_GRACEFUL_TIMEOUT) and, as SIGINT, to every job worker (Huey's graceful stop: the running task
  finishes). SIGINT and SIGQUIT stop gunicorn quickly and the job workers with SIGTERM (Huey's immediate stop).
  SIGHUP (reload) goes to gunicorn only.
- A job worker that dies is seen within POLL_SECONDS and started again at most once a second; while each dies at
  once the wait doubles, up to MAX_GAP_SECONDS.
- When gunicorn has exited, the job workers left get what remains of GUNICORN_GRACEFUL_TIMEOUT from the stop signal,
  then SIGKILL to each group; the supervisor exits with gunicorn's status.
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

from service.settings import current

WORKER = (sys.executable, "-m", "service.jobs.worker")
GUNICORN = (sys.executable, "-m", "gunicorn", "-c", "service/gunicorn.conf.py", "service.wsgi:app")
POLL_SECONDS = 0.5  # how soon a dead job worker is noticed
FIRST_GAP_SECONDS = 1.0  # the least time between two starts of one worker
MAX_GAP_SECONDS = 10.0  # one that keeps dying at once (its queue unreachable, say) is started at most this seldom
STEADY_SECONDS = 10.0  # one that ran this long had started well: whatever ended it, the gap is the first again
KILLED_WAIT_SECONDS = 5.0  # a SIGKILLed process is gone at once, unless stuck in the kernel: never wait for ever
# What each stop signal asks of gunicorn and of the job workers.
FORWARDED = {signal.SIGTERM: (signal.SIGTERM, signal.SIGINT), signal.SIGINT: (signal.SIGINT, signal.SIGTERM),
             signal.SIGQUIT: (signal.SIGQUIT, signal.SIGTERM)}


def describe(returncode: int) -> str:
    """A child's end as Popen reports it: a negative code is the signal that killed it."""
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-returncode).name}"
        return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


def signal_group(process: subprocess.Popen, sig: signal.Signals) -> None:
    """``sig`` to the process group that ``process`` leads (the group outlives its leader while members remain)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)


@dataclass
class Slot:
    """One worker's place: its process (None while it waits to be started again), and when to start the next."""

    number: int
    process: subprocess.Popen | None = None
    started: float = 0.0
    due: float = 0.0
    gap: float = FIRST_GAP_SECONDS  # between this start and the next, should this one die at once


class JobWorkers:
    """``count`` processes running ``command``, restarted when one dies (:meth:`check`), stopped by :meth:`stop`."""

    def __init__(self, count: int, graceful_timeout: float, command: Sequence[str] = WORKER,
                 log: logging.Logger | None = None) -> None:
        self.count, self.graceful_timeout, self.command = count, graceful_timeout, list(command)
        self.log = log or logging.getLogger(__name__)
        self.slots = [Slot(number) for number in range(1, count + 1)]
        self._lock = threading.Lock()  # between the restarts and the stop
        self._interrupted: float | None = None  # when the stop signal went out: none is started after

    def start(self) -> None:
        """Start every worker (none once they were asked to stop)."""
        with self._lock:
            for slot in self.slots if self._interrupted is None else ():
                self._start(slot)

    def pids(self) -> list[int]:
        """The process ids of the workers running now."""
        return [slot.process.pid for slot in self.slots if slot.process and slot.process.poll() is None]

    def check(self) -> None:
        """Note the workers that have died, and start those that are due."""
        with self._lock:
            if self._interrupted is not None:
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

    def interrupt(self, sig: signal.Signals = signal.SIGINT) -> None:
        """Ask each worker's group to stop, once, and start none after: SIGINT, Huey's graceful stop (its running
        task finishes), or SIGTERM, its immediate one."""
        with self._lock:
            if self._interrupted is not None:
                return  # a second SIGINT would turn Huey's graceful stop into an immediate one
            self._interrupted = time.monotonic()
            for slot in self.slots:
                if slot.process is not None and slot.process.poll() is None:
                    signal_group(slot.process, sig)

    def stop(self) -> None:
        """Interrupt the workers (unless they are), wait for them until GUNICORN_GRACEFUL_TIMEOUT has passed since,
        then SIGKILL each group (with whatever a worker forked and left in it), and log how each ended."""
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
        except OSError as error:  # no memory or processes left to fork, say: the next check tries again
            self._schedule(slot, slot.started)
            self.log.error("could not start job worker %d (%s): %s", slot.number, " ".join(self.command), error)
            return
        self.log.info("job worker %d started (pid %d): %s", slot.number, slot.process.pid, " ".join(self.command))


class Supervisor:
    """gunicorn (``server``, a command) and the job workers, run side by side until gunicorn exits."""

    def __init__(self, server: Sequence[str], workers: JobWorkers, log: logging.Logger | None = None) -> None:
        self.server_command, self.workers = list(server), workers
        self.log = log or logging.getLogger(__name__)
        self.server: subprocess.Popen | None = None
        self.stopping = threading.Event()

    def forward(self, number: int, frame: object = None) -> None:
        """A signal handler: the stop signals to gunicorn and the job workers at once, SIGHUP to gunicorn."""
        sig = signal.Signals(number)
        if self.server is None:  # before gunicorn started: none will be
            self.stopping.set()
            return
        if sig == signal.SIGHUP:
            self.server.send_signal(sig)
            return
        to_server, to_workers = FORWARDED[sig]
        self.stopping.set()
        self.workers.interrupt(to_workers)
        signal_group(self.server, to_server)

    def run(self) -> int:
        """Start both, restart dead job workers while gunicorn runs, stop the job workers once it exits; its exit
        status."""
        for sig in (*FORWARDED, signal.SIGHUP):
            signal.signal(sig, self.forward)
        if self.stopping.is_set():
            return 0
        self.server = subprocess.Popen(self.server_command, stdin=subprocess.DEVNULL, start_new_session=True)
        self.workers.start()
        while self.server.poll() is None:
            self.workers.check()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.server.wait(timeout=POLL_SECONDS)
        if not self.stopping.is_set():
            self.log.warning("gunicorn (pid %d) %s: stopping the job workers", self.server.pid,
                             describe(self.server.returncode))
        self.workers.stop()
        code = self.server.returncode
        return 128 - code if code < 0 else code  # killed by a signal: 128 + its number, as a shell says it


def main(argv: list[str] | None = None) -> int:
    """Serve: gunicorn with ``argv`` (default: service/gunicorn.conf.py and service.wsgi:app) and the job workers."""
    settings = current()  # a bad value ends it here, in one line, before anything starts
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] [%(process)d] [%(levelname)s] %(message)s")
    server = [*GUNICORN[:3], *argv] if argv else GUNICORN
    workers = JobWorkers(settings.server.embedded_workers, settings.server.graceful_timeout)
    return Supervisor(server, workers).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
