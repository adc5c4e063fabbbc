"""The tree SGLang refuses, without a server: rayspec's pre-launch rule (``fits_tree``) against
SGLang's own code, at a real server's first speculative decode (its warm-up):
``organize_draft_results`` keeps the ``ndt - 1`` best draft nodes with ``torch.topk`` and fails
on a tree that holds fewer; the tree verify's ``_compact_accept_to_front`` moves the accepted
path (``steps + 1`` slots) to the front of each request's block of ``ndt`` and fails on a shorter
block. The draft loop's score shapes are SGLang's: ``[b, 1, topk]`` at the first step,
``[b, topk, topk]`` after it. The error texts are the ones the classifier reads."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from rayspec._types import SpecSettings
from rayspec.server import classify_failure
from tests.real_sglang import _study as st

_ASK_SGLANG = """
import json, torch
from sglang.srt.speculative.eagle_utils import organize_draft_results
from sglang.srt.speculative.eagle_worker_common import _compact_accept_to_front
out = []
for steps in range(1, 5):
    for topk in range(1, 5):
        for ndt in range(2, 2 + topk + (steps - 1) * topk ** 2 + 3):
            scores = [torch.rand(1, 1, topk)] + [
                torch.rand(1, topk, topk) for _ in range(steps - 1)]
            tokens = [torch.randint(0, 100, (1, topk))] + [
                torch.randint(0, 100, (1, topk * topk)) for _ in range(steps - 1)]
            parents = [torch.zeros(1, topk + 1, dtype=torch.long)] + [
                torch.zeros(1, topk, dtype=torch.long) for _ in range(steps - 1)]
            try:
                organize_draft_results(scores, tokens, parents, ndt)
                if topk > 1:  # the tree path of the verify (a chain's block is its path)
                    _compact_accept_to_front(torch.zeros(2 * ndt, 3),
                        torch.zeros(2, steps + 1, dtype=torch.long), 2, num_draft_tokens=ndt)
                out.append([steps, topk, ndt, ""])
            except RuntimeError as exc:
                out.append([steps, topk, ndt, str(exc).splitlines()[0]])
print(json.dumps(out))
"""


def test_rayspec_refuses_exactly_the_trees_sglang_cannot_build(sglang_python: Path) -> None:
    proc = subprocess.run(
        [str(sglang_python), "-c", _ASK_SGLANG],
        capture_output=True, text=True, timeout=300, env=st.driver_env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    cases = json.loads(proc.stdout.strip().splitlines()[-1])
    refused = [c for c in cases if c[3]]
    assert refused and len(refused) < len(cases)
    for steps, topk, ndt, error in cases:
        fits = SpecSettings("EAGLE3", steps, topk, ndt).fits_tree
        assert fits == (error == ""), (steps, topk, ndt, error)
        if error:  # what a real server logs at its first decode, classified as such
            assert classify_failure(f"RuntimeError: {error}", 1, "startup").value == (
                "invalid_draft_tree"
            ), error
