"""``python -m rayspec.tune`` with ``server.engine: sglang`` against the real SGLang server on
this CPU, as a user runs it: two studies at once (a subprocess each), faults injected from
outside, then the folder read back and ``best.sh`` run as printed.

Study ``main`` (the random tiny target and its random EAGLE-3 drafter): the baseline, an
EAGLE-3 chain and a tree (enqueued), then three victims, each a configuration of its own:
the drafter's folder vanishes before trial 3 starts (and comes back after), trial 4's
scheduler is stopped (SIGSTOP) mid-run, trial 5's scheduler is killed mid-run, trial 6's port
is taken by a stranger while its server starts; then the baseline's second start (the gate's
drift check). The NCCL screen is asked for one NCCL
variable and has no GPU. Study ``agree`` (the always-agreeing pair, with its own baseline: its
outputs are not the random target's): the baseline, a chain; the driver is killed with SIGKILL
once the third server (the baseline's second start) is up, and nothing of that server may be
left behind.

11 server starts (one fails in seconds), two at a time: several minutes on two cores
(docs/real-sglang-cpu.md).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import free_port_block
from tests.real_sglang import _study as st
from tests.real_sglang._models import TinyModels
from tests.real_sglang._server import scaffold_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3000)]

STUDY_TIMEOUT_S = 2400.0
KILL_WAIT_S = 60.0  # reaper grace (15 s) + Ray noticing the dead driver
CHAIN = {"spec.mode": "EAGLE3", "spec.num_steps": 2, "spec.eagle_topk": 1}
TREE = {
    "spec.mode": "EAGLE3",
    "spec.num_steps": 2,
    "spec.eagle_topk": 2,
    "spec.num_draft_tokens": 4,
}
NO_DRAFT_VICTIM = {"spec.mode": "EAGLE3", "spec.num_steps": 1, "spec.eagle_topk": 1}
HANG_VICTIM = {"spec.mode": "EAGLE3", "spec.num_steps": 3, "spec.eagle_topk": 1}
KILL_VICTIM = {
    "spec.mode": "EAGLE3", "spec.num_steps": 1, "spec.eagle_topk": 2, "spec.num_draft_tokens": 3,
}  # fmt: skip
PORT_VICTIM = {
    "spec.mode": "EAGLE3", "spec.num_steps": 2, "spec.eagle_topk": 2, "spec.num_draft_tokens": 3,
}  # fmt: skip
MAIN_TRIALS = 8  # the baseline, 6 enqueued, the baseline's second start


@dataclasses.dataclass
class Studies:
    main: Path  # the study folder
    agree: Path
    main_out: str  # the driver's output
    agree_out: str
    main_rc: int | None
    main_wall_s: float
    faults: list[st.Fault]
    killed_tree: list[int]  # the agree study's last server tree when its driver was killed
    left_after_kill: list[int]
    site_log: str
    python: Path
    main_port: int


def _rename(src: Path, dst: Path) -> str:
    os.rename(src, dst)
    return f"renamed {src.name} -> {dst.name}"


@pytest.fixture(scope="module")
def studies(
    sglang_python: Path, tiny_models: TinyModels, tmp_path_factory: pytest.TempPathFactory
) -> Studies:
    root = tmp_path_factory.mktemp("real-study")
    draft = root / "draft"  # a copy: trial 3 of the main study loses it for a while
    shutil.copytree(tiny_models.draft, draft)
    gone = root / "draft.gone"
    site_log = root / "site.log"
    # The scaffolding goes in server.env (as a user passes environment to the server), except
    # the site log: that one only the driver's environment has, so the servers carry it only if
    # the Ray actors really pass the driver's environment on.
    server_env = scaffold_env()
    main_port, agree_port = free_port_block(), free_port_block()
    main = st.experiment(
        name="main", out_dir=root / "runs", python=sglang_python, target=tiny_models.target,
        draft=draft, port=main_port, env=server_env,
        enqueue=[CHAIN, TREE, NO_DRAFT_VICTIM, HANG_VICTIM, KILL_VICTIM, PORT_VICTIM],
        max_restarts=MAIN_TRIALS,
        num_steps=[1, 2, 3], eagle_topk=[1, 2], num_draft_tokens=[3, 4],
        nccl={"NCCL_PROTO": ["LL"]},
    )  # fmt: skip
    agree = st.experiment(
        name="agree", out_dir=root / "runs", python=sglang_python,
        target=tiny_models.agree_target, draft=tiny_models.agree_draft, port=agree_port,
        env=server_env, enqueue=[CHAIN], max_restarts=3, num_steps=[2], eagle_topk=[1],
        num_draft_tokens=[3],
    )  # fmt: skip
    env = st.driver_env({"RAYSPEC_TEST_SITE_LOG": str(site_log)})
    main_folder, agree_folder = root / "runs" / "main", root / "runs" / "agree"
    holder = st.PortHolder(main_port)
    faults = [
        st.Fault(3, st.launched, lambda _p: _rename(draft, gone)),
        st.Fault(3, st.exited, lambda _p: _rename(gone, draft)),
        st.Fault(4, st.measuring, st.stop_scheduler),
        st.Fault(5, st.measuring, st.kill_scheduler),
        # A stranger takes the port after rayspec found it free, while SGLang starts.
        st.Fault(6, st.launched, holder.take),
        st.Fault(6, st.exited, holder.give_back),
    ]
    t0 = time.monotonic()
    main_proc = st.start_study(st.write_yaml(root / "main.yaml", main), root / "main.out", env)
    agree_proc = st.start_study(st.write_yaml(root / "agree.yaml", agree), root / "agree.out", env)
    injector = st.Injector(main_folder, faults)
    injector.start()
    killed: list[int] = []
    left: list[int] = []
    try:
        # The agree study: SIGKILL its driver once its third server (trial 2) is ready.
        third = st.trial_log(agree_folder, 2)
        if (
            st.wait_for(
                lambda: st.FLUSH_LINE in st.read_text(third) or agree_proc.poll() is not None,
                STUDY_TIMEOUT_S,
            )
            and agree_proc.poll() is None
        ):
            killed = st.server_pids(third)[1]
            os.kill(agree_proc.pid, signal.SIGKILL)
            agree_proc.wait(timeout=30)
            st.wait_for(lambda: not st.alive(killed), KILL_WAIT_S)
            left = st.alive(killed)
        main_rc = main_proc.wait(timeout=max(1.0, STUDY_TIMEOUT_S - (time.monotonic() - t0)))
        wall = time.monotonic() - t0
    finally:
        injector.stop_event.set()
        holder.give_back(root)
        for proc in (main_proc, agree_proc):
            if proc.poll() is None:
                st.kill_group(proc)
        st.kill_group(agree_proc)  # what Ray left of the killed driver's session
    return Studies(
        main=main_folder, agree=agree_folder,
        main_out=st.read_text(root / "main.out"), agree_out=st.read_text(root / "agree.out"),
        main_rc=main_rc, main_wall_s=wall, faults=faults, killed_tree=killed,
        left_after_kill=left, site_log=st.read_text(site_log), python=sglang_python,
        main_port=main_port,
    )  # fmt: skip


def _rows(folder: Path) -> dict[int, dict[str, Any]]:
    return st.trials(folder)


def test_the_study_ends_normally_and_records_every_trial(studies: Studies) -> None:
    assert studies.main_rc == 0, studies.main_out[-3000:]
    rows = _rows(studies.main)
    assert sorted(rows) == list(range(MAIN_TRIALS)), studies.main_out[-3000:]
    roles = {n: r["role"] for n, r in rows.items()}
    assert roles[0] == "baseline" and roles[7] == "baseline#2"
    assert [roles[n] for n in range(1, 7)] == [f"enqueued[{i}]" for i in range(6)]
    for n in (0, 1, 2, 7):
        assert rows[n]["state"] == "COMPLETE", (n, rows[n]["failure_detail"], rows[n]["log_tail"])
        assert rows[n]["engine"] == "sglang"
        assert json.loads(rows[n]["command"])[1:3] == ["-m", "sglang.launch_server"]
        assert rows[n]["value"] > 0


def test_the_nccl_screen_without_a_gpu_is_one_clear_line(studies: Studies) -> None:
    lines = [ln for ln in studies.main_out.splitlines() if "NCCL screen" in ln]
    assert len(lines) == 1, lines
    assert "GPU" in lines[0] and "0 visible" in lines[0], lines[0]
    assert "Traceback" not in studies.main_out and "\x1b[" not in studies.main_out


def test_speculative_trials_carry_the_real_accept_length_three_ways(studies: Studies) -> None:
    rows = _rows(studies.main)
    reqs = [r for r in st.requests(studies.main) if r["trial"] in (1, 2) and r["run"] >= 0]
    assert reqs
    for r in reqs:  # per request, from meta_info.spec_verify_ct
        assert r["spec_verify_ct"] > 0
        assert r["accept_length"] == pytest.approx(r["completion_tokens"] / r["spec_verify_ct"])
    for n in (1, 2):
        row = rows[n]
        # A random drafter: nearly every draft token rejected, about one token per verify.
        assert 1.0 <= row["accept_length"] < 1.5, row["accept_length"]
        for key in ("server_accept_length", "metrics_spec_accept_length", "log_accept_len_mean"):
            assert row[key] is not None and 1.0 <= row[key] < 1.5, (key, row[key])
    baseline = rows[0]
    assert math.isnan(baseline["accept_length"]) or baseline["accept_length"] is None
    assert baseline["metrics_spec_accept_length"] is None  # no speculation, no accept length
    assert baseline["log_accept_len_mean"] is None


def test_the_gate_compares_real_greedy_output_ids(studies: Studies) -> None:
    rows = _rows(studies.main)
    by_trial: dict[int, list[list[int]]] = {}
    for r in st.requests(studies.main):
        if r["output_ids"] is not None:
            by_trial.setdefault(r["trial"], []).append(list(r["output_ids"]))
    assert by_trial[0] and len(by_trial[0][0]) == 32
    for n in (1, 2):
        assert rows[n]["gate_compared"] > 0 and rows[n]["gate_diverged_early"] == 0
    # The baseline's second start: the same outputs, so the gate stays on.
    assert "the gate is off" not in studies.main_out
    assert sorted(map(tuple, by_trial[7])) == sorted(map(tuple, by_trial[0]))


def test_a_missing_draft_folder_is_an_argument_error_with_sglangs_log(studies: Studies) -> None:
    row = _rows(studies.main)[3]
    assert row["state"] == "FAIL"
    assert row["failure"] == "argument_error", (row["failure"], row["failure_detail"])
    assert "Repo id must be in the form" in row["failure_detail"], row["failure_detail"]
    assert "speculative_hook.py" in row["log_tail"], row["log_tail"]


def test_a_stopped_scheduler_is_a_stalled_stream(studies: Studies) -> None:
    fault = studies.faults[2]
    assert fault.done.startswith("SIGSTOP"), fault.done
    row = _rows(studies.main)[4]
    assert row["state"] == "FAIL"
    assert row["failure"] == "stalled_stream", (row["failure"], row["failure_detail"])
    assert "Decode batch" in row["log_tail"] or "POST /generate" in row["log_tail"]


def test_a_killed_scheduler_is_a_crash_mid_benchmark(studies: Studies) -> None:
    fault = studies.faults[3]
    assert fault.done.startswith("SIGKILL"), fault.done
    row = _rows(studies.main)[5]
    assert row["state"] == "FAIL"
    assert row["failure"] == "crash_mid_benchmark", (row["failure"], row["failure_detail"])
    assert row["log_tail"].strip()


def test_a_port_taken_while_sglang_starts_fails_at_once(studies: Studies) -> None:
    assert studies.faults[4].done.startswith("listening"), studies.faults[4].done
    row = _rows(studies.main)[6]
    assert row["state"] == "FAIL" and row["failure"] == "unknown", row["failure_detail"]
    assert "address already in use" in row["failure_detail"]
    assert "error while attempting to bind on address" in row["log_tail"]  # SGLang's own line


def test_no_server_process_outlives_its_trial(studies: Studies) -> None:
    for fault in studies.faults:
        assert not st.alive(fault.tree), (fault.trial, fault.done, st.alive(fault.tree))


def test_an_ordinary_stop_is_no_crash_to_sglang(studies: Studies) -> None:
    # SIGTERM reaches the server alone, which stops its scheduler and detokenizer itself.
    for n in (0, 1, 2, 7):
        log = st.read_text(st.trial_log(studies.main, n))
        assert "stop requested" in log
        assert "crashed with exit code" not in log, log[-2000:]


def test_the_drivers_environment_reaches_every_server_process(studies: Studies) -> None:
    # Only the driver had RAYSPEC_TEST_SITE_LOG: every SGLang process wrote its line through
    # the Ray actors' inherited environment.
    lines = studies.site_log.splitlines()  # "pid ppid argv" of each Python that loaded it
    servers = {ln.split()[0] for ln in lines if "'--model-path'" in ln}
    children = [ln for ln in lines if ln.split()[1] in servers and "multiprocessing" in ln]
    assert len(servers) >= MAIN_TRIALS, lines[:5]  # every start, the failed ones included
    assert children, lines[:5]  # and their scheduler / detokenizer processes


def test_report_and_best_sh_are_written(studies: Studies) -> None:
    report = (studies.main / "report.md").read_text()
    assert "engine: sglang" in report
    for reason in ("argument_error", "stalled_stream", "crash_mid_benchmark", "unknown"):
        assert reason in report
    best = (studies.main / "best.sh").read_text()
    assert f"exec {studies.python} -m sglang.launch_server" in best
    assert "${MODEL_PATH" not in best
    assert "RAYSPEC_TEST_FAKE_AMX" in best  # server.env travels with the launch line


def test_best_sh_as_printed_starts_the_real_server(studies: Studies, tmp_path: Path) -> None:
    script = studies.main / "best.sh"
    env = st.driver_env()  # this shell's PATH: best.sh names the interpreter (server.python)
    log = tmp_path / "best.log"
    proc = subprocess.Popen(
        ["bash", str(script)], stdout=open(log, "wb"), stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, env=env, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{studies.main_port}/health_generate"
    tree: list[int] = []

    def healthy() -> bool:
        tree.extend(p for p in _tree(proc.pid) if p not in tree)
        if proc.poll() is not None:
            return True
        try:
            return httpx.get(url, timeout=10).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        assert st.wait_for(healthy, 300, poll_s=1.0) and proc.poll() is None, st.read_text(log)[
            -3000:
        ]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        st.wait_for(lambda: not st.alive(tree), 30)
        for pid in st.alive(tree):
            os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _tree(pid: int) -> list[int]:
    from rayspec.server._process import process_tree

    return process_tree(pid)


def test_the_agreeing_pair_accepts_every_draft(studies: Studies) -> None:
    rows = _rows(studies.agree)
    assert rows[0]["state"] == "COMPLETE" and rows[0]["role"] == "baseline"
    chain = rows[1]
    assert chain["state"] == "COMPLETE", (chain["failure_detail"], chain["log_tail"])
    # 2 steps: at most 3 tokens per verify; the prefill's first token makes it a little less.
    assert 2.5 < chain["accept_length"] <= 3.0, chain["accept_length"]
    assert chain["server_accept_length"] > 2.5
    # Compared with its own baseline (the same target), not the random target's.
    assert chain["gate_compared"] > 0 and chain["gate_diverged_early"] == 0


def test_kill_9_of_the_driver_leaves_no_sglang_process(studies: Studies) -> None:
    assert len(studies.killed_tree) >= 3, studies.agree_out[-3000:]  # server + its children
    assert studies.left_after_kill == [], [st.cmdline(p) for p in studies.left_after_kill]
