"""The ``sgl_kernel`` stand-in against references: attention against PyTorch's
``scaled_dot_product_attention`` (bfloat16 inputs, float32 reference), the tree and pool ops
against hand-worked cases of the kernels' semantics. The checks run in the SGLang env
(``_check_kernels.py``, which has torch); these tests assert on its results."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.real_sglang._server import scaffold_env

CHECKS = Path(__file__).with_name("_check_kernels.py")
BF16_TOLERANCE = 0.02  # inputs ~N(0, 1): bfloat16 output rounding is ~0.004
# The tree of the hand-worked cases: nodes 1 and 2 are the root's children, 3 is 1's child.
TREE_MASK = [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]


@pytest.fixture(scope="module")
def results(sglang_python: Path) -> dict[str, Any]:
    out = subprocess.run(
        [str(sglang_python), str(CHECKS)],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", **scaffold_env(fake_amx=False)},
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    loaded: dict[str, Any] = json.loads(out.stdout)
    return loaded


@pytest.mark.parametrize("key", ["decode_error", "decode_error_via_ops"])
def test_decode_attention_matches_sdpa_and_stores_the_new_kv(
    results: dict[str, Any], key: str
) -> None:
    assert results[key] < BF16_TOLERANCE


@pytest.mark.parametrize(
    "key", ["extend_error", "extend_error_via_ops", "extend_error_not_causal", "tree_error"]
)
def test_extend_attention_matches_sdpa_with_its_mask(results: dict[str, Any], key: str) -> None:
    assert results[key] < BF16_TOLERANCE


@pytest.mark.parametrize("key", ["extend_error_if_unmasked", "tree_error_if_unmasked"])
def test_the_attention_check_tells_the_masks_apart(results: dict[str, Any], key: str) -> None:
    """Against an unmasked reference the same output is far off: the check can fail."""
    assert results[key] > 10 * BF16_TOLERANCE


def test_a_chain_is_a_linked_list_with_a_causal_mask(results: dict[str, Any]) -> None:
    chain = results["chain"]
    assert chain["next_token"] == [1, 2, 3, -1]
    assert chain["sibling"] == [-1, -1, -1, -1]
    assert chain["positions"] == [10, 11, 12, 13]
    assert chain["mask"] == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]


@pytest.mark.parametrize("key", ["tree", "tree_full_mask"])
def test_a_tree_links_children_and_siblings_and_masks_non_ancestors(
    results: dict[str, Any], key: str
) -> None:
    tree = results[key]
    seq_len = 10 if key == "tree" else 3
    assert tree["index"] == [0, 1, 2, 3]
    assert tree["next_token"] == [1, 3, -1, -1]
    assert tree["sibling"] == [-1, 2, -1, -1]
    assert tree["positions"] == [seq_len, seq_len + 1, seq_len + 1, seq_len + 2]
    assert tree["mask"] == TREE_MASK
    assert tree["prefix_kept"]


def test_verify_accepts_a_sibling_when_the_first_child_is_wrong(results: dict[str, Any]) -> None:
    case = results["verify_sibling"]
    assert case["accepted"] == 1
    assert case["accept_index"] == [0, 2, -1]
    assert case["predicts"] == [12, -7, 55, -7]  # the target's tokens at accepted nodes


def test_verify_follows_the_longest_matching_path(results: dict[str, Any]) -> None:
    case = results["verify_path"]
    assert case["accepted"] == 2
    assert case["accept_index"] == [0, 1, 3]
    assert case["predicts"] == [11, 13, -7, 66]  # 66: the bonus token after node 3


def test_verify_with_no_match_keeps_only_the_bonus(results: dict[str, Any]) -> None:
    case = results["verify_none"]
    assert case["accepted"] == 0
    assert case["accept_index"] == [0, -1, -1]
    assert case["predicts"] == [99, -7, -7, -7]


def test_pool_ops_move_the_slots_they_name(results: dict[str, Any]) -> None:
    pool = results["pool"]
    assert pool["req_to_token_rows"] == [[0, 0, 0, 40, 41, 0], [50, 51, 52, 0]]
    assert pool["extend_locs"] == [40, 41, 50, 51, 52]
    assert pool["draft_locs"] == [40, 41, 51, 52]
    assert pool["draft_table"] == [[50, 51], [50, 52]]
    assert pool["bonus"] == [6, 10]
    assert pool["accepted_locs"] == [70, 73, 72]
    assert pool["kv_rows_copied"]
