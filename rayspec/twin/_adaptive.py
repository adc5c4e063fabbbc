"""SGLang's adaptive speculative steps, as the twin runs them.

A port of SGLang 0.5.23 ``python/sglang/srt/speculative/adaptive_spec_params.py``: each
batch-size tier ("slot") keeps an EMA of accepted drafts per request and, after a warm-up and
every ``update_interval`` verify batches, moves ``num_steps`` among its ``candidate_steps``
(drop below ``step - 0.5 + down_hysteresis``, rise above ``step - 0.5 + up_hysteresis``;
step 0 is plain decoding and probes the smallest positive step next). A batch routes to the
largest tier key not above it. The controller is exact; what a step costs is the twin's
[est] model (docs/twin-model.md has no adaptive measurement).

Example:
    >>> steps = AdaptiveSteps(3, load_tiers(None))
    >>> steps.steps_for(1), steps.candidate_steps
    (3, [0, 1, 3, 5, 7])
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["DEFAULT_TIERS", "AdaptiveSteps", "StepSlot", "candidate_steps", "load_tiers"]

#: SGLang's DEFAULT_ADAPTIVE_CONFIG (0.5.23).
DEFAULT_TIERS: dict[str, dict[str, Any]] = {
    "1": {"candidate_steps": [1, 3, 5, 7], "down_hysteresis": -0.25},
    "8": {"candidate_steps": [0, 1, 3], "down_hysteresis": 0.0},
    "32": {"candidate_steps": [0, 1], "down_hysteresis": 0.0},
    "64": {"candidate_steps": [0], "down_hysteresis": 0.0},
}


def load_tiers(path: str | None) -> dict[int, dict[str, Any]]:
    """The tiers of ``--speculative-adaptive-config`` (SGLang's defaults without a path).

    Top-level keys that are not batch sizes are defaults for every tier, as in SGLang.

    Raises:
        ValueError: SGLang's messages for a tier without valid ``candidate_steps`` or a file
            without any batch-size key; OSError/JSONDecodeError for an unreadable file.
    """
    raw: Mapping[str, Any]
    if path is None:
        raw = DEFAULT_TIERS
    else:
        with open(path, encoding="utf-8") as fh:
            raw = json.load(fh)
    shared = {k: v for k, v in raw.items() if not k.isdigit()}
    tiers: dict[int, dict[str, Any]] = {}
    for key, entry in raw.items():
        if not key.isdigit():
            continue
        steps = entry.get("candidate_steps") if isinstance(entry, dict) else None
        if (
            not isinstance(steps, list)
            or not steps
            or not all(isinstance(s, int) and s >= 0 for s in steps)
        ):
            raise ValueError(
                f"BS {key}: candidate_steps must be a list of non-negative ints, got {steps!r}"
            )
        tiers[int(key)] = {**shared, **entry}
    if not tiers:
        raise ValueError(
            "speculative_adaptive_config must contain at least one integer-string BS key, "
            f'e.g. {{"1": {{"candidate_steps": [1,3,7]}}}}. Got keys: {list(raw)}'
        )
    return tiers


def candidate_steps(tiers: Mapping[int, Mapping[str, Any]]) -> list[int]:
    """The union of every tier's candidate steps (SGLang checks the start step against it)."""
    return sorted({s for entry in tiers.values() for s in entry["candidate_steps"]})


class StepSlot:
    """One tier: the EMA of accepted drafts and the step it has settled on."""

    def __init__(self, initial_steps: int, cfg: Mapping[str, Any]) -> None:
        self.candidate_steps: list[int] = sorted(set(cfg["candidate_steps"]))
        self.ema_alpha = float(cfg.get("ema_alpha", 0.2))
        self.update_interval = int(cfg.get("update_interval", 5))
        self.warmup_batches = int(cfg.get("warmup_batches", 10))
        self.down_hysteresis = float(cfg.get("down_hysteresis", -0.25))
        self.up_hysteresis = float(cfg.get("up_hysteresis", 0.0))
        self.ceiling_coeff = float(cfg.get("ceiling_coeff", 0))
        if initial_steps in self.candidate_steps:
            self.current_steps = initial_steps
        else:
            self.current_steps = self.candidate_steps[len(self.candidate_steps) // 2]
        self.ema_accept_len = float(self.current_steps - 1)
        self._batch_count = 0

    def update(self, correct_per_request: list[int]) -> bool:
        """Feed one verify batch; True when the step changed."""
        if not correct_per_request:
            return False
        if self.current_steps > 0:
            mean = sum(correct_per_request) / len(correct_per_request)
            alpha = self.ema_alpha
            self.ema_accept_len = (1 - alpha) * self.ema_accept_len + alpha * mean
        self._batch_count += 1
        if self._batch_count <= self.warmup_batches:
            return False
        if (self._batch_count - self.warmup_batches) % self.update_interval != 0:
            return False
        return self._recompute()

    def _recompute(self) -> bool:
        old = self.current_steps
        idx = self.candidate_steps.index(old)
        old_idx = idx
        if old == 0:  # probe the smallest positive step after a no-speculation interval
            idx = min(idx + 1, len(self.candidate_steps) - 1)
            target = self.candidate_steps[idx]
            if target > 0 and self.ema_accept_len < 0:
                self.ema_accept_len = float(target - 1)
            return self._apply(target)
        while idx > 0:
            prev = self.candidate_steps[idx - 1]
            drop = (0.5 if prev == 0 else prev - 0.5) + self.down_hysteresis
            if self.ema_accept_len <= drop:
                idx -= 1
            else:
                break
        if idx == old_idx:
            while idx < len(self.candidate_steps) - 1:
                if self.ema_accept_len > self.candidate_steps[idx] - 0.5 + self.up_hysteresis:
                    idx += 1
                else:
                    break
        target = self.candidate_steps[idx]
        if self.ceiling_coeff > 0:  # caps downward moves only
            ceiling = max(1, math.ceil(self.ema_accept_len * self.ceiling_coeff))
            if ceiling < target <= old:
                while idx > 0 and self.candidate_steps[idx] > ceiling:
                    idx -= 1
                target = self.candidate_steps[idx]
        return self._apply(target)

    def _apply(self, target: int) -> bool:
        changed = target != self.current_steps
        self.current_steps = target
        return changed


class AdaptiveSteps:
    """Routes a batch size to its tier (the largest tier key not above it, else the first)."""

    def __init__(self, initial_steps: int, tiers: Mapping[int, Mapping[str, Any]]) -> None:
        self._keys = sorted(tiers)
        self._slots = {bs: StepSlot(initial_steps, tiers[bs]) for bs in self._keys}
        self.candidate_steps = candidate_steps(tiers)

    def _slot(self, batch: int) -> StepSlot:
        i = bisect.bisect_right(self._keys, batch) - 1
        return self._slots[self._keys[max(0, i)]]

    def steps_for(self, batch: int) -> int:
        return self._slot(batch).current_steps

    def on_verify(self, correct_per_request: list[int], batch: int) -> int | None:
        """Feed one verify batch's accepted drafts; the new step when its tier moved."""
        slot = self._slot(batch)
        return slot.current_steps if slot.update(correct_per_request) else None

    def ema_for(self, batch: int) -> float:
        return self._slot(batch).ema_accept_len
