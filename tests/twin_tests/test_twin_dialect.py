"""Where the twin's dialect differed from SGLang 0.5.23's, as clients nobody here wrote found
(SGLang's bench_serving, AIPerf, the openai client), each checked against SGLang's source:
the ``sglext`` chunk of its own, ``/tokenize`` with ``messages``, ``/detokenize`` with
``skip_special_tokens: false``, ``reasoning_content`` in chat deltas, chat without a max-token
field, the model card's ``parent``, and the speculative ``meta_info`` fields by version; then
every answer against real SGLang's recorded shapes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from rayspec._types import SpecSettings
from rayspec.testing._twin import TwinProcess
from rayspec.twin._engine import GenRequest
from rayspec.twin._text import EOS_TEXT
from rayspec.twin._text import EOS_TOKEN_ID
from rayspec.twin._text import detokenize
from rayspec.twin._text import encode
from tests.sglang_dialect import AGREE_EAGLE3
from tests.sglang_dialect import EAGLE3
from tests.sglang_dialect import MODES
from tests.sglang_dialect import TEXTLESS_FLAGS
from tests.sglang_dialect import TWIN_FLAGS
from tests.sglang_dialect import load_recorded
from tests.sglang_dialect import log_answers
from tests.sglang_dialect import probe
from tests.sglang_dialect import problems
from tests.sglang_dialect import server_flags
from tests.sglang_dialect import shapes

from .conftest import SPEC_ARGS


@pytest.fixture(scope="module")
def twin() -> Iterator[TwinProcess]:
    with TwinProcess([*SPEC_ARGS, "--served-model-name", "kimi", "--twin-realtime", "false"]) as t:
        t.wait_ready()
        yield t


def _stream(twin: TwinProcess, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream("POST", twin.base_url + path, json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        return [json.loads(line[6:]) for line in r.iter_lines()
                if line.startswith("data: ") and line != "data: [DONE]"]  # fmt: skip


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_spec_details_come_in_a_chunk_of_their_own(twin: TwinProcess, path: str) -> None:
    body: dict[str, Any] = {"model": "kimi", "max_tokens": 20, "stream": True, "ignore_eos": True,
        "return_spec_tokens_details": True, "stream_options": {"include_usage": True}}  # fmt: skip
    if path.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": "hi there"}]
    else:
        body["prompt"] = "hi there"
    events = _stream(twin, path, body)
    # SGLang (serving_completions.py / serving_chat.py): after the finish, a chunk with no
    # choices carries the response-level sglext, then the usage chunk.
    *content, ext, usage = events
    assert content[-1]["choices"][0]["finish_reason"] == "length"
    assert all(not c.get("sglext") for c in content)
    assert ext["choices"] == [] and ext["usage"] is None
    details = ext["sglext"]["spec_tokens_details"]
    assert sorted(details) == sorted([
        "spec_accept_rate", "spec_accept_length", "spec_cap_length", "spec_block_accept_length",
        "spec_num_correct_drafts", "spec_num_proposed_drafts", "spec_verify_ct",
        "spec_correct_drafts_histogram", "spec_cap_lens_histogram"])  # fmt: skip
    assert sum(details["spec_correct_drafts_histogram"]) == details["spec_verify_ct"] > 0
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 20


def test_no_sglext_without_speculation(start_twin: Any) -> None:
    plain = start_twin(["--tp-size", "8", "--twin-realtime", "false"])
    events = _stream(plain, "/v1/completions", {"prompt": "hi", "max_tokens": 5, "stream": True,
        "ignore_eos": True, "return_spec_tokens_details": True})  # fmt: skip
    assert [e for e in events if e["choices"] == []] == []
    assert all(e.get("sglext") is None for e in events)


def test_tokenize_messages_counts_what_chat_counts(twin: TwinProcess) -> None:
    c = httpx.Client(base_url=twin.base_url, timeout=30)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "a b c"}]
    tok = c.post("/v1/tokenize", json={"model": "kimi", "messages": messages})
    assert tok.status_code == 200, tok.text
    chat = c.post("/v1/chat/completions", json={"model": "kimi", "messages": messages,
                                                "max_tokens": 2}).json()  # fmt: skip
    assert tok.json()["count"] == len(tok.json()["tokens"]) == chat["usage"]["prompt_tokens"] == 5
    assert c.post("/tokenize", json={"messages": []}).status_code == 400


def test_detokenize_keeps_special_tokens_when_asked(twin: TwinProcess) -> None:
    c = httpx.Client(base_url=twin.base_url, timeout=30)
    words = detokenize([1000, 1001])
    ids = [*encode(words), EOS_TOKEN_ID]
    assert c.post("/detokenize", json={"tokens": ids}).json()["text"] == words
    kept = c.post("/detokenize", json={"tokens": ids, "skip_special_tokens": False}).json()
    assert kept["text"] == f"{words} {EOS_TEXT}"
    both = c.post("/v1/detokenize", json={"tokens": [ids], "skip_special_tokens": False}).json()
    assert both["text"] == [f"{words} {EOS_TEXT}"]
    assert detokenize(encode(kept["text"]), skip_special_tokens=False) == kept["text"]


def test_chat_deltas_carry_reasoning_content(twin: TwinProcess) -> None:
    events = _stream(twin, "/v1/chat/completions", {"model": "kimi", "max_tokens": 6,
        "stream": True, "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    # SGLang's StreamDelta keeps reasoning_content required: null, never missing.
    assert deltas and all("reasoning_content" in d and d["reasoning_content"] is None
                          for d in deltas)  # fmt: skip
    assert deltas[-1] == {"reasoning_content": None}  # the finish chunk's
    assert all("usage" not in e for e in events)  # no usage unless asked for


def test_chat_without_a_max_token_field_runs_to_end_of_sequence(twin: TwinProcess) -> None:
    c = httpx.Client(base_url=twin.base_url, timeout=60)
    out = c.post("/v1/chat/completions", json={"model": "kimi",
        "messages": [{"role": "user", "content": "tell me a story"}]}).json()  # fmt: skip
    # SGLang sends max_new_tokens None (no limit); the twin's answers run >= 512 tokens.
    assert out["choices"][0]["finish_reason"] == "stop"
    assert out["usage"]["completion_tokens"] >= 512
    unlimited = {"text": "tell me a story", "sampling_params": {"max_new_tokens": None}}
    gen = c.post("/generate", json=unlimited).json()
    assert gen["meta_info"]["finish_reason"]["type"] == "stop"


def test_model_card_has_parent(twin: TwinProcess) -> None:
    c = httpx.Client(base_url=twin.base_url, timeout=30)
    card = c.get("/v1/models").json()["data"][0]
    assert "parent" in card and card["parent"] is None
    assert isinstance(card["max_model_len"], int)
    assert c.get("/v1/models/kimi").json() == card


def _request(histogram: list[int]) -> GenRequest:
    import random

    req = GenRequest(rid="r", index=0, prompt_tokens=3, max_new_tokens=9, output_ids=[],
                     mult=1.0, time_factor=1.0, rng=random.Random(0), arrival_s=0.0)  # fmt: skip
    req.output_tokens, req.verify_ct = 9, 3
    req.correct_drafts, req.proposed_drafts, req.histogram = 6, 9, histogram
    return req


def test_speculative_meta_fields_by_version() -> None:
    spec = SpecSettings("EAGLE3", num_steps=3, eagle_topk=1, num_draft_tokens=4)
    req = _request([0, 0, 3, 0])
    new = req.meta_spec(spec, (0, 5, 23))
    # 0.5.23: no aliases; the histogram ends at the most drafts accepted (SGLang grows it).
    assert new["spec_correct_drafts_histogram"] == [0, 0, 3]
    assert not {"spec_accepted_drafts", "spec_proposed_drafts", "spec_accept_histogram"} & set(new)
    old = req.meta_spec(spec, (0, 5, 12))
    assert old["spec_accept_histogram"] == [0, 0, 3] and old["spec_accepted_drafts"] == 6
    assert set(req.meta_spec(spec, (0, 5, 5))) == {
        "spec_verify_ct", "spec_accept_length", "spec_accept_rate"}  # fmt: skip


# The tiny target's config.json as the real-SGLang tests make it (its context length, 2048,
# is what SGLang and the twin read from it).
TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
    "num_hidden_layers": 8, "max_position_embeddings": 2048, "vocab_size": 1024,
}  # fmt: skip


def _model_folder(root: Any, name: str) -> str:
    folder = root / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY_CONFIG))
    return str(folder)


@pytest.mark.parametrize("mode", MODES)
def test_the_twin_answers_in_real_sglangs_shapes(mode: str, tmp_path: Any) -> None:
    """Every request rayspec (and the outside clients) send, and the error and edge requests,
    against real SGLang 0.5.23's recorded shapes: what rayspec reads, the whole stream,
    response and refusal shapes, no invented metric or server-info field
    (tests/sglang_dialect.py has the rules). ``agree``: the always-agreeing pair, whose every
    token is a special token without text, against the twin with ``--twin-text pad``."""
    target = _model_folder(tmp_path, "tiny-target")
    draft = None if mode == "plain" else "tiny-draft"
    flags = server_flags(target, draft, AGREE_EAGLE3 if mode == "agree" else EAGLE3)
    if mode == "agree":
        flags += TEXTLESS_FLAGS
    log = tmp_path / "twin.log"
    with TwinProcess([*flags, *TWIN_FLAGS], log_path=str(log)) as twin:
        twin.wait_ready(60)
        answers = probe(twin.base_url)
    answers |= log_answers(log)
    assert problems(load_recorded()[mode], shapes(answers), spec=mode != "plain") == []
