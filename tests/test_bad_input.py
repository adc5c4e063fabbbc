"""The bad-input corpus: each case is refused with one clear line, exit code 2, nothing started.

"Nothing started" means: no Ray in this process, no study folder written, and (for one case run
as a real subprocess) no process left behind.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from typing import Any

import pytest

from rayspec.tune.__main__ import main
from tests.helpers import REPO
from tests.helpers import twin_doc
from tests.helpers import write_experiment

FIELD = {"server": {"engine": "sglang", "model_path": "org/kimi", "draft_model_path": "org/d"}}

# (case id, sections merged into a minimal twin experiment, overrides, expected text)
CASES: list[tuple[str, dict[str, Any], list[str], str]] = [
    ("unknown-key-yaml", {"server": {"tp_sise": 8}}, [], "did you mean 'tp_size'"),
    ("unknown-key-override", {}, ["bench.repeat=3"], "did you mean one of 'repeats'"),
    ("unknown-section", {}, ["servers.port=1"], "servers"),
    ("wrong-type", {}, ["study.n_trials=abc"], "study.n_trials"),
    ("wrong-type-float", {}, ["bench.repeats=2.5"], "bench.repeats"),
    ("n-trials-zero", {}, ["study.n_trials=0"], "study.n_trials: 0 must be at least 1"),
    ("max-restarts-zero", {}, ["study.max_restarts=0"], "study.max_restarts: 0 must be"),
    ("max-wall-negative", {}, ["study.max_wall_s=-5"], "study.max_wall_s: -5.0 must be"),
    ("start-noise", {}, ["study.start_noise=2"], "study.start_noise: 2.0 must be in"),
    (
        "placement-timeout-negative",
        {},
        ["cluster.placement_timeout_s=-1"],
        "cluster.placement_timeout_s: -1.0 must be 0 (wait for ever) or more",
    ),
    (
        "max-repeats-below",
        {},
        ["bench.repeats=5", "bench.max_repeats=3"],
        "bench.max_repeats: 3 must be at least bench.repeats (5)",
    ),
    (
        "screen-tolerance",
        {},
        ["search.nccl_screen.tolerance=1.5"],
        "search.nccl_screen.tolerance: 1.5",
    ),
    ("screen-max-sets", {}, ["search.nccl_screen.max_sets=0"], "search.nccl_screen.max_sets"),
    ("port-range", {}, ["server.port=70000"], "server.port: 70000"),
    ("tp-zero", {}, ["server.tp_size=0"], "server.tp_size: 0"),
    ("repeats-zero", {}, ["bench.repeats=0"], "bench.repeats: 0"),
    ("max-tokens-negative", {}, ["bench.max_tokens=-1"], "bench.max_tokens: -1"),
    ("mem-fraction", {}, ["server.mem_fraction_static=1.5"], "server.mem_fraction_static"),
    ("unknown-engine", {}, ["server.engine=vllm"], "server.engine: Invalid value 'vllm'"),
    ("unknown-sampler", {}, ["study.sampler=bayes"], "study.sampler: Invalid value 'bayes'"),
    (
        "grid-too-large",
        {
            "study": {"sampler": "grid"},
            "search": {
                "nccl": {
                    "NCCL_MAX_NCHANNELS": [str(n) for n in range(1, 33)],
                    "NCCL_BUFFSIZE": [str(2**i) for i in range(16, 32)],
                    "NCCL_PROTO": ["LL", "Simple"],
                }
            },
        },
        [],
        # 61 speculative points x 33 x 17 x 3
        "study.sampler: grid would try 102,663 configurations (at most 100,000)",
    ),
    ("override-no-equals", {}, ["study.n_trials"], "expected dotted.key=value"),
    ("override-no-key", {}, ["=5"], "expected dotted.key=value"),
    ("override-plus", {}, ["+study.extra=1"], "expected dotted.key=value"),
    ("missing-model-path", {"server": {"engine": "sglang"}}, [], "server.model_path: required"),
    (
        "missing-draft-path",
        {"server": {"engine": "sglang", "model_path": "org/kimi"}},
        [],
        "server.draft_model_path: required",
    ),
    (
        "env-and-search",
        {"server": {"env": {"NCCL_PROTO": "LL"}}, "search": {"nccl": {"NCCL_PROTO": ["LL"]}}},
        [],
        "search.nccl.NCCL_PROTO: is also fixed in server.env",
    ),
    (
        "flag-fixed-and-searched",
        {
            "server": {"extra_flags": ["--disable-custom-all-reduce"]},
            "search": {"flags": {"--disable-custom-all-reduce": ["on", "off"]}},
        },
        [],
        "is also fixed in server.extra_flags",
    ),
    ("managed-flag", {"server": {"extra_flags": ["--port", "1"]}}, [], "--port is set by rayspec"),
    ("nvls-flag", {"server": {"extra_flags": ["--enable-nccl-nvls"]}}, [], "NVLink multicast"),
    (
        "symm-mem-searched",
        {"search": {"flags": {"--enable-symm-mem": ["on", "off"]}}},
        [],
        "--enable-symm-mem turns NVLink multicast on",
    ),
    ("nvls-env", {"server": {"env": {"NCCL_NVLS_ENABLE": "1"}}}, [], "NCCL_NVLS_ENABLE"),
    ("nvls-algo", {"search": {"nccl": {"NCCL_ALGO": ["Ring", "NVLS"]}}}, [], "uses NVLS"),
    ("env-name", {"server": {"env": {"1BAD": "x"}}}, [], "not a valid environment variable"),
    ("non-nccl-searched", {"search": {"nccl": {"CUDA_X": ["1"]}}}, [], "only NCCL_* variables"),
    (
        "dead-flag",
        {"search": {"flags": {"--num-continuous-decode-steps": ["1", "4"]}}},
        [],
        "never read by SGLang",
    ),
    ("spec-mode", {}, ["search.speculative.modes=[off,MEDUSA]"], "'MEDUSA' is not one of"),
    ("steps-zero", {}, ["search.speculative.num_steps=[0,2]"], "0 must be at least 1"),
    (
        "enqueue-value",
        {
            "study": {"enqueue": [{"nccl.NCCL_PROTO": "LL256"}]},
            "search": {"nccl": {"NCCL_PROTO": ["LL", "Simple"]}},
        },
        [],
        "study.enqueue[0].nccl.NCCL_PROTO: 'LL256' is not one of the choices",
    ),
    (
        "enqueue-param",
        {"study": {"enqueue": [{"spec.depth": 3}]}},
        [],
        "spec.depth: not a parameter",
    ),
    ("study-name", {"study": {"name": "a/b"}}, [], "study.name"),
    (
        "fault-on-real-engine",
        {**FIELD, "server": {**FIELD["server"], "twin": {"fault": "oom"}}},
        [],
        "server.twin.fault",
    ),
    ("twin-profile", {"server": {"twin": {"profile": "no-such-node"}}}, [], "server.twin.profile"),
    (
        "twin-tp-too-large",
        {},
        ["server.tp_size=16"],
        "server.tp_size: 16 is more than the 8 GPUs of the twin's node",
    ),
    (
        "node-resource-builtin",
        {},
        ["cluster.node_resource=GPU"],
        "cluster.node_resource: 'GPU' is not a custom resource name",
    ),
    (
        "node-resource-spaces",
        {"cluster": {"node_resource": "h200 nodes"}},
        [],
        "cluster.node_resource: 'h200 nodes' is not a custom resource name",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_refused(case, tmp_path, capsys, monkeypatch) -> None:
    import ray

    started: list[object] = []
    monkeypatch.setattr(ray, "init", lambda *a, **k: started.append((a, k)))
    _, sections, overrides, expected = case
    out = tmp_path / "runs"
    path = write_experiment(str(tmp_path), twin_doc(str(out), **sections))
    rc = main([path, *overrides])
    err = capsys.readouterr().err
    assert rc == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    assert expected in lines[0]
    assert not out.exists()  # nothing written
    assert started == []  # Ray was never started


@pytest.mark.parametrize("where", ["proc", "under-a-file"])
def test_an_output_dir_that_cannot_be_created_is_refused(where, tmp_path, capsys, monkeypatch):
    """Refused in preflight, one line naming output.dir, before Ray starts."""
    import ray

    started: list[object] = []
    monkeypatch.setattr(ray, "init", lambda *a, **k: started.append((a, k)))
    if where == "proc":
        if not os.path.isdir("/proc"):
            pytest.skip("no /proc here")
        out = "/proc/rayspec-runs"
    else:
        (tmp_path / "a-file").write_text("")
        out = str(tmp_path / "a-file" / "runs")
    path = write_experiment(str(tmp_path), twin_doc(out))
    rc = main([path])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: output.dir: {out}/t cannot be created: ")
    assert started == []
    assert not os.path.exists(out)


def test_unreadable_and_invalid_files(tmp_path, capsys) -> None:
    assert main([str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read the experiment file" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("study: {name: x\nserver: [\n")
    assert main([str(bad)]) == 2
    assert "invalid YAML at line" in capsys.readouterr().err
    listy = tmp_path / "list.yaml"
    listy.write_text("- a\n- b\n")
    assert main([str(listy)]) == 2
    assert "expected a mapping" in capsys.readouterr().err


def test_taken_port_is_refused_before_anything_starts(tmp_path) -> None:
    """A real subprocess: exit 2, one line, no study folder, no child left."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        out = tmp_path / "runs"
        path = write_experiment(str(tmp_path), twin_doc(str(out)))
        proc = subprocess.run(
            [sys.executable, "-m", "rayspec.tune", path, f"server.port={port}"],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=120,
            env={**os.environ, "RAY_AUTH_MODE": "disabled"},
        )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        f"error: server.port: {port} on 127.0.0.1 is already in use; free it or choose "
        "another with server.port=..."
    )
    assert not out.exists()


def test_real_engine_without_sglang_is_refused(tmp_path, capsys) -> None:
    import importlib.util

    import pytest

    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("sglang is installed here: the check has nothing to refuse")
    doc = twin_doc(str(tmp_path / "runs"), **FIELD)
    rc = main([write_experiment(str(tmp_path), doc)])
    err = capsys.readouterr().err
    assert rc == 2 and "server.engine: sglang is not installed" in err
    assert not (tmp_path / "runs").exists()
