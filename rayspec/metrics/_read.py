"""Where a study's Ray metrics are exported, and reading them back while it runs.

Ray's own service-discovery file (``/tmp/ray/prom_metrics_service_discovery.json``) is shared
by every Ray session on the machine and lists exporters long dead, so it says nothing about
*this* study. The driver therefore writes its node's exporter and Ray session into the study
folder (``ray_metrics.json``); the reader asks that exporter alone and keeps the samples tagged
with the study's name and session.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import os
import re
import socket
import time
from dataclasses import dataclass

from rayspec._atomic import write_atomic
from rayspec._exceptions import RayspecError
from rayspec._text import one_line

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


_MAX_FILE_BYTES = 64 << 10  # ray_metrics.json is one short line


def _load(folder: str) -> Exporter:
    path = os.path.join(folder, EXPORTER_FILE)
    if os.path.islink(path):  # the study writes a file of its own, never a link
        raise MetricsUnavailable(f"{path}: a symbolic link, not a file a study wrote")
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.loads(fh.read(_MAX_FILE_BYTES + 1)[:_MAX_FILE_BYTES])
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


MAX_ANSWER_BYTES = 32 << 20
"""The most ``/metrics`` text read (a node's exporter serves well under a megabyte)."""

_ADDRESS = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):(?P<port>[0-9]{1,5})$")


def _own_host(host: str) -> bool:
    """Whether ``host`` is loopback or an address of this machine (the driver's own node)."""
    bare = host.strip("[]")
    try:
        ip = ipaddress.ip_address(bare)
    except ValueError:
        return bare == "localhost"
    if ip.is_loopback:
        return True
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((bare, 0))  # only an address of one of this machine's interfaces binds
        except OSError:
            return False
    return True


def _check_address(where: Exporter, path: str) -> tuple[str, int]:
    """The exporter's host and port, when it is one the study can have written: ``host:port``
    of this machine (the driver's node), nothing else (no URL, no other host)."""
    m = _ADDRESS.match(where.address)
    port = int(m.group("port")) if m else 0
    if m is None or not 0 < port < 65536:
        raise MetricsUnavailable(
            f"{path}: exporter {where.address[:80]!r} is not a host:port (not written by a study)"
        )
    if not _own_host(m.group("host")):
        raise MetricsUnavailable(
            f"{path}: exporter {where.address} is not on this machine: a study records its "
            "own node's exporter, so this file was not written by one (not read)"
        )
    return m.group("host").strip("[]"), port


def _fetch(host: str, port: int, deadline: float) -> tuple[int, bytes]:
    """(status, body) of ``GET /metrics``, every step bounded by ``deadline`` (a slow
    exporter is cut off, not waited on read by read) and the body by
    :data:`MAX_ANSWER_BYTES`."""

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the time budget is spent")
        return remaining

    conn = http.client.HTTPConnection(host, port, timeout=left())
    try:
        conn.connect()
        sock = conn.sock  # kept: the connection lets go of it once the answer will close
        conn.request("GET", "/metrics", headers={"Accept": "text/plain"})
        resp = conn.getresponse()
        chunks: list[bytes] = []
        size = 0
        while True:
            sock.settimeout(left())  # what is left of the whole budget, not per read
            chunk = resp.read1(65536)
            if not chunk:
                break
            size += len(chunk)
            if size > MAX_ANSWER_BYTES:
                raise ValueError(f"the answer is larger than {MAX_ANSWER_BYTES >> 20} MiB")
            chunks.append(chunk)
        return resp.status, b"".join(chunks)
    finally:
        conn.close()


def read_study_metrics(folder: str, timeout_s: float = 3.0) -> list[str]:
    """The study's ``ray_rayspec_*`` samples, one Prometheus-style line each, sorted.

    Only an exporter on this machine is asked (the one a study records is its driver's own
    node), in ``timeout_s`` in all, at most :data:`MAX_ANSWER_BYTES` of it.

    Raises:
        MetricsUnavailable: no exporter recorded, one the study cannot have written, it does
            not answer in time (the study is not running), or it holds none of this study's
            samples yet.
    """
    from prometheus_client.parser import text_string_to_metric_families

    where = _load(folder)
    host, port = _check_address(where, os.path.join(folder, EXPORTER_FILE))
    url = f"http://{where.address}/metrics"
    try:
        status, body = _fetch(host, port, time.monotonic() + timeout_s)
    except TimeoutError:  # a read past the budget, or the budget spent between reads
        raise MetricsUnavailable(
            f"study {where.study}: its Ray exporter {where.address} gave no whole answer "
            f"within {timeout_s:g} s: is the study running? Its results are in trials/ either way"
        ) from None
    except (OSError, http.client.HTTPException, ValueError) as exc:
        reason = one_line(str(exc) or type(exc).__name__)[:200]
        raise MetricsUnavailable(
            f"study {where.study}: its Ray exporter {where.address} does not answer ({reason}): "
            "is the study running? Its results are in trials/ either way"
        ) from None
    if status != 200:
        raise MetricsUnavailable(
            f"study {where.study}: its Ray exporter {where.address} answered HTTP {status}: "
            "is the study running? Its results are in trials/ either way"
        )
    text = body.decode("utf-8", errors="replace")
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
    except ValueError:  # the parser quotes the line: the answer is not echoed
        raise MetricsUnavailable(f"{url}: not Prometheus text") from None
    if not lines:
        raise MetricsUnavailable(
            f"study {where.study}: no metrics at {where.address} yet (they appear about 10 s "
            "after its first finished trial)"
        )
    return sorted(lines)
