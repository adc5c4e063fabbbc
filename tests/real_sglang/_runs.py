"""One real server start, used by several tests: start, send the requests, stop, keep results.

Each start costs 30-60 s here, so a test module runs a server once (a module fixture calling
``serve_and_collect``) and its tests assert on what was recorded, including what was left of the
process tree after the stop.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from tests.helpers import pids_alive
from tests.real_sglang._models import TinyModels
from tests.real_sglang._server import RealServer

PROMPTS = ("The red model", "Verify the draft tree on node 7")
MAX_NEW_TOKENS = 40
REQUEST_TIMEOUT_S = 240.0


@dataclasses.dataclass(frozen=True)
class ServerRun:
    name: str
    flags: tuple[str, ...]
    startup_s: float  # launch to /health_generate 200 (for the report; never asserted)
    outputs: tuple[dict[str, Any], ...]  # /generate answers, one per prompt
    server_info: dict[str, Any]
    metrics_before: str  # /metrics once ready, before the prompts
    metrics: str  # /metrics after the prompts
    tree: tuple[int, ...]  # every pid of the server's tree seen while it ran
    alive_after_stop: tuple[int, ...]
    site_log: tuple[str, ...]  # lines the scaffolding's sitecustomize wrote, one per process
    log: str
    probed: Any = None  # what serve_and_collect's ``probe`` returned (after the above)


def target_flags(models: TinyModels) -> list[str]:
    """The plain line: the tiny target, bfloat16, SGLang's AMX attention backend."""
    return [
        "--model-path",
        str(models.target),
        "--dtype",
        "bfloat16",
        "--attention-backend",
        "intel_amx",
    ]


CHAIN = {"steps": 2, "topk": 1, "draft_tokens": 3}
# The always-agreeing pair: every draft accepted (accept length steps + 1), every token is
# token 0 (a special token with no text).
AGREE = {"steps": 3, "topk": 1, "draft_tokens": 4}
AGREE_TOKENS = 64


def eagle_flags(target: str, draft: str, shape: dict[str, int]) -> list[str]:
    return [
        "--model-path",
        target,
        "--dtype",
        "bfloat16",
        "--attention-backend",
        "intel_amx",
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        draft,
        "--speculative-num-steps",
        str(shape["steps"]),
        "--speculative-eagle-topk",
        str(shape["topk"]),
        "--speculative-num-draft-tokens",
        str(shape["draft_tokens"]),
    ]


def metric(text: str, name: str) -> float:
    """The value of the unlabelled-or-first sample of ``name`` in a Prometheus text page."""
    for line in text.splitlines():
        if line.startswith(name) and line[len(name)] in " {":
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(f"no {name} in /metrics")


def greedy(
    client: httpx.Client, base_url: str, prompt: str, max_new_tokens: int
) -> dict[str, Any]:
    body = {
        "text": prompt,
        "sampling_params": {
            "temperature": 0,
            "max_new_tokens": max_new_tokens,
            "ignore_eos": True,
        },
    }
    response = client.post(f"{base_url}/generate", json=body)
    response.raise_for_status()
    answer: dict[str, Any] = response.json()
    return answer


# Every run of this session, for the summary line pytest prints at the end (conftest.py).
RUNS: list[ServerRun] = []


def summary(run: ServerRun) -> str:
    """One line: startup seconds and the accept length of each request, if speculative."""
    accept = [o["meta_info"].get("spec_accept_length") for o in run.outputs]
    shown = ", ".join(f"{a:.2f}" for a in accept if a is not None) or "-"
    seconds = ", ".join(f"{o['meta_info']['e2e_latency']:.2f}" for o in run.outputs)
    return f"{run.name}: ready in {run.startup_s:.1f} s, requests {seconds} s, accept {shown}"


def serve_and_collect(
    name: str,
    real_server: RealServer,
    flags: Sequence[str],
    workdir: Path,
    prompts: Sequence[str] = PROMPTS,
    max_new_tokens: int = MAX_NEW_TOKENS,
    env: Mapping[str, str] | None = None,
    probe: Callable[[str, Path], Any] | None = None,
) -> ServerRun:
    """Start, send the prompts, read /get_server_info and /metrics, then ``probe(base_url,
    log_path)`` if given (another test's requests on the same start), stop."""
    site_log = workdir / "site.log"
    site_log.write_text("")
    stopped: list[int] = []
    started = time.monotonic()
    with real_server(
        flags, env={"RAYSPEC_TEST_SITE_LOG": str(site_log), **(env or {})}, stopped=stopped
    ) as (base_url, log_path):
        startup_s = time.monotonic() - started
        with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
            metrics_before = client.get(f"{base_url}/metrics").text
            outputs = tuple(greedy(client, base_url, p, max_new_tokens) for p in prompts)
            server_info = client.get(f"{base_url}/get_server_info").json()
            metrics = client.get(f"{base_url}/metrics").text
        probed = probe(base_url, log_path) if probe is not None else None
    run = ServerRun(
        name=name,
        flags=tuple(flags),
        startup_s=startup_s,
        outputs=outputs,
        server_info=server_info,
        metrics_before=metrics_before,
        metrics=metrics,
        tree=tuple(stopped),
        alive_after_stop=tuple(pids_alive(stopped)),
        site_log=tuple(site_log.read_text().splitlines()),
        log=log_path.read_text(errors="replace"),
        probed=probed,
    )
    RUNS.append(run)
    return run
