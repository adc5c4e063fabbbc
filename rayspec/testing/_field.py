"""The field's reference settings (docs/twin-model.md, *The field measurements*), for tests,
benchmarks and examples."""

from __future__ import annotations

from types import MappingProxyType

FIELD_TUNED_NCCL = MappingProxyType(
    {
        "NCCL_PROTO": "LL",
        "NCCL_ALGO": "Ring",
        "NCCL_P2P_LEVEL": "SYS",
        "NCCL_MAX_NCHANNELS": "16",
        "NCCL_BUFFSIZE": "16777216",
        "NCCL_NTHREADS": "512",
    }
)
""""NCCL tuned" of the field table: the six variables the hand-tuned node exported."""


def eagle3_flags(steps: int, topk: int = 1, draft_tokens: int | None = None) -> list[str]:
    """SGLang's EAGLE-3 flags, all three numbers together (topk 1: steps + 1 draft tokens)."""
    ndt = steps + 1 if draft_tokens is None else draft_tokens
    return [
        "--speculative-algorithm", "EAGLE3",
        "--speculative-draft-model-path", "drafter",
        "--speculative-num-steps", str(steps),
        "--speculative-eagle-topk", str(topk),
        "--speculative-num-draft-tokens", str(ndt),
    ]  # fmt: skip
