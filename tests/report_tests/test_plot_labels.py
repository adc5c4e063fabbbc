"""The plots' labels fit their place: an axis label is cut between settings, never inside one,
and says how many it left out; a bar's label has a bounded number of short lines (the newcomer's
plots had labels running into each other)."""

from __future__ import annotations

from rayspec._types import Candidate
from rayspec._types import SpecSettings
from rayspec.report._plots import BAR_LABEL_COLUMNS
from rayspec.report._plots import BAR_LABEL_LINES
from rayspec.report._plots import bar_label
from rayspec.report._plots import short_label

NCCL = (
    ("NCCL_ALGO", "Ring"), ("NCCL_BUFFSIZE", "16777216"), ("NCCL_MAX_NCHANNELS", "16"),
    ("NCCL_NTHREADS", "512"), ("NCCL_P2P_LEVEL", "SYS"), ("NCCL_PROTO", "LL"),
)  # fmt: skip
LONG = Candidate(NCCL, SpecSettings("EAGLE3", 2, 1, 3), flags=("--chunked-prefill-size", "4096"))


def test_an_axis_label_is_cut_between_settings_and_counts_the_rest() -> None:
    full = short_label(LONG, 500)
    settings = full.split("; ", 1)[1].split()
    for width in range(30, 130):  # from "2 steps/topk 1/3 tok; +8 more" up
        text = short_label(LONG, width)
        assert len(text) <= width
        head, _, rest = text.partition("; ")
        assert head == "2 steps/topk 1/3 tok"
        words = rest.split()
        if "more" in words:
            kept = words[:-2]
            assert words[-2] == f"+{len(settings) - len(kept)}"
        else:
            kept = words
        assert kept == settings[: len(kept)]  # whole settings, in order
    assert short_label(Candidate(), 56) == "no spec; NCCL default"


def test_a_bar_label_is_a_few_short_lines() -> None:
    for cand in (LONG, Candidate(), Candidate(NCCL[:2], SpecSettings("EAGLE3", 3, 4, 8))):
        lines = bar_label(cand).splitlines()
        assert 1 <= len(lines) <= BAR_LABEL_LINES
        assert all(len(line) <= BAR_LABEL_COLUMNS for line in lines), lines
        assert lines[0].startswith(("2 steps", "3 steps", "no spec"))
