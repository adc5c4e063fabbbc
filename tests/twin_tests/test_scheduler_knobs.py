"""On the twin the scheduler knobs (``search.scheduler``) move the answer under load.

Each case serves one load in process (the twin server's engine on a virtual clock, noise off)
from the launch line rayspec builds, so what is checked is the whole path: candidate -> argv
-> the twin's parser and resolution -> its batch scheduler and performance model.
"""

from __future__ import annotations

from rayspec import Candidate
from rayspec import SpecSettings
from rayspec.server import build_launch
from rayspec.twin import load_profile
from rayspec.twin._simulate import LoadAsk
from rayspec.twin._simulate import SimulatedServer
from tests.helpers import TWIN_EXPERIMENT
from tests.helpers import cached_config
from tests.helpers import without_noise

CHAIN = SpecSettings("EAGLE3", 2, 1, 3)


def _serve(knobs: dict[str, int], asks: list[LoadAsk], concurrency: int, spec=CHAIN):
    cfg = cached_config(TWIN_EXPERIMENT, ["server.max_running_requests=64"])
    cand = Candidate(spec=spec, scheduler=tuple(sorted(knobs.items())))
    launch = build_launch(cfg, cand, port=1, log_path="-", trial=1)
    args = list(launch.argv[3:])
    profile = without_noise(load_profile(cfg.server.twin.profile))
    return SimulatedServer(args, dict(launch.env), profile).serve(asks, concurrency)


def _tok_s(served) -> float:
    end_s = max(r.sent_s + r.e2e_ms / 1000 for r in served)
    return sum(r.completion_tokens for r in served) / end_s


def _mean_ttft(served) -> float:
    return sum(r.ttft_ms for r in served) / len(served)


def closed_loop(n: int, tokens: int = 64, prompt: int = 64) -> list[LoadAsk]:
    return [LoadAsk(prompt, tokens) for _ in range(n)]


def test_the_running_cap_queues_requests_beyond_it() -> None:
    asks = closed_loop(32)
    capped = _serve({"max_running_requests": 8, "cuda_graph_max_bs": 8}, asks, 32)
    wide = _serve({"max_running_requests": 32, "cuda_graph_max_bs": 32}, asks, 32)
    assert _tok_s(wide) > 1.5 * _tok_s(capped)
    assert _mean_ttft(capped) > 2 * _mean_ttft(wide)  # the queue waits for free slots


def test_decode_batches_above_the_graph_cap_run_eagerly_and_slower() -> None:
    asks = closed_loop(32)
    graphs = _serve({"max_running_requests": 32, "cuda_graph_max_bs": 32}, asks, 32)
    eager = _serve({"max_running_requests": 32, "cuda_graph_max_bs": 8}, asks, 32)
    assert _tok_s(eager) < 0.97 * _tok_s(graphs)  # 3.2 ms more per 65 ms cycle at batch 32
    # Below the graph cap nothing changes: both run every batch in a graph.
    small = closed_loop(4)
    a = _serve({"max_running_requests": 32, "cuda_graph_max_bs": 32}, small, 4)
    b = _serve({"max_running_requests": 32, "cuda_graph_max_bs": 8}, small, 4)
    assert _tok_s(a) == _tok_s(b)


def test_a_long_prompt_prefills_in_chunks_and_the_running_stream_waits_for_them() -> None:
    # One stream decoding; a long prompt arrives half a second in.
    asks = [LoadAsk(16, 400), LoadAsk(8000, 8, due_s=0.5)]
    whole = _serve({"chunked_prefill_size": -1}, asks, 2)
    chunked = _serve({"chunked_prefill_size": 1024}, asks, 2)
    # Eight forwards instead of one: each pays the prefill's fixed cost (no mixed chunk, so
    # decode does not ride along), for the long prompt's TTFT and the running stream's gap.
    assert chunked[1].ttft_ms > whole[1].ttft_ms + 300
    assert max(chunked[0].itl_ms) > max(whole[0].itl_ms) + 300
    # Chunking by the default (8192, the H200 table) leaves an 8000-token prompt whole.
    default = _serve({}, asks, 2)
    assert default[1].ttft_ms == whole[1].ttft_ms


def test_the_http_twin_prefills_a_long_prompt_in_the_chunks_the_launch_line_asks() -> None:
    import asyncio

    from rayspec.bench import StreamClient
    from rayspec.testing._twin import TwinProcess
    from rayspec.twin._text import count_prompt_tokens

    prompt = " ".join(f"word{i}" for i in range(3000))
    tokens = count_prompt_tokens(prompt)
    cfg = cached_config(TWIN_EXPERIMENT)

    async def one(url: str) -> None:
        async with StreamClient(url, max_streams=1, clock="twin") as client:
            await client.stream(prompt, 4, twin_clock=True)

    prefills = {}
    for chunk in (-1, 1024):
        cand = Candidate(scheduler=(("chunked_prefill_size", chunk),))
        launch = build_launch(cfg, cand, port=0, log_path="-", trial=1)
        args = list(launch.argv[3:])
        for flag in ("--port", "--host"):  # TwinProcess picks its own port
            i = args.index(flag)
            del args[i : i + 2]
        with TwinProcess(args, env=dict(launch.env)) as twin:
            twin.wait_ready()
            before = twin.log().count("Prefill batch")
            asyncio.run(one(twin.base_url))
            prefills[chunk] = twin.log().count("Prefill batch") - before
    assert prefills == {-1: 1, 1024: -(-tokens // 1024)}
