"""Bad input at the edges of the machine (issue 33, low items): what the environment, the file
system and a held port show. Each case: one ``error:`` line naming the key or the variable,
exit 2, no traceback, nothing written; or, where nothing is wrong, no line at all.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from tests.helpers import REPO
from tests.helpers import twin_doc
from tests.helpers import write_experiment
from tests.reliability_tests._support import SUBPROCESS_ENV
from tests.test_bad_input_preflight import experiment
from tests.test_bad_input_preflight import port
from tests.test_bad_input_preflight import refused

# Starts the private cluster as the driver does, then stops it.
_CONNECT = """
import sys
from rayspec._config import load_config
from rayspec.tune._cluster import connect, disconnect
disconnect(connect(load_config(sys.argv[1], sys.argv[2:])))
print("connected", flush=True)
"""


def test_a_held_dashboard_port_says_nothing_with_the_dashboard_off(tmp_path) -> None:
    """Ray bound the port it was given even with the dashboard off, and logged "Failed to bind
    to 127.0.0.1:8265 because it's already occupied" for a dashboard nobody asked for."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        path = write_experiment(str(tmp_path), twin_doc(str(tmp_path / "runs")))
        overrides = ["cluster.include_dashboard=false", f"cluster.dashboard_port={port}"]
        done = subprocess.run(
            [sys.executable, "-c", _CONNECT, path, *overrides], cwd=REPO, env=SUBPROCESS_ENV,
            capture_output=True, text=True, timeout=240,
        )  # fmt: skip
    assert done.returncode == 0 and "connected" in done.stdout, done.stderr
    assert "Failed to bind" not in done.stderr, done.stderr
    assert str(port) not in done.stderr, done.stderr


# -- prompt files (issue 33, item 8; the 100,000-deep low item) -------------------------------


@pytest.fixture
def no_ray(monkeypatch) -> None:
    import ray

    def refused_here(*_a: object, **_k: object) -> None:
        raise AssertionError("ray.init was called for a refused experiment")

    monkeypatch.setattr(ray, "init", refused_here)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        # A lone surrogate: every request of every trial failed as `unknown` ("utf-8").
        ('{"prompt": "ok"}\n{"prompt": "caf\\ud83d"}\n',
         ":2: the prompt holds a lone surrogate (U+D83D at character 3)"),
        ('[\n {"prompt": "ok"},\n {"prompt": "x", "category": "\\udc00"}\n]\n',
         ":3: 'category' holds a lone surrogate (U+DC00"),
        ("[" * 100_000 + "]" * 100_000 + "\n", ":1: nested too deeply for a JSON reader"),
        ('{"prompt": "x", "output_tokens": 1' + "0" * 5000 + "}\n",
         ":1: not a usable JSON value (Exceeds the limit (4300 digits)"),
        ('{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n'.encode("latin-1"),
         ":2: not UTF-8 text (byte 0xe9 at offset 32)"),
    ],
)  # fmt: skip
def test_a_prompt_file_that_cannot_be_sent_is_refused_at_its_line(
    body: str | bytes, expected: str, tmp_path, capsys, no_ray
) -> None:
    data = tmp_path / "prompts.jsonl"
    if isinstance(body, bytes):
        data.write_bytes(body)
    else:
        data.write_text(body, encoding="utf-8")
    line = refused([experiment(tmp_path), f"bench.prompts={data}", port()], capsys, expected)
    assert line.startswith(f"error: bench.prompts: {data}:"), line


@pytest.mark.parametrize(
    "body",
    [
        # JSON strings may hold U+2028, U+2029 and U+0085 as they are: not line breaks.
        '{"prompt": "one\u2028two"}\n{"prompt": "three\x85four"}\n',
        '\ufeff{"prompt": "a file saved with a byte order mark"}\n',
        '{"prompt": "a surrogate pair is a character: \\ud83d\\ude00"}\r\n',
    ],
)
def test_prompt_files_that_are_fine_load(body: str, tmp_path) -> None:
    from rayspec.bench import load_dataset

    data = tmp_path / "prompts.jsonl"
    data.write_text(body, encoding="utf-8")
    texts = [r.text for r in load_dataset(str(data))]
    assert texts and all(t.encode("utf-8") for t in texts)
    assert "one\u2028two" in texts or "😀" in texts[0] or "order mark" in texts[0]


# -- a tiny Poisson rate (issue 33, item 6) --------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["bench.ladder.request_rate=[0.001,2]"],
         "bench.ladder.request_rate: 0.001 requests/s spreads a run's 32 arrivals (scenario "
         "r0p001) over 8.6 h on average, longer than bench.request_timeout_s (900 s)"),
        (["bench.scenarios=[{name: a, requests_per_run: 11, request_rate: 0.5}]",
          "bench.request_timeout_s=10"],
         "bench.scenarios[0].request_rate: 0.5 requests/s spreads a run's 11 arrivals "
         "(scenario a) over 20 s on average, longer than bench.request_timeout_s (10 s)"),
    ],
)  # fmt: skip
def test_a_rate_whose_arrivals_cannot_fit_is_refused(
    overrides: list[str], expected: str, tmp_path, capsys, no_ray
) -> None:
    """No deadline applies while no request is in flight: the study waited for hours. Even a
    dry run says so (the rule is the experiment's, not this machine's)."""
    refused(["--dry-run", experiment(tmp_path), *overrides], capsys, expected)


def test_a_rate_that_fits_is_accepted(tmp_path, capsys) -> None:
    from rayspec.tune.__main__ import main

    rc = main(["--dry-run", experiment(tmp_path), "bench.ladder.request_rate=[0.04]"])
    assert rc == 0, capsys.readouterr().err  # 31 gaps of 25 s: 775 s < 900 s


def test_a_run_ends_at_its_bound_whatever_it_waits_on() -> None:
    """Each request has its own deadline; a wait that escapes them (here a client that never
    answers) still ends at the run's bound, its requests recorded as failed, not hung."""
    import asyncio

    from rayspec.bench import BenchPlan
    from rayspec.bench import Scenario
    from rayspec.bench._runner import _one_run
    from rayspec.bench._runner import run_bound_s

    class Silent:
        async def measure(self, *args: object, **kwargs: object) -> object:
            await asyncio.Event().wait()  # never set
            raise AssertionError("unreachable")

    scenario = Scenario("p", concurrency=2, requests_per_run=4, max_tokens=4, request_rate=500.0)
    plan = BenchPlan(scenarios=(scenario,), request_timeout_s=0.05)

    async def go() -> object:
        return await asyncio.wait_for(_one_run(Silent(), plan, scenario, 0, 4), 60)  # type: ignore[arg-type]

    report = asyncio.run(go())
    assert [r.index for r in report.records] == [0, 1, 2, 3]  # type: ignore[attr-defined]
    assert all(r.failure == "stalled_stream" for r in report.records)  # type: ignore[attr-defined]
    assert "passed its bound" in report.records[0].error  # type: ignore[attr-defined]
    # The bound: the last arrival, then two waves of requests on two streams.
    assert run_bound_s(plan, scenario, [0.0, 0.1, 0.2, 0.3], 2) == pytest.approx(
        0.3 + 2 * 0.05 + 5
    )


def test_a_plan_refuses_arrivals_past_its_bound() -> None:
    from rayspec._exceptions import ConfigError
    from rayspec.bench import BenchPlan
    from rayspec.bench import Scenario

    slow = Scenario("p", requests_per_run=32, request_rate=0.001)
    with pytest.raises(ConfigError, match=r"spreads a run's 32 arrivals over 31000 s"):
        BenchPlan(scenarios=(slow,))


# -- a prompt longer than the context (issue 33, item 7) -------------------------------------


def _long_prompts(tmp_path, words: int) -> str:
    import json

    path = tmp_path / "long.jsonl"
    path.write_text(
        json.dumps({"prompt": "short"}) + "\n" + json.dumps({"prompt": "w " * words}) + "\n",
        encoding="utf-8",
    )
    return str(path)


def test_a_prompt_longer_than_the_twins_context_is_refused(tmp_path, capsys, no_ray) -> None:
    """Every trial stalled 60 s (stalled_stream) on it until the budget was spent."""
    data = _long_prompts(tmp_path, 300_000)
    refused(
        [experiment(tmp_path), f"bench.prompts={data}", port()], capsys,
        f"bench.prompts: {data}:2: the prompt is 300,000 words, so at least as many tokens, "
        "and the served model's context length is 262,144 tokens (the twin's)",
    )  # fmt: skip


def test_a_context_length_flag_is_the_served_context(tmp_path, capsys, no_ray) -> None:
    data = _long_prompts(tmp_path, 5000)
    refused(
        [experiment(tmp_path), f"bench.prompts={data}", port(),
         "server.extra_flags=[--context-length,4096]"], capsys,
        "context length is 4,096 tokens (--context-length in server.extra_flags)",
    )  # fmt: skip


def test_a_real_models_config_gives_its_context(tmp_path, capsys) -> None:
    """The real engine: the target's config.json (max_position_embeddings), read in
    preflight's node checks' way; the long prompt is one line among the node's findings."""
    import json

    from rayspec._config import load_config
    from rayspec.tune._fit import check_prompt_lengths
    from rayspec.tune._fit import served_context

    model = tmp_path / "target"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 2048}))
    server = {"engine": "sglang", "model_path": str(model), "draft_model_path": str(model)}
    doc = twin_doc(str(tmp_path / "runs"), server=server)
    doc["bench"] = {"prompts": _long_prompts(tmp_path, 3000)}
    cfg = load_config(write_experiment(str(tmp_path), doc), [])
    assert served_context(cfg) == (2048, f"{model}/config.json")
    (line,) = check_prompt_lengths(cfg)
    assert ":2: the prompt is 3,000 words" in line and "2,048 tokens" in line
    doc["bench"]["scenarios"] = [{"name": "cut", "input_len": [100, 1000]}]
    cfg = load_config(write_experiment(str(tmp_path), doc), [])
    assert check_prompt_lengths(cfg) == []  # every prompt cut to 1,000 words at most


# -- TMPDIR and paths past the system's limits (issue 33, low) --------------------------------


def test_a_tmpdir_that_is_a_file_is_named(tmp_path, capsys, monkeypatch, no_ray) -> None:
    """Ray failed inside ray.init with "[Errno 20] Not a directory: '.../ray'; ... resume"
    (exit 1), naming neither TMPDIR nor what to do."""
    afile = tmp_path / "afile"
    afile.write_text("")
    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(afile))
    refused(
        [experiment(tmp_path), port()], capsys,
        f"TMPDIR: Ray's private cluster keeps its files in {afile}/ray: {afile} is not a folder",
    )  # fmt: skip


def test_a_tmpdir_too_long_for_rays_sockets_is_named(tmp_path, capsys, monkeypatch, no_ray):
    """Ray's "validate_socket_filename failed: AF_UNIX path length cannot exceed 107 bytes"."""
    deep = tmp_path / ("d" * 90)
    deep.mkdir()
    monkeypatch.setenv("RAY_TMPDIR", str(deep))
    line = refused([experiment(tmp_path), port()], capsys, "RAY_TMPDIR: ")
    assert "is too long for Ray's sockets under it" in line and "at most 107" in line


def test_a_tmpdir_ray_can_create_or_a_joined_cluster_is_fine(tmp_path, monkeypatch) -> None:
    import tempfile

    from rayspec._config import load_config
    from rayspec.tune._preflight import _check_ray_temp

    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="t") as short:  # room for the sockets
        monkeypatch.setenv("TMPDIR", os.path.join(short, "new"))  # Ray creates it
        assert _check_ray_temp(load_config(experiment(tmp_path), [])) == []
    afile = tmp_path / "afile"
    afile.write_text("")
    monkeypatch.setenv("TMPDIR", str(afile))
    joined = load_config(experiment(tmp_path), ["cluster.address=127.0.0.1:6379"])
    assert _check_ray_temp(joined) == []  # a joined cluster keeps its own folder


@pytest.mark.parametrize("dry_run", [False, True])
@pytest.mark.parametrize("where", ["name", "path"])
def test_a_path_past_the_system_limit_is_named(where, dry_run, tmp_path, capsys, no_ray):
    """Was "error: [Errno 36] File name too long: '<the whole 4,000-character path>'", exit 1."""
    if where == "name":
        out = tmp_path / ("x" * 300)
        expected = "output.dir: the folder name 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx…' is 300"
    else:
        out = tmp_path.joinpath(*["abcdefghij" * 20] * 25)
        expected = "output.dir: the study's files would have paths of "
    argv = [experiment(tmp_path), f"output.dir={out}", port()]
    line = refused(["--dry-run", *argv] if dry_run else argv, capsys, expected)
    assert len(line) < 300, line
