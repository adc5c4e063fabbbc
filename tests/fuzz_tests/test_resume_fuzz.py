"""Property: a resume with one experiment key changed is refused with one ``error:`` line naming
that key (exit 2, nothing written), or the key is one a resume may change (docs/config.md,
*Resuming a study*) and the resume is accepted.

One stored study (a small twin study of simulated trials) is resumed through the CLI in-process
with ``--dry-run`` (preflight's resume check, no Ray, nothing written) and ``key=value`` for one
key of the schema (:mod:`tests.fuzz_tests._schema`): a table of values a user might mean for
every key (another load, prompt set, profile, objective, model, budget, port, ...), values of
the key's type drawn by Hypothesis, and the same content under another name (a copied prompt
file or profile, which is no change). A value a new study would refuse too is bad input (the
config fuzz's domain): it must still be one ``error:`` line.

Seeded and bounded as the config fuzz (``RAYSPEC_FUZZ_SEED``, ``RAYSPEC_FUZZ_EXAMPLES``).
"""

from __future__ import annotations

import contextlib
import fnmatch
import io
import os
import shutil
import sys
from collections import Counter
from dataclasses import dataclass
from importlib import resources
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from rayspec._config import load_config
from rayspec.search import SearchSpace
from rayspec.search._resume import IDENTITY_KEYS
from rayspec.search._resume import SPACE_KEYS
from rayspec.search._resume import may_change
from rayspec.search._resume import space_fingerprint
from rayspec.testing import SimulatedTrials
from rayspec.tune import run_study
from tests.fuzz_tests._schema import KEYS
from tests.fuzz_tests._schema import override_text
from tests.fuzz_tests._schema import plausible
from tests.fuzz_tests.test_config_fuzz import FUZZ
from tests.fuzz_tests.test_config_fuzz import seeded
from tests.helpers import write_experiment

# Outcomes, for the closing count (conftest.py prints them).
RESUME_COUNTS: Counter[str] = Counter()
KINDS = dict(KEYS)

STORED = {
    "study": {"name": "r", "max_restarts": 2, "seed": 0},
    "cluster": {"include_dashboard": False},
    "server": {"engine": "twin", "tp_size": 8, "port": 39100},
    "search": {
        "nccl": {"NCCL_PROTO": ["unset", "LL"]},
        "speculative": {
            "modes": ["off", "EAGLE3"],
            "num_steps": [1, 2],
            "eagle_topk": [1],
            "num_draft_tokens": [2, 3],
        },
    },  # fmt: skip
    "bench": {"warmup": 0, "repeats": 1, "max_repeats": 1, "max_tokens": 16},
}


def _alternatives(tmp: str) -> dict[str, list[Any]]:
    """Values a user might mean for each key of :data:`STORED`'s study (paths under ``tmp``)."""
    return {
        "study.name": ["r2"],
        "study.max_restarts": [5, 40],
        "study.max_wall_s": [60.0],
        "study.n_trials": [3, 10],
        "study.sampler": ["tpe", "random", "grid"],
        "study.seed": [1],
        "study.storage": [os.path.join(tmp, "elsewhere", "optuna.journal")],
        "study.n_startup_trials": [2],
        "study.enqueue": [[{"spec.mode": "EAGLE3", "spec.num_steps": 2, "spec.eagle_topk": 1}]],
        "study.objective": ["tok_s_min", "tok_s_peak", "tok_s_ci95_low", "goodput"],
        "study.objective_scenario": ["single"],
        "study.slo": [{"ttft_p99_ms": 500.0}, {"itl_p99_ms": 50.0}],
        "study.pruning": [False],
        "study.prune_min_runs": [2],
        "study.alpha": [0.01],
        "study.pick_margin": [0.02],
        "study.start_noise": [0.02],
        "study.stop_gain": [0.001],
        "study.expect_accept_length": [2.0],
        "study.verify_plan": [0, 2],
        "cluster.address": ["127.0.0.1:6379"],
        "cluster.num_cpus": [2],
        "cluster.num_gpus": [8],
        "cluster.include_dashboard": [True],
        "cluster.dashboard_host": ["localhost"],
        "cluster.dashboard_port": [8300],
        "cluster.max_concurrent_trials": [2, 0],
        "cluster.node_resource": ["h200"],
        "cluster.placement_timeout_s": [30.0],
        "server.engine": ["sglang"],
        "server.model_path": ["/models/target"],
        "server.draft_model_path": ["/models/eagle3"],
        "server.tp_size": [4],
        "server.host": ["localhost"],
        "server.port": [39200],
        "server.attention_backend": ["fa3"],
        "server.max_running_requests": [16],
        "server.cuda_graph_max_bs": [16],
        "server.mem_fraction_static": [0.8],
        "server.trust_remote_code": [True],
        "server.enable_metrics": [False],
        "server.sglang_version": ["0.5.21"],
        "server.python": [sys.executable],
        "server.extra_flags": [["--disable-radix-cache"]],
        "server.env": [{"FOO": "1"}],
        "server.startup_timeout_s": [120.0],
        "server.stop_timeout_s": [5.0],
        "server.allow_nvlink_multicast": [True],
        "server.extra_nccl_vars": [["NCCL_FOO"]],
        "server.twin.profile": ["h200-nvlink-tp8-dense", os.path.join(tmp, "same-profile.yaml")],
        "server.twin.seed": [3],
        "server.twin.startup_s": [0.1],
        "server.twin.fault": ["draft-layers:0.5"],
        "server.twin.version": ["0.5.21"],
        "search.nccl": [{"NCCL_PROTO": ["unset", "LL", "Simple"]}],
        "search.speculative.modes": [["off"]],
        "search.speculative.num_steps": [[1, 2, 3]],
        "search.speculative.eagle_topk": [[1, 2]],
        "search.speculative.num_draft_tokens": [[2, 3, 4]],
        "search.speculative.overlap": [["on", "off"]],
        "search.flags": [{"--disable-custom-all-reduce": ["on", "off"]}],
        "search.scheduler.max_running_requests": [[16, 48]],
        "search.scheduler.cuda_graph_max_bs": [[16, 48]],
        "search.scheduler.chunked_prefill_size": [[2048, 8192]],
        "search.nccl_screen.enabled": [False],
        "search.nccl_screen.max_sets": [8],
        "search.nccl_screen.timeout_s": [30.0],
        "search.nccl_screen.tolerance": [0.05],
        "search.nccl_screen.hidden_size": [4096],
        "search.nccl_screen.dtype_bytes": [1],
        "bench.warmup": [1],
        "bench.repeats": [2],
        "bench.max_repeats": [4],
        "bench.max_tokens": [32, 500],
        "bench.check_outputs": [False],
        "bench.gate_tokens": [8],
        "bench.concurrency": [2],
        "bench.prompts": ["mixed", os.path.join(tmp, "same-prompts.jsonl")],
        "bench.api": ["chat"],
        "bench.temperature": [0.7],
        "bench.read_timeout_s": [5.0],
        "bench.request_timeout_s": [100.0],
        "bench.scenarios": [
            [{"name": "c4", "concurrency": 4, "requests_per_run": 4, "max_tokens": 16}]
        ],  # fmt: skip
        "bench.ladder.concurrency": [[1, 4]],
        "bench.ladder.request_rate": [[2.0]],
        "bench.ladder.requests_per_run": [8],
        "bench.ladder.max_concurrency": [32],
        "output.dir": [os.path.join(tmp, "other-runs")],
    }


@dataclass(frozen=True)
class Stored:
    experiment: str
    out: str
    alternatives: dict[str, list[Any]]
    same_content: frozenset[str]  # values naming the stored study's files under another name


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Stored:
    tmp = str(tmp_path_factory.mktemp("resume-fuzz"))
    out = os.path.join(tmp, "runs")
    doc = {**STORED, "output": {"dir": out}}
    path = write_experiment(tmp, doc)
    run_study(load_config(path), trial_fn=SimulatedTrials(), printer=lambda _line: None)
    builtin = resources.files("rayspec")
    same_profile = os.path.join(tmp, "same-profile.yaml")
    same_prompts = os.path.join(tmp, "same-prompts.jsonl")
    with resources.as_file(builtin.joinpath("twin/profiles/kimi-k2.5-tp8-pcie.yaml")) as src:
        shutil.copy(src, same_profile)
    with resources.as_file(builtin.joinpath("bench/prompts/default.jsonl")) as src:
        shutil.copy(src, same_prompts)
    return Stored(path, out, _alternatives(tmp), frozenset({same_profile, same_prompts}))


def _cli(*argv: str) -> tuple[int, str]:
    from rayspec.tune.__main__ import main

    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(["--dry-run", *argv])
    return code, err.getvalue()


def _names(key: str, line: str) -> bool:
    """The error line names ``key`` (the space's keys: by the parameter Optuna stores)."""
    if key in line:
        return True
    if any(fnmatch.fnmatchcase(key, p) for p in SPACE_KEYS):
        return line.startswith("error: search")
    return False


def _same_space(stored: Stored, key: str, override: str) -> bool:
    """A change of the searched space that leaves the space as Optuna samples it."""
    if not any(fnmatch.fnmatchcase(key, p) for p in SPACE_KEYS):
        return False
    old = SearchSpace.from_config(load_config(stored.experiment).search)
    new = SearchSpace.from_config(load_config(stored.experiment, [override]).search)
    return space_fingerprint(old) == space_fingerprint(new) and old.size() == new.size()


def check_resume(stored: Stored, key: str, value: Any) -> str:
    """The invariant for one case; returns how it ended (for the counts)."""
    override = override_text(key, value)
    fresh_dir = os.path.join(os.path.dirname(stored.out), "fresh")
    fresh = [f"output.dir={fresh_dir}", override] if key != "output.dir" else [override]
    code_new, _ = _cli(stored.experiment, *fresh)
    code, err = _cli(stored.experiment, override)
    lines = err.strip().splitlines()
    assert code in (0, 2), (override, code, err)
    assert "Traceback" not in err, (override, err)
    if code == 2:
        assert lines and all(ln.startswith("error: ") for ln in lines), (override, err)
    if code_new != 0:  # bad input on its own, refused as such
        assert code == 2, (override, err)
        return "bad input"
    same = isinstance(value, str) and value in stored.same_content
    if code == 0:
        if load_config(stored.experiment) == load_config(stored.experiment, [override]):
            return "accepted (no change)"  # the value drawn is the stored one
        if _same_space(stored, key, override):
            return "accepted (the same space)"  # e.g. tree budgets in a space of chains only
        allowed = may_change(key) or key in IDENTITY_KEYS or same
        assert allowed, f"{override}: a resume accepted a change the fingerprint misses"
        return "accepted (same content)" if same else "accepted"
    assert len(lines) == 1, (override, err)
    assert _names(key, lines[0]), (override, lines[0])
    assert not may_change(key), f"{override}: refused, though a resume may change it: {err}"
    return "refused"


def _table(stored_alts: dict[str, list[Any]]) -> list[tuple[str, Any]]:
    return [(k, v) for k, values in stored_alts.items() for v in values]


def test_every_key_of_the_schema_has_values_to_try(stored: Stored) -> None:
    assert set(stored.alternatives) == set(KINDS), set(KINDS) ^ set(stored.alternatives)


def test_each_key_changed_alone_is_refused_naming_it_or_accepted_by_the_allow_list(
    stored: Stored,
) -> None:
    for key, value in _table(stored.alternatives):
        RESUME_COUNTS[check_resume(stored, key, value)] += 1
        RESUME_COUNTS["cases"] += 1
    assert RESUME_COUNTS["refused"] >= 40 and RESUME_COUNTS["accepted"] >= 30, RESUME_COUNTS
    assert RESUME_COUNTS["accepted (same content)"] == 2


@seeded
@settings(FUZZ, max_examples=max(20, FUZZ.max_examples // 3))
@given(data=st.data())
def test_generated_resumes_are_refused_naming_the_key_or_allowed(stored: Stored, data) -> None:
    key = data.draw(st.sampled_from(sorted(KINDS)), label="key")
    table = stored.alternatives[key]
    value = data.draw(st.one_of(st.sampled_from(table), plausible(KINDS[key])), label="value")
    RESUME_COUNTS[check_resume(stored, key, value)] += 1
    RESUME_COUNTS["cases"] += 1
