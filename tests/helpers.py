"""Small helpers shared by tests: writing experiment files."""

from __future__ import annotations

import os
from typing import Any

import yaml

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


def free_port_block(n: int = 4) -> int:
    """A port p such that p..p+n-1 were free a moment ago (for concurrent test studies)."""
    import socket

    for _ in range(50):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            base = sock.getsockname()[1]
        if base + n > 65535:
            continue
        try:
            for port in range(base, base + n):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no block of free ports found")
