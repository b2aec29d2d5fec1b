"""deploy/k8s (kustomize) and deploy/kserve: rendered as kubectl renders them, every object validated against the
Kubernetes and KServe schemas with unknown fields refused, and every setting checked against the service and the
image (no cluster here: tests/live/test_pod.py runs the pod's command under its restrictions)."""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import re
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml

from service.jobs import queue
from service.settings import VARIABLES, JobSettings, Limits, from_env
from tests.harness import (
    COMPOSE,
    ROOT,
    container_environment,
    image_command,
    image_environment,
    image_user,
    in_ci,
    kubectl_available,
    kustomize,
)

OVERLAYS = ("dev", "prod")
KUBERNETES = ("1.30", kubernetes_validate.latest_version())  # the oldest version the manifests need, the newest
SETTINGS = ROOT / "deploy" / "k8s" / "base" / "settings.env"
INFERENCE_SERVICE = ROOT / "deploy" / "kserve" / "inferenceservice.yaml"
KSERVE_CRD = ROOT.parent / "shared" / "kserve" / "inferenceservices-crd.yaml"
KEDA_CRDS = {kind: ROOT.parent / "shared" / "keda" / f"keda.sh_{kind.lower()}s.yaml"
             for kind in ("ScaledObject", "TriggerAuthentication")}  # KEDA's kinds, by their CRDs' file names
API, WORKER = "attention", "attention-worker"  # the Deployments (and their autoscalers and network policies)
DEPLOYMENTS = (API, WORKER)
PASSWORD = "ATTENTION_QUEUE_PASSWORD"
FS_GROUP = ("fsGroup", "fsGroupChangePolicy")  # the shared volume's group: only where that volume is mounted

Objects = dict[tuple[str, str], dict]


@functools.cache
def rendered(name: str) -> Objects:
    """The overlay's objects by (kind, name), as kubectl renders them."""
    if not kubectl_available():
        if in_ci():
            pytest.fail("kubectl (with kustomize built in) is not on PATH: the manifests cannot be rendered")
        pytest.skip("kubectl (with kustomize built in) is not on PATH")
    objects = kustomize(name)
    by_key = {(obj["kind"], obj["metadata"]["name"]): obj for obj in objects}
    assert len(by_key) == len(objects), "one object per kind and name"
    return by_key


def only(objects: Objects, kind: str) -> dict:
    """The one object of ``kind`` (the generated ConfigMap's name carries a hash)."""
    [found] = [obj for (each, _), obj in objects.items() if each == kind]
    return found


@pytest.fixture(params=OVERLAYS)
def overlay(request) -> tuple[str, Objects]:
    """(overlay name, its rendered objects by kind and name)."""
    return request.param, rendered(request.param)


@pytest.fixture(params=DEPLOYMENTS)
def deployment(request) -> str:
    """The name of one of the Deployments: the API's or the batch-job workers'."""
    return request.param


@pytest.fixture(scope="module")
def isvc() -> dict:
    return yaml.safe_load(INFERENCE_SERVICE.read_text())


def pod_spec(objects: Objects, name: str = API) -> dict:
    return objects["Deployment", name]["spec"]["template"]["spec"]


def container(objects: Objects, name: str = API) -> dict:
    [single] = pod_spec(objects, name)["containers"]
    return single


def settings_file() -> dict[str, str]:
    """settings.env as kustomize reads it: NAME=value lines, # comments."""
    lines = [line for line in SETTINGS.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


def environment(objects: Objects, name: str = API) -> dict[str, str | None]:
    """The container's variables: the generated ConfigMap's (envFrom) then its literal env (None: from a Secret)."""
    [source] = container(objects, name)["envFrom"]
    assert source["configMapRef"]["name"] == only(objects, "ConfigMap")["metadata"]["name"]  # hashed by kustomize
    return container_environment(container(objects, name), list(objects.values()))


def service_variables() -> set[str]:
    """Every environment variable the service reads (service.settings declares each one)."""
    return set(VARIABLES)


def project_version() -> str:
    [version] = re.findall(r'^version = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(), re.M)
    return version


def worker_command() -> list[str]:
    """The console script pyproject.toml ships for service.jobs.worker:main, as a command."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    return [name for name, target in scripts.items() if target == "service.jobs.worker:main"]


def volumes_by_mount(objects: Objects, name: str) -> dict[str, dict]:
    """A Deployment's container mounts: mountPath -> the pod's volume it mounts."""
    volumes = {volume["name"]: volume for volume in pod_spec(objects, name)["volumes"]}
    return {mount["mountPath"]: volumes[mount["name"]] for mount in container(objects, name)["volumeMounts"]}


# --- schemas -------------------------------------------------------------------------------------------------------

def validate(obj: dict, version: str) -> None:
    """kubernetes-validate, strict (unknown fields refused). A kind it has no schema for raises
    SchemaNotFoundError, which fails the test: its command line only warns about one."""
    kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("version", KUBERNETES)
def test_every_rendered_object_is_valid_kubernetes(overlay, version):
    _, objects = overlay
    for obj in objects.values():
        if obj["kind"] not in KEDA_CRDS:  # KEDA's kinds: their CRDs' schemas (below)
            validate(obj, version)


def test_keda_s_objects_are_valid_for_keda_s_crds(overlay):
    name, objects = overlay
    found = [obj for obj in objects.values() if obj["kind"] in KEDA_CRDS]
    assert sorted(obj["kind"] for obj in found) == ([] if name == "dev" else sorted(KEDA_CRDS))
    for obj in found:
        assert obj["apiVersion"] == "keda.sh/v1alpha1"
        assert crd_errors(keda_schema(obj["kind"]), obj) == []
        validate({"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]}, KUBERNETES[0])


def test_the_keda_validation_refuses_unknown_fields_and_wrong_types():
    scaled = copy.deepcopy(rendered("prod")["ScaledObject", WORKER])
    scaled["spec"]["triggers"][0]["listName"] = "misplaced"  # a trigger's parameter outside its metadata
    assert any("listName" in error for error in crd_errors(keda_schema("ScaledObject"), scaled))
    wrong = copy.deepcopy(rendered("prod")["ScaledObject", WORKER])
    wrong["spec"]["minReplicaCount"] = "one"
    assert crd_errors(keda_schema("ScaledObject"), wrong)
    auth = copy.deepcopy(rendered("prod")["TriggerAuthentication", "attention-redis"])
    auth["spec"]["secretTargetRef"][0]["secret"] = "attention-redis"
    assert crd_errors(keda_schema("TriggerAuthentication"), auth)


def test_the_validation_refuses_unknown_fields_and_kinds():
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"}, "spec": {"ports": [{"port": 1}]}}
    validate(service, KUBERNETES[0])
    with pytest.raises(kubernetes_validate.ValidationError):
        validate({**service, "spec": {"ports": [{"port": 1, "targetPorts": 8000}]}}, KUBERNETES[0])
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        validate({"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "metadata": {}}, "1.30")


def strict(schema: object) -> object:
    """A CRD's OpenAPI schema with every object that lists its properties closed to others (what the API server's
    strict field validation does), except where the CRD keeps unknown fields on purpose."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {key: strict(value) for key, value in schema.items()}
    if ("properties" in schema and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")):
        closed["additionalProperties"] = False
    return closed


def crd_schema(path: Path, version: str) -> dict:
    """The strict schema of ``version`` in the CRD at ``path`` (skipped, saying so, where it is not beside the
    repository)."""
    if not path.exists():
        pytest.skip(f"the CRD is not beside the repository ({path})")
    crd = yaml.safe_load(path.read_text())
    [served] = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return strict(served["schema"]["openAPIV3Schema"])


@pytest.fixture(scope="module")
def kserve_schema() -> dict:
    return crd_schema(KSERVE_CRD, "v1beta1")


@functools.cache
def keda_schema(kind: str) -> dict:
    return crd_schema(KEDA_CRDS[kind], "v1alpha1")


def crd_errors(schema: dict, obj: dict) -> list[str]:
    validator = jsonschema.Draft7Validator(schema)
    return [f"{'/'.join(map(str, error.absolute_path))}: {error.message}" for error in validator.iter_errors(obj)]


def test_the_inference_service_is_valid_for_kserve(kserve_schema, isvc):
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1" and isvc["kind"] == "InferenceService"
    assert crd_errors(kserve_schema, isvc) == []
    # The CRD leaves metadata to the API server (ObjectMeta): check it as any object's metadata.
    validate({"apiVersion": "v1", "kind": "ConfigMap", "metadata": isvc["metadata"]}, KUBERNETES[0])


def test_the_kserve_validation_refuses_unknown_fields_and_wrong_types(kserve_schema, isvc):
    unknown = copy.deepcopy(isvc)
    unknown["spec"]["predictor"]["containers"][0]["probe"] = {}
    assert any("probe" in error for error in crd_errors(kserve_schema, unknown))
    wrong = copy.deepcopy(isvc)
    wrong["spec"]["predictor"]["scaleMetric"] = "gpu"
    assert crd_errors(kserve_schema, wrong)


# --- the pods ------------------------------------------------------------------------------------------------------

def test_the_pods_run_the_image_commands_as_the_image_user_with_nothing_more(overlay, deployment):
    _, objects = overlay
    pod, api = pod_spec(objects, deployment), container(objects, deployment)
    uid, gid, user = image_user()
    assert user == "app" and pod["securityContext"]["runAsUser"] == uid == 10001
    assert pod["securityContext"]["runAsGroup"] == gid == 10001 and pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    # the shared volume's files belong to the image's group, where the volume's driver applies fsGroup
    assert (pod["securityContext"]["fsGroup"], pod["securityContext"]["fsGroupChangePolicy"]) == (gid, "OnRootMismatch")
    assert api["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                      "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}
    assert api["command"] == {API: image_command(), WORKER: worker_command()}[deployment]
    assert worker_command() == ["attention-worker"]
    assert api["image"] == f"attention-service:{project_version()}"
    assert pod["automountServiceAccountToken"] is False
    account = only(objects, "ServiceAccount")
    assert pod["serviceAccountName"] == account["metadata"]["name"] and account["automountServiceAccountToken"] is False
    assert pod["enableServiceLinks"] is False  # else ATTENTION_* variables of the Service would reach the service


def test_the_worker_pod_is_the_api_pod_but_for_command_resources_and_serving(overlay):
    _, objects = overlay
    api, worker = pod_spec(objects, API), pod_spec(objects, WORKER)
    for field in ("securityContext", "serviceAccountName", "automountServiceAccountToken", "enableServiceLinks",
                  "volumes"):
        assert worker[field] == api[field], field
    for field in ("image", "imagePullPolicy", "securityContext", "volumeMounts"):
        assert container(objects, WORKER)[field] == container(objects, API)[field], field
    # it serves no HTTP: no port, no probe, no Service; and it needs no API keys, only the Redis password
    assert not {"ports", "startupProbe", "readinessProbe", "livenessProbe"} & set(container(objects, WORKER))
    assert container(objects, WORKER)["env"] == [redis_password(objects, API)]
    assert environment(objects, WORKER) == {**only(objects, "ConfigMap")["data"], PASSWORD: None}


def test_the_writable_paths_are_a_memory_backed_tmp_and_the_shared_jobs_volume(overlay, deployment):
    _, objects = overlay
    mounts = volumes_by_mount(objects, deployment)
    data = environment(objects, deployment)["ATTENTION_DATA_DIR"]
    assert set(mounts) == {"/tmp", data}  # tempfile's directory (metrics, heartbeats), and the jobs' files
    assert mounts["/tmp"]["emptyDir"]["medium"] == "Memory" and mounts["/tmp"]["emptyDir"]["sizeLimit"]
    claim = only(objects, "PersistentVolumeClaim")
    assert mounts[data]["persistentVolumeClaim"] == {"claimName": claim["metadata"]["name"]}
    env = environment(objects, deployment)
    assert "TMPDIR" not in env and "PROMETHEUS_MULTIPROC_DIR" not in env


def test_the_jobs_volume_is_one_claim_every_node_may_mount_read_write(overlay):
    _, objects = overlay
    claim = only(objects, "PersistentVolumeClaim")["spec"]
    assert claim["accessModes"] == ["ReadWriteMany"]  # API and worker pods on any nodes, all writing
    assert claim["resources"]["requests"]["storage"] == "20Gi"
    assert "storageClassName" not in claim  # the cluster's default, or an overlay's class offering ReadWriteMany


def test_resources_are_requested_limited_and_size_the_workers(overlay):
    name, objects = overlay
    resources = container(objects)["resources"]
    assert resources["requests"] == resources["limits"]  # Guaranteed QoS
    cpus = float(resources["limits"]["cpu"])
    assert cpus == math.ceil(cpus) == {"dev": 1, "prod": 2}[name]  # the quota gunicorn sizes its workers by
    assert resources["limits"]["memory"].endswith("Mi") or resources["limits"]["memory"].endswith("Gi")
    assert "WEB_CONCURRENCY" not in environment(objects)
    # a batch-job worker computes one chunk at a time on one BLAS thread: one CPU
    worker = container(objects, WORKER)["resources"]
    assert worker["requests"] == worker["limits"] == {"cpu": "1", "memory": "1536Mi"}


def mebibytes(quantity: str) -> float:
    """A Kubernetes (2Gi, 1536Mi) or compose (2g, 1536m) memory quantity in MiB."""
    number, unit = re.fullmatch(r"(\d+)([MG])i?", quantity, re.I).groups()
    return int(number) * (1024 if unit.upper() == "G" else 1)


def test_the_memory_limits_agree_everywhere_and_hold_the_measured_models(isvc):
    """The same containers get the same memory in compose, Kubernetes and KServe, above what benchmarks/memory.py
    measured with both packaged models (PSS: the master and two workers 838 MiB, a job worker 738 MiB) by at least
    the largest answer a worker may build (~570 MB, docs/batch.md) per worker."""
    objects = rendered("prod")
    web = {mebibytes(container(objects)["resources"]["limits"]["memory"]),
           mebibytes(isvc["spec"]["predictor"]["containers"][0]["resources"]["limits"]["memory"]),
           mebibytes(COMPOSE["services"]["api"]["deploy"]["resources"]["limits"]["memory"])}
    job = {mebibytes(container(objects, WORKER)["resources"]["limits"]["memory"]),
           mebibytes(COMPOSE["services"]["worker"]["deploy"]["resources"]["limits"]["memory"])}
    assert len(web) == len(job) == 1
    assert web.pop() >= 838 + 2 * 570 and job.pop() >= 738 + 570


def test_probes_use_the_service_port_and_paths_the_app_answers(overlay, client):
    _, objects = overlay
    api = container(objects)
    [port] = api["ports"]
    assert port == {"name": "http", "containerPort": int(environment(objects)["PORT"]), "protocol": "TCP"}
    probes = {kind: api[kind]["httpGet"] for kind in ("startupProbe", "readinessProbe", "livenessProbe")}
    assert {kind: probe["path"] for kind, probe in probes.items()} == {
        "startupProbe": "/readyz", "readinessProbe": "/readyz", "livenessProbe": "/healthz"}
    for probe in probes.values():
        assert probe["port"] == port["name"]
        assert client.get(probe["path"]).status_code == 200
    template = objects["Deployment", API]["spec"]["template"]["metadata"]["annotations"]
    assert template["prometheus.io/scrape"] == "true" and int(template["prometheus.io/port"]) == port["containerPort"]
    assert client.get(template["prometheus.io/path"]).status_code == 200
    assert "annotations" not in objects["Deployment", WORKER]["spec"]["template"]["metadata"]  # nothing to scrape


def test_the_grace_period_covers_the_pre_stop_pause_and_the_graceful_timeout(overlay):
    _, objects = overlay
    pause = container(objects)["lifecycle"]["preStop"]["sleep"]["seconds"]
    graceful = int(environment(objects)["GUNICORN_GRACEFUL_TIMEOUT"])
    assert pause > 0 and pod_spec(objects)["terminationGracePeriodSeconds"] > pause + graceful


def test_a_stopping_worker_first_asks_huey_for_its_graceful_stop_and_has_time_for_a_chunk(overlay):
    _, objects = overlay
    command = container(objects, WORKER)["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["python", "-c"] and "os.kill(1, signal.SIGINT)" in command[2]  # tests/live/test_pod.py
    [pause] = map(float, re.findall(r"time\.sleep\(([\d.]+)\)", command[2]))
    env = environment(objects, WORKER)
    # a chunk is at most a /v1/batch request's work, which gunicorn bounds by GUNICORN_TIMEOUT
    grace = pod_spec(objects, WORKER)["terminationGracePeriodSeconds"]
    assert grace > pause + int(env["GUNICORN_TIMEOUT"]) > int(env["GUNICORN_GRACEFUL_TIMEOUT"])


def test_every_variable_set_is_one_the_service_reads(overlay, deployment):
    _, objects = overlay
    read = service_variables()
    assert {"API_KEYS", "HOST", "GUNICORN_GRACEFUL_TIMEOUT", "ATTENTION_MAX_D_MODEL", "ATTENTION_MODELS"} <= read
    assert set(environment(objects, deployment)) - read == set()
    if deployment == API:
        [secret] = [item for item in container(objects)["env"] if item["name"] == "API_KEYS"]
        assert secret["valueFrom"]["secretKeyRef"]["optional"] is True  # no Secret: auth off, the pod still starts


def redis_password(objects: Objects, name: str) -> dict:
    """The container's ATTENTION_QUEUE_PASSWORD entry."""
    [entry] = [item for item in container(objects, name)["env"] if item["name"] == PASSWORD]
    return entry


def test_both_pods_read_the_redis_password_from_one_secret_that_must_exist(overlay, deployment):
    _, objects = overlay
    reference = redis_password(objects, deployment)["valueFrom"]["secretKeyRef"]
    assert reference == {"name": "attention-redis", "key": "password"}  # not optional: no Secret, no pod
    assert PASSWORD not in only(objects, "ConfigMap")["data"]  # never in the ConfigMap
    assert urlsplit(settings_file()["ATTENTION_QUEUE_URL"]).password is None  # nor in the URL


def test_the_settings_hold_every_limit_at_the_service_default(environ):
    settings = settings_file()
    limits = {f.name: f.metadata["variable"] for f in dataclasses.fields(Limits)}
    assert {name: int(settings[variable]) for name, variable in limits.items()} == Limits().as_dict()
    for name, value in settings.items():
        environ.setenv(name, value)
    assert from_env().limits == Limits()


def test_the_settings_send_the_batches_to_the_worker_pods_through_redis_and_the_shared_volume():
    settings = settings_file()
    assert settings["ATTENTION_EMBEDDED_WORKERS"] == "0"  # the worker Deployment computes; the API stores, enqueues
    assert settings["ATTENTION_DATA_DIR"] == image_environment()["ATTENTION_DATA_DIR"] == "/data"
    queue = urlsplit(settings["ATTENTION_QUEUE_URL"])
    assert (queue.scheme, queue.hostname, queue.port) == ("redis", "attention-redis", 6379)  # a Service of yours


# --- the objects around the pods -----------------------------------------------------------------------------------

def selects(selector: dict, labels: dict) -> bool:
    return selector.items() <= labels.items()


def pod_labels(objects: Objects, name: str) -> dict:
    return objects["Deployment", name]["spec"]["template"]["metadata"]["labels"]


def test_selectors_match_the_pods_and_the_autoscaler_and_budget_target_the_deployment(overlay):
    _, objects = overlay
    deployment = objects["Deployment", API]
    labels, workers = pod_labels(objects, API), pod_labels(objects, WORKER)
    for name in DEPLOYMENTS:
        assert selects(objects["Deployment", name]["spec"]["selector"]["matchLabels"], pod_labels(objects, name))
    assert not selects(deployment["spec"]["selector"]["matchLabels"], workers)  # neither owns the other's pods
    assert not selects(objects["Deployment", WORKER]["spec"]["selector"]["matchLabels"], labels)
    service = only(objects, "Service")
    assert selects(service["spec"]["selector"], labels) and not selects(service["spec"]["selector"], workers)
    assert service["spec"]["ports"][0]["targetPort"] == container(objects)["ports"][0]["name"]
    policy = objects["NetworkPolicy", API]["spec"]
    assert selects(policy["podSelector"]["matchLabels"], labels) and policy["policyTypes"] == ["Ingress"]
    assert not selects(policy["podSelector"]["matchLabels"], workers)
    assert policy["ingress"] == [{"ports": [{"port": container(objects)["ports"][0]["containerPort"],
                                             "protocol": "TCP"}]}]
    for name in DEPLOYMENTS:
        if ("HorizontalPodAutoscaler", name) in objects:
            target = objects["HorizontalPodAutoscaler", name]["spec"]["scaleTargetRef"]
            assert target == {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}
    if ("PodDisruptionBudget", API) in objects:
        budget = objects["PodDisruptionBudget", API]["spec"]["selector"]["matchLabels"]
        assert selects(budget, labels) and not selects(budget, workers)
    for constraint in pod_spec(objects).get("topologySpreadConstraints", []):
        assert selects(constraint["labelSelector"]["matchLabels"], labels)


def test_nothing_reaches_the_workers_and_every_pod_may_reach_redis(overlay):
    _, objects = overlay
    policy = objects["NetworkPolicy", WORKER]["spec"]
    assert selects(policy["podSelector"]["matchLabels"], pod_labels(objects, WORKER))
    assert not selects(policy["podSelector"]["matchLabels"], pod_labels(objects, API))
    assert policy["policyTypes"] == ["Ingress"] and "ingress" not in policy  # Ingress with no rule: none allowed
    # No policy restricts egress: Redis (ATTENTION_QUEUE_URL, outside these manifests) is the cluster's to allow.
    policies = [obj["spec"] for (kind, _), obj in objects.items() if kind == "NetworkPolicy"]
    assert len(policies) == 2 and all("Egress" not in policy["policyTypes"] for policy in policies)


def test_dev_runs_one_replica_without_autoscaler_or_budget():
    objects = rendered("dev")
    for name in DEPLOYMENTS:
        assert objects["Deployment", name]["spec"]["replicas"] == 1
    assert not [kind for kind, _ in objects if kind in ("HorizontalPodAutoscaler", "PodDisruptionBudget")]


def test_prod_keeps_two_replicas_on_different_nodes_and_rolls_out_with_none_down():
    objects = rendered("prod")
    deployment, hpa = objects["Deployment", API]["spec"], objects["HorizontalPodAutoscaler", API]["spec"]
    assert "replicas" not in deployment  # the HPA's: kubectl apply would reset a count set here
    assert hpa["minReplicas"] >= 2 and hpa["maxReplicas"] == 20
    assert hpa["metrics"] == [{"type": "Resource", "resource": {
        "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}}}]
    assert deployment["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    budget = objects["PodDisruptionBudget", API]["spec"]
    assert budget["maxUnavailable"] == 1 < hpa["minReplicas"] and budget["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    constraints = deployment["template"]["spec"]["topologySpreadConstraints"]
    spread = {constraint["topologyKey"]: constraint["whenUnsatisfiable"] for constraint in constraints}
    assert all(constraint["nodeTaintsPolicy"] == "Honor" for constraint in constraints)  # tainted nodes: no domain
    assert spread == {"kubernetes.io/hostname": "DoNotSchedule", "topology.kubernetes.io/zone": "ScheduleAnyway"}


def test_prod_scales_the_workers_with_keda_on_the_queue_the_service_builds(tmp_path):
    objects = rendered("prod")
    workers, scaled = objects["Deployment", WORKER]["spec"], objects["ScaledObject", WORKER]["spec"]
    assert "replicas" not in workers  # KEDA's HPA owns the count
    assert ("HorizontalPodAutoscaler", WORKER) not in objects  # KEDA refuses a target another HPA manages
    assert objects["HorizontalPodAutoscaler", API]["spec"]["scaleTargetRef"]["name"] == API  # the API keeps its own
    assert scaled["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": WORKER}
    # the scaler counts queued tasks only and the reaper runs in the workers: never none (keda.yaml says why)
    assert scaled["minReplicaCount"] == 1 and scaled["maxReplicaCount"] == 10
    [trigger] = scaled["triggers"]
    assert trigger["type"] == "redis"
    url = urlsplit(settings_file()["ATTENTION_QUEUE_URL"])
    built = queue.build(JobSettings(data_dir=tmp_path, queue_url=url.geturl()), Limits())  # opens no connection
    assert trigger["metadata"]["listName"] == built.huey.storage.queue_key == "huey.redis.attentionjobs"
    assert trigger["metadata"]["address"] == f"{url.hostname}:{url.port}"
    assert trigger["metadata"]["databaseIndex"] == url.path.strip("/")
    assert trigger["metadata"]["enableTLS"] == str(url.scheme == "rediss").lower()
    assert int(trigger["metadata"]["listLength"]) > 0 and "password" not in trigger["metadata"]
    auth = objects["TriggerAuthentication", trigger["authenticationRef"]["name"]]["spec"]
    [secret] = auth["secretTargetRef"]
    reference = redis_password(objects, WORKER)["valueFrom"]["secretKeyRef"]
    assert secret == {"parameter": "password", "name": reference["name"], "key": reference["key"]}
    assert workers["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}


def test_huey_s_redis_queue_is_the_sorted_set_keda_counts(tmp_path):
    """The scaler counts a sorted set with ZCARD: the service's queue must be Huey's priority queue (a list would
    be counted too, but the tasks' priorities would go)."""
    built = queue.build(JobSettings(data_dir=tmp_path, queue_url="redis://attention-redis:6379/0"), Limits())
    assert type(built.huey.storage).__name__ == "PriorityRedisStorage" and built.huey.storage.priority


# --- KServe --------------------------------------------------------------------------------------------------------

def test_the_inference_service_is_a_standard_mode_custom_predictor_scaled_by_hpa(isvc):
    annotations = isvc["metadata"]["annotations"]
    assert annotations["serving.kserve.io/deploymentMode"] == "Standard"
    assert annotations["serving.kserve.io/autoscalerClass"] == "hpa"
    predictor = isvc["spec"]["predictor"]
    assert (predictor["scaleMetric"], predictor["scaleTarget"]) == ("cpu", 70)
    assert predictor["minReplicas"] >= 2 and predictor["maxReplicas"] == 20
    [api] = predictor["containers"]
    assert api["name"] == "kserve-container"
    assert api["ports"] == [{"containerPort": 8000, "protocol": "TCP"}]


def test_the_inference_service_pod_is_the_deployments_pod_without_the_jobs_volume(isvc, client, environ):
    objects = rendered("prod")
    pod, api = pod_spec(objects), container(objects)
    predictor = isvc["spec"]["predictor"]
    [served] = predictor["containers"]
    for field in ("image", "command", "resources", "securityContext", "lifecycle"):
        assert served[field] == api[field], field
    for field in ("terminationGracePeriodSeconds", "automountServiceAccountToken", "enableServiceLinks"):
        assert predictor[field] == pod[field], field
    # No shared volume, hence no fsGroup for it: the synchronous API only (the manifest says why)
    assert predictor["securityContext"] == {k: v for k, v in pod["securityContext"].items() if k not in FS_GROUP}
    data = environment(objects)["ATTENTION_DATA_DIR"]
    assert served["volumeMounts"] == [m for m in api["volumeMounts"] if m["mountPath"] != data]
    assert predictor["volumes"] == [v for v in pod["volumes"] if "persistentVolumeClaim" not in v]
    assert predictor["annotations"] == objects["Deployment", API]["spec"]["template"]["metadata"]["annotations"]
    assert predictor["deploymentStrategy"] == objects["Deployment", API]["spec"]["strategy"]
    settings = environment(objects)
    literal = {item["name"]: item.get("value") for item in served["env"]}
    jobs_off = {"ATTENTION_BATCH_JOBS": "0"}  # its one setting of its own: the Deployment serves batch jobs
    assert literal == {**{name: settings[name] for name in literal if name not in jobs_off}, **jobs_off}
    # no workers beside it (each replica would keep a queue of its own), and no shared queue: the jobs endpoints
    # answer 501 saying where batch jobs run (tests/unit/edge/jobs/test_gate.py)
    assert literal["ATTENTION_EMBEDDED_WORKERS"] == "0" and "ATTENTION_QUEUE_URL" not in literal
    assert "ATTENTION_BATCH_JOBS" not in settings
    for name, value in literal.items():
        if value is not None:
            environ.setenv(name, value)
    assert not from_env().jobs.served
    assert int(literal["PORT"]) == served["ports"][0]["containerPort"]
    for kind, path in (("startupProbe", "/v2/health/ready"), ("readinessProbe", "/v2/health/ready"),
                       ("livenessProbe", "/v2/health/live")):
        assert served[kind]["httpGet"] == {"path": path, "port": 8000}
        assert client.get(path).status_code == 200
        assert {k: v for k, v in served[kind].items() if k != "httpGet"} == {
            k: v for k, v in api[kind].items() if k != "httpGet"}
