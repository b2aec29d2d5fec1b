"""Batch jobs across hosts (issue 36): six "machines" built from Linux namespaces on this one, a batch run through
nginx with the ``openai`` client while a worker host dies, another loses its network, and an API host dies.

Run it (as root; ``ip`` from iproute2, ``unshare`` and ``nsenter`` from util-linux, nginx and redis-server)::

    sudo .venv/bin/python -m tests.hosts          # ~2 minutes: builds the network, runs both batches, prints the
                                                   # fault figures, removes everything (also on Ctrl-C or failure)

``tests/live/test_hosts.py`` runs the same two scenarios and asserts on what they return.

The network (names all start with :data:`PREFIX`, addresses in :data:`SUBNET`.0/24, nothing else touched)::

    this machine (the client, 10.236.0.1) --veth-- [bridge in the "lan" namespace] --veth-- each host's eth0
    redis .10 (redis-server, a password)   api1 .21, api2 .22 (gunicorn, compose's api command)
    edge .30 (nginx, deploy/nginx.conf)    worker1 .41, worker2 .42 (attention-worker)

Each host is a network namespace (its own stack, one veth to the bridge), a mount namespace and a PID namespace
whose init is ``sleep``: SIGKILL to that init kills every process of the host at once, as a machine that loses
power. In its mount namespace a host has its own ``/tmp`` (a directory of its own, bind-mounted: its local disk;
its logs, nginx's and Redis' files, gunicorn's metrics) and the one shared directory, ``/srv``, bind-mounted from
the same place on every host: it stands for the NFS export or ReadWriteMany volume that ``ATTENTION_DATA_DIR``
must be across machines. The code and the venv are the same files everywhere, as a machine image would be.

One run at a time on a machine: the names are fixed, and a run starts by removing what a run before it left.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from tests.harness import (
    BIN,
    CONTAINER_ONLY,
    ROOT,
    LaunchError,
    compose_api_command,
    compose_api_environment,
    exited,
    redis_answers,
    render_nginx_conf,
    wait_for,
    wait_until_answers,
    wait_until_up,
)
from tests.live.jobs import assert_accounted, huey_tasks

PREFIX = "aj36-"  # every namespace, link and directory this module makes; unique to it on this machine
SUBNET = "10.236.0"  # a /24 of the private 10/8, routed only through PREFIX's client link
LAN = f"{PREFIX}lan"  # the namespace holding the bridge (the switch): nothing of it lands in this machine's stack
CLIENT_LINK = f"{PREFIX}client"  # this machine's end of its veth to the bridge
CLIENT = f"{SUBNET}.1"
ADDRESSES = {"redis": 10, "api1": 21, "api2": 22, "edge": 30, "worker1": 41, "worker2": 42}
REDIS_PORT, API_PORT = 6379, 8000
PASSWORD = "aj36-not-a-secret-but-required"
DATA = "/srv"  # the shared volume, as every host sees it
LEASE, REAP = 3.0, 0.5  # ATTENTION_BATCH_LEASE_SECONDS, ATTENTION_BATCH_REAP_SECONDS: a lost chunk costs seconds
CHUNK_ITEMS = 32
# The item: 6 encoder layers of width 512 on two tokens, one seed: ~23 ms of one core here in a stacked chunk (a
# chunk of 32 ~0.75 s), answering ~6 KB; its weights are drawn once per worker.
BODY = {"tokens": ["the", "cat"], "d_model": 512, "n_heads": 8, "n_layers": 6, "return_weights": False,
        "decimals": 3, "seed": 3}
ENCODER = "/v1/encoder"
ITEMS_FAULTS = 1800  # ~41 s of one core: ~21-30 s on two workers on this shared machine
ITEMS_API = 480  # the second run only needs to outlast the kill of an API host and a few polls
TIMEOUT = 150.0  # seconds any one batch may take to end here, faults and all


def ip(*args: str, check: bool = True) -> str:
    """``ip`` with ``args``; its output."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode:
        raise LaunchError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def namespaces() -> list[str]:
    """The network namespaces of :data:`PREFIX` (``ip netns list`` prints ``name (id: n)``)."""
    return [line.split()[0] for line in ip("netns", "list").splitlines() if line.startswith(PREFIX)]


def clean_stale() -> None:
    """Remove what an earlier run left (killed before its clean-up): its processes (every one in its namespaces),
    namespaces, link and directories. Only names of :data:`PREFIX`."""
    for name in namespaces():
        for pid in ip("netns", "pids", name).split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        ip("netns", "del", name, check=False)
    if CLIENT_LINK in ip("-o", "link", "show"):
        ip("link", "del", CLIENT_LINK, check=False)
    for stale in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        shutil.rmtree(stale, ignore_errors=True)


def missing() -> str | None:
    """Why namespaces cannot be made here (None: they can): not root, or a tool missing."""
    if os.geteuid() != 0:
        return "network, mount and PID namespaces need root"
    for tool in ("ip", "unshare", "nsenter", "redis-server", "nginx"):
        if not (shutil.which(tool) or Path(f"/usr/sbin/{tool}").exists() or Path(f"/usr/bin/{tool}").exists()):
            return f"`{tool}` is not installed (iproute2, util-linux, nginx, redis-server; .ci/run installs them)"
    # root in a container without CAP_SYS_ADMIN (or with namespaces forbidden by seccomp) cannot make them either
    tried = subprocess.run(["unshare", "--net", "--mount", "--pid", "--fork", "true"], capture_output=True,
                           text=True, timeout=30)
    if tried.returncode:
        return f"this machine refuses new namespaces: {tried.stderr.strip()}"
    return None


def state(pid: int) -> str | None:
    """A process's state letter (R, S, T stopped, Z...); None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


def pid_namespace(pid: int) -> str | None:
    """The PID namespace of ``pid`` (``pid:[inode]``); None once it is gone."""
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except (FileNotFoundError, ProcessLookupError, PermissionError):  # gone, or not ours to read (the sandbox's)
        return None


class Host:
    """One machine: network namespace ``PREFIX<name>`` on the bridge at ``SUBNET.<n>``, and a mount and PID namespace
    held by an init (``sleep``); ``run`` starts a process in all three. ``private``: its /tmp, seen from here."""

    def __init__(self, network: Network, name: str) -> None:
        self.network, self.name = network, name
        self.netns = f"{PREFIX}{name}"
        self.address = f"{SUBNET}.{ADDRESSES[name]}"
        self.private = network.base / name
        self.processes: list[subprocess.Popen] = []
        self.init_process: subprocess.Popen | None = None
        ip("netns", "add", self.netns)
        # The bridge's port is named after the host: `ip -n LAN link set <name> down` pulls its cable.
        ip("-n", LAN, "link", "add", name, "type", "veth", "peer", "name", "eth0", "netns", self.netns)
        ip("-n", LAN, "link", "set", name, "master", "br0", "up")
        ip("-n", self.netns, "addr", "add", f"{self.address}/24", "dev", "eth0")
        ip("-n", self.netns, "link", "set", "eth0", "up")
        ip("-n", self.netns, "link", "set", "lo", "up")
        self.boot()

    def boot(self) -> None:
        """Start the host's init: a fresh PID namespace (its PID 1) and mount namespace, with /srv the shared volume
        and /tmp its own directory (emptied: a machine that boots again has lost nothing of the volume only)."""
        self.stop()  # a host booted again: whatever still ran on it is gone first
        shutil.rmtree(self.private, ignore_errors=True)
        self.private.mkdir(parents=True)
        # The volume first: its source is under this machine's /tmp, which the second mount hides.
        script = 'mount --bind "$1" /srv && mount --bind "$2" /tmp && touch /tmp/.booted && exec sleep infinity'
        self.init_process = subprocess.Popen(
            ["ip", "netns", "exec", self.netns, "unshare", "--mount", "--propagation", "private", "--pid", "--fork",
             "--mount-proc", "--", "sh", "-c", script, "init", str(self.network.export), str(self.private)],
            stdout=subprocess.DEVNULL, stderr=(self.private.parent / f"{self.name}.init.log").open("w"),
            start_new_session=True)
        booted = self.private / ".booted"
        wait_until_answers(booted.exists, self.init_process, f"host {self.name}'s init")
        # `ip netns exec` execs unshare, whose one child is the init (PID 1 inside).
        self.init = wait_for(lambda: next(iter(child_pids(self.init_process.pid)), None), 10, "the init's pid")

    def run(self, name: str, argv: list[str], env: Mapping[str, str]) -> subprocess.Popen:
        """``argv`` on this host (its network, mounts and process view), output in its /tmp/<name>.log."""
        log = (self.private / f"{name}.log").open("wb")
        process = subprocess.Popen(
            ["nsenter", f"--target={self.init}", "--net", "--mount", "--pid", f"--wd={ROOT}", "--", *argv],
            env=dict(env), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.processes.append(process)
        return process

    def sh(self, script: str) -> subprocess.CompletedProcess:
        """``sh -c script`` on this host, waited for (30 s at most)."""
        return subprocess.run(["nsenter", f"--target={self.init}", "--net", "--mount", "--pid", "--", "sh", "-c",
                               script], capture_output=True, text=True, timeout=30)

    def log(self, name: str) -> str:
        path = self.private / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def pids(self) -> list[int]:
        """Every process of the host (those in its PID namespace), by their pids here."""
        mine = pid_namespace(self.init)
        if mine is None:
            return []
        return [int(entry.name) for entry in Path("/proc").iterdir()
                if entry.name.isdigit() and pid_namespace(int(entry.name)) == mine]

    def kill(self) -> float:
        """SIGKILL to the init: the kernel kills every process of the PID namespace at once. Returns the seconds
        until the last of them had exited (bounded: 10 s)."""
        doomed = self.pids()
        started = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.init, signal.SIGKILL)

        def gone() -> bool:
            self.wake_launchers()  # a frozen host's launchers must reap its dead, or its init never finishes dying
            return all(exited(pid) for pid in doomed)

        wait_for(gone, 10, f"every process of {self.name} to exit")
        took = time.monotonic() - started
        for process in [*self.processes, self.init_process]:
            if process is not None:
                process.wait(timeout=10)
        self.processes = []
        return took

    def freeze(self) -> None:
        """SIGSTOP to every process of the host: it holds still, as it was. Returns once each launcher has stopped
        itself too (:meth:`wake_launchers`), so that :meth:`thaw` finds it stopped and wakes it."""
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        wait_for(lambda: all(process.poll() is not None or state(process.pid) in ("T", "Z", None)
                             for process in self.processes), 10, f"{self.name}'s launchers to stop")

    def thaw(self) -> None:
        """SIGCONT to every process of the host, and to the launchers (:meth:`wake_launchers`)."""
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self.wake_launchers()

    def wake_launchers(self) -> None:
        """SIGCONT to the nsenter that started each process here: one whose child stops stops itself too
        (util-linux's nsenter, to pass job control on), and stays stopped when the child alone is continued; a
        stopped nsenter reaps nothing, and a PID namespace's init does not finish dying until every process of it
        is reaped."""
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGCONT)

    def cable(self, plugged: bool) -> None:
        """Plug or pull the host's cable: its bridge port up or down (its own eth0 then has no carrier)."""
        ip("-n", LAN, "link", "set", self.name, "up" if plugged else "down")

    def stop(self) -> None:
        if self.init_process is not None and self.init_process.poll() is None:
            self.kill()


class Network:
    """The bridge, this machine's link to it, and the hosts; everything removed at :meth:`close` (and what a run
    before left, at the start)."""

    def __init__(self) -> None:
        clean_stale()
        self.hosts: dict[str, Host] = {}
        self.base = Path(tempfile.mkdtemp(prefix=PREFIX))
        self.export = self.base / "export"  # the shared volume (NFS export), bind-mounted on each host's /srv
        self.export.mkdir()
        try:
            ip("netns", "add", LAN)
            ip("-n", LAN, "link", "add", "br0", "type", "bridge")
            ip("-n", LAN, "link", "set", "br0", "up")
            ip("link", "add", CLIENT_LINK, "type", "veth", "peer", "name", "client", "netns", LAN)
            ip("-n", LAN, "link", "set", "client", "master", "br0", "up")
            ip("addr", "add", f"{CLIENT}/24", "dev", CLIENT_LINK)
            ip("link", "set", CLIENT_LINK, "up")
        except BaseException:
            self.close()
            raise

    def add(self, name: str) -> Host:
        self.hosts[name] = host = Host(self, name)
        return host

    def close(self) -> None:
        """Every host's processes killed, the namespaces, the link and the directories removed."""
        for host in self.hosts.values():
            with contextlib.suppress(Exception):  # the rest goes on: clean_stale removes what is left
                host.stop()
        clean_stale()

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def child_pids(pid: int) -> list[int]:
    """The children of ``pid`` (its main thread's)."""
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return []


def environment(**extra: str) -> dict[str, str]:
    """What every host's service gets: this machine's PATH and the like, compose's api environment (but its
    container paths), the shared volume, Redis and its password, the short lease and reap, no models."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("ATTENTION_", "GUNICORN_", "PROMETHEUS_")) and name not in ("HOST", "PORT")}
    env.update({name: value for name, value in compose_api_environment().items() if name not in CONTAINER_ONLY})
    env.update({"ATTENTION_DATA_DIR": DATA, "ATTENTION_QUEUE_URL": f"redis://{SUBNET}.{ADDRESSES['redis']}:"
                f"{REDIS_PORT}/0", "ATTENTION_QUEUE_PASSWORD": PASSWORD, "ATTENTION_MODELS": "",
                "ATTENTION_BATCH_LEASE_SECONDS": str(LEASE), "ATTENTION_BATCH_REAP_SECONDS": str(REAP),
                "ATTENTION_BATCH_CHUNK_ITEMS": str(CHUNK_ITEMS), "TMPDIR": "/tmp"})
    env.update(extra)
    return env


def start_redis(host: Host) -> None:
    process = host.run("redis", [shutil.which("redis-server") or "/usr/bin/redis-server", "--port", str(REDIS_PORT),
                                 "--bind", "0.0.0.0", "--save", "", "--appendonly", "no", "--dir", "/tmp",
                                 "--requirepass", PASSWORD], environment())
    wait_until_answers(lambda: redis_answers(host.address, REDIS_PORT), process, f"redis-server on {host.address}")


def start_api(host: Host) -> None:
    """compose's api command (gunicorn alone, ATTENTION_EMBEDDED_WORKERS=0), one web worker: the cores go to the
    job workers."""
    argv = compose_api_command()
    argv[0] = str(BIN / "gunicorn")
    process = host.run("gunicorn", argv, environment(HOST="0.0.0.0", PORT=str(API_PORT), WEB_CONCURRENCY="1"))
    wait_until_up(f"http://{host.address}:{API_PORT}/readyz", process, f"gunicorn on {host.name}")


def start_edge(host: Host, upstreams: list[Host]) -> str:
    """nginx with deploy/nginx.conf before ``upstreams``; its URL."""
    workdir = host.private / "nginx"
    workdir.mkdir()
    inside = Path("/tmp/nginx")  # workdir as the host sees it
    conf = render_nginx_conf(80, [f"{api.address}:{API_PORT}" for api in upstreams], inside, host=host.address)
    (workdir / "nginx.conf").write_text(conf)
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    process = host.run("nginx", [binary, "-c", str(inside / "nginx.conf"), "-p", str(inside), "-g", "daemon off;"],
                       environment())
    url = f"http://{host.address}"
    wait_until_up(f"{url}/readyz", process, "nginx")
    return url


def start_worker(host: Host) -> None:
    process = host.run("worker", [str(BIN / "attention-worker")], environment())
    wait_until_answers(lambda: "Huey consumer started" in host.log("worker"), process,
                       f"attention-worker on {host.name}")


def chunks_begun(host: Host) -> tuple[int, int]:
    """Chunk tasks a worker host's ``attention-worker`` has begun and finished."""
    return huey_tasks(host.log("worker"), "chunk")


def holding_a_chunk(host: Host, timeout: float = 30) -> None:
    """Until the host's worker is in the middle of a chunk (begun, not finished): a fault then loses one."""
    wait_for(lambda: (lambda begun, done: begun > done)(*chunks_begun(host)), timeout,
             f"{host.name} in the middle of a chunk")


def frozen_holding_a_chunk(host: Host, timeout: float = 30) -> None:
    """Until the host is frozen (every process SIGSTOPped) in the middle of a chunk: killed then, it dies holding
    one, however short the moment between a chunk's end and its log line."""
    deadline = time.monotonic() + timeout
    while True:
        holding_a_chunk(host, timeout)
        host.freeze()
        begun, done = chunks_begun(host)
        if begun > done:
            return
        host.thaw()
        assert time.monotonic() < deadline, f"{host.name} not frozen mid-chunk within {timeout} s"


@dataclass
class Leases:
    """A thread reading every chunk lease of one batch from Redis every 20 ms (as the workers write them: service.
    jobs.leases), keeping each change with the time it was seen: when a lost chunk was queued again, and how long
    chunks run."""

    batch_id: str
    chunks: int
    seen: dict[int, list[tuple[float, dict | None]]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    stopped: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        from service.jobs import keys, queue
        from service.settings import JobSettings, Limits

        settings = JobSettings(data_dir=Path(tempfile.mkdtemp(prefix=PREFIX)), queue_password=PASSWORD,
                               queue_url=f"redis://{SUBNET}.{ADDRESSES['redis']}:{REDIS_PORT}/0")
        self.store = queue.build(settings, Limits()).store
        shutil.rmtree(settings.data_dir, ignore_errors=True)  # made by build; Redis holds everything read here
        self.keys = [keys.lease(self.batch_id, str(index)) for index in range(self.chunks)]
        self.thread = threading.Thread(target=self._watch, name="leases", daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        last: list[Any] = [None] * self.chunks
        while True:
            final = self.stopped.is_set()  # one whole read after stop(): the last release is seen, however late
            now = time.time()
            try:
                found = self.store.get_many(self.keys)
            except Exception as exc:  # kept, and shown by cost(): a gap in what was seen
                self.errors.append(f"{now:.2f}: {exc!r}")
                found = last
            for index, lease in enumerate(found):
                if lease != last[index]:
                    self.seen.setdefault(index, []).append((now, lease))
                    last[index] = lease
            if final:
                return
            self.stopped.wait(0.02)

    def stop(self) -> None:
        """Stop reading, after one more read of every lease."""
        self.stopped.set()
        self.thread.join(timeout=15)
        assert not self.thread.is_alive(), "the leases' reader did not stop"

    def runs(self) -> list[tuple[int, float, float]]:
        """Every run of a chunk seen done: (index, began, ended), from its running lease's first time to the moment
        its lease was gone. A run whose lease was queued again instead (lost) is no chunk time, and neither is a
        running lease written before the state it replaced was seen: a renewal held up by a cut cable, landing
        once the cable is back (seen here: written at the cut, landed 6 s later over the reaper's "queued")."""
        found = []
        for index, changes in self.seen.items():
            began, before = None, 0.0
            for at, lease in changes:
                if lease is not None and lease["state"] == "running":
                    if began is None and lease["at"] >= before:
                        began = lease["at"]
                elif began is not None:
                    if lease is None:
                        found.append((index, began, at))
                    began = None
                before = at
        return found

    def requeued_after(self, moment: float) -> tuple[int, float] | None:
        """The first chunk queued again after ``moment`` (index, when the reaper queued it); None if none was."""
        found = [(lease["at"], index) for index, changes in self.seen.items() for _, lease in changes
                 if lease is not None and lease["state"] == "queued" and lease["at"] > moment]
        return (min(found)[1], min(found)[0]) if found else None

    def held_after(self, index: int, moment: float) -> float:
        """Seconds chunk ``index`` spent in a worker's hands, until done, in runs that began after ``moment``: the
        run again, or what was left of the first run when its worker came back (0 when that worker had finished it
        while cut off, and the task queued again found it done)."""
        return sum(ended - began for i, began, ended in self.runs() if i == index and began > moment)


@dataclass
class Cost:
    """What a fault cost: ``detected`` seconds from the fault until the reaper queued the lost chunk again, and
    ``rerun`` seconds the chunk then spent in a worker's hands until done (:meth:`Leases.held_after`); their sum
    against ``bound``: lease + reap period + the queue's grace (service.jobs.leases.QUEUED_GRACE) + one chunk (the
    slowest run of the batch). The wait in the queue between the two is no cost: a chunk queued again goes behind
    the others, and the workers compute those meanwhile."""

    fault: str
    detected: float
    rerun: float
    bound: float

    @property
    def total(self) -> float:
        return self.detected + self.rerun

    def __str__(self) -> str:
        then = (f"then {self.rerun:.2f} s in a worker's hands" if self.rerun else
                "nothing run again (the worker cut off finished it once back)")
        return (f"{self.fault}: chunk queued again {self.detected:.2f} s after the fault, {then}: {self.total:.2f} s "
                f"against the bound {self.bound:.2f} s")


def cost(leases: Leases, fault: str, moment: float) -> Cost:
    """The :class:`Cost` of the fault at ``moment`` (time.time()), from the leases seen."""
    from service.jobs.leases import QUEUED_GRACE

    requeued = leases.requeued_after(moment)
    around = {index: [(round(at - moment, 2), lease) for at, lease in changes if -3 < at - moment < 10]
              for index, changes in leases.seen.items()}
    assert requeued is not None, (f"{fault}: no chunk was queued again after the fault; reads failed: "
                                  f"{leases.errors}; leases around it: { {i: c for i, c in around.items() if c} }")
    index, queued_at = requeued
    slowest = max(ended - began for _, began, ended in leases.runs())
    return Cost(fault, queued_at - moment, leases.held_after(index, queued_at), LEASE + REAP + QUEUED_GRACE + slowest)


def input_file(count: int, directory: Path) -> tuple[Path, list[str]]:
    """``count`` lines of :data:`BODY` for /v1/encoder, in a file; their custom_ids."""
    ids = [f"item-{index}" for index in range(count)]
    path = directory / f"requests-{count}.jsonl"
    path.write_bytes(b"".join(orjson.dumps({"custom_id": custom_id, "method": "POST", "url": ENCODER, "body": BODY})
                              + b"\n" for custom_id in ids))
    return path, ids


@dataclass
class Outcome:
    """What a run of a batch returns: the ended batch, its output and error lines, its ids, and figures."""

    batch: Any
    output: list[dict]
    errors: list[dict]
    ids: list[str]
    figures: dict[str, Any]


class Cluster:
    """The six hosts of the module's docstring, started; the client's view of them."""

    def __init__(self, network: Network) -> None:
        self.network = network
        self.redis = network.add("redis")
        self.apis = [network.add("api1"), network.add("api2")]
        self.edge = network.add("edge")
        self.workers = [network.add("worker1"), network.add("worker2")]
        start_redis(self.redis)
        for api in self.apis:
            start_api(api)
        self.url = start_edge(self.edge, self.apis)
        for worker in self.workers:
            start_worker(worker)

    def client(self) -> Any:
        """The openai client on nginx: its own retries off, so that what recovers is the service."""
        from openai import OpenAI

        return OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=60)

    def access_log(self) -> list[dict]:
        path = self.edge.private / "nginx" / "access.log"
        return [orjson.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


def submit(client: Any, path: Path) -> Any:
    with path.open("rb") as file:
        uploaded = client.files.create(file=file, purpose="batch")
    return client.batches.create(input_file_id=uploaded.id, endpoint=ENCODER, completion_window="24h")


def poll(client: Any, batch_id: str, until: Callable[[Any], bool], timeout: float = TIMEOUT,
         latencies: list[float] | None = None) -> Any:
    """The batch once ``until(batch)`` holds, retrieved every 50 ms (each call's seconds in ``latencies``)."""
    deadline = time.monotonic() + timeout
    while True:
        asked = time.monotonic()
        found = client.batches.retrieve(batch_id)
        if latencies is not None:
            latencies.append(time.monotonic() - asked)
        if until(found):
            return found
        assert time.monotonic() < deadline, f"timed out after {timeout} s: {found}"
        time.sleep(0.05)


def ended(batch: Any) -> bool:
    return batch.status in ("completed", "failed", "expired", "cancelled")


def progressed(fraction: float) -> Callable[[Any], bool]:
    """Until ``fraction`` of the batch's requests are done (or it ended)."""
    return lambda batch: ended(batch) or (batch.request_counts.total > 0 and batch.request_counts.completed
                                          >= fraction * batch.request_counts.total)


def download(client: Any, batch: Any) -> tuple[list[dict], list[dict]]:
    """The batch's output and error lines, through the client."""
    return tuple([orjson.loads(line) for line in client.files.content(file_id).content.splitlines()]
                 if file_id else [] for file_id in (batch.output_file_id, batch.error_file_id))


def worker_faults(cluster: Cluster, scratch: Path) -> Outcome:
    """The first run: a batch of :data:`ITEMS_FAULTS` through nginx; mid-batch worker2's cable pulled for twice the
    lease while it holds a chunk (worker1's reaper finds that chunk lost), then every process of worker1 killed
    while it holds one (worker2, back, finds it). Both faults are made while a chunk is in the host's hands, so
    each loses one. Figures: what each fault cost (:class:`Cost`), how long the worker host took to die whole, how
    long worker2 took to work again once plugged back, the run's chunk times."""
    client = cluster.client()
    path, ids = input_file(ITEMS_FAULTS, scratch)
    started = time.monotonic()
    batch = submit(client, path)
    leases = Leases(batch.id, -(-ITEMS_FAULTS // CHUNK_ITEMS))
    try:
        first, second = cluster.workers
        poll(client, batch.id, progressed(0.15))
        frozen_holding_a_chunk(second)
        begun_before = chunks_begun(second)[0]
        cut = time.time()
        second.cable(False)
        second.thaw()  # it goes on with its chunk, cut off
        try:
            time.sleep(2 * LEASE)  # the fault itself: the cable stays out for twice the lease
        finally:
            second.cable(True)
        plugged = time.monotonic()
        # worker2 works again without a restart: a chunk begun after it was plugged back (it takes a task from
        # Redis, so none began while the cable was out; the one it held counted in begun_before).
        wait_for(lambda: chunks_begun(second)[0] > begun_before, 60, "worker2 to begin a chunk again")
        resumed = time.monotonic() - plugged
        poll(client, batch.id, progressed(0.5))
        frozen_holding_a_chunk(first)
        killed = time.time()
        died_in = first.kill()
        batch = poll(client, batch.id, ended)
        took = time.monotonic() - started
    finally:
        leases.stop()
    output, errors = download(client, batch)
    runs = [ended_ - began for _, began, ended_ in leases.runs()]
    figures = {"cable": cost(leases, "worker2's cable out for 2 x lease", cut),
               "kill": cost(leases, "worker1 killed whole", killed), "died_in": died_in, "resumed": resumed,
               "took": took, "chunk_median": statistics.median(runs), "chunk_max": max(runs),
               "worker2_restarted": [process.poll() for process in cluster.workers[1].processes] != [None]}
    return Outcome(batch, output, errors, ids, figures)


def api_fault(cluster: Cluster, scratch: Path) -> Outcome:
    """The second run: worker1 booted again; a batch of :data:`ITEMS_API`; while the client polls, api1 is killed
    whole and its cable pulled (a machine gone: no answer at all, not a refused connection); the client polls on
    and downloads through nginx, which moves on to api2. Figures: the client's slowest call before and after the
    kill, and nginx's requests that went to api1, failed, and were passed to api2."""
    first = cluster.workers[0]
    first.boot()
    start_worker(first)
    client = cluster.client()
    path, ids = input_file(ITEMS_API, scratch)
    batch = submit(client, path)
    before: list[float] = []
    poll(client, batch.id, progressed(0.3), latencies=before)
    doomed = cluster.apis[0]
    doomed.kill()
    doomed.cable(False)
    killed_at = len(cluster.access_log())
    after: list[float] = []
    batch = poll(client, batch.id, ended, latencies=after)
    # Downloads until one of them went to the dead host first: nginx skips a failed server for its fail_timeout
    # (5 s), then tries it again with the next request. Each download is the same bytes.
    asked = time.monotonic()
    output, errors = download(client, batch)
    downloads = [time.monotonic() - asked]
    deadline = time.monotonic() + 30
    while not any(line["path"].endswith("/content") for line in moved(cluster.access_log()[killed_at:])):
        assert time.monotonic() < deadline and len(downloads) < 200, "no download went to the dead host in 30 s"
        asked = time.monotonic()
        assert download(client, batch) == (output, errors)
        downloads.append(time.monotonic() - asked)
        time.sleep(0.1)
    figures = {"slowest_before": max(before), "slowest_after": max(after), "polls_after": len(after),
               "downloads": downloads, "moved_on": moved(cluster.access_log()[killed_at:])}
    return Outcome(batch, output, errors, ids, figures)


def describe(line: dict) -> str:
    """One nginx access line as the figures show it."""
    return f"{line['method']} {line['path']} {line['duration_s']} s, upstream status {line['upstream_status']}"


def moved(log: list[dict]) -> list[dict]:
    """nginx's requests that one upstream failed and the next answered (``upstream``: two addresses)."""
    return [line for line in log if "," in line["upstream"]]


def accounted(outcome: Outcome) -> None:
    """Every custom_id in exactly one output or error line, none twice, no other; the counts equal the lines."""
    counts = outcome.batch.request_counts
    assert_accounted(outcome.output, outcome.errors, outcome.ids,
                     {"total": counts.total, "completed": counts.completed, "failed": counts.failed})


def report_faults(outcome: Outcome) -> str:
    """The first run's figures, as the test and the script print them."""
    figures = outcome.figures
    return (f"run 1: {len(outcome.ids)} items, {outcome.batch.status} in {figures['took']:.1f} s; chunks of "
            f"{CHUNK_ITEMS}: median {figures['chunk_median']:.2f} s, slowest {figures['chunk_max']:.2f} s (fault-free "
            f"on two workers: ~{-(-len(outcome.ids) // CHUNK_ITEMS) * figures['chunk_median'] / 2:.0f} s)\n"
            f"  {figures['cable']}; worker2 began a chunk again {figures['resumed']:.2f} s after its cable was back\n"
            f"  {figures['kill']}; every process of worker1 gone {figures['died_in']:.3f} s after the SIGKILL")


def report_api(outcome: Outcome) -> str:
    """The second run's figures, as the test and the script print them."""
    figures = outcome.figures
    return (f"run 2: {len(outcome.ids)} items, {outcome.batch.status}; api1 killed and unplugged while polling: "
            f"slowest poll {figures['slowest_before']:.2f} s before, {figures['slowest_after']:.2f} s after "
            f"({figures['polls_after']} polls); {len(figures['downloads'])} downloads, slowest "
            f"{max(figures['downloads']):.2f} s; moved on by nginx: "
            + "; ".join(describe(line) for line in figures["moved_on"]))


@contextlib.contextmanager
def cluster() -> Iterator[Cluster]:
    """The network and its six hosts, started; all removed at the end, whatever happened."""
    with Network() as network:
        yield Cluster(network)


def main() -> None:
    """Both runs, their figures printed; everything removed at the end."""
    why = missing()
    if why:
        sys.exit(f"tests.hosts: {why}")
    scratch = Path(tempfile.mkdtemp(prefix="hosts-input-"))
    try:
        with cluster() as hosts:
            first = worker_faults(hosts, scratch)
            accounted(first)
            print(report_faults(first))
            second = api_fault(hosts, scratch)
            accounted(second)
            print(report_api(second))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
