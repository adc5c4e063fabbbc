"""Preflight on output budgets and on what the twin simulates (issue 33: medium 5 and a
newcomer's find).

A budget past the served context length is refused before anything starts (SGLang refuses
every such request with HTTP 400: every trial would fail), naming the key; the twin's trials
are its profile's model at its profile's TP size, and a study that names another says so in
one warning line each."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rayspec.tune.__main__ import main
from tests.helpers import free_port_block
from tests.helpers import twin_doc
from tests.helpers import write_experiment


@pytest.fixture
def no_ray(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    import ray

    started: list[object] = []
    monkeypatch.setattr(ray, "init", lambda *a, **k: started.append((a, k)))
    return started


def _experiment(tmp_path: Any, **sections: Any) -> str:
    sections.setdefault("cluster", {"include_dashboard": False})
    return write_experiment(str(tmp_path), twin_doc(str(tmp_path / "runs"), **sections))


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str], expected: str) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert expected in lines[0] and "Traceback" not in err, lines[0]
    return lines[0]


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["bench.max_tokens=1000000000000"], "bench.max_tokens"),
        (["bench.max_tokens=262144"], "bench.max_tokens"),  # the context itself: no room
        (["bench.scenarios=[{name: s, max_tokens: 10}, {name: t, max_tokens: 300000}]"],
         "bench.scenarios[1].max_tokens"),
        (["bench.scenarios=[{name: s, max_tokens: 10, output_len: [5, 9000000]}]"],
         "bench.scenarios[0].output_len"),
    ],
)  # fmt: skip
def test_a_budget_past_the_twins_context_is_refused(
    tmp_path: Any, capsys: pytest.CaptureFixture[str], no_ray: list[object],
    overrides: list[str], key: str,
) -> None:  # fmt: skip
    line = _refused([_experiment(tmp_path), *overrides], capsys, f"error: {key}: ")
    assert "262,144 tokens (the twin's context length)" in line and "at most 262,143" in line
    assert no_ray == []


def test_the_largest_budget_that_fits_is_accepted(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--dry-run", _experiment(tmp_path), "bench.max_tokens=262143"]) == 0


def test_a_prompt_records_budget_is_checked(
    tmp_path: Any, capsys: pytest.CaptureFixture[str], no_ray: list[object]
) -> None:
    prompts = tmp_path / "p.jsonl"
    rows = [{"prompt": "a", "output_tokens": 100}, {"prompt": "b", "output_tokens": 10**12}]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = _experiment(tmp_path, bench={"prompts": str(prompts)})
    port = f"server.port={free_port_block(1)}"  # launching: the prompts are read
    _refused([path, port], capsys, "a record's output_tokens: 1,000,000,000,000")


def test_the_context_comes_from_the_model_folder_and_the_flag(
    tmp_path: Any, capsys: pytest.CaptureFixture[str], no_ray: list[object]
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    config = {"architectures": ["LlamaForCausalLM"], "max_position_embeddings": 2048}
    (model / "config.json").write_text(json.dumps(config))
    path = _experiment(tmp_path, server={"model_path": str(model)})
    line = _refused([path, "bench.max_tokens=2048"], capsys, "error: bench.max_tokens: 2,048")
    assert f"2,048 tokens (the context length of {model}/config.json)" in line
    flag = "server.extra_flags=[--context-length, '100']"
    _refused([path, "bench.max_tokens=100", flag], capsys, "--context-length in server.extra")


def test_the_real_engine_refuses_a_budget_no_model_takes(
    tmp_path: Any, capsys: pytest.CaptureFixture[str], no_ray: list[object]
) -> None:
    path = _experiment(tmp_path, server={
        "engine": "sglang", "model_path": "org/kimi", "draft_model_path": "org/d"})  # fmt: skip
    _refused(["--dry-run", path, "bench.max_tokens=1000000000000"], capsys,
             "longer than any served model's context")  # fmt: skip


def test_the_twin_says_what_it_does_not_simulate(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Llama path returned Kimi-K2.5's numbers and --tp-size 4 the timings of 8, silently."""
    path = _experiment(tmp_path, server={"model_path": "meta-llama/Llama-3.3-70B"})
    assert main(["--dry-run", path, "server.tp_size=4"]) == 0
    warnings = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("warning: ")]
    assert len(warnings) == 2, warnings
    tp, model = warnings
    assert tp.startswith("warning: server.tp_size=4: profile kimi-k2.5-tp8-pcie: ")
    assert "describes TP 8 only; the timings are TP 8's" in tp
    assert model.startswith("warning: server.model_path=meta-llama/Llama-3.3-70B: not a local")
    assert "KimiK25ForConditionalGeneration" in model
    (tmp_path / "ok").mkdir()
    assert main(["--dry-run", _experiment(tmp_path / "ok")]) == 0  # the profile's own: quiet
    assert "warning: " not in capsys.readouterr().err
