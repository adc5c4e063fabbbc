"""Tolerant parsers for SGLang's log lines (pure functions).

Formats: docs/sglang.md, *Log lines*. SGLang's own parser requires ``#queue-req: N,``
and so misses 0.5.23 lines; here every field has its own regex, so the 0.4.10 (``Decode batch.``),
0.5.5 (trailing ``, ``) and 0.5.23 (no trailing comma, ``accept rate``) shapes, the
``Decode batch [iter]`` form and ``cpu graph``/``npu graph`` labels all parse, and a field a
version lacks is None.
"""

from __future__ import annotations

import dataclasses
import re

from rayspec.engines._base import DecodeBatch

_DECODE = re.compile(r"Decode batch\b")
_PREFIX = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)((?: [A-Z]+\d+)*)\]")
_INT = r"\s*(\d+)"
_FLOAT = r"\s*([0-9]+(?:\.[0-9]+)?(?:[eE][-+]?\d+)?|nan|inf)"


_DECODE_FIELDS: dict[str, tuple[re.Pattern[str], type]] = {
    "running_req": (re.compile(r"#running-req:" + _INT), int),
    "num_tokens": (re.compile(r"(?:#token|#full token):" + _INT), int),
    "token_usage": (re.compile(r"(?<![\w#])token usage:" + _FLOAT), float),
    "accept_len": (re.compile(r"(?<!block )accept len:" + _FLOAT), float),
    "accept_rate": (re.compile(r"accept rate:" + _FLOAT), float),
    "gen_throughput_tok_s": (re.compile(r"gen throughput \(token/s\):" + _FLOAT), float),
    "queue_req": (re.compile(r"#queue-req:" + _INT), int),
}
_GRAPH = re.compile(r"(?:cuda|cpu|npu) graph:\s*(True|False)")


def parse_decode_line(line: str) -> DecodeBatch | None:
    """Parse one ``Decode batch`` line; None if the line is not one.

    Example::

        >>> b = parse_decode_line("[2026-11-29 12:00:00 TP0] Decode batch, #running-req: 1, "
        ...     "#token: 9, token usage: 0.03, accept len: 3.12, cuda graph: True, "
        ...     "gen throughput (token/s): 94.00, #queue-req: 0")
        >>> (b.ranks, b.accept_len, b.accept_rate, b.gen_throughput_tok_s)
        ('TP0', 3.12, None, 94.0)
    """
    if not _DECODE.search(line):
        return None
    values: dict[str, object] = {}
    for name, (pattern, kind) in _DECODE_FIELDS.items():
        m = pattern.search(line)
        values[name] = kind(m.group(1)) if m else None
    g = _GRAPH.search(line)
    p = _PREFIX.match(line)
    return DecodeBatch(
        timestamp=p.group(1) if p else None,
        ranks=p.group(2).strip() if p else "",
        graph=(g.group(1) == "True") if g else None,
        **values,  # type: ignore[arg-type]
    )


def parse_decode_lines(text: str) -> list[DecodeBatch]:
    """Every ``Decode batch`` line of ``text``, in order."""
    out = []
    for line in text.splitlines():
        batch = parse_decode_line(line)
        if batch is not None:
            out.append(batch)
    return out


@dataclasses.dataclass(frozen=True)
class StartupSummary:
    """The scheduler's startup summary line (scheduler.py:1267-1276); missing fields are None."""

    max_total_num_tokens: int | None
    chunked_prefill_size: int | None
    max_prefill_tokens: int | None
    max_running_requests: int | None
    context_len: int | None
    available_gpu_mem_gb: float | None


_SUMMARY_KEY = re.compile(r"max_total_num_tokens=\s*-?\d+")
_SUMMARY_INTS = (
    "max_total_num_tokens",
    "chunked_prefill_size",
    "max_prefill_tokens",
    "max_running_requests",
    "context_len",
)
_GPU_MEM = re.compile(r"available_gpu_mem=\s*([0-9.]+)\s*GB")


def parse_startup_summary(text: str) -> StartupSummary | None:
    """The last startup summary line in ``text``, or None if there is none."""
    lines = [ln for ln in text.splitlines() if _SUMMARY_KEY.search(ln)]
    if not lines:
        return None
    line = lines[-1]
    values: dict[str, int | None] = {}
    for key in _SUMMARY_INTS:
        m = re.search(rf"\b{key}=\s*(-?\d+)", line)
        values[key] = int(m.group(1)) if m else None
    g = _GPU_MEM.search(line)
    return StartupSummary(available_gpu_mem_gb=float(g.group(1)) if g else None, **values)
