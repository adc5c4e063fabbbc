"""study.slo and study.objective=goodput on the command line: a bad one is refused with one
line naming the key, exit 2, before anything starts."""

from __future__ import annotations

from typing import Any

import pytest

from rayspec._config import load_config
from rayspec.tune.__main__ import main
from tests.helpers import twin_doc
from tests.helpers import write_experiment

CASES: list[tuple[str, dict[str, Any], list[str], str]] = [
    ("unknown-key", {}, ["study.slo.ttft_p90_ms=100"],
     "study.slo.ttft_p90_ms: unknown key; expected ttft_p99_ms or itl_p99_ms"),
    ("unknown-key-yaml", {"study": {"slo": {"tpot_ms": 5}}}, [], "study.slo.tpot_ms: unknown key"),
    ("zero", {}, ["study.slo.ttft_p99_ms=0"], "study.slo.ttft_p99_ms: 0.0 must be a positive"),
    ("negative", {}, ["study.slo.itl_p99_ms=-3"], "study.slo.itl_p99_ms: -3.0 must be a positive"),
    ("infinite", {}, ["study.slo.itl_p99_ms=inf"], "study.slo.itl_p99_ms: inf"),
    ("not-a-number", {}, ["study.slo.itl_p99_ms=abc"], "study.slo.itl_p99_ms"),
    ("goodput-without-slo", {}, ["study.objective=goodput"],
     "study.objective: goodput needs study.slo"),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_bad_slo_is_refused_in_one_line(case, tmp_path, capsys, monkeypatch) -> None:
    import ray

    started: list[object] = []
    monkeypatch.setattr(ray, "init", lambda *a, **k: started.append((a, k)))
    _, sections, overrides, expected = case
    out = tmp_path / "runs"
    doc = twin_doc(str(out))
    for key, value in sections.items():
        doc[key].update(value)
    rc = main([write_experiment(str(tmp_path), doc), *overrides])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2 and len(lines) == 1, err
    assert lines[0].startswith("error: ") and expected in lines[0], lines[0]
    assert not out.exists() and started == []


def test_a_good_slo_loads(tmp_path) -> None:
    path = write_experiment(str(tmp_path), twin_doc(str(tmp_path)))
    cfg = load_config(path, ["study.objective=goodput", "study.slo.ttft_p99_ms=250",
                             "study.slo.itl_p99_ms=40"])  # fmt: skip
    assert cfg.study.slo == {"ttft_p99_ms": 250.0, "itl_p99_ms": 40.0}
