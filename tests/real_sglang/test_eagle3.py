"""The real SGLang server with EAGLE-3 on this CPU: SGLang's own scheduler, EAGLE workers,
verify logic and API fields, with the stand-in kernels underneath.

Greedy decoding must not depend on speculation: a chain (topk 1) and a tree (topk 2) give the
very tokens the plain server gives. A drafter that always agrees with its target is accepted in
full at every step (accept length = steps + 1), a random one almost never.
"""

from __future__ import annotations

import math

import pytest

from tests.real_sglang._models import TinyModels
from tests.real_sglang._runs import AGREE
from tests.real_sglang._runs import AGREE_TOKENS
from tests.real_sglang._runs import CHAIN
from tests.real_sglang._runs import MAX_NEW_TOKENS
from tests.real_sglang._runs import ServerRun
from tests.real_sglang._runs import eagle_flags
from tests.real_sglang._runs import serve_and_collect
from tests.real_sglang._server import RealServer

# A test's timeout covers its fixtures: the first here may start two servers (70-80 s each
# on a loaded 2-core machine), past the suite's 300 s default.
pytestmark = pytest.mark.timeout(900)

TREE = {"steps": 2, "topk": 2, "draft_tokens": 4}


@pytest.fixture(scope="module")
def chain(chain_run: ServerRun) -> ServerRun:
    return chain_run  # one start for this module and the contract diff


@pytest.fixture(scope="module")
def tree(
    real_server: RealServer, tiny_models: TinyModels, tmp_path_factory: pytest.TempPathFactory
) -> ServerRun:
    flags = eagle_flags(str(tiny_models.target), str(tiny_models.draft), TREE)
    return serve_and_collect("tree", real_server, flags, tmp_path_factory.mktemp("tree"))


@pytest.fixture(scope="module")
def agree(agree_run: ServerRun) -> ServerRun:
    return agree_run  # one start for this module and the contract diff


@pytest.fixture(params=["chain", "tree"])
def speculative(request: pytest.FixtureRequest) -> tuple[ServerRun, dict[str, int]]:
    shape = CHAIN if request.param == "chain" else TREE
    return request.getfixturevalue(request.param), shape


def test_greedy_tokens_are_those_of_the_plain_server(
    speculative: tuple[ServerRun, dict[str, int]], plain_run: ServerRun
) -> None:
    run, _ = speculative
    for spec_out, plain_out in zip(run.outputs, plain_run.outputs, strict=True):
        assert spec_out["output_ids"] == plain_out["output_ids"]
        assert spec_out["text"] == plain_out["text"]


def test_the_server_runs_the_requested_eagle_shape(
    speculative: tuple[ServerRun, dict[str, int]],
) -> None:
    run, shape = speculative
    info = run.server_info
    assert info["speculative_algorithm"] == "EAGLE3"
    assert info["attention_backend"] == "intel_amx"
    assert info["speculative_num_steps"] == shape["steps"]
    assert info["speculative_eagle_topk"] == shape["topk"]
    assert info["speculative_num_draft_tokens"] == shape["draft_tokens"]


def test_meta_info_counts_verify_steps_and_accepted_drafts(
    speculative: tuple[ServerRun, dict[str, int]],
) -> None:
    """accept length = tokens / verify steps; the histogram has one entry per verify step."""
    run, shape = speculative
    for out in run.outputs:
        meta = out["meta_info"]
        assert meta["completion_tokens"] == MAX_NEW_TOKENS
        verify = meta["spec_verify_ct"]
        assert 0 < verify <= MAX_NEW_TOKENS
        assert math.isclose(meta["spec_accept_length"], MAX_NEW_TOKENS / verify)
        histogram = meta["spec_correct_drafts_histogram"]
        assert sum(histogram) == verify
        assert len(histogram) <= shape["steps"] + 1
        assert meta["spec_num_proposed_drafts"] == verify * (shape["draft_tokens"] - 1)


def test_an_always_agreeing_drafter_is_accepted_in_full(agree: ServerRun) -> None:
    (out,) = agree.outputs
    meta = out["meta_info"]
    full = AGREE["steps"] + 1
    assert meta["completion_tokens"] == AGREE_TOKENS
    assert set(out["output_ids"]) == {0}  # zero final norms: all logits 0, token 0 wins
    # Every verify step but possibly the last (cut at max_new_tokens) accepts all drafts.
    assert meta["spec_verify_ct"] <= math.ceil(AGREE_TOKENS / full) + 1
    assert meta["spec_accept_length"] >= full - 0.25
    assert meta["spec_accept_rate"] >= 0.9
    histogram = meta["spec_correct_drafts_histogram"]
    assert histogram[AGREE["steps"]] >= sum(histogram) - 2


def test_a_random_drafter_is_rarely_accepted(chain: ServerRun, agree: ServerRun) -> None:
    """The accept length moves with the drafter: not a constant of the setup."""
    random_len = max(out["meta_info"]["spec_accept_length"] for out in chain.outputs)
    agree_len = agree.outputs[0]["meta_info"]["spec_accept_length"]
    assert random_len < 1.5
    assert agree_len > random_len + 1.5


@pytest.mark.parametrize("name", ["chain", "tree", "agree"])
def test_stopping_leaves_no_process_of_the_tree(request: pytest.FixtureRequest, name: str) -> None:
    run: ServerRun = request.getfixturevalue(name)
    assert len(run.tree) >= 3
    assert run.alive_after_stop == ()
