"""Why a server failed, read from SGLang's real failure lines (a pure function).

The texts are SGLang's (docs/sglang.md, *Speculative rules* and *Failure texts*) and the NCCL
failure classes of docs/twin-model.md, *NCCL variables*. The table is ordered: the first rule whose
pattern occurs in the log wins, so a more specific cause sits above a more general one (a
graph capture that failed because of an OOM is reported as the graph capture, whose remedy
differs; NCCL's "no algorithm" error is also an ``ncclInvalidUsage`` and must beat the init
rule). When no rule matches, the phase decides.
"""

from __future__ import annotations

import dataclasses
import re

from rayspec._exceptions import FailureReason
from rayspec.engines._base import Phase


@dataclasses.dataclass(frozen=True)
class _Rule:
    pattern: re.Pattern[str]
    reason: FailureReason
    returncode: int | None = None  # required exit status, if any
    phases: frozenset[Phase] = frozenset(Phase)


_RULES: tuple[_Rule, ...] = (
    # docs/sglang.md, *Speculative rules*: tree budget exceeded, torch.topk fails at the first
    # speculative decode.
    _Rule(re.compile(r"selected index k out of range"), FailureReason.INVALID_DRAFT_TREE),
    # A tree's budget short of its accepted path (steps + 1): 0.5.23's verify moves the path to
    # the front of a block of num_draft_tokens (eagle_worker_common._compact_accept_to_front).
    _Rule(
        re.compile(
            r"_compact_accept_to_front|The expanded size of the tensor \(\d+\) must match "
            r"the existing size \(\d+\) at non-singleton dimension 1"
        ),
        FailureReason.INVALID_DRAFT_TREE,
    ),
    # docs/twin-model.md, *NCCL variables* / NCCL src/enqueue.cc: nothing usable left in NCCL_ALGO
    # x NCCL_PROTO.
    _Rule(
        re.compile(r"no algorithm/protocol available", re.IGNORECASE),
        FailureReason.NCCL_FIRST_COLLECTIVE,
    ),
    # NCCL "invalid usage" at communicator init (unknown NCCL_PROTO/NCCL_ALGO token).
    _Rule(
        re.compile(r"ncclInvalidUsage|NCCL error.*invalid usage", re.IGNORECASE),
        FailureReason.NCCL_INIT,
    ),
    # docs/sglang.md, *Failure texts*: decode_cuda_graph_runner "Capture cuda graph failed: {e}".
    _Rule(
        re.compile(r"Capture cuda graph failed", re.IGNORECASE), FailureReason.CUDA_GRAPH_CAPTURE
    ),
    # docs/sglang.md, *Failure texts*: torch OOM inside the scheduler traceback; KV pool too small.
    _Rule(
        re.compile(
            r"CUDA out of memory|OutOfMemoryError|Not enough memory\. Please try to increase"
        ),
        FailureReason.OUT_OF_MEMORY,
    ),
    # argparse: "usage: ...\nlaunch_server.py: error: unrecognized arguments: ..." and exit 2.
    _Rule(
        re.compile(r"(?m)^(?:usage: |\S+: error: )"),
        FailureReason.ARGUMENT_ERROR,
        returncode=2,
        phases=frozenset({Phase.STARTUP}),
    ),
    # docs/sglang.md, *Speculative rules*: resolution-time failures of the speculative flags (exit
    # 1, before any weights).
    _Rule(
        re.compile(
            r"Unknown speculative algorithm name"
            r"|TypeError: '>' not supported between instances of 'NoneType' and 'int'"
        ),
        FailureReason.ARGUMENT_ERROR,
        phases=frozenset({Phase.STARTUP}),
    ),
    # A model or draft path that does not exist: SGLang resolves the draft's config while it
    # resolves the arguments (speculative_hook.py, get_config), takes a missing local path for
    # a hub id and exits 1 before any weights load (seen on real 0.5.23).
    _Rule(
        re.compile(
            r"OSError: Repo id must be in the form 'repo_name'"
            r"|is not a local folder and is not a valid model identifier"
        ),
        FailureReason.ARGUMENT_ERROR,
        phases=frozenset({Phase.STARTUP}),
    ),
)

_FALLBACK = {
    Phase.STARTUP: FailureReason.STARTUP_CRASH,
    Phase.TIMEOUT: FailureReason.NEVER_READY,
    Phase.SERVING: FailureReason.CRASH_MID_BENCHMARK,
}


def classify_failure(log_text: str, returncode: int | None, phase: str | Phase) -> FailureReason:
    """Classify a server failure from its log, its exit status and when it happened.

    Args:
        log_text: the server log (or its tail; the last MiB is plenty).
        returncode: the exit status (negative for a signal), or None if it did not exit.
        phase: ``"startup"`` (exited before ready), ``"timeout"`` (never ready, still
            running) or ``"serving"`` (exited after ready).

    Returns:
        The most specific :class:`FailureReason` the evidence supports.

    Raises:
        ValueError: ``phase`` is not one of the three.

    Example::

        >>> classify_failure("RuntimeError: selected index k out of range", 1, "startup")
        <FailureReason.INVALID_DRAFT_TREE: 'invalid_draft_tree'>
    """
    phase = Phase(phase)
    for rule in _RULES:
        if phase not in rule.phases:
            continue
        if rule.returncode is not None and rule.returncode != returncode:
            continue
        if rule.pattern.search(log_text):
            return rule.reason
    return _FALLBACK[phase]
