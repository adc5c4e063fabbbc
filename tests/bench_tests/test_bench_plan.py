"""BenchPlan/Scenario validation and the shipped, deterministic prompt sets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import rayspec.bench
from rayspec import ConfigError
from rayspec.bench import BenchPlan
from rayspec.bench import Scenario
from rayspec.bench import builtin_prompt_sets
from rayspec.bench import load_prompts
from rayspec.bench import request_input


def test_the_defaults_are_the_field_protocol() -> None:
    """The field measurements' protocol: 1 warm-up, 5 runs, 1 request of 500 tokens."""
    plan = BenchPlan()
    (s,) = plan.scenarios
    assert (plan.warmup, plan.repeats, s.concurrency, s.requests_per_run, s.max_tokens) == (
        1,
        5,
        1,
        1,
        500,
    )
    assert plan.endpoint == "generate" and plan.temperature == 0.0 and plan.flush_cache


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"concurrency": 0}, "concurrency"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"requests_per_run": 1.5}, "requests_per_run"),
        ({"request_rate": 0.0}, "request_rate"),
        ({"output_len_range": (10, 5)}, "output_len_range"),
        ({"name": ""}, "name"),
    ],
)
def test_scenario_validation(kwargs: dict[str, object], match: str) -> None:
    base: dict[str, object] = {"name": "s"}
    with pytest.raises(ConfigError, match=match):
        Scenario(**(base | kwargs))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"scenarios": ()}, "scenarios"),
        ({"scenarios": (Scenario("a"), Scenario("a"))}, "duplicate"),
        ({"repeats": 0}, "repeats"),
        ({"warmup": -1}, "warmup"),
        ({"endpoint": "responses"}, "endpoint"),
        ({"read_timeout_s": 0}, "read_timeout_s"),
        ({"cpu_warn_fraction": 1.5}, "cpu_warn_fraction"),
    ],
)
def test_plan_validation(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        BenchPlan(**kwargs)  # type: ignore[arg-type]


def test_plan_normalises_sequences() -> None:
    plan = BenchPlan(scenarios=[Scenario("a", output_len_range=[5, 9])])  # type: ignore[arg-type]
    assert isinstance(plan.scenarios, tuple)
    assert plan.scenarios[0].output_len_range == (5, 9)
    hash(plan)  # frozen and hashable: safe across actor boundaries


def test_default_prompt_set_is_shipped() -> None:
    assert "default" in builtin_prompt_sets()
    prompts = load_prompts("default")
    assert len(prompts) == 64 and len(set(prompts)) == 64
    assert all(len(p.split()) >= 10 for p in prompts)


def test_prompt_selection_is_deterministic_and_varied() -> None:
    s = Scenario("c4", concurrency=4, requests_per_run=8)
    run0 = [request_input(s, 0, i).prompt for i in range(8)]
    assert run0 == [request_input(s, 0, i).prompt for i in range(8)]
    assert len(set(run0)) == 8
    run1 = [request_input(s, 1, i).prompt for i in range(8)]
    assert not set(run0) & set(run1)
    warm = request_input(s, -1, 0).prompt
    assert warm not in run0


def test_length_ranges() -> None:
    s = Scenario("r", output_len_range=(100, 200), input_len_range=(300, 400))
    inputs = [request_input(s, 0, i) for i in range(20)]
    assert all(100 <= x.max_tokens <= 200 for x in inputs)
    assert len({x.max_tokens for x in inputs}) > 5
    assert all(300 <= len(x.prompt.split()) <= 400 for x in inputs)
    assert inputs == [request_input(s, 0, i) for i in range(20)]


def test_custom_prompt_file(tmp_path: Path) -> None:
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"prompt": "a b c"}) + "\n\n" + json.dumps({"text": "d e"}) + "\n")
    assert load_prompts(str(path)) == ("a b c", "d e")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": 3}\n')
    with pytest.raises(ConfigError, match="bad.jsonl:1"):
        load_prompts(str(bad))
    with pytest.raises(ConfigError, match="neither a built-in"):
        load_prompts(str(tmp_path / "missing.jsonl"))


def test_exported_members() -> None:
    public = {n for n in dir(rayspec.bench) if not n.startswith("_")} - {"annotations"}
    assert set(rayspec.bench.__all__) == public
    assert rayspec.bench.__all__ == sorted(rayspec.bench.__all__)
