"""The twin's flag surface and SGLang's resolution rules, checked in-process (fast)."""

from __future__ import annotations

import argparse

import pytest

from rayspec.twin._args import build_parser
from rayspec.twin._args import parse_args
from rayspec.twin._resolve import MAX_RUNNING_WARNING
from rayspec.twin._resolve import TOPK1_WARNING
from rayspec.twin._resolve import resolve_server_args

BASE = ["--model-path", "m", "--tp-size", "8"]
EAGLE = [*BASE, "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "d"]
ARCH = "KimiK25ForConditionalGeneration"


def resolve(argv: list[str], env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return resolve_server_args(parse_args(argv), architecture=ARCH, env=env or {})


def spec(steps: int, topk: int, ndt: int) -> list[str]:
    return [
        *EAGLE,
        "--speculative-num-steps",
        str(steps),
        "--speculative-eagle-topk",
        str(topk),
        "--speculative-num-draft-tokens",
        str(ndt),
    ]


def test_every_option_has_help() -> None:
    for version in ((0, 5, 12), (0, 5, 19), (0, 5, 23)):
        parser = build_parser(version)
        missing = [a.option_strings for a in parser._actions if a.option_strings and not a.help]
        assert missing == []


def test_issue_flags_parse_with_sglang_spelling() -> None:
    ns = parse_args(
        [
            *spec(5, 1, 6),
            "--host",
            "127.0.0.1",
            "--port",
            "30001",
            "--mem-fraction-static",
            "0.85",
            "--disable-custom-all-reduce",
            "--max-running-requests",
            "4",
            "--attention-backend",
            "fa3",
            "--enable-metrics",
            "--log-level",
            "warning",
            "--trust-remote-code",
            "--num-continuous-decode-steps",
            "3",
            "--cuda-graph-max-bs-decode",
            "4",
            "--decode-log-interval",
            "10",
            "--skip-server-warmup",
            "--context-length",
            "4096",
            "--chunked-prefill-size",
            "2048",
            "--enable-nccl-nvls",
            "--enable-symm-mem",
            "--tensor-parallel-size",
            "8",
            "--speculative-draft-model",
            "d2",
            "--model",
            "m2",
        ]
    )
    assert ns.max_running_requests == 4
    assert ns.speculative_draft_model_path == "d2"
    assert ns.model_path == "m2"
    assert ns.num_continuous_decode_steps == 3


def test_unknown_flag_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args([*BASE, "--no-such-flag"])
    assert info.value.code == 2
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err


def test_cuda_graph_max_bs_by_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args([*BASE, "--cuda-graph-max-bs", "64"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode" in err
    old = parse_args([*BASE, "--cuda-graph-max-bs", "64", "--twin-version", "0.5.19"])
    assert old.cuda_graph_max_bs_decode == 64
    older = parse_args([*BASE, "--cuda-graph-max-bs", "64", "--twin-version", "0.5.5"])
    assert older.cuda_graph_max_bs_decode == 64
    with pytest.raises(SystemExit):
        parse_args([*BASE, "--cuda-graph-max-bs-decode", "64", "--twin-version", "0.5.5"])


def test_topk_one_forces_draft_tokens() -> None:
    res = resolve(spec(3, 1, 8))
    assert res.args["speculative_num_draft_tokens"] == 4
    assert res.spec is not None and res.spec.num_draft_tokens == 4
    assert TOPK1_WARNING in res.warnings
    no_ndt = resolve([*EAGLE, "--speculative-num-steps", "2", "--speculative-eagle-topk", "1"])
    assert no_ndt.args["speculative_num_draft_tokens"] == 3


def test_running_request_cap() -> None:
    res = resolve(spec(2, 1, 3))
    assert res.max_running_requests == 48
    assert MAX_RUNNING_WARNING in res.warnings
    assert resolve([*spec(2, 1, 3), "--max-running-requests", "128"]).max_running_requests == 128
    baseline = resolve(BASE)
    assert baseline.spec is None and baseline.max_running_requests != 48
    # the 48 cap does not lower the graph size (resolved before speculation)
    assert res.args["cuda_graph_max_bs_decode"] == 512


@pytest.mark.parametrize(
    ("extra", "exc", "text"),
    [
        (
            ["--speculative-num-steps", "3"],
            TypeError,
            "'>' not supported between instances of 'NoneType' and 'int'",
        ),
        (["--speculative-eagle-topk", "2"], AssertionError, ""),
        (["--speculative-num-draft-tokens", "4"], AssertionError, ""),
        (
            ["--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "4"],
            AssertionError,
            "",
        ),
    ],
)
def test_partial_spec_flags_fail(extra: list[str], exc: type[Exception], text: str) -> None:
    with pytest.raises(exc) as info:
        resolve([*EAGLE, *extra])
    assert text in str(info.value)


def test_unknown_algorithm_and_backend_rules() -> None:
    with pytest.raises(ValueError, match="Unknown speculative algorithm name: FOO"):
        resolve([*BASE, "--speculative-algorithm", "FOO"])
    with pytest.raises(ValueError, match="trtllm_mha"):
        resolve([*spec(3, 2, 4), "--attention-backend", "trtllm_mha"])
    with pytest.raises(ValueError, match="page_size"):
        resolve([*spec(3, 2, 4), "--page-size", "16", "--attention-backend", "torch_native"])


def test_automatic_params_and_attention_shift() -> None:
    auto = resolve(EAGLE)
    assert (auto.spec.num_steps, auto.spec.eagle_topk, auto.spec.num_draft_tokens) == (3, 1, 4)
    llama = resolve_server_args(parse_args(EAGLE), architecture="LlamaForCausalLM", env={})
    assert llama.spec is not None and llama.spec.num_draft_tokens == 8
    assert llama.args["attention_backend"] == "fa3"  # topk still None when chosen
    assert resolve(spec(3, 2, 4)).args["attention_backend"] == "flashinfer"
    assert resolve(spec(3, 1, 4)).args["attention_backend"] == "fa3"


def test_tree_budget_is_not_a_resolution_error() -> None:
    res = resolve(spec(2, 2, 16))
    assert res.tree_error is not None and "selected index k out of range" in res.tree_error
    assert resolve(spec(2, 2, 7)).tree_error is None
    # A budget short of the tree's accepted path (steps + 1): SGLang 0.5.23's verify error.
    short = resolve(spec(5, 2, 4)).tree_error
    assert short is not None and "expanded size of the tensor (4)" in short, short
    assert "existing size (6)" in short
    assert resolve(spec(5, 2, 6)).tree_error is None


def test_sglang_env_writes() -> None:
    res = resolve(BASE, env={"NCCL_NVLS_ENABLE": "0"})
    assert res.env_updates["CUDA_DEVICE_MAX_CONNECTIONS"] == "8"
    assert "NCCL_NVLS_ENABLE" not in res.env_updates  # 0.5.23 leaves an existing value alone
    assert resolve(BASE).env_updates["NCCL_NVLS_ENABLE"] == "0"
    forced = resolve([*BASE, "--enable-nccl-nvls"], env={"NCCL_NVLS_ENABLE": "0"})
    assert forced.env_updates["NCCL_NVLS_ENABLE"] == "1"
    assert resolve([*BASE, "--enable-symm-mem"]).env_updates["NCCL_NVLS_ENABLE"] == "1"


def test_memory_defaults() -> None:
    res = resolve(BASE)
    assert res.args["mem_fraction_static"] == pytest.approx(0.848, abs=0.001)
    assert res.args["chunked_prefill_size"] == 8192
    explicit = resolve([*BASE, "--max-running-requests", "16"])
    assert explicit.args["cuda_graph_max_bs_decode"] == 16


def test_namespace_is_plain_argparse() -> None:
    assert isinstance(parse_args(BASE), argparse.Namespace)
