"""Small helpers shared by tests: writing experiment files."""

from __future__ import annotations

import os
from typing import Any

import yaml

from rayspec.testing._twin import free_port_block  # noqa: F401  (tests import it from here)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TWIN_EXPERIMENT = os.path.join(REPO, "experiments", "eagle3-twin.yaml")
FIELD_EXPERIMENT = os.path.join(REPO, "experiments", "eagle3.yaml")


def write_experiment(folder: str, doc: dict[str, Any], name: str = "exp.yaml") -> str:
    path = os.path.join(folder, name)
    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(doc, fh, sort_keys=False)
    return path


def twin_doc(out_dir: str, **sections: Any) -> dict[str, Any]:
    """A minimal twin experiment; ``sections`` update it one level deep."""
    doc: dict[str, Any] = {
        "study": {"name": "t", "n_trials": 3},
        "server": {"engine": "twin"},
        "output": {"dir": out_dir},
    }
    for key, value in sections.items():
        doc.setdefault(key, {}).update(value)
    return doc
