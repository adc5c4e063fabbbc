"""The real-engine path builds the field's launch (docs/sglang.md, *Launch template*; the tuned
NCCL of docs/twin-model.md)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from rayspec import Candidate
from rayspec import SpecSettings
from rayspec.engines.sglang import CONTRACT_PINNED_VERSIONS
from rayspec.engines.sglang import SGLANG_VERSIONS
from rayspec.engines.sglang import cuda_graph_flag
from rayspec.engines.sglang import sglang_features
from rayspec.search import SearchSpace
from rayspec.server._command import build_launch
from rayspec.server._command import shell_line
from rayspec.testing import FIELD_TUNED_NCCL
from tests.helpers import FIELD_EXPERIMENT
from tests.helpers import TWIN_EXPERIMENT
from tests.helpers import cached_config

FIELD_OVERRIDES = [
    "server.model_path=/models/kimi-k2.5-int4",
    "server.draft_model_path=/models/kimi-k2.5-eagle3",
]
TUNED = dict(FIELD_TUNED_NCCL)


def _field_candidate() -> Candidate:
    return Candidate(nccl_env=tuple(sorted(TUNED.items())), spec=SpecSettings("EAGLE3", 2, 1, 3))


def test_field_launch_line() -> None:
    cfg = cached_config(FIELD_EXPERIMENT, FIELD_OVERRIDES)
    launch = build_launch(cfg, _field_candidate(), port=30000, log_path="/tmp/t.log")
    # The template of docs/sglang.md, *Launch template*, with the field's values:
    expected = [
        sys.executable, "-m", "sglang.launch_server",
        "--model-path", "/models/kimi-k2.5-int4", "--tp-size", "8",
        "--host", "127.0.0.1", "--port", "30000",
        "--speculative-algorithm", "EAGLE3",
        "--speculative-draft-model-path", "/models/kimi-k2.5-eagle3",
        "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "3",
        "--attention-backend", "triton", "--max-running-requests", "48",
        "--cuda-graph-max-bs-decode", "48", "--mem-fraction-static", "0.85",
        "--trust-remote-code", "--enable-metrics",
    ]  # fmt: skip
    assert list(launch.argv) == expected
    assert launch.engine == "sglang"
    env = launch.env_dict
    assert {k: env[k] for k in TUNED} == TUNED
    assert env["NCCL_NVLS_ENABLE"] == "0"  # multicast stays off
    assert env["SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"] == "1"
    assert launch.unset_env == ()
    assert not any("nvls" in a or "symm-mem" in a for a in launch.argv)


def test_baseline_leaves_out_speculation_and_unsets_nccl() -> None:
    cfg = cached_config(FIELD_EXPERIMENT, FIELD_OVERRIDES)
    launch = build_launch(cfg, Candidate(), port=30001, log_path="/tmp/t.log")
    assert not any(a.startswith("--speculative") for a in launch.argv)
    # The running-request and graph caps stay explicit, as in the speculative arm.
    assert "--max-running-requests" in launch.argv and "--cuda-graph-max-bs-decode" in launch.argv
    assert set(launch.unset_env) == set(TUNED)  # nothing leaks in from the node's environment
    assert launch.port == 30001 and "30001" in launch.argv


def test_real_engine_is_never_the_twin_and_twin_says_so() -> None:
    real = build_launch(
        cached_config(FIELD_EXPERIMENT, FIELD_OVERRIDES), Candidate(), port=1, log_path="-"
    )
    assert "rayspec.twin.server" not in real.argv and not any("--twin" in a for a in real.argv)
    twin = build_launch(cached_config(TWIN_EXPERIMENT), _field_candidate(), port=1, log_path="-")
    assert twin.argv[1:3] == ("-m", "rayspec.twin.server") and twin.engine == "twin"
    assert "--twin-profile" in twin.argv and "--twin-seed" in twin.argv


def test_graph_flag_by_version() -> None:
    assert cuda_graph_flag("0.5.23") == "--cuda-graph-max-bs-decode"
    assert cuda_graph_flag("0.5.18") == "--cuda-graph-max-bs-decode"
    assert cuda_graph_flag("0.5.12") == "--cuda-graph-max-bs"
    assert cuda_graph_flag("0.4.10.post2") == "--cuda-graph-max-bs"
    assert cuda_graph_flag("0.5.17") == "--cuda-graph-max-bs"
    assert cuda_graph_flag("0.5.20rc1") == "--cuda-graph-max-bs-decode"  # counts as 0.5.20


def test_version_table() -> None:
    old, new = "--cuda-graph-max-bs", "--cuda-graph-max-bs-decode"
    assert [r.since for r in SGLANG_VERSIONS] == sorted(r.since for r in SGLANG_VERSIONS)
    assert sglang_features("0.3.0") is SGLANG_VERSIONS[0]  # older: the oldest known row
    assert sglang_features("0.9.1") is SGLANG_VERSIONS[-1]
    both = sglang_features("0.5.19")  # the old name is a deprecated alias of the new one
    assert both.cuda_graph_flag == new and both.deprecated_graph_flags == (old,)
    assert both.rejected_graph_flags == ()
    assert sglang_features("0.5.20").rejected_graph_flags == (old,)
    assert not sglang_features("0.5.19").has_ready_endpoint
    assert sglang_features("0.5.20").has_ready_endpoint
    assert sglang_features("0.4.10").spec_meta_fields == ("spec_verify_ct",)
    assert "spec_accepted_drafts" in sglang_features("0.5.20").spec_meta_fields
    assert "spec_accepted_drafts" not in sglang_features("0.5.21").spec_meta_fields
    assert "spec_accept_length" in sglang_features("0.5.23").spec_meta_fields


def test_contract_pinned_version_is_the_one_ci_builds() -> None:
    script = Path(__file__).resolve().parents[2] / ".ci" / "sglang-env"
    built = re.search(r"^SGLANG_VERSION=(\S+)$", script.read_text(), re.MULTILINE)
    assert built is not None and CONTRACT_PINNED_VERSIONS == (built.group(1),)


def test_twin_seed_is_per_trial_and_reproducible() -> None:
    cfg = cached_config(TWIN_EXPERIMENT)
    seeds = [build_launch(cfg, Candidate(), port=1, log_path="-", trial=n).argv for n in (0, 1, 0)]
    assert seeds[0] == seeds[2] != seeds[1]


def test_searched_flags_reach_argv_and_shell_line_quotes() -> None:
    cfg = cached_config(TWIN_EXPERIMENT, ["search.flags={--disable-custom-all-reduce: [on, off]}"])
    space = SearchSpace.from_config(cfg.search)
    cand = space.candidate({"flags.--disable-custom-all-reduce": "on"})
    launch = build_launch(cfg, cand, port=1, log_path="-")
    assert "--disable-custom-all-reduce" in launch.argv
    line = shell_line(launch)
    assert line.startswith("env -u ") and "NCCL_NVLS_ENABLE=0" in line
