"""Prompt sets from users' data: ShareGPT / OpenAI conversations, categories, the mixed set."""

from __future__ import annotations

import json
import pathlib

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from rayspec._exceptions import ConfigError
from rayspec.bench import builtin_prompt_sets
from rayspec.bench import load_dataset
from rayspec.bench import load_prompts


def _jsonl(path: pathlib.Path, records: list[object]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


def test_sharegpt_json_array_takes_the_first_human_turn(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "sg.json"
    path.write_text(
        json.dumps(
            [
                {
                    "conversations": [
                        {"from": "system", "value": "be brief"},
                        {"from": "human", "value": "first"},
                        {"from": "gpt", "value": "answer"},
                        {"from": "human", "value": "second"},
                    ]
                },
                {"conversations": [{"from": "gpt", "value": "no user here"}]},
                {"conversations": [{"from": "human", "value": "third"}], "category": "chat"},
            ],
            indent=2,
        ),
        encoding="utf-8",
    )
    records = load_dataset(str(path))
    assert [(r.text, r.category) for r in records] == [("first", "default"), ("third", "chat")]
    assert load_prompts(str(path)) == ("first", "third")


def test_openai_messages_jsonl(tmp_path: pathlib.Path) -> None:
    path = _jsonl(
        tmp_path / "oa.jsonl",
        [
            {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}]},
            {"messages": [{"role": "assistant", "content": "only me"}]},
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "parts"}]}]},
        ],
    )
    assert load_prompts(path) == ("hi", "parts")


def test_plain_prompt_and_text_lines_still_load(tmp_path: pathlib.Path) -> None:
    path = _jsonl(tmp_path / "p.jsonl", [{"prompt": "a", "category": "code"}, {"text": "b"}])
    assert [(r.text, r.category) for r in load_dataset(path)] == [("a", "code"), ("b", "default")]


def test_a_file_without_any_user_turn_names_the_file(tmp_path: pathlib.Path) -> None:
    path = _jsonl(tmp_path / "none.jsonl", [{"conversations": [{"from": "gpt", "value": "x"}]}])
    with pytest.raises(ConfigError, match=r"none\.jsonl: no record has a user turn.*expected"):
        load_dataset(path)


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ('{"prompt": "ok"}\n{"prompt": \n', r"bad\.jsonl:2: not valid JSON"),
        ('[\n  {"prompt": "ok"},\n  {"prompt"\n]', r"bad\.jsonl:4: not valid JSON"),
        ('{"prompt": "ok", "category": 3}\n', r"bad\.jsonl:1: 'category' must be"),
        ('{"other": "x"}\n', r"bad\.jsonl:1: expected records"),
    ],
)
def test_malformed_files_say_file_and_line(tmp_path: pathlib.Path, body: str, match: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(body, encoding="utf-8")
    with pytest.raises(ConfigError, match=match):
        load_dataset(str(path))


def test_mixed_is_shipped_with_12_prompts_of_each_category() -> None:
    assert "mixed" in builtin_prompt_sets()
    records = load_dataset("mixed")
    counts: dict[str, int] = {}
    for r in records:
        counts[r.category] = counts.get(r.category, 0) + 1
    assert counts == {"code": 12, "math": 12, "chat": 12, "long-form": 12}
    assert len(set(load_prompts("mixed"))) == 48


_text = st.text(min_size=1, max_size=20)
_turn = st.fixed_dictionaries(
    {"from": st.sampled_from(["human", "gpt", "system"]), "value": _text}
)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(_turn, max_size=5), min_size=1, max_size=8))
def test_sharegpt_round_trips_to_first_human_turns(
    tmp_path_factory: pytest.TempPathFactory, conversations: list[list[dict[str, str]]]
) -> None:
    firsts = [next((t["value"] for t in c if t["from"] == "human"), None) for c in conversations]
    expected = tuple(v for v in firsts if v is not None)
    path = tmp_path_factory.mktemp("sg") / "data.json"
    path.write_text(json.dumps([{"conversations": c} for c in conversations]), encoding="utf-8")
    if expected:
        assert load_prompts(str(path)) == expected
    else:
        with pytest.raises(ConfigError, match="no record has a user turn"):
            load_prompts(str(path))


def test_the_cli_refuses_a_conversation_file_without_user_turns(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Exit 2 before Ray starts, one line naming the key and the file."""
    import ray

    from tests.test_bad_input_preflight import experiment
    from tests.test_bad_input_preflight import port
    from tests.test_bad_input_preflight import refused

    started: list[object] = []
    monkeypatch.setattr(ray, "init", lambda *a, **k: started.append((a, k)))
    data = _jsonl(
        tmp_path / "gpt_only.jsonl", [{"messages": [{"role": "assistant", "content": "x"}]}]
    )
    line = refused(
        [experiment(tmp_path), f"bench.prompts={data}", port()],
        capsys,
        "bench.prompts: ",
    )
    assert "gpt_only.jsonl: no record has a user turn" in line
    assert started == []


def test_a_record_s_output_tokens_is_its_request_s_length(tmp_path: pathlib.Path) -> None:
    """The data's own output lengths: a record's ``output_tokens`` is what its request asks
    for; a record without one asks for the scenario's ``max_tokens``; a scenario's
    ``output_len_range`` overrides both."""
    from rayspec.bench import Scenario
    from rayspec.bench import request_input

    path = _jsonl(
        tmp_path / "lens.jsonl",
        [
            {"prompt": "short answer", "output_tokens": 12},
            {"conversations": [{"from": "human", "value": "chat"}], "output_tokens": 230},
            {"messages": [{"role": "user", "content": "no length"}]},
        ],
    )
    assert [r.output_tokens for r in load_dataset(path)] == [12, 230, None]
    want = {"short answer": 12, "chat": 230, "no length": 77}
    sc = Scenario(name="c3", concurrency=3, requests_per_run=3, max_tokens=77, prompt_set=path)
    asks = [request_input(sc, run, i) for run in range(2) for i in range(3)]
    assert {a.prompt for a in asks} == set(want)
    assert all(a.max_tokens == want[a.prompt] for a in asks)
    ranged = Scenario(name="r", max_tokens=77, prompt_set=path, output_len_range=(5, 6))
    assert all(5 <= request_input(ranged, 0, i).max_tokens <= 6 for i in range(3))


@pytest.mark.parametrize("value", [0, -3, 1.5, "12", True, [12]])
def test_a_bad_output_tokens_names_the_record_and_the_key(
    tmp_path: pathlib.Path, value: object
) -> None:
    path = _jsonl(
        tmp_path / "bad.jsonl", [{"prompt": "ok"}, {"prompt": "x", "output_tokens": value}]
    )
    with pytest.raises(
        ConfigError, match=r"bad\.jsonl:2: 'output_tokens' must be an integer >= 1"
    ):
        load_dataset(path)
