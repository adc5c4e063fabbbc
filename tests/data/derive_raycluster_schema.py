"""Derive tests/data/raycluster-<version>.schema.json from KubeRay's RayCluster CRD.

The API server validates a RayCluster against the CRD's ``openAPIV3Schema`` and *prunes* every
field the schema does not know, silently (``kubectl apply`` succeeds, the field is gone). This
script turns that schema into a strict JSON Schema (2020-12) that tests/test_clusters.py runs
over clusters/kuberay/rayspec-raycluster.yaml, so a misspelt or misplaced field is an error:

- an object with ``properties`` that the API server would prune gets
  ``additionalProperties: false`` (none in this CRD preserves unknown fields);
- ``x-kubernetes-int-or-string`` becomes ``anyOf: [integer, string]`` (the CRD already says
  so); the other ``x-kubernetes-*`` keys (list/map types, one CEL rule on ``managedBy``) are
  dropped: they constrain nothing the manifest uses;
- the schema is trimmed to what the manifest reaches: every property name is kept at each object
  the manifest enters, with its full schema where the manifest uses it and ``CUT`` (which
  nothing passes) where it does not, so a field the manifest starts to use fails until this
  script is run again;
- the head's and the workers' pod templates (the same schema in the CRD) become one
  ``$defs/PodTemplateSpec``, trimmed to what the head and worker templates use together.

Run it again after adding a field to the manifest, from a kuberay checkout::

    git -C kuberay show v1.5.1:ray-operator/config/crd/bases/ray.io_rayclusters.yaml > crd.yaml
    python tests/data/derive_raycluster_schema.py crd.yaml --version v1.5.1 \\
        --commit "$(git -C kuberay rev-list -n1 v1.5.1)"
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
MANIFEST = os.path.join(HERE, "..", "..", "clusters", "kuberay", "rayspec-raycluster.yaml")
CRD_PATH = "ray-operator/config/crd/bases/ray.io_rayclusters.yaml"

Shape = dict[str, Any] | bool  # what a document reaches: nested keys, or True for a leaf
# A property the manifest does not use: nothing is valid under it (not ``false``, under which
# jsonschema reports the error without the property's path).
CUT = {"$comment": "cut", "not": {}}


def shape_of(doc: Any) -> Shape:
    """The keys ``doc`` uses, merged over list items."""
    if isinstance(doc, dict):
        return {k: shape_of(v) for k, v in doc.items()}
    if isinstance(doc, list):
        merged: Shape = True
        for item in doc:
            merged = merge(merged, shape_of(item))
        return merged
    return True


def merge(a: Shape, b: Shape) -> Shape:
    if not isinstance(a, dict):
        return b
    if not isinstance(b, dict):
        return a
    out = dict(a)
    for k, v in b.items():
        out[k] = merge(out[k], v) if k in out else v
    return out


def strict(node: Any) -> Any:
    """A k8s structural schema as JSON Schema, with pruning made an error."""
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "properties":
            out[key] = {name: strict(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not") and isinstance(value, dict):
            out[key] = strict(value)
        elif key in ("anyOf", "allOf", "oneOf"):
            out[key] = [strict(sub) for sub in value]
        elif not key.startswith("x-kubernetes-"):
            out[key] = value
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    prunes = node.get("type") == "object" and "properties" in node
    if prunes and "additionalProperties" not in node:
        assert not node.get("x-kubernetes-preserve-unknown-fields"), node
        out["additionalProperties"] = False
    return out


def trim(schema: Any, shape: Shape) -> Any:
    """``schema`` cut down to what ``shape`` reaches (unreached properties become ``CUT``)."""
    if not isinstance(schema, dict) or not isinstance(shape, dict):
        return schema
    out = dict(schema)
    if "properties" in schema:
        out["properties"] = {
            name: trim(sub, shape[name]) if name in shape else CUT
            for name, sub in schema["properties"].items()
        }
    if "items" in schema:
        out["items"] = trim(schema["items"], shape)
    return out


def derive(crd: dict[str, Any], manifest: dict[str, Any], version: str, commit: str) -> Any:
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = strict(v1["schema"]["openAPIV3Schema"])
    spec = schema["properties"]["spec"]["properties"]
    head_t = spec["headGroupSpec"]["properties"]["template"]
    worker_t = spec["workerGroupSpecs"]["items"]["properties"]["template"]
    assert head_t == worker_t, "the head and worker pod templates differ in this CRD"
    templates: Shape = True
    doc_spec = manifest["spec"]
    for group in [doc_spec["headGroupSpec"], *doc_spec.get("workerGroupSpecs", [])]:
        templates = merge(templates, shape_of(group["template"]))
    ref = {"$ref": "#/$defs/PodTemplateSpec"}
    spec["headGroupSpec"]["properties"]["template"] = ref
    spec["workerGroupSpecs"]["items"]["properties"]["template"] = ref
    body = shape_of(manifest)
    assert isinstance(body, dict)
    for group in ("headGroupSpec", "workerGroupSpecs"):
        if group in body["spec"]:
            body["spec"][group]["template"] = True  # the $ref stays whole
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$comment": (
            f"Derived by tests/data/derive_raycluster_schema.py from ray-project/kuberay "
            f"{version} (commit {commit}), {CRD_PATH}, spec.versions[name=v1].schema."
            "openAPIV3Schema: unknown fields are errors (the API server prunes them), and "
            "properties clusters/kuberay/rayspec-raycluster.yaml does not use are cut (nothing "
            "is valid under them): run the script again after adding one."
        ),
        "x-kuberay-version": version,
        "x-kuberay-commit": commit,
        **trim(schema, body),
        "$defs": {"PodTemplateSpec": trim(head_t, templates)},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("crd", help=f"the CRD file ({CRD_PATH} at the tag)")
    p.add_argument("--version", required=True, help="the kuberay tag, e.g. v1.5.1")
    p.add_argument("--commit", required=True, help="the commit the tag names")
    p.add_argument("--manifest", default=MANIFEST)
    args = p.parse_args()
    with open(args.crd, encoding="utf-8") as fh:
        crd = yaml.safe_load(fh)
    with open(args.manifest, encoding="utf-8") as fh:
        manifest = yaml.safe_load(fh)
    out = os.path.join(HERE, f"raycluster-{args.version}.schema.json")
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(derive(crd, manifest, args.version, args.commit), fh, indent=1, sort_keys=True)
        fh.write("\n")
    print(out)


if __name__ == "__main__":
    main()
