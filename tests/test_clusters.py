"""clusters/: rayspec's side of each cluster loads, and the KubeRay manifest agrees with it."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from rayspec._config import load_config
from tests.helpers import REPO
from tests.helpers import TWIN_EXPERIMENT

CLUSTERS = os.path.join(REPO, "clusters")


@pytest.mark.parametrize("name", ["local.yaml", "onprem-8gpu.yaml", "kuberay.yaml"])
def test_each_cluster_file_merges_over_an_experiment(name: str) -> None:
    cfg = load_config(TWIN_EXPERIMENT, [os.path.join(CLUSTERS, name)])
    assert cfg.cluster.address == ("" if name == "local.yaml" else "auto")


def test_the_kuberay_manifest_gives_the_study_gpu_nodes_of_its_kind() -> None:
    cfg = load_config(TWIN_EXPERIMENT, [os.path.join(CLUSTERS, "kuberay.yaml")])
    path = os.path.join(CLUSTERS, "kuberay", "rayspec-raycluster.yaml")
    with open(path, encoding="utf-8") as fh:
        doc = yaml.safe_load(fh)
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == "RayCluster"
    head = doc["spec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0"  # no trial on the head
    assert head["rayStartParams"]["dashboard-port"] == "8265"
    assert head["serviceType"] == "ClusterIP" and doc["spec"]["authOptions"]["mode"] == "token"
    (group,) = doc["spec"]["workerGroupSpecs"]
    # KubeRay's quoting: a JSON object inside a quoted string.
    declared = json.loads(json.loads(group["rayStartParams"]["resources"]))
    assert cfg.cluster.node_resource in declared
    gpus = int(group["rayStartParams"]["num-gpus"])
    (container,) = group["template"]["spec"]["containers"]
    assert int(container["resources"]["limits"]["nvidia.com/gpu"]) == gpus
    assert gpus % cfg.server.tp_size == 0  # whole trials per pod
    with open(os.path.join(CLUSTERS, "kuberay", "Dockerfile"), encoding="utf-8") as fh:
        docker = fh.read()
    assert "ray[default]==2.60.0" in docker and "/opt/rayspec[sglang]" in docker
