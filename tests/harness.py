"""Real servers for the tests and benchmarks: gunicorn instances, Debian's nginx and redis-server on loopback,
always stopped.

``Gunicorn`` runs docker-compose.yml's ``api`` command (``service/gunicorn.conf.py``) on a free loopback port,
with this environment plus what the caller adds; ``compose=True`` adds compose's ``api`` environment too (the
topology as shipped). ``Nginx`` runs the repo's deploy/nginx.conf with only its ports and paths templated (see
:func:`render_nginx_conf`). ``RedisServer`` runs redis-server, persisting nothing, for the batch jobs' queue.
Bounded: a server that does not answer within ``START_TIMEOUT`` is stopped and reported; every server is stopped
(SIGTERM, then SIGKILL to its process group) when its ``with`` block ends. No pytest here: benchmarks/ import it
too (with the repository root on sys.path).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
GUNICORN = BIN / "gunicorn"
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
NGINX_CONF = (ROOT / "deploy" / "nginx.conf").read_text()
START_TIMEOUT = 30.0
# compose's jobs volume path and Redis host, which exist in its containers only: a local instance keeps this process's
# (tests/conftest.py's data directory; no URL: the SQLite queue in it) unless its env names others.
CONTAINER_ONLY = ("ATTENTION_DATA_DIR", "ATTENTION_QUEUE_URL", "ATTENTION_QUEUE_PASSWORD")
APP = "service.wsgi:app"


class LaunchError(RuntimeError):
    """A server exited or did not answer in time (the message holds the end of its output)."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def children(pid: int) -> list[int]:
    """Pids of a process's children (Linux /proc): a gunicorn master's are its web and job workers. Each thread
    lists the children it forked: the master's job workers restarted by its monitor thread are that thread's."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # a thread that ended meanwhile
            found += [int(child) for child in (task / "children").read_text().split()]
    return found


def process_group(pid: int) -> int | None:
    """The process group of ``pid``; None once it is gone."""
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def exited(pid: int) -> bool:
    """Whether ``pid`` has exited: gone, or a zombie its parent has not reaped (this test, an init that never does)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or between the open and the read (ESRCH)
        return True


def new_masters(pid: int) -> list[int]:
    """The masters an upgrade in place (USR2) of master ``pid`` started: its children told GUNICORN_PID."""
    found = []
    with contextlib.suppress(FileNotFoundError):  # the old master gone
        for child in children(pid):
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # exited, or exiting (ESRCH)
                if b"GUNICORN_PID=" in Path(f"/proc/{child}/environ").read_bytes():
                    found.append(child)
    return found


def stop_master(pid: int) -> None:
    """SIGTERM to a master that is not a Gunicorn instance's own (one that USR2 started), and wait for its exit."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    wait_for(lambda: exited(pid), 30, f"{pid}'s exit")


def wait_for(condition, timeout: float, what: str):
    """Poll ``condition()`` until it gives something true, and return that; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
    return found


def requests_total(instance, route: str) -> float:
    """http_requests_total of ``route`` (all statuses) on one instance (anything with a ``url``): every worker's,
    summed, as its /metrics reports it."""
    response = requests.get(f"{instance.url}/metrics", timeout=10)
    assert response.status_code == 200, response.text
    return sum(sample.value for family in text_string_to_metric_families(response.text) for sample in family.samples
               if sample.name == "http_requests_total" and sample.labels["route"] == route)


def in_flight(instance) -> float:
    """http_requests_in_flight of one instance (anything with a ``url``); the scrape reading it counts too."""
    response = requests.get(f"{instance.url}/metrics", timeout=5)
    return sum(sample.value for family in text_string_to_metric_families(response.text) for sample in family.samples
               if sample.name == "http_requests_in_flight")


def slow_encoder_body(seed: int = 7) -> dict:
    """A /v1/encoder body within the default limits that computes for ~0.6 s here (6 layers, 128 x 512)."""
    rng = np.random.default_rng(seed)
    return {"embeddings": rng.standard_normal((128, 512)).round(4).tolist(), "n_heads": 8, "n_layers": 6,
            "return_weights": False}


def post_in_flight(instance, path: str, body: dict) -> Future[requests.Response]:
    """POST ``body`` to ``path`` of ``instance`` from a thread; return once the instance counts it in flight (a
    second worker answers that scrape). The future's result is the response (the request times out after 30 s)."""
    executor = ThreadPoolExecutor(max_workers=1)
    answer = executor.submit(requests.post, f"{instance.url}{path}", json=body, timeout=30)
    executor.shutdown(wait=False)  # the request goes on; the thread ends with it
    wait_for(lambda: in_flight(instance) >= 2, 10, f"the POST to {path} in flight (plus the scrape)")
    return answer


def wait_until_answers(answers: Callable[[], bool], process: subprocess.Popen, what: str) -> None:
    """Poll ``answers()`` until it is true; fail if the process exits or START_TIMEOUT passes."""
    deadline = time.monotonic() + START_TIMEOUT
    while not answers():
        if process.poll() is not None:
            raise LaunchError(f"{what} exited with {process.returncode}")
        if time.monotonic() > deadline:
            raise LaunchError(f"{what} did not answer within {START_TIMEOUT} s")
        time.sleep(0.05)


def wait_until_up(url: str, process: subprocess.Popen, what: str) -> None:
    """Poll ``url`` until it answers 200; fail if the process exits or START_TIMEOUT passes."""

    def answers() -> bool:
        try:
            return requests.get(url, timeout=2).status_code == 200
        except (requests.ConnectionError, requests.Timeout):  # not listening yet, or no worker booted yet
            return False

    wait_until_answers(answers, process, f"{what} at {url}")


def interpolate(value: object) -> str:
    """A compose value with ``${NAME:-default}`` replaced by its default (the topology as shipped)."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", str(value))


def compose_api_command() -> list[str]:
    """The api service's command in docker-compose.yml, as argv."""
    command = COMPOSE["services"]["api"]["command"]
    return shlex.split(command) if isinstance(command, str) else list(command)


def compose_api_environment() -> dict[str, str]:
    """The api service's environment in docker-compose.yml (values as strings)."""
    return {name: interpolate(value) for name, value in COMPOSE["services"]["api"]["environment"].items()}


def kustomize(overlay: str) -> list[dict]:
    """The objects ``kubectl kustomize deploy/k8s/overlays/<overlay>`` renders (kubectl must be on PATH)."""
    out = subprocess.run(["kubectl", "kustomize", str(ROOT / "deploy" / "k8s" / "overlays" / overlay)],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return [document for document in yaml.safe_load_all(out) if document]


def container_environment(container: dict, objects: list[dict]) -> dict[str, str | None]:
    """A rendered container's variables as the kubelet layers them: each envFrom ConfigMap's data, then the
    literal env (None for a variable from a Secret: its value is not in the manifests)."""
    configmaps = {obj["metadata"]["name"]: obj["data"] for obj in objects if obj["kind"] == "ConfigMap"}
    env: dict[str, str | None] = {}
    for source in container.get("envFrom", []):
        env.update(configmaps[source["configMapRef"]["name"]])
    env.update({variable["name"]: variable.get("value") for variable in container.get("env", [])})
    return env


def kubectl_available() -> bool:
    return shutil.which("kubectl") is not None


DOCKERFILE = (ROOT / "Dockerfile").read_text()


def image_command() -> list[str]:
    """The Dockerfile's CMD, as argv."""
    [cmd] = re.findall(r"^CMD (\[.*\])$", DOCKERFILE, re.M)
    return json.loads(cmd)


def image_user() -> tuple[int, int, str]:
    """(uid, gid, name) of the user the Dockerfile creates and runs as."""
    [(uid, gid)] = re.findall(r"useradd\b[^\n]*--uid (\d+) --gid (\d+)", DOCKERFILE)
    assert re.search(rf"groupadd\b[^\n]*--gid {gid} ", DOCKERFILE)
    [user] = re.findall(r"^USER (\S+)$", DOCKERFILE, re.M)
    return int(uid), int(gid), user


def image_environment() -> dict[str, str]:
    """The Dockerfile's ENV: the container runtime sets it, under a manifest's variables."""
    lines = DOCKERFILE.replace("\\\n", " ").splitlines()
    return dict(word.split("=", 1) for line in lines if line.startswith("ENV ") for word in shlex.split(line[4:]))


# What a live server of this checkout serves unless its test names the models (ATTENTION_MODELS, in env or in
# this process's environment): MiniLM only, as the decoder adds ~4 s and ~600 MB to each start.
LIVE_MODELS = "all-minilm-l6-v2"


class Gunicorn:
    """One API instance on 127.0.0.1:<free port>, in its own session, until ``stop()`` (or its ``with`` ends).

    ``env`` adds or overrides variables (after ``workers``, which sets WEB_CONCURRENCY; without either,
    gunicorn's config starts one worker per core; :data:`LIVE_MODELS` without ATTENTION_MODELS); ``compose=True``
    starts from compose's api environment (but for CONTAINER_ONLY); a fresh
    ATTENTION_DATA_DIR, removed at the end, unless ``env`` names one (never the checkout's ./data, nor compose's
    /data volume);
    ``app`` replaces the WSGI app (module:name, importable from the repository root); ``root`` serves another
    checkout of the service instead, with its own venv (the benchmarks' ``--before``: the code before a change);
    ``preexec_fn`` runs in the child before gunicorn is exec'd (e.g. to join a cgroup, which the workers then
    inherit). A fresh metrics
    directory unless ``env`` names one. The output goes to a file (a pipe nobody reads fills up after a few
    hundred request lines and then blocks every worker); ``log()`` reads it.
    """

    data_dir: str | None = None  # made by this instance: removed at stop()
    root: Path = ROOT  # the checkout served (the benchmarks' --before serves another)

    def __init__(self, env: Mapping[str, str] | None = None, workers: int | None = None, *, compose: bool = False,
                 app: str = APP, root: Path = ROOT, preexec_fn: Callable[[], None] | None = None) -> None:
        self.port = free_port()
        self.root = root
        self.url = f"http://127.0.0.1:{self.port}"
        self.logfile = tempfile.NamedTemporaryFile(prefix="gunicorn-", suffix=".log", delete=False)  # noqa: SIM115
        argv = compose_api_command()
        gunicorn = GUNICORN if root == ROOT else root / ".venv" / "bin" / "gunicorn"  # the checkout's venv's
        argv[0], argv[-1] = str(gunicorn), app  # compose's app is service.wsgi:app
        environment = {name: value for name, value in os.environ.items() if name != "PROMETHEUS_MULTIPROC_DIR"}
        environment.update({name: value for name, value in compose_api_environment().items()
                            if name not in CONTAINER_ONLY} if compose else {})
        self.data_dir = None if "ATTENTION_DATA_DIR" in (env or {}) else tempfile.mkdtemp(prefix="attention-data-")
        environment.update({"ATTENTION_DATA_DIR": self.data_dir} if self.data_dir else {})
        environment.update({"HOST": "127.0.0.1", "PORT": str(self.port)})
        environment.update({"WEB_CONCURRENCY": str(workers)} if workers is not None else {})
        environment.update(env or {})
        if root == ROOT:  # a checkout before the decoder knows no packaged name
            environment.setdefault("ATTENTION_MODELS", LIVE_MODELS)
        self.start(argv, environment, preexec_fn)

    def start(self, argv: list[str], environment: Mapping[str, str],
              preexec_fn: Callable[[], None] | None = None) -> None:
        """Run ``argv`` from the repository root, in its own session, until /healthz answers and WEB_CONCURRENCY
        (default 1) workers exist; stopped, with its log in the error, if not. ``argv`` may be a launcher that
        execs gunicorn in the end (tests/live/test_pod.py): the pid must be the master's."""
        self.process = subprocess.Popen(argv, cwd=self.root, env=environment, stdout=self.logfile,
                                        stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=preexec_fn)
        try:
            wait_until_up(f"{self.url}/healthz", self.process, "gunicorn")
            self._wait_for_workers(int(environment.get("WEB_CONCURRENCY", 1)))  # at least that many
        except BaseException as exc:  # whatever happened, never leave the instance running
            log = self.log()
            self.stop()
            raise LaunchError(f"{exc}: {log[-3000:]}") from None

    @property
    def pid(self) -> int:
        """The master's process id."""
        return self.process.pid

    def _wait_for_workers(self, count: int, timeout: float = START_TIMEOUT) -> None:
        """Until all ``count`` workers exist: gunicorn spawns them with a random pause of up to 0.1 s
        each, so the first can answer before the last is forked (preload makes this visible)."""
        deadline = time.monotonic() + timeout
        while len(self.workers()) < count:
            if time.monotonic() > deadline:
                raise LaunchError(f"only {len(self.workers())} of {count} workers after {timeout} s")
            time.sleep(0.05)

    def workers(self) -> list[int]:
        """Pids of the master's web workers: its children in its own process group."""
        return [pid for pid in children(self.pid) if process_group(pid) == self.pid]

    def rss_kib(self) -> dict[int, int]:
        """Resident memory of each worker, KiB (VmRSS from /proc)."""
        sizes = {}
        for pid in self.workers():
            status = Path(f"/proc/{pid}/status").read_text()
            sizes[pid] = int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.M).group(1))
        return sizes

    def terminate(self) -> None:
        """SIGTERM to the master: graceful shutdown (workers finish their current request)."""
        self.process.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL to the master and its web workers at once: a crashed instance."""
        os.killpg(self.process.pid, signal.SIGKILL)

    def log(self) -> str:
        return Path(self.logfile.name).read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.terminate()
            try:
                self.process.wait(timeout=25)
            except subprocess.TimeoutExpired:
                self.kill()
                self.process.wait(timeout=5)
        with contextlib.suppress(ProcessLookupError):  # any worker left behind by a kill of the master
            os.killpg(self.process.pid, signal.SIGKILL)
        if self.data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
        self.logfile.close()
        os.unlink(self.logfile.name)

    def __enter__(self) -> Gunicorn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def render_nginx_conf(listen: int, upstreams: list[str], workdir: Path, host: str = "127.0.0.1") -> str:
    """deploy/nginx.conf with only ports and paths changed, each replacement checked to apply once.

    ``listen 80`` -> ``host`` (loopback; tests/hosts.py: a host's own address) and the port; the compose
    upstream ``server api:8000`` line -> one line per local instance; pid, logs and temp paths -> ``workdir``;
    ``user`` (root in CI) kept as root.
    """
    text = NGINX_CONF
    [upstream] = re.findall(r"^\s*server api:8000\b[^;]*;\n", text, re.M)
    servers = "".join(upstream.replace("api:8000", address) for address in upstreams)
    replacements = [
        ("_temp_path /tmp/nginx-", f"_temp_path {workdir}/nginx-"),
        (upstream, servers),
        ("listen 80;", f"listen {host}:{listen};"),
        ("pid /tmp/nginx.pid;", f"pid {workdir}/nginx.pid;"),
        ("error_log /dev/stderr warn;", f"error_log {workdir}/error.log warn;"),
        ("access_log /dev/stdout json;", f"access_log {workdir}/access.log json;"),
    ]
    for old, new in replacements:
        assert old in text, f"deploy/nginx.conf no longer has {old!r}: update render_nginx_conf"
        text = text.replace(old, new)
    if os.geteuid() == 0:  # as root, nginx's workers would switch to `nobody`, who cannot write workdir
        text = "user root;\n" + text
    return text


def end(process: subprocess.Popen, sig: signal.Signals, timeout: float = 10) -> None:
    """``sig`` to a server's process, then SIGKILL if it has not exited within ``timeout`` seconds."""
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


class Nginx:
    """Debian's nginx with the repo's config in front of ``upstreams`` (host:port), on a free port."""

    def __init__(self, upstreams: list[str]) -> None:
        binary = shutil.which("nginx") or "/usr/sbin/nginx"
        self.workdir = Path(tempfile.mkdtemp(prefix="nginx-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        conf = self.workdir / "nginx.conf"
        conf.write_text(render_nginx_conf(self.port, upstreams, self.workdir))
        self.process = subprocess.Popen([binary, "-c", str(conf), "-p", str(self.workdir), "-g", "daemon off;"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        try:
            wait_until_up(f"{self.url}/healthz", self.process, "nginx")
        except BaseException as exc:  # never leave nginx running
            self.stop()
            raise LaunchError(f"{exc}: {self.error_log()[-3000:]}") from None

    def error_log(self) -> str:
        path = self.workdir / "error.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def access_log(self) -> list[dict]:
        path = self.workdir / "access.log"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def stop(self) -> None:
        end(self.process, signal.SIGQUIT)  # nginx's graceful stop
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Nginx:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def nginx_available() -> bool:
    return bool(shutil.which("nginx") or Path("/usr/sbin/nginx").exists())


class RedisServer:
    """Debian's redis-server on 127.0.0.1:<free port> for the batch-job tests' queue, its files and log in a fresh
    directory, removed with it at ``stop()``. By default nothing is persisted (no RDB snapshots, no AOF);
    ``appendonly``: an append-only file, fsynced every second as compose's, so that :meth:`kill` then
    :meth:`restart` keeps what it acknowledged; ``password``: its ``requirepass``."""

    def __init__(self, *, appendonly: bool = False, password: str | None = None) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="redis-"))
        self.port = free_port()
        self.password = password
        self.command = [shutil.which("redis-server") or "/usr/bin/redis-server", "--port", str(self.port),
                        "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes" if appendonly else "no",
                        "--dir", str(self.workdir), "--logfile", str(self.workdir / "redis.log"),
                        *(["--requirepass", password] if password else [])]
        self.process = self._start()

    def _start(self) -> subprocess.Popen:
        process = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        try:
            wait_until_answers(self.ping, process, f"redis-server on port {self.port}")
        except BaseException as exc:  # never leave redis-server running
            log = self.log()
            end(process, signal.SIGKILL)
            shutil.rmtree(self.workdir, ignore_errors=True)
            raise LaunchError(f"{exc}: {log[-3000:]}") from None
        return process

    @property
    def url(self) -> str:
        """For redis-py and Huey (``ATTENTION_QUEUE_URL``): database 0, without the password."""
        return f"redis://127.0.0.1:{self.port}/0"

    def ping(self) -> bool:
        """Whether the server answers PING now (:func:`redis_answers`)."""
        return redis_answers("127.0.0.1", self.port)

    def pause(self) -> None:
        """SIGSTOP: the server stays connected and listening, and answers nothing (a silent Redis)."""
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT: it answers again, as it was."""
        self.process.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL: gone at once, saving nothing more."""
        self.process.kill()
        self.process.wait(timeout=10)

    def restart(self) -> None:
        """Start it again on the same port, directory and files (its append-only file, if it keeps one)."""
        self.process = self._start()

    def log(self) -> str:
        path = self.workdir / "redis.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        self.resume()  # a paused server would not see the SIGTERM until the SIGKILL
        end(self.process, signal.SIGTERM)  # redis-server saves nothing (--save ''), then exits
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def redis_answers(host: str, port: int) -> bool:
    """Whether a Redis at ``host:port`` answers PING now (RESP's inline form, over a plain socket): PONG, or
    NOAUTH's refusal when it wants a password."""
    try:
        with socket.create_connection((host, port), timeout=2) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith((b"+PONG", b"-NOAUTH"))
    except OSError:  # not listening yet
        return False


def redis_available() -> bool:
    return bool(shutil.which("redis-server") or Path("/usr/bin/redis-server").exists())


def in_ci() -> bool:
    """Whether this runs in CI (CI set to anything but empty, 0 or false; .ci/run sets CI=true): there, tests
    that need a tool the CI installs (nginx, chromium, redis-server) fail when it is missing instead of skipping."""
    return os.environ.get("CI", "").lower() not in ("", "0", "false")

