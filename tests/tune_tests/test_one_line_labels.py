"""Defence in depth behind the config's control-character refusal: a label, a study name or a
twin profile that somehow holds a line break never ends a comment of ``best.sh`` (the next
line would run) and never splits a progress line."""

from __future__ import annotations

import dataclasses
import math
import subprocess

from rayspec._config import load_config
from rayspec._text import one_line
from rayspec._text import unsafe_char
from rayspec._types import Candidate
from rayspec.results import Row
from rayspec.results import deploy_script
from tests.helpers import twin_doc
from tests.helpers import write_experiment

INJECTED = "x\ntouch PWNED\n#"


def test_one_line_escapes_every_line_break() -> None:
    for ch in "\n\r\x00\x0b\x0c\x1b\x7f\x85\u2028\u2029\ud800":
        assert unsafe_char(f"a{ch}b") == ch
        assert len(f"a{one_line(ch)}b".splitlines()) == 1
    assert one_line("plain é 日本") == "plain é 日本"
    assert one_line("a\nb") == "a\\nb"


def test_a_label_is_one_line() -> None:
    cand = Candidate(flags=("--tokenizer-path", INJECTED))
    assert "\n" not in cand.label() and "touch PWNED" in cand.label()


def test_best_sh_comments_stay_comments(tmp_path) -> None:
    cfg = load_config(write_experiment(str(tmp_path), twin_doc(str(tmp_path / "runs"))))
    # Past validation on purpose: what the script writer does with such text on its own.
    cfg = dataclasses.replace(
        cfg,
        study=dataclasses.replace(cfg.study, name=f"t{INJECTED}"),
        server=dataclasses.replace(
            cfg.server, twin=dataclasses.replace(cfg.server.twin, profile=f"p{INJECTED}")
        ),
    )
    cand = Candidate(flags=("--tokenizer-path", INJECTED))
    row = Row(trials=(3,), label=cand.label(), candidate=cand, role="", tok_s_mean=10.0,
              tok_s_runs=10.0, tok_s_peak=11.0, accept_length=math.nan, sd=0.0, starts=1,
              runs=5)  # fmt: skip
    script = deploy_script(cfg, row, None)
    lines = script.splitlines()
    assert not any(line.strip().startswith("touch") for line in lines), script
    assert all(line.startswith(("#", "set ", "unset ", "export ", "exec ")) for line in lines), (
        script
    )
    # bash reads it as the comments and commands above (the argv keeps the newline, quoted).
    check = subprocess.run(["bash", "-n", "-c", script], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
