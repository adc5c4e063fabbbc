"""SGLang's Prometheus series for the twin's ``/metrics`` (``docs/sglang.md``, *HTTP API*).

A tiny text-format writer (no prometheus_client dependency): gauges are read from the engine
when scraped, counters and histograms are kept here.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping

_BUCKETS: Mapping[str, tuple[float, ...]] = {
    "time_to_first_token_seconds": (
        0.001,
        0.005,
        0.01,
        0.02,
        0.04,
        0.06,
        0.08,
        0.1,
        0.25,
        0.5,
        0.75,
        1.0,
        2.5,
        5.0,
        7.5,
        10.0,
        15.0,
        20.0,
        25.0,
        30.0,
    ),
    "inter_token_latency_seconds": (
        0.002,
        0.004,
        0.006,
        0.008,
        0.01,
        0.015,
        0.02,
        0.025,
        0.03,
        0.035,
        0.04,
        0.06,
        0.08,
        0.1,
        0.2,
        0.4,
        0.6,
        0.8,
        1.0,
        2.0,
        4.0,
        6.0,
        8.0,
    ),
    "e2e_request_latency_seconds": (
        0.1,
        0.2,
        0.4,
        0.6,
        0.8,
        1.0,
        2.0,
        4.0,
        6.0,
        8.0,
        10.0,
        20.0,
        40.0,
        60.0,
        80.0,
        100.0,
        200.0,
        400.0,
        800.0,
    ),
    "request_time_per_output_token_seconds": (
        0.002,
        0.005,
        0.01,
        0.015,
        0.02,
        0.025,
        0.03,
        0.04,
        0.05,
        0.075,
        0.1,
        0.15,
        0.2,
        0.3,
        0.4,
        0.5,
        0.75,
        1.0,
        2.5,
    ),
}


class _Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.total = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.buckets, value)
        if i < len(self.counts):
            self.counts[i] += 1
        self.total += 1
        self.sum += value


class MetricsRegistry:
    """Histograms observed by the engine, plus the text rendering of every series.

    Args:
        labels: SGLang's labels (``model_name, engine_type, tp_rank, pp_rank, moe_ep_rank``).
    """

    def __init__(self, labels: Mapping[str, str]) -> None:
        self._labels = dict(labels)
        self._hist = {name: _Histogram(b) for name, b in _BUCKETS.items()}

    def observe(self, name: str, value: float) -> None:
        """Record one observation of histogram ``name`` (seconds)."""
        self._hist[name].observe(value)

    def _label_text(self, extra: Mapping[str, str] | None = None) -> str:
        labels = dict(self._labels)
        if extra:
            labels.update(extra)
        return ",".join(f'{k}="{v}"' for k, v in labels.items())

    def render(self, gauges: Mapping[str, float], counters: Mapping[str, float]) -> str:
        """Prometheus text exposition of every series.

        Args:
            gauges: ``sglang:<name>`` gauge values (names without the prefix).
            counters: counter values (names without the prefix, ending in ``_total``).
        """
        out: list[str] = []
        lab = self._label_text()
        for name, value in gauges.items():
            out.append(f"# HELP sglang:{name} {name.replace('_', ' ')}.")
            out.append(f"# TYPE sglang:{name} gauge")
            out.append(f"sglang:{name}{{{lab}}} {float(value)}")
        for name, value in counters.items():
            out.append(f"# HELP sglang:{name} {name.replace('_', ' ')}.")
            out.append(f"# TYPE sglang:{name} counter")
            out.append(f"sglang:{name}{{{lab}}} {float(value)}")
        for name, hist in self._hist.items():
            out.append(f"# HELP sglang:{name} {name.replace('_', ' ')}.")
            out.append(f"# TYPE sglang:{name} histogram")
            out.append(f"sglang:{name}_sum{{{lab}}} {hist.sum}")
            cumulative = 0
            for bound, count in zip(hist.buckets, hist.counts, strict=True):
                cumulative += count
                out.append(
                    f"sglang:{name}_bucket{{{self._label_text({'le': str(bound)})}}} {cumulative}"
                )
            out.append(f"sglang:{name}_bucket{{{self._label_text({'le': '+Inf'})}}} {hist.total}")
            out.append(f"sglang:{name}_count{{{lab}}} {hist.total}")
        return "\n".join(out) + "\n"
