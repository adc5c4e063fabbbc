"""best.sh runs the interpreter the study measured with (found running a real study's best.sh
on a node whose SGLang lives in its own venv, ``server.python``: ``python`` from the PATH had no
SGLang)."""

from __future__ import annotations

from rayspec._types import Candidate
from rayspec.results import Row
from rayspec.results import deploy_script
from tests.helpers import FIELD_EXPERIMENT
from tests.helpers import TWIN_EXPERIMENT
from tests.helpers import cached_config

PATHS = ["server.model_path=/models/target", "server.draft_model_path=/models/draft"]


def _row() -> Row:
    return Row(
        trials=(0,), label="no speculation", candidate=Candidate(), role="baseline",
        tok_s_mean=50.0, tok_s_runs=50.0, tok_s_peak=51.0, accept_length=float("nan"), sd=0.5,
        starts=1, runs=5,
    )  # fmt: skip


def _exec_line(script: str) -> str:
    return next(line for line in script.splitlines() if line.startswith("exec "))


def test_the_servers_interpreter_runs_the_best_configuration(tmp_path) -> None:
    cfg = cached_config(
        FIELD_EXPERIMENT, [*PATHS, "server.python=/opt/sglang/bin/python"], out=tmp_path
    )
    line = _exec_line(deploy_script(cfg, _row(), None))
    assert line.startswith("exec /opt/sglang/bin/python -m sglang.launch_server ")


def test_without_server_python_it_is_python_from_the_path(tmp_path) -> None:
    cfg = cached_config(FIELD_EXPERIMENT, PATHS, out=tmp_path)
    assert _exec_line(deploy_script(cfg, _row(), None)).startswith("exec python -m sglang.")
    # A twin study's interpreter ran the twin, not SGLang: the node's python.
    twin = cached_config(TWIN_EXPERIMENT, ["server.python=/venv/bin/python"], out=tmp_path)
    assert _exec_line(deploy_script(twin, _row(), None)).startswith("exec python -m sglang.")
