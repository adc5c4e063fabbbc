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
from tests.helpers import free_port_block
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
    ("stop-gain", {}, ["study.stop_gain=-0.1"], "study.stop_gain: -0.1 must be in [0, 0.5)"),
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
                    "NCCL_MAX_NCHANNELS": [str(n) for n in range(1, 65)],
                    "NCCL_BUFFSIZE": [str(2**i) for i in range(16, 32)],
                    "NCCL_PROTO": ["LL", "Simple"],
                }
            },
        },
        [],
        # 35 speculative points x 65 x 17 x 3
        "study.sampler: grid would try 116,025 configurations (at most 100,000)",
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
    ("env-name", {"server": {"env": {"1BAD": "x"}}}, [], "server.env: '1BAD' is not a valid"),
    ("non-nccl-searched", {"search": {"nccl": {"CUDA_X": ["1"]}}}, [], "only NCCL_* variables"),
    (
        "dead-flag",
        {"search": {"flags": {"--num-continuous-decode-steps": ["1", "4"]}}},
        [],
        "never read by SGLang",
    ),
    ("spec-mode", {}, ["search.speculative.modes=[off,MEDUSA]"], "'MEDUSA' is not one of"),
    # Found by the fuzz suite: a list inside the modes reached the normalising step untyped.
    (
        "spec-mode-nested-list",
        {"search": {"speculative": {"modes": ["off", ["EAGLE3"]]}}},
        [],
        "search.speculative.modes[1]: expected str, got list",
    ),
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
    # -- issue 17: control characters in any value (argv, env, best.sh, progress lines) ------
    (
        "newline-in-searched-flag",
        {
            "search": {"flags": {"--tokenizer-path": ["x\ntouch PWNED\n#"]}},
            "study": {"enqueue": [{"flags.--tokenizer-path": "x\ntouch PWNED\n#"}]},
        },
        [],
        "study.enqueue[0].flags.--tokenizer-path: 'x\\ntouch PWNED\\n#' holds the control "
        "character \\n",
    ),
    (
        "newline-in-searched-flag-only",
        {"search": {"flags": {"--tokenizer-path": ["x\ntouch PWNED\n#"]}}},
        [],
        "search.flags.--tokenizer-path[1]: 'x\\ntouch PWNED\\n#' holds the control character",
    ),
    ("cr-in-extra-flag", {"server": {"extra_flags": ["--x", "a\rb"]}}, [], "extra_flags[1]"),
    (
        "nul-in-model-path",
        {**FIELD, "server": {**FIELD["server"], "model_path": "m\0"}},
        [],
        "server.model_path: 'm\\x00' holds the control character \\x00",
    ),
    ("del-in-env", {"server": {"env": {"FOO": "a\x7fb"}}}, [], "server.env.FOO"),
    ("c1-next-line", {"server": {"env": {"FOO": "a\x85b"}}}, [], "\\x85"),
    ("line-separator", {"server": {"attention_backend": "fa3\u2028x"}}, [], "\\u2028"),
    ("paragraph-sep", {"server": {"twin": {"profile": "p\u2029"}}}, [], "server.twin.profile"),
    (
        "newline-in-enqueue",
        {"study": {"enqueue": [{"nccl.NCCL_PROTO": "LL\nx"}]}},
        [],
        "study.enqueue[0].nccl.NCCL_PROTO",
    ),
    ("newline-in-env-name", {"server": {"env": {"A\nB": "1"}}}, [], "server.env: 'A\\nB' holds"),
    ("tab-in-output-dir", {}, ["output.dir=/tmp/a\tb"], "output.dir"),
    ("escape-in-study-name", {"study": {"name": "t\x1b[2J"}}, [], "study.name"),
    ("newline-in-unknown-key", {"x\ntouch PWNED\n#": {}}, [], "x\\ntouch PWNED\\n#"),
    # -- flags as SGLang's argparse reads them (unique prefixes, --flag=value) ---------------
    (
        "abbrev-host",
        {},
        ["server.extra_flags=[--hos,0.0.0.0]"],
        "--hos (SGLang reads it as --host",
    ),
    ("abbrev-host-equals", {}, ["server.extra_flags=[--hos=0.0.0.0]"], "as --host"),
    (
        "abbrev-multicast",
        {},
        ["server.extra_flags=[--enable-nccl-nv]"],
        "--enable-nccl-nv (SGLang reads it as --enable-nccl-nvls: its parser takes unique "
        "prefixes) turns NVLink multicast on",
    ),
    ("abbrev-tp", {}, ["server.extra_flags=[--tp-s,4]"], "as --tp-size"),
    (
        "abbrev-searched",
        {"search": {"flags": {"--enable-symm": ["on"]}}},
        [],
        "as --enable-symm-mem",
    ),
    (
        "api-key-flag",
        {"server": {"extra_flags": ["--api-key", "sk-live-123"]}},
        [],
        "server.extra_flags: --api-key takes a key rayspec's benchmark client does not send",
    ),
    ("api-key-abbrev", {}, ["server.extra_flags=[--admin-api,x]"], "as --admin-api-key"),
    (
        "abbrev-dead",
        {"search": {"flags": {"--num-continuous-d": ["1", "4"]}}},
        [],
        "never read by SGLang",
    ),
    (
        "config-file-flag",
        {},
        ["server.extra_flags=[--config,x.yaml]"],
        "--config makes SGLang read more flags from a file",
    ),
    (
        "flag-choice-is-a-flag",
        {"search": {"flags": {"--foo": ["--host"]}}},
        [],
        "would be read as a flag of its own",
    ),
    # -- numbers ---------------------------------------------------------------------------
    ("seed-negative", {}, ["study.seed=-1"], "study.seed: -1 must be between 0 and 4294967295"),
    ("seed-huge", {}, ["study.seed=4294967296"], "study.seed: 4294967296 must be between"),
    ("twin-seed-huge", {}, ["server.twin.seed=99999999999"], "server.twin.seed"),
    ("name-too-long", {"study": {"name": "a" * 300}}, [], "study.name: 300 characters: at most"),
    ("num-gpus-negative", {}, ["cluster.num_gpus=-1"], "cluster.num_gpus: -1 must be 0 or more"),
    ("num-cpus-negative", {}, ["cluster.num_cpus=-2"], "cluster.num_cpus: -2 must be 0 or more"),
    (
        "port-plus-slots",
        {},
        ["server.port=65535", "cluster.max_concurrent_trials=2"],
        "server.port: 65535: 2 concurrent trials use ports 65535-65536, past 65535",
    ),
    ("dashboard-port-range", {}, ["cluster.dashboard_port=70000"], "cluster.dashboard_port"),
    (
        "startup-timeout-nan",
        {},
        ["server.startup_timeout_s=nan"],
        "server.startup_timeout_s: nan is not a finite number",
    ),
    ("stop-timeout-zero", {}, ["server.stop_timeout_s=0"], "server.stop_timeout_s: 0.0 must be"),
    ("read-timeout-nan", {}, ["bench.read_timeout_s=nan"], "bench.read_timeout_s: nan is not"),
    ("request-timeout-neg", {}, ["bench.request_timeout_s=-1"], "bench.request_timeout_s"),
    (
        "temperature-negative",
        {},
        ["bench.temperature=-1"],
        "bench.temperature: -1.0 must be 0 (greedy) or more",
    ),
    ("alpha-inf", {}, ["study.alpha=inf"], "study.alpha: inf is not a finite number"),
    ("max-wall-inf", {}, ["study.max_wall_s=.inf"], "study.max_wall_s: inf is not a finite"),
    ("placement-nan", {}, ["cluster.placement_timeout_s=nan"], "cluster.placement_timeout_s"),
    (
        "rate-nan",
        {"bench": {"scenarios": [{"name": "a", "request_rate": float("nan")}]}},
        [],
        "bench.scenarios[0].request_rate: nan is not a finite number",
    ),
    (
        "ladder-and-scenarios",
        {"bench": {"scenarios": [{"name": "a"}], "ladder": {"concurrency": [1, 8]}}},
        [],
        "bench.ladder: set bench.ladder or bench.scenarios, not both",
    ),
    ("ladder-zero", {}, ["bench.ladder.concurrency=[0,8]"], "bench.ladder.concurrency: [0, 8]"),
    ("ladder-twice", {}, ["bench.ladder.concurrency=[8,8]"], "must be distinct integers"),
    ("ladder-rate-neg", {}, ["bench.ladder.request_rate=[-1]"], "bench.ladder.request_rate"),
    (
        "ladder-rates-one-name",
        {},
        ["bench.ladder.request_rate=[2,2.0]"],
        "bench.ladder.request_rate: [2.0, 2.0] must be distinct positive numbers",
    ),
    ("ladder-cap-zero", {}, ["bench.ladder.max_concurrency=0"], "bench.ladder.max_concurrency"),
    (
        "ladder-objective",
        {},
        ["bench.ladder.concurrency=[1,8]", "study.objective_scenario=c4"],
        "study.objective_scenario: 'c4' is not a scenario of bench.scenarios or bench.ladder "
        "(those are: c1, c8)",
    ),
    (
        "int-past-int64",
        {},
        ["bench.max_tokens=100000000000000000000"],
        "bench.max_tokens: 100000000000000000000 is out of range",
    ),
    (
        "list-as-env-value",
        {},
        ["server.env={NCCL_PROTO: ['x']}"],
        "server.env.NCCL_PROTO: expected str, got list",
    ),
    ("list-into-mapping", {}, ["search.nccl=[]"], "override search.nccl: "),
    ("float-overflow", {}, ["server.twin.startup_s=1e400"], "server.twin.startup_s: inf"),
    # -- storage, cluster, space, twin ------------------------------------------------------
    ("storage-blank", {"study": {"storage": " "}}, [], "study.storage: ' ' begins or ends with"),
    (
        "storage-scheme",
        {"study": {"storage": "foo://x"}},
        [],
        "study.storage: 'foo://x' is not a database URL rayspec can open",
    ),
    ("storage-memory", {"study": {"storage": "sqlite://"}}, [], "in-memory database"),
    ("address-garbage", {}, ["cluster.address=http://x:1"], "cluster.address"),
    ("address-no-port", {}, ["cluster.address=headnode"], "is not host:port"),
    ("address-port-range", {}, ["cluster.address=h:99999"], "is not host:port"),
    (
        "no-baseline-in-space",
        {},
        ["search.speculative.modes=[EAGLE3]"],
        "search.speculative.modes: ['EAGLE3'] must include off",
    ),
    (
        "twin-fault-bogus",
        {},
        ["server.twin.fault=bogus"],
        "server.twin.fault: --twin-fault 'bogus': unknown kind",
    ),
    ("nccl-extra-not-nccl", {}, ["server.extra_nccl_vars=[FOO]"], "server.extra_nccl_vars"),
    # -- search.scheduler: SGLang's rules for its knobs ------------------------------------
    (
        "knob-running-zero",
        {},
        ["search.scheduler.max_running_requests=[0,8]"],
        "search.scheduler.max_running_requests: 0 must be at least 1",
    ),
    (
        "knob-chunk-zero",
        {},
        ["search.scheduler.chunked_prefill_size=[0]"],
        "search.scheduler.chunked_prefill_size: 0 must be a positive number of tokens, or -1",
    ),
    (
        "knob-graph-above-cap",
        {},
        ["server.max_running_requests=32", "search.scheduler.cuda_graph_max_bs=[16,64]"],
        "search.scheduler.cuda_graph_max_bs: 64 is above the running cap "
        "(server.max_running_requests: 32); SGLang clamps",
    ),
    (
        "knob-graph-above-searched-caps",
        {},
        [
            "search.scheduler.max_running_requests=[8,16]",
            "search.scheduler.cuda_graph_max_bs=[32]",
        ],
        "search.scheduler.cuda_graph_max_bs: 32 is above the running cap "
        "(search.scheduler.max_running_requests: 16)",
    ),  # fmt: skip
    (
        "knob-chunk-also-fixed",
        {},
        [
            "search.scheduler.chunked_prefill_size=[2048]",
            "server.extra_flags=[--chunked-prefill-size,4096]",
        ],
        "server.extra_flags: '--chunked-prefill-size' is searched in "
        "search.scheduler.chunked_prefill_size",
    ),  # fmt: skip
    (
        "knob-not-an-int",
        {},
        ["search.scheduler.max_running_requests=[many]"],
        "search.scheduler.max_running_requests",
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
            # No dashboard: its port 8265 may be held here, and would be a second line.
            [
                sys.executable,
                "-m",
                "rayspec.tune",
                path,
                f"server.port={port}",
                "cluster.include_dashboard=false",
            ],  # fmt: skip
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
    # A free port: the default 30000 may be held by any SGLang on the machine, and the port
    # line would come first.
    rc = main([write_experiment(str(tmp_path), doc), f"server.port={free_port_block(1)}",
               "cluster.include_dashboard=false"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and "server.engine: sglang is not installed" in err
    assert not (tmp_path / "runs").exists()
