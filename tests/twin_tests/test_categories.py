"""The twin's acceptance by prompt category (``drafter.category_mult``): read strictly, applied
alike by the HTTP twin and the in-process simulation, and stored per trial."""

from __future__ import annotations

import statistics

import pytest
import yaml

from rayspec import Candidate
from rayspec import SpecSettings
from rayspec._config import load_config
from rayspec.bench import request_input
from rayspec.bench import run_benchmark_detailed
from rayspec.store import ParquetTrialStore
from rayspec.testing import SimulatedTrials
from rayspec.testing._twin import TwinProcess
from rayspec.tune import run_study
from rayspec.tune._trial import bench_plan
from rayspec.twin import load_profile
from rayspec.twin._errors import ProfileError
from rayspec.twin._profile import _PROFILE_DIR
from rayspec.twin._profile import profile_from_dict
from rayspec.twin._simulate import SimulatedServer
from rayspec.twin._text import count_prompt_tokens
from tests.helpers import REPO
from tests.helpers import TWIN_EXPERIMENT
from tests.helpers import free_port_block
from tests.twin_tests.test_simulate import LL_SYS
from tests.twin_tests.test_simulate import _argv

REFERENCE = f"{REPO}/rayspec/twin/{_PROFILE_DIR}/kimi-k2.5-tp8-pcie.yaml"
SPEC = SpecSettings("EAGLE3", 3, 1, 4)


def _doc() -> dict:  # type: ignore[type-arg]
    with open(REFERENCE, encoding="utf-8") as fh:
        return yaml.safe_load(fh)  # type: ignore[no-any-return]


def test_the_reference_profile_gives_code_more_acceptance_than_chat() -> None:
    drafter = load_profile("kimi-k2.5-tp8-pcie").drafter
    assert drafter.mult_for("code") > drafter.mult_for("long-form") > drafter.mult_for("chat")
    assert drafter.mult_for("default") == drafter.mult_for(None) == 1.0  # the fit's prompts
    assert drafter.mult_for("not named") == 1.0


def test_a_profile_without_category_mult_scales_nothing() -> None:
    doc = _doc()
    del doc["drafter"]["category_mult"]
    assert profile_from_dict(doc).drafter.mult_for("code") == 1.0


@pytest.mark.parametrize("bad", [0, -1.0, "high", True])
def test_a_bad_category_multiplier_names_its_key(bad: object) -> None:
    doc = _doc()
    doc["drafter"]["category_mult"] = {"code": bad}
    with pytest.raises(ProfileError, match=r"'drafter\.category_mult\.code'"):
        profile_from_dict(doc)


def _sim_accepts(category: str) -> list[float]:
    cfg = load_config(TWIN_EXPERIMENT)
    args, env = _argv(cfg, Candidate(nccl_env=LL_SYS, spec=SPEC))
    server = SimulatedServer(args, env)
    out = []
    for _ in range(40):
        got = server.generate(40, 200, None, category)
        assert got.verify_ct
        out.append(got.completion_tokens / got.verify_ct)
    return out


def test_the_simulation_accepts_more_drafts_for_code_than_for_chat() -> None:
    code, chat, plain = (statistics.mean(_sim_accepts(c)) for c in ("code", "chat", "default"))
    assert code > plain > chat
    assert code / chat > 1.05  # 1.12 / 0.94 on every a_j: well beyond the sampling spread


def test_the_http_twin_gets_the_category_from_the_client_and_the_simulation_agrees() -> None:
    """A twin study's client sends each request's category; the HTTP twin draws exactly the
    tokens and verify steps the simulation draws for the same category."""
    cfg = load_config(
        TWIN_EXPERIMENT,
        ["bench.max_tokens=120", "bench.repeats=4", "bench.prompts=mixed"],
    )
    args, env = _argv(cfg, Candidate(nccl_env=LL_SYS, spec=SPEC))
    plan = bench_plan(cfg)
    with TwinProcess([*args, "--twin-realtime", "false"], env=env) as twin:
        twin.wait_ready()
        served = run_benchmark_detailed(twin.base_url, plan).records
    sim = SimulatedServer(args, env)
    scenario = plan.scenarios[0]
    cats = set()
    for rec in served:
        ask = request_input(scenario, rec.run, rec.index)
        assert rec.category == ask.category
        cats.add(rec.category)
        got = sim.generate(count_prompt_tokens(ask.prompt), ask.max_tokens, None, ask.category)
        assert (got.completion_tokens, got.verify_ct) == (rec.completion_tokens,
                                                          rec.spec_verify_ct)  # fmt: skip
    assert len(cats) > 1


def test_a_simulated_study_on_the_mixed_set_stores_per_category_figures(tmp_path) -> None:
    cfg = load_config(
        TWIN_EXPERIMENT,
        [
            f"output.dir={tmp_path}", f"server.port={free_port_block()}", "bench.repeats=8",
            "bench.max_tokens=200", "bench.prompts=mixed", "study.max_restarts=2",
            "cluster.include_dashboard=false",
        ],
    )  # fmt: skip
    run_study(cfg, printer=lambda _line: None, trial_fn=SimulatedTrials())
    store = ParquetTrialStore(cfg.out_dir)
    spec_row = next(
        r for r in store.trial_rows() if r["spec_algorithm"] and r["state"] == "COMPLETE"
    )
    figures = {r["category"]: r for r in store.category_rows({spec_row["trial"]})}
    assert sorted(figures) == ["chat", "code", "long-form", "math"]
    counts = [f["requests"] for f in figures.values()]
    assert sum(counts) == spec_row["requests_ok"] + spec_row["requests_failed"] >= 8
    assert figures["code"]["accept_length"] > figures["chat"]["accept_length"]
