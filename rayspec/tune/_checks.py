"""Is a trial right, not only fast: the correctness gate and the acceptance alarm (pure).

**The gate.** With greedy decoding, speculation is lossless (SGLang verifies every draft against
the target) and NCCL's settings change timing, not values; so every trial's output for a prompt
should be the baseline's. Real engines drift a little (a near-tie flips under other kernels),
which shows late in an output if at all; a corrupting setting (``NCCL_PROTO=LL128`` forced on a
PCIe ring, NVIDIA/nccl PR #2053) garbles it early. A trial fails the gate (``wrong_output``) when
most of its compared requests leave the baseline's output within the first ``gate_tokens``
tokens. On a real node the study starts the baseline twice first: when two starts of the same
configuration already disagree that early, the engine is not deterministic enough for the gate,
which then stays off (and says so).

**The alarm.** A drafter fed the wrong hidden-state layers still produces correct output (the
target verifies), it just accepts far fewer tokens, which looks like "speculation does not pay".
A trial at least as deep as the best chain measured so far whose accept length is far below
that chain's (or below ``study.expect_accept_length``) is flagged with a hint.
"""

from __future__ import annotations

import hashlib
import math
import statistics
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Sequence
from dataclasses import dataclass

from rayspec._plural import plural
from rayspec._types import Candidate
from rayspec._types import RequestRecord

__all__ = [
    "ALARM_RATIO",
    "Verdict",
    "acceptance_alarm",
    "judge",
    "reference_outputs",
]

# A trial's accept length below this fraction of what its drafter gave is flagged.
ALARM_RATIO = 0.7

PromptKey = Callable[[str, int, int], str]  # (scenario, run, index) -> the request's identity


def prompt_key(prompt: str, max_tokens: int) -> str:
    """A request's identity: the same prompt asked for the same length."""
    digest = hashlib.sha256(prompt.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{digest}:{max_tokens}"


def reference_outputs(
    records: Iterable[RequestRecord], key_of: PromptKey
) -> dict[str, tuple[int, ...]]:
    """The outputs of a reference trial (the baseline), by request identity."""
    out: dict[str, tuple[int, ...]] = {}
    for r in records:
        if r.ok and r.output_ids:
            out.setdefault(key_of(r.scenario, r.run, r.index), r.output_ids)
    return out


def _first_divergence(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@dataclass(frozen=True)
class Verdict:
    """How a trial's outputs compare with the reference's.

    Attributes:
        compared: requests with a reference output for the same prompt and length.
        diverged_early: of those, how many left the reference within the first gate tokens.
        median_divergence: the median token position where outputs first differ (the output
            length when they never do).
        wrong: the gate's verdict.
    """

    compared: int
    diverged_early: int
    median_divergence: float
    wrong: bool

    def describe(self, gate_tokens: int, reference_trial: int) -> str:
        return (
            f"{self.diverged_early} of {self.compared} outputs differ from the baseline's "
            f"(trial {reference_trial}) within the first {plural(gate_tokens, 'token')} "
            f"(first difference at token {self.median_divergence:.0f}, median): "
            "a fast wrong answer"
        )


def judge(
    records: Iterable[RequestRecord],
    reference: dict[str, tuple[int, ...]],
    key_of: PromptKey,
    *,
    gate_tokens: int,
) -> Verdict | None:
    """Compare a trial's outputs with the reference's (None when nothing can be compared)."""
    positions: list[int] = []
    early = 0
    for r in records:
        if not (r.ok and r.output_ids):
            continue
        ref = reference.get(key_of(r.scenario, r.run, r.index))
        if ref is None:
            continue
        d = _first_divergence(r.output_ids, ref)
        positions.append(d)
        if d < min(gate_tokens, len(ref), len(r.output_ids)):
            early += 1
    if not positions:
        return None
    return Verdict(
        compared=len(positions),
        diverged_early=early,
        median_divergence=float(statistics.median(positions)),
        wrong=early * 2 > len(positions),
    )


@dataclass(frozen=True)
class Chain:
    """A measured chain trial: its depth, accept length and throughput."""

    trial: int
    steps: int
    accept_length: float
    tok_s: float


def acceptance_alarm(
    candidate: Candidate,
    accept_length: float,
    chains: Sequence[Chain],
    *,
    expected: float | None = None,
) -> str:
    """A hint when ``candidate`` accepts far fewer tokens than its drafter can ("" if not).

    The reference is the best chain measured so far (by throughput) when the candidate drafts
    at least as deep as it (a deeper chain or a tree of that depth accepts at least as much),
    and ``expected`` (``study.expect_accept_length``) for any speculative candidate.
    """
    spec = candidate.spec
    if spec is None or not math.isfinite(accept_length):
        return ""
    refs: list[tuple[float, str]] = []
    if expected is not None:
        refs.append((expected, "study.expect_accept_length"))
    best = max(chains, key=lambda c: c.tok_s, default=None)
    if (
        best is not None
        and spec.num_steps >= best.steps
        and spec.num_draft_tokens - 1 >= best.steps
        and math.isfinite(best.accept_length)
    ):
        what = f"trial {best.trial}, the best chain ({plural(best.steps, 'step')})"
        refs.append((best.accept_length, what))
    for ref, what in refs:
        if accept_length < ALARM_RATIO * ref:
            return (
                f"accept length {accept_length:.2f} is far below {ref:.2f} ({what}): check the "
                "drafter's hidden-state layer wiring (eagle_aux_hidden_state_layer_ids in its "
                "config.json) and that the draft was trained for this target"
            )
    return ""


class OutputGate:
    """The gate's state through a study: the reference outputs, and whether it is on.

    Args:
        key_of: a request's identity from (scenario, run, index).
        gate_tokens: the early window (``bench.gate_tokens``).
        enabled: ``bench.check_outputs``.
    """

    def __init__(self, key_of: PromptKey, *, gate_tokens: int, enabled: bool = True) -> None:
        self.key_of = key_of
        self.gate_tokens = gate_tokens
        self.enabled = enabled
        self.reference: dict[str, tuple[int, ...]] = {}
        self.reference_trial: int | None = None
        self.off_reason = ""

    def set_reference(self, trial: int, records: Iterable[RequestRecord]) -> None:
        """The baseline's outputs become the reference."""
        self.reference = reference_outputs(records, self.key_of)
        self.reference_trial = trial

    def check_drift(self, records: Iterable[RequestRecord]) -> str:
        """A second start of the baseline: turn the gate off when it already differs early.

        Returns a line to print when the gate goes off ("" otherwise).
        """
        verdict = self.judge(records)
        if verdict is None or not verdict.wrong:
            return ""
        self.enabled = False
        self.off_reason = (
            f"two starts of the baseline differ within {plural(self.gate_tokens, 'token')} in "
            f"{verdict.diverged_early} of {verdict.compared} outputs: this engine's greedy output "
            "is not deterministic enough for the correctness gate, which is off for this study"
        )
        return self.off_reason

    def unchecked_reason(self) -> str:
        """Why an enabled gate compared nothing (for the trial's row and the progress line)."""
        if self.reference_trial is None:
            return "no baseline reference: the baseline has not been measured"
        if not self.reference:
            return f"no baseline reference: trial {self.reference_trial}'s outputs are not stored"
        return "none of its outputs matches a prompt of the baseline's"

    def judge(self, records: Iterable[RequestRecord]) -> Verdict | None:
        if not self.enabled or self.reference_trial is None:
            return None
        return judge(records, self.reference, self.key_of, gate_tokens=self.gate_tokens)
