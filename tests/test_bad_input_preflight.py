"""Bad input that only the files, the sockets or the machine show (issue 17, items 7 and 9).

Each case: exit 2, one line naming the key, no traceback, no Ray, nothing written; or, where the
input is good after all (TIME-WAIT, ``^NVLS``, a declared NCCL variable), it is accepted.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

import pytest

from rayspec._config import YAML_MAX_NODES
from rayspec._config import load_config
from rayspec._exceptions import ConfigError
from rayspec._exceptions import FailureReason
from rayspec._exceptions import LaunchError
from rayspec.testing import SimulatedTrials
from rayspec.tune import run_study
from rayspec.tune.__main__ import main
from rayspec.tune._preflight import check_port_free
from tests.helpers import free_port_block
from tests.helpers import twin_doc
from tests.helpers import write_experiment

FIELD = {"server": {"engine": "sglang", "model_path": "org/kimi", "draft_model_path": "org/d"}}


@pytest.fixture
def no_ray(monkeypatch) -> list[object]:
    import ray

    started: list[object] = []
    monkeypatch.setattr(ray, "init", lambda *a, **k: started.append((a, k)))
    return started


def refused(argv: list[str], capsys: Any, expected: str) -> str:
    """Run the CLI in-process; it must exit 2 with one ``error:`` line holding ``expected``."""
    rc = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert expected in lines[0], lines[0]
    assert "Traceback" not in err
    return lines[0]


def experiment(tmp_path: Any, **sections: Any) -> str:
    """A twin experiment without the Ray dashboard (its port 8265 may be held here: a test
    never depends on a fixed port being free); the dashboard tests turn it on."""
    sections.setdefault("cluster", {"include_dashboard": False})
    return write_experiment(str(tmp_path), twin_doc(str(tmp_path / "runs"), **sections))


def port() -> str:
    return f"server.port={free_port_block(1)}"


# -- the experiment file itself --------------------------------------------------------------


def test_a_file_that_is_not_utf8(tmp_path, capsys, no_ray) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"study: {name: caf\xe9}\n")
    refused([str(path)], capsys, "not UTF-8 text (byte 0xe9 at offset 17)")
    assert no_ray == []


def test_nul_bytes_in_paths(tmp_path, capsys, no_ray) -> None:
    path = experiment(tmp_path)
    refused([path + "\0x"], capsys, "the file name holds a control character ('\\x00')")
    refused([path, "more\0.yaml"], capsys, "control character")
    refused([path, "output.dir=/tmp/a\0b"], capsys, "output.dir")
    refused([path, "bench.prompts=/p\0.jsonl"], capsys, "bench.prompts")
    assert no_ray == [] and not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("study: {name: t}\nstudy: {name: u}\n", "at line 2, column 1: duplicate key 'study'"),
        ("server:\n  port: 1\n  port: 2\n", "at line 3, column 3: duplicate key 'port'"),
        ("search:\n  nccl: {NCCL_PROTO: [LL], NCCL_PROTO: [Simple]}\n", "'NCCL_PROTO'"),
    ],
)
def test_duplicate_keys_are_refused(tmp_path, capsys, text, expected) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text(text)
    refused([str(path)], capsys, expected)


def test_a_merge_key_may_be_overridden(tmp_path) -> None:
    """``<<: *base`` then the same key: YAML's merge, not a duplicate."""
    path = tmp_path / "merge.yaml"
    path.write_text(
        "base: &b {name: t, n_trials: 3}\n"
        "study: {<<: *b, n_trials: 4}\nserver: {engine: twin}\n".replace("base:", "x-base:")
    )
    with pytest.raises(ConfigError, match="x-base"):  # an unknown section, not a duplicate
        load_config(str(path))


def test_an_alias_bomb_is_refused_without_expanding_it(tmp_path, capsys, no_ray) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):  # 10**9 values once expanded
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]")
    lines.append("study: {name: t, enqueue: [*a8]}")
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    refused([str(path)], capsys, f"at most {YAML_MAX_NODES:,}")
    bomb = "[" + ",".join(["&a [x,x,x,x,x,x,x,x,x,x]"] + ["*a"] * 20000) + "]"
    refused([experiment(tmp_path), f"study.enqueue={bomb}"], capsys, "override study.enqueue")
    assert no_ray == []


def test_recursive_and_deep_documents(tmp_path, capsys) -> None:
    path = tmp_path / "rec.yaml"
    path.write_text("study: &s {name: t, x: *s}\n")
    refused([str(path)], capsys, "an alias refers to a node that contains it")
    deep = tmp_path / "deep.yaml"
    deep.write_text("study: " + "[" * 20000 + "]" * 20000 + "\n")
    refused([str(deep)], capsys, "deep.yaml")


# -- storage ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["folder", "sqlite-folder", "sqlite-missing-dir"])
def test_bad_storage_is_refused_before_anything_is_written(kind, tmp_path, capsys, no_ray):
    storage = {
        "folder": str(tmp_path),
        "sqlite-folder": f"sqlite:///{tmp_path}",
        "sqlite-missing-dir": f"sqlite:///{tmp_path}/no/such/dir/study.db",
    }[kind]
    expected = "does not exist" if kind == "sqlite-missing-dir" else "is a folder"
    refused([experiment(tmp_path), f"study.storage={storage}", port()], capsys, expected)
    assert no_ray == [] and not (tmp_path / "runs").exists()


def test_a_new_sqlite_file_is_not_created_by_a_refused_run(tmp_path, capsys) -> None:
    db = tmp_path / "study.db"
    refused(
        [experiment(tmp_path), f"study.storage=sqlite:///{db}", "server.python=/no/py", port()],
        capsys,
        "server.python: /no/py is not an executable file",
    )
    assert not db.exists()


# -- what only this machine says -------------------------------------------------------------


def test_missing_server_python_and_prompts(tmp_path, capsys, no_ray) -> None:
    refused([experiment(tmp_path), "server.python=/no/python", port()], capsys, "server.python")
    refused(
        [experiment(tmp_path), f"bench.prompts={tmp_path}/none.jsonl", port()],
        capsys,
        "bench.prompts: prompt set",
    )
    assert no_ray == [] and not (tmp_path / "runs").exists()


def test_a_taken_dashboard_port(tmp_path, capsys, no_ray) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        taken = sock.getsockname()[1]
        refused(
            [
                experiment(tmp_path),
                "cluster.include_dashboard=true",
                f"cluster.dashboard_port={taken}",
                port(),
            ],  # fmt: skip
            capsys,
            f"cluster.dashboard_port: {taken} on 127.0.0.1 is already in use",
        )
    assert no_ray == []


def test_an_unresolvable_dashboard_host(tmp_path, capsys, no_ray) -> None:
    refused(
        [
            experiment(tmp_path),
            "cluster.include_dashboard=true",
            "cluster.dashboard_host=no-such-host.invalid",
            port(),
        ],  # fmt: skip
        capsys,
        "cluster.dashboard_host: cannot resolve 'no-such-host.invalid'",
    )
    assert no_ray == []


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_a_cluster_address_with_nothing_behind_it(scheme, tmp_path, capsys, no_ray) -> None:
    """A bounded probe (seconds), not Ray's own minutes of retries."""
    free = free_port_block(1)
    refused(
        [experiment(tmp_path), f"cluster.address={scheme}127.0.0.1:{free}"],
        capsys,
        f"cluster.address: nothing answers at 127.0.0.1:{free}",
    )
    assert no_ray == [] and not (tmp_path / "runs").exists()


# -- NCCL names and NCCL_ALGO's exclusion syntax (real engine, --dry-run) --------------------


def test_an_unknown_nccl_variable_is_refused_with_a_hint(tmp_path, capsys) -> None:
    path = experiment(tmp_path, **FIELD)
    line = refused(
        ["--dry-run", path, "search.nccl={NCCL_PROTOCOL: [LL]}"],
        capsys,
        "search.nccl.NCCL_PROTOCOL: NCCL_PROTOCOL is not a variable NCCL reads",
    )
    assert "did you mean NCCL_PROTO?" in line
    assert "server.extra_nccl_vars=[NCCL_PROTOCOL]" in line
    refused(["--dry-run", path, "server.env={NCCL_BUFSIZE: '1'}"], capsys, "NCCL_BUFFSIZE?")
    # Declared: accepted.
    declared = ["search.nccl={NCCL_PROTOCOL: [LL]}", "server.extra_nccl_vars=[NCCL_PROTOCOL]"]
    assert main(["--dry-run", path, *declared]) == 0


@pytest.mark.parametrize("algo", ["^NVLS", "allreduce:^nvls,nvlstree", "^Ring"])
def test_nccl_algo_exclusion_is_accepted(algo, tmp_path, capsys) -> None:
    path = experiment(tmp_path, **FIELD)
    assert main(["--dry-run", path, f"search.nccl={{NCCL_ALGO: ['{algo}']}}"]) == 0, (
        capsys.readouterr().err
    )


def test_nccl_algo_naming_nvls_is_still_refused(tmp_path, capsys) -> None:
    path = experiment(tmp_path, **FIELD)
    refused(["--dry-run", path, "search.nccl={NCCL_ALGO: ['allreduce:nvls']}"], capsys, "NVLS")


# -- item 7: ports ---------------------------------------------------------------------------


def _time_wait_port() -> int:
    """A port left in TIME_WAIT: the listening side closes its accepted connection first."""
    with socket.socket() as server:
        # As uvicorn (SGLang) and aiohttp (the twin) listen: their TIME_WAIT takes a reuse.
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen()
        number = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", number))
        conn, _ = server.accept()
        conn.close()  # the active close: TIME_WAIT is on the server's side
        client.recv(1)
        client.close()
    return number


def test_a_port_in_time_wait_counts_as_free() -> None:
    """After a crash the server's port sits in TIME_WAIT for up to 60 s; uvicorn binds it
    with SO_REUSEADDR, so preflight must not refuse "run the same command again"."""
    number = _time_wait_port()
    check_port_free("127.0.0.1", number)  # no ConfigError


def test_a_finished_study_is_not_refused_for_a_held_port(tmp_path, capsys) -> None:
    doc = twin_doc(str(tmp_path / "runs"), study={"name": "t", "max_restarts": 2},
                   bench={"repeats": 2, "max_tokens": 40})  # fmt: skip
    doc["study"].pop("n_trials")
    path = write_experiment(str(tmp_path), doc)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        held = sock.getsockname()[1]
        cfg = load_config(path, [f"server.port={held}"])
        run_study(cfg, trial_fn=SimulatedTrials(), printer=lambda _line: None)
        assert main([path, f"server.port={held}"]) == 0, capsys.readouterr().err
        # Nor for a held dashboard port: no Ray starts either.
        dash = f"cluster.dashboard_port={held}"
        assert main([path, f"server.port={held}", dash]) == 0, capsys.readouterr().err
    assert "nothing left to run" in capsys.readouterr().out


def test_a_held_port_does_not_hide_the_other_problems(tmp_path, capsys) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        held = sock.getsockname()[1]
        rc = main([experiment(tmp_path), f"server.port={held}", "server.python=/no/python"])
    err = capsys.readouterr().err
    assert rc == 2
    lines = err.strip().splitlines()
    assert any(line.startswith("error: server.python:") for line in lines), err
    assert any(line.startswith(f"error: server.port: {held}") for line in lines), err


def test_a_port_held_at_launch_is_not_the_configurations_fault(tmp_path) -> None:
    """The server's own bind probe says port_in_use, a cause outside the configuration."""
    from rayspec._exceptions import NOT_THE_CONFIG
    from rayspec.server._process import check_port_free as bind_probe

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        with pytest.raises(LaunchError) as caught:
            bind_probe("127.0.0.1", sock.getsockname()[1])
    assert caught.value.reason is FailureReason.PORT_IN_USE
    assert FailureReason.PORT_IN_USE.value in NOT_THE_CONFIG


def test_a_port_held_between_trials_stops_the_study_without_charging(tmp_path) -> None:
    """Trial 1 meets a port held by another process: no restart charged, the configuration
    queued again, the study stopped with a line saying what to do; the resume runs it."""
    from rayspec.tune._trial import failed_result

    simulated = SimulatedTrials()
    calls: list[int] = []

    def trial_fn(cfg, number, candidate, **kw):  # type: ignore[no-untyped-def]
        calls.append(number)
        if number == 1:
            return failed_result(
                number, candidate, FailureReason.PORT_IN_USE,
                "port 1 on 127.0.0.1 is already in use", start=time.time(),
            )  # fmt: skip
        return simulated(cfg, number, candidate, **kw)

    doc = twin_doc(str(tmp_path / "runs"), study={"name": "t", "max_restarts": 3},
                   bench={"repeats": 2, "max_tokens": 40})  # fmt: skip
    doc["study"].pop("n_trials")
    cfg = load_config(write_experiment(str(tmp_path), doc))
    lines: list[str] = []
    outcome = run_study(cfg, trial_fn=trial_fn, printer=lines.append)
    assert outcome.stopped and "port was held by another process" in outcome.stopped
    assert "run the same command again" in outcome.stopped
    assert outcome.report.restarts == 1  # the baseline only: trial 1 started no server
    assert calls == [0, 1]
    # The resume runs the queued configuration again, and the budget is what it was.
    again = run_study(cfg, trial_fn=simulated, printer=lines.append)
    assert again.report.restarts == 3
    failures = [t for t in again.report.failures if t[2] == FailureReason.PORT_IN_USE.value]
    assert len(failures) == 1
    assert os.path.isdir(tmp_path / "runs" / "t")
