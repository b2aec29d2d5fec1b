"""deploy/k8s (kustomize) and deploy/kserve: rendered as kubectl renders them, every object validated against the
Kubernetes and KServe schemas with unknown fields refused, and every setting checked against the service and the
image (no cluster here: tests/live/test_pod.py runs the pod's command under its restrictions)."""

from __future__ import annotations

import copy
import functools
import math
import re

import jsonschema
import kubernetes_validate
import pytest
import yaml

from service.operations import catalogue
from service.operations.limits import Limits, env_name
from tests.harness import (
    ROOT,
    container_environment,
    image_command,
    image_user,
    in_ci,
    kubectl_available,
    kustomize,
    read_variables,
)

OVERLAYS = ("dev", "prod")
KUBERNETES = ("1.30", kubernetes_validate.latest_version())  # the oldest version the manifests need, the newest
SETTINGS = ROOT / "deploy" / "k8s" / "base" / "settings.env"
INFERENCE_SERVICE = ROOT / "deploy" / "kserve" / "inferenceservice.yaml"
KSERVE_CRD = ROOT.parent / "shared" / "kserve" / "inferenceservices-crd.yaml"
BLAS_VARIABLES = {"OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"}  # read by the BLAS libraries

@functools.cache
def rendered(name: str) -> dict[str, dict]:
    """The overlay's objects by kind, as kubectl renders them; each kind appears at most once."""
    if not kubectl_available():
        if in_ci():
            pytest.fail("kubectl (with kustomize built in) is not on PATH: the manifests cannot be rendered")
        pytest.skip("kubectl (with kustomize built in) is not on PATH")
    objects = kustomize(name)
    by_kind = {obj["kind"]: obj for obj in objects}
    assert len(by_kind) == len(objects), "one object per kind"
    return by_kind


@pytest.fixture(params=OVERLAYS)
def overlay(request) -> tuple[str, dict[str, dict]]:
    """(overlay name, its rendered objects by kind)."""
    return request.param, rendered(request.param)


@pytest.fixture(scope="module")
def isvc() -> dict:
    return yaml.safe_load(INFERENCE_SERVICE.read_text())


def pod_spec(objects: dict[str, dict]) -> dict:
    return objects["Deployment"]["spec"]["template"]["spec"]


def container(objects: dict[str, dict]) -> dict:
    [only] = pod_spec(objects)["containers"]
    return only


def settings_file() -> dict[str, str]:
    """settings.env as kustomize reads it: NAME=value lines, # comments."""
    lines = [line for line in SETTINGS.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


def environment(objects: dict[str, dict]) -> dict[str, str | None]:
    """The container's variables: the generated ConfigMap's (envFrom) then its literal env (None: from a Secret)."""
    [source] = container(objects)["envFrom"]
    assert source["configMapRef"]["name"] == objects["ConfigMap"]["metadata"]["name"]  # hashed, as kustomize renames
    return container_environment(container(objects), list(objects.values()))


def service_variables() -> set[str]:
    """Every environment variable the service reads: the names in its os.environ calls, the limits'
    ATTENTION_MAX_* names, ATTENTION_MODELS, and the BLAS libraries' thread counts."""
    return read_variables() | {env_name(name) for name in Limits().as_dict()} | {catalogue.VARIABLE} | BLAS_VARIABLES


def project_version() -> str:
    [version] = re.findall(r'^version = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(), re.M)
    return version


# --- schemas -------------------------------------------------------------------------------------------------------

def validate(obj: dict, version: str) -> None:
    """kubernetes-validate, strict (unknown fields refused). A kind it has no schema for raises
    SchemaNotFoundError, which fails the test: its command line only warns about one."""
    kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("version", KUBERNETES)
def test_every_rendered_object_is_valid_kubernetes(overlay, version):
    _, objects = overlay
    for obj in objects.values():
        validate(obj, version)


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


@pytest.fixture(scope="module")
def kserve_schema() -> dict:
    if not KSERVE_CRD.exists():
        pytest.skip(f"KServe's CRD is not beside the repository ({KSERVE_CRD})")
    crd = yaml.safe_load(KSERVE_CRD.read_text())
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == "v1beta1"]
    return strict(version["schema"]["openAPIV3Schema"])


def kserve_errors(schema: dict, isvc: dict) -> list[str]:
    validator = jsonschema.Draft7Validator(schema)
    return [f"{'/'.join(map(str, error.absolute_path))}: {error.message}" for error in validator.iter_errors(isvc)]


def test_the_inference_service_is_valid_for_kserve(kserve_schema, isvc):
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1" and isvc["kind"] == "InferenceService"
    assert kserve_errors(kserve_schema, isvc) == []
    # The CRD leaves metadata to the API server (ObjectMeta): check it as any object's metadata.
    validate({"apiVersion": "v1", "kind": "ConfigMap", "metadata": isvc["metadata"]}, KUBERNETES[0])


def test_the_kserve_validation_refuses_unknown_fields_and_wrong_types(kserve_schema, isvc):
    unknown = copy.deepcopy(isvc)
    unknown["spec"]["predictor"]["containers"][0]["probe"] = {}
    assert any("probe" in error for error in kserve_errors(kserve_schema, unknown))
    wrong = copy.deepcopy(isvc)
    wrong["spec"]["predictor"]["scaleMetric"] = "gpu"
    assert kserve_errors(kserve_schema, wrong)


# --- the pod -------------------------------------------------------------------------------------------------------

def test_the_pod_runs_the_image_command_as_the_image_user_with_nothing_more(overlay):
    _, objects = overlay
    pod, api = pod_spec(objects), container(objects)
    uid, gid, user = image_user()
    assert user == "app" and pod["securityContext"]["runAsUser"] == uid == 10001
    assert pod["securityContext"]["runAsGroup"] == gid == 10001 and pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert api["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                      "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}
    assert api["command"] == image_command()
    assert api["image"] == f"attention-service:{project_version()}"
    assert pod["automountServiceAccountToken"] is False
    account = objects["ServiceAccount"]
    assert pod["serviceAccountName"] == account["metadata"]["name"] and account["automountServiceAccountToken"] is False
    assert pod["enableServiceLinks"] is False  # else ATTENTION_* variables of the Service would reach the service


def test_the_only_writable_path_is_a_memory_backed_temporary_directory(overlay):
    _, objects = overlay
    volumes = {volume["name"]: volume for volume in pod_spec(objects)["volumes"]}
    mounts = container(objects)["volumeMounts"]
    assert [mount["mountPath"] for mount in mounts] == ["/tmp"]  # tempfile's directory: metrics and heartbeats
    for mount in mounts:
        assert volumes[mount["name"]]["emptyDir"]["medium"] == "Memory"
        assert volumes[mount["name"]]["emptyDir"]["sizeLimit"]
    assert "TMPDIR" not in environment(objects) and "PROMETHEUS_MULTIPROC_DIR" not in environment(objects)


def test_resources_are_requested_limited_and_size_the_workers(overlay):
    name, objects = overlay
    resources = container(objects)["resources"]
    assert resources["requests"] == resources["limits"]  # Guaranteed QoS
    cpus = float(resources["limits"]["cpu"])
    assert cpus == math.ceil(cpus) == {"dev": 1, "prod": 2}[name]  # the quota gunicorn sizes its workers by
    assert resources["limits"]["memory"].endswith("Mi") or resources["limits"]["memory"].endswith("Gi")
    assert "WEB_CONCURRENCY" not in environment(objects)


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
    template = objects["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    assert template["prometheus.io/scrape"] == "true" and int(template["prometheus.io/port"]) == port["containerPort"]
    assert client.get(template["prometheus.io/path"]).status_code == 200


def test_the_grace_period_covers_the_pre_stop_pause_and_the_graceful_timeout(overlay):
    _, objects = overlay
    pause = container(objects)["lifecycle"]["preStop"]["sleep"]["seconds"]
    graceful = int(environment(objects)["GUNICORN_GRACEFUL_TIMEOUT"])
    assert pause > 0 and pod_spec(objects)["terminationGracePeriodSeconds"] > pause + graceful


def test_every_variable_set_is_one_the_service_reads(overlay):
    _, objects = overlay
    read = service_variables()
    assert {"API_KEYS", "HOST", "GUNICORN_GRACEFUL_TIMEOUT", "ATTENTION_MAX_D_MODEL", "ATTENTION_MODELS"} <= read
    assert set(environment(objects)) - read == set()
    [secret] = [item for item in container(objects)["env"] if item["name"] == "API_KEYS"]
    assert secret["valueFrom"]["secretKeyRef"]["optional"] is True  # no Secret: auth off, the pod still starts


def test_the_settings_hold_every_limit_at_the_service_default():
    settings = settings_file()
    assert {name: int(settings[env_name(name)]) for name in Limits().as_dict()} == Limits().as_dict()
    assert Limits.from_env(settings) == Limits()


# --- the objects around the pod ------------------------------------------------------------------------------------

def selects(selector: dict, labels: dict) -> bool:
    return selector.items() <= labels.items()


def test_selectors_match_the_pods_and_the_autoscaler_and_budget_target_the_deployment(overlay):
    _, objects = overlay
    deployment = objects["Deployment"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selects(deployment["spec"]["selector"]["matchLabels"], labels)
    assert selects(objects["Service"]["spec"]["selector"], labels)
    assert objects["Service"]["spec"]["ports"][0]["targetPort"] == container(objects)["ports"][0]["name"]
    policy = objects["NetworkPolicy"]["spec"]
    assert selects(policy["podSelector"]["matchLabels"], labels) and policy["policyTypes"] == ["Ingress"]
    assert policy["ingress"] == [{"ports": [{"port": container(objects)["ports"][0]["containerPort"],
                                             "protocol": "TCP"}]}]
    if "HorizontalPodAutoscaler" in objects:
        target = objects["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]
        assert target == {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment["metadata"]["name"]}
    if "PodDisruptionBudget" in objects:
        assert selects(objects["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"], labels)
    for constraint in pod_spec(objects).get("topologySpreadConstraints", []):
        assert selects(constraint["labelSelector"]["matchLabels"], labels)


def test_dev_runs_one_replica_without_autoscaler_or_budget():
    objects = rendered("dev")
    assert objects["Deployment"]["spec"]["replicas"] == 1
    assert "HorizontalPodAutoscaler" not in objects and "PodDisruptionBudget" not in objects


def test_prod_keeps_two_replicas_on_different_nodes_and_rolls_out_with_none_down():
    objects = rendered("prod")
    deployment, hpa = objects["Deployment"]["spec"], objects["HorizontalPodAutoscaler"]["spec"]
    assert "replicas" not in deployment  # the HPA's: kubectl apply would reset a count set here
    assert hpa["minReplicas"] >= 2 and hpa["maxReplicas"] == 20
    assert hpa["metrics"] == [{"type": "Resource", "resource": {
        "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}}}]
    assert deployment["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    budget = objects["PodDisruptionBudget"]["spec"]
    assert budget["maxUnavailable"] == 1 < hpa["minReplicas"] and budget["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    constraints = deployment["template"]["spec"]["topologySpreadConstraints"]
    spread = {constraint["topologyKey"]: constraint["whenUnsatisfiable"] for constraint in constraints}
    assert all(constraint["nodeTaintsPolicy"] == "Honor" for constraint in constraints)  # tainted nodes: no domain
    assert spread == {"kubernetes.io/hostname": "DoNotSchedule", "topology.kubernetes.io/zone": "ScheduleAnyway"}


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


def test_the_inference_service_pod_is_the_deployments_pod(isvc, client):
    objects = rendered("prod")
    pod, api = pod_spec(objects), container(objects)
    predictor = isvc["spec"]["predictor"]
    [served] = predictor["containers"]
    for field in ("image", "command", "resources", "securityContext", "lifecycle", "volumeMounts"):
        assert served[field] == api[field], field
    for field in ("securityContext", "terminationGracePeriodSeconds", "automountServiceAccountToken",
                  "enableServiceLinks", "volumes"):
        assert predictor[field] == pod[field], field
    assert predictor["annotations"] == objects["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    assert predictor["deploymentStrategy"] == objects["Deployment"]["spec"]["strategy"]
    settings = environment(objects)
    literal = {item["name"]: item.get("value") for item in served["env"]}
    assert literal == {name: settings[name] for name in literal}  # a subset of the Deployment's, the same values
    assert int(literal["PORT"]) == served["ports"][0]["containerPort"]
    for kind, path in (("startupProbe", "/v2/health/ready"), ("readinessProbe", "/v2/health/ready"),
                       ("livenessProbe", "/v2/health/live")):
        assert served[kind]["httpGet"] == {"path": path, "port": 8000}
        assert client.get(path).status_code == 200
        assert {k: v for k, v in served[kind].items() if k != "httpGet"} == {
            k: v for k, v in api[kind].items() if k != "httpGet"}

