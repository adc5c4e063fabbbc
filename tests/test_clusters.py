"""clusters/: rayspec's side of each cluster loads, and the KubeRay files agree with KubeRay (its
RayCluster schema and how its operator starts Ray), with Ray, with the image and with the
commands of docs/cluster.md (the README's *On a Ray cluster* links it)."""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import tomllib
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest
import yaml

from rayspec._config import OutputConfig
from rayspec._config import ServerConfig
from rayspec.engines.sglang import CONTRACT_PINNED_VERSIONS
from tests.helpers import REPO
from tests.helpers import TWIN_EXPERIMENT
from tests.helpers import cached_config

CLUSTERS = os.path.join(REPO, "clusters")
MANIFEST = os.path.join(CLUSTERS, "kuberay", "rayspec-raycluster.yaml")
DOCKERFILE = os.path.join(CLUSTERS, "kuberay", "Dockerfile")
# tests/data/derive_raycluster_schema.py made it from KubeRay's CRD; it names the tag and commit.
SCHEMA = os.path.join(REPO, "tests", "data", "raycluster-v1.5.1.schema.json")
GUIDE = os.path.join(REPO, "docs", "cluster.md")  # the cluster steps, as the user runs them


def _load(path: str) -> Any:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh) if path.endswith(".json") else yaml.safe_load(fh)


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read()


@pytest.mark.parametrize("name", ["local.yaml", "onprem-8gpu.yaml", "kuberay.yaml"])
def test_each_cluster_file_merges_over_an_experiment(name: str) -> None:
    cfg = cached_config(TWIN_EXPERIMENT, [os.path.join(CLUSTERS, name)])
    assert cfg.cluster.address == ("" if name == "local.yaml" else "auto")


# ---------------------------------------------------------------- the RayCluster, as KubeRay's
# API server sees it: it prunes unknown fields silently, so the vendored schema makes them errors.


def schema_errors(doc: Any) -> list[str]:
    """Where ``doc`` breaks the vendored RayCluster schema, one line each."""
    found = []
    for err in jsonschema.Draft202012Validator(_load(SCHEMA)).iter_errors(doc):
        where = "/".join(str(p) for p in err.absolute_path) or "(top)"
        why = err.message
        if isinstance(err.schema, dict) and err.schema.get("$comment") == "cut":
            why = (
                "a RayCluster field the vendored schema leaves out: run "
                "tests/data/derive_raycluster_schema.py again (its docstring says how)"
            )
        found.append(f"{where}: {why}")
    return sorted(found)


def test_the_kuberay_manifest_is_a_raycluster_kuberay_keeps_whole() -> None:
    schema = _load(SCHEMA)
    assert schema_errors(_load(MANIFEST)) == []
    # The schema is the oldest operator the manifest and the guide name (authOptions).
    oldest = schema["x-kuberay-version"].removeprefix("v")
    assert f"v{oldest} or newer" in _read(MANIFEST)
    assert f"KubeRay operator ({oldest} or newer)" in " ".join(_read(GUIDE).split())


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        *parents, last = path.split("/")
        node: Any = doc
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[last] = value

    return change


@pytest.mark.parametrize(
    "change, where",
    [
        (_set("spec/workerGroupSpecs/0/replica", 2), "spec/workerGroupSpecs/0"),  # a typo
        (_set("spec/rayStartParams", {"num-gpus": "0"}), "spec"),  # the wrong level
        (_set("spec/headGroupSpec/rayStartParams/dashboard-port", 8265), "dashboard-port"),
        (_set("spec/authOptions/mode", "Token"), "spec/authOptions/mode"),
        (_set("spec/workerGroupSpecs/0/replicas", "2"), "spec/workerGroupSpecs/0/replicas"),
        (_set("spec/headGroupSpec/template/spec/containers/0/ports/0/port", 6379), "ports/0"),
        (_set("spec/headGroupSpec/template/spec/hostNetwork", True), "hostNetwork"),
        (_set("metadata", "rayspec"), "metadata"),
    ],
)
def test_the_vendored_schema_rejects_what_the_api_server_would_prune_or_refuse(
    change: Callable[[dict[str, Any]], None], where: str
) -> None:
    doc = copy.deepcopy(_load(MANIFEST))
    change(doc)
    errors = schema_errors(doc)
    assert errors and any(where in e for e in errors), errors


# ---------------------------------------------------------------- `ray start` in each pod


def _quantity(text: str | int) -> int:
    """A Kubernetes quantity as an integer (what KubeRay's ``Quantity.Value()`` passes on)."""
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti|k|M|G|T)?", str(text))
    assert match, f"no quantity this test knows: {text!r}"
    powers = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6}
    powers |= {"G": 10**9, "T": 10**12}
    return int(match.group(1)) * powers.get(match.group(2) or "", 1)


def kuberay_ray_start(cluster: dict[str, Any], group: dict[str, Any], head: bool) -> list[str]:
    """The ``ray start`` argv of a pod of ``group``: the line KubeRay's operator hands to
    ``/bin/bash -c``, split as bash splits it.

    A port of ray-operator/controllers/ray/common/pod.go (setMissingRayStartParams,
    generateRayStartCommand, addWellKnownAcceleratorResources, getResourcesMap and
    convertParamMap; alike in KubeRay v1.5.1 and v1.7.0) for what this manifest uses: no
    group-level ``resources`` or ``labels``, no autoscaler.
    """
    params = dict(group["rayStartParams"])
    if head:
        params.setdefault("dashboard-host", "0.0.0.0")
    else:
        name = cluster["metadata"]["name"]
        params.setdefault("address", f"{name}-head-svc.default.svc.cluster.local:6379")
    params.setdefault("metrics-export-port", "8080")
    params["block"] = "true"
    params.setdefault("dashboard-agent-listen-port", "52365")
    limits = group["template"]["spec"]["containers"][0]["resources"].get("limits", {})
    for param, key in (("num-cpus", "cpu"), ("memory", "memory")):
        if param not in params and key in limits:
            params[param] = str(_quantity(limits[key]))
    if limits:
        # The operator reads `resources` back before it adds GPUs; when it cannot, it logs an
        # error for every pod and adds none.
        text = params.get("resources", "{}").strip("'\"` ")
        try:
            json.loads(text)
        except ValueError as exc:
            raise AssertionError(f"KubeRay cannot read resources {text!r}: {exc}") from None
        gpus = [key for key in sorted(limits) if key.endswith("gpu")]
        if "num-gpus" not in params and gpus:
            params["num-gpus"] = str(_quantity(limits[gpus[0]]))
    flags = []
    for key in sorted(params):
        value = params[key]
        explicit = ("log-color", "include-dashboard", "include-log-monitor")
        if value.lower() in ("true", "false") and key not in explicit:
            flags += [f"--{key}"] if value.lower() == "true" else []
        else:
            flags.append(f"--{key}={value}")
    return shlex.split(" ".join(["ray start", *(["--head"] if head else []), *flags]))


def test_each_pod_starts_ray_as_the_study_needs() -> None:
    from ray.scripts.scripts import start  # Ray's own `ray start` parser

    cfg = cached_config(TWIN_EXPERIMENT, [os.path.join(CLUSTERS, "kuberay.yaml")])
    doc = _load(MANIFEST)
    head_group = doc["spec"]["headGroupSpec"]
    for group in [head_group, *doc["spec"]["workerGroupSpecs"]]:
        for key, value in group["rayStartParams"].items():
            assert isinstance(value, str), f"rayStartParams.{key}: KubeRay takes strings only"
    argv = kuberay_ray_start(doc, head_group, head=True)
    head = start.make_context("start", argv[2:]).params
    assert head["head"] and head["block"] and head["num_gpus"] == 0  # no trial on the head
    (container,) = head_group["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["dashboard"] == head["dashboard_port"] == 8265  # the guide's port-forward
    assert ports["gcs"] == 6379 and ports["client"] == 10001  # the guide's ray:// port
    (group,) = doc["spec"]["workerGroupSpecs"]
    assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
    worker = start.make_context("start", kuberay_ray_start(doc, group, head=False)[2:]).params
    assert cfg.cluster.node_resource in json.loads(worker["resources"])
    (container,) = group["template"]["spec"]["containers"]
    assert worker["num_gpus"] == _quantity(container["resources"]["limits"]["nvidia.com/gpu"])
    assert worker["num_gpus"] % cfg.server.tp_size == 0  # whole trials per pod
    assert worker["address"].startswith(f"{doc['metadata']['name']}-head-svc.")


# ---------------------------------------------------------------- the image and the guide


def _dockerfile() -> tuple[dict[str, str], list[str], list[list[str]], str]:
    """The Dockerfile's ARG defaults, RUN lines, COPY instructions and WORKDIR."""
    text = _read(DOCKERFILE).replace("\\\n", " ")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    args = dict(ln.split(None, 1)[1].split("=", 1) for ln in lines if ln.startswith("ARG "))
    runs = [ln.split(None, 1)[1] for ln in lines if ln.startswith("RUN ")]
    copies = [ln.split()[1:] for ln in lines if ln.startswith("COPY ")]
    (workdir,) = [ln.split()[1] for ln in lines if ln.startswith("WORKDIR ")]
    return args, runs, copies, workdir


def _guide_kuberay_commands() -> list[list[str]]:
    text = _read(GUIDE)
    section = text[text.index("\n## Kubernetes (KubeRay)\n") :]
    section = section[: section.index("\n## ", 1)]  # the section, up to the next one
    block = section.split("```bash\n", 1)[1]
    lines = block.split("```", 1)[0].replace("\\\n", " ").splitlines()
    return [shlex.split(line, comments=True) for line in lines if line.strip()]


def test_the_image_holds_what_the_manifest_and_the_guide_expect() -> None:
    args, runs, copies, workdir = _dockerfile()
    doc = _load(MANIFEST)
    pyproject = tomllib.loads(_read(os.path.join(REPO, "pyproject.toml")))
    project = pyproject["project"]
    # SGLang's release image of the version rayspec's launch lines are checked against.
    image, tag = args["SGLANG_IMAGE"].split(":")
    assert image == "lmsysorg/sglang" and tag == f"v{ServerConfig().sglang_version}"
    assert ServerConfig().sglang_version in CONTRACT_PINNED_VERSIONS
    # One Ray everywhere: the image's pin, the RayCluster's rayVersion and pyproject's floor.
    (ray_pin,) = re.findall(r'"ray\[default\]==([\d.]+)"', " ".join(runs))
    assert doc["spec"]["rayVersion"] == ray_pin
    assert f"ray[default]>={ray_pin.rsplit('.', 1)[0]}" in project["dependencies"]
    # The pip install names an extra pyproject has, from where the sources were copied.
    (install,) = [r for r in runs if "/opt/rayspec[" in r]
    (extra,) = re.findall(r'"/opt/rayspec\[(\w+)\]"', install)
    assert extra in project["optional-dependencies"]
    copied = {}
    for *sources, dest in copies:
        for src in sources:
            assert os.path.exists(os.path.join(REPO, src)), src
            copied[src] = dest if len(sources) == 1 else os.path.join(dest, src)
    assert {project["readme"], "pyproject.toml", "rayspec"} <= set(copied)
    assert all(dest.startswith(workdir + "/") for dest in copied.values())
    # The guide's commands: the study runs in the head pod, from WORKDIR, on files it copied.
    commands = _guide_kuberay_commands()
    name = doc["metadata"]["name"]
    (get_head,) = [c for c in commands if c[0].startswith("HEAD=")]
    # The labels KubeRay puts on every pod (pod.go labelPod; utils/constant.go).
    assert f"ray.io/cluster={name},ray.io/node-type=head" in " ".join(get_head)
    (tune,) = [c for c in commands if "rayspec.tune" in c]
    assert tune[:5] == ["kubectl", "exec", "-it", "$HEAD", "--"]
    assert tune[5:8] == ["python3", "-m", "rayspec.tune"]
    files = [a for a in tune[8:] if a.endswith(".yaml")]
    assert files == ["experiments/eagle3.yaml", "clusters/kuberay.yaml"]
    for path in files:
        assert path.split("/")[0] in copied and os.path.exists(os.path.join(REPO, path))
    (models,) = doc["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0][
        "volumeMounts"
    ][:1]
    overrides = dict(a.split("=", 1) for a in tune[8:] if "=" in a)
    assert all(v.startswith(models["mountPath"] + "/") for v in overrides.values())
    (cp,) = [c for c in commands if c[:2] == ["kubectl", "cp"]]
    assert cp[2] == "${HEAD#pod/}:" + os.path.join(workdir, OutputConfig().dir)
    build = next(c for c in commands if c[:2] == ["docker", "build"])
    assert build[2:4] == ["-f", os.path.relpath(DOCKERFILE, REPO)] and build[-1] == "."
    assert ["kubectl", "wait", f"raycluster/{name}"] == next(
        c[:3] for c in commands if c[:2] == ["kubectl", "wait"]
    )


# ---------------------------------------------------------------- the on-prem launcher config

LAUNCHER = os.path.join(CLUSTERS, "onprem-8gpu.ray.yaml")


def _launcher() -> dict[str, Any]:
    doc: dict[str, Any] = _load(LAUNCHER)
    doc["provider"].update(head_ip="10.0.0.1", worker_ips=["10.0.0.2", "10.0.0.3"])
    return doc


def _env_and_argv(command: str) -> tuple[dict[str, str], list[str]]:
    """A start command's leading VAR=value assignments and the rest."""
    words = shlex.split(command)
    env = dict(w.split("=", 1) for w in words if re.fullmatch(r"[A-Za-z_]\w*=.*", w))
    return env, words[len(env) :]


def test_ray_up_takes_the_launcher_config(monkeypatch: pytest.MonkeyPatch) -> None:
    from ray.autoscaler._private.util import prepare_config
    from ray.autoscaler._private.util import validate_config

    monkeypatch.chdir(REPO)  # `ray up` runs from the checkout: file mounts are relative to it
    validate_config(prepare_config(_launcher()))  # Ray's own schema: unknown keys are errors
    broken = _launcher() | {"file_mount": {}}
    with pytest.raises(Exception, match="file_mount"):
        validate_config(prepare_config(broken))


def test_the_launcher_syncs_the_sources_and_not_the_checkout() -> None:
    mounts = _launcher()["file_mounts"]
    sources = {remote.removeprefix("~/rayspec/"): local for remote, local in mounts.items()}
    # "." would copy .venv (whose links to the local Python break the head's autoscaler), .git
    # and runs/ to every node (seen in .ci/rehearse-onprem).
    assert "." not in mounts.values() and "./" not in mounts.values()
    for name in ("pyproject.toml", "README.md", "rayspec", "experiments", "clusters"):
        assert sources.get(name) == f"./{name}", f"{name} is not synced to ~/rayspec"
        assert os.path.exists(os.path.join(REPO, name))
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as fh:
        assert tomllib.load(fh)["project"]["readme"] in sources  # pip -e needs it on the node


def test_each_node_starts_ray_as_the_study_needs() -> None:
    from ray.scripts.scripts import start  # Ray's own `ray start` parser

    doc = _launcher()
    cfg = cached_config(TWIN_EXPERIMENT, [os.path.join(CLUSTERS, "onprem-8gpu.yaml")])
    *_, head_cmd = doc["head_start_ray_commands"]
    *_, worker_cmd = doc["worker_start_ray_commands"]
    head_env, head_argv = _env_and_argv(head_cmd)
    worker_env, worker_argv = _env_and_argv(worker_cmd)
    head = start.make_context("start", head_argv[2:]).params
    worker = start.make_context("start", worker_argv[2:]).params
    assert head["head"] and head["dashboard_host"] == "127.0.0.1"  # the SSH tunnel's end
    assert worker["address"] == f"$RAY_HEAD_IP:{head['port']}"
    for params in (head, worker):
        assert params["num_gpus"] % cfg.server.tp_size == 0  # whole trials per node
    assert head_env["RAY_AUTH_MODE"] == worker_env["RAY_AUTH_MODE"] == "token"
    # `ray up` exports RAY_enable_autoscaler_v2=1, and v2 counts the local provider's head as one
    # of min_workers: one worker of two started in .ci/rehearse-onprem (Ray 2.60).
    assert head_env["RAY_enable_autoscaler_v2"] == "0"
    # `ray down` runs a bare `ray stop` on the head: the node's login shell must find the venv's.
    assert any("rayspec-venv/bin:$PATH" in c and ".bashrc" in c for c in doc["setup_commands"])
