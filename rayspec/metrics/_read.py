"""Where a study's Ray metrics are exported, and reading them back while it runs.

Ray's own service-discovery file (``/tmp/ray/prom_metrics_service_discovery.json``) is shared
by every Ray session on the machine and lists exporters long dead, so it says nothing about
*this* study. The driver therefore writes its node's exporter and Ray session into the study
folder (``ray_metrics.json``); the reader asks that exporter alone and keeps the samples tagged
with the study's name and session.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass

from rayspec._atomic import write_atomic
from rayspec._exceptions import RayspecError

__all__ = ["EXPORTER_FILE", "MetricsUnavailable", "read_study_metrics", "write_exporter_file"]

EXPORTER_FILE = "ray_metrics.json"
PREFIX = "ray_rayspec_"
# Labels Ray adds to every sample; the reader shows the study's own (study, state, trial, ...).
_RAY_LABELS = frozenset(
    {"Component", "NodeAddress", "SessionName", "Version", "WorkerId", "JobId"}
)


class MetricsUnavailable(RayspecError):
    """The study's metrics cannot be read now; the message is one line saying why."""


@dataclass(frozen=True)
class Exporter:
    study: str
    address: str  # host:port of the driver node's Prometheus exporter
    session: str  # Ray's session name (the SessionName label)


def write_exporter_file(out_dir: str, study: str, address: str, session: str) -> str:
    """Record where this study's metrics are exported; returns the file's path."""
    path = os.path.join(out_dir, EXPORTER_FILE)
    doc = {"study": study, "exporter": address, "session": session}
    return write_atomic(path, json.dumps(doc) + "\n")


def _load(folder: str) -> Exporter:
    path = os.path.join(folder, EXPORTER_FILE)
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
        return Exporter(str(doc["study"]), str(doc["exporter"]), str(doc["session"]))
    except FileNotFoundError:
        what = "a study folder" if os.path.isdir(folder) else "a folder"
        raise MetricsUnavailable(
            f"{folder}: no {EXPORTER_FILE} ({what} whose study has not started Ray)"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise MetricsUnavailable(f"{path}: unreadable ({type(exc).__name__})") from None


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _format(name: str, labels: dict[str, str], value: float) -> str:
    own = sorted(
        (k, v) for k, v in labels.items() if k not in _RAY_LABELS and not k.startswith("otel_")
    )
    shown = ",".join(f'{k}="{_escape(v)}"' for k, v in own)
    return f"{name}{{{shown}}} {value:g}"


def read_study_metrics(folder: str, timeout_s: float = 3.0) -> list[str]:
    """The study's ``ray_rayspec_*`` samples, one Prometheus-style line each, sorted.

    Raises:
        MetricsUnavailable: no exporter recorded, it does not answer (the study is not
            running), or it holds none of this study's samples yet.
    """
    from prometheus_client.parser import text_string_to_metric_families

    where = _load(folder)
    url = f"http://{where.address}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - http only
            text = resp.read().decode("utf-8", errors="replace")
    except (OSError, urllib.error.URLError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise MetricsUnavailable(
            f"study {where.study}: its Ray exporter {where.address} does not answer ({reason}): "
            "is the study running? Its results are in trials/ either way"
        ) from None
    lines = []
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if (
                    s.name.startswith(PREFIX)
                    and s.labels.get("study") == where.study
                    and s.labels.get("SessionName", where.session) == where.session
                ):
                    lines.append(_format(s.name, dict(s.labels), float(s.value)))
    except ValueError as exc:
        raise MetricsUnavailable(f"{url}: not Prometheus text ({exc})") from None
    if not lines:
        raise MetricsUnavailable(
            f"study {where.study}: no metrics at {where.address} yet (they appear about 10 s "
            "after its first finished trial)"
        )
    return sorted(lines)
