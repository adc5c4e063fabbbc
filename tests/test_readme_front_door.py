"""The README is a front door: one screen (what rayspec is, the two command lines CI and users
run, the real-node command, the study folder, the four lines of output to read), then links to
the pages that hold the rest. Every page it links exists, and so does every section a link
names."""

from __future__ import annotations

import os
import re

import pytest

from tests.helpers import README_HOMES
from tests.helpers import REPO

QUICKSTART = (
    "python3 -m venv .venv && .venv/bin/pip install -q -e . && "
    ".venv/bin/python -m rayspec.tune experiments/eagle3-twin.yaml"
)
TESTS = (
    "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && "
    ".venv/bin/python -m pytest -q"
)
SCREEN = 40  # lines before the first list of links
MORE = 150  # lines after it, about

HOMES = README_HOMES
# The pages the README's text moved to, and the README: their links must hold too.
PAGES = ["README.md", *(h for h in HOMES if h != "docs/twin-model.md")]

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_LINK_ITEM = re.compile(r"^[-*] \[[^\]]+\]\([^)]+\)")
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def _read(path: str) -> str:
    with open(os.path.join(REPO, path), encoding="utf-8") as fh:
        return fh.read()


def _screen() -> list[str]:
    lines = _read("README.md").splitlines()
    first = next((i for i, line in enumerate(lines) if _LINK_ITEM.match(line)), None)
    assert first is not None, "the README has no list of links"
    return lines[:first]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]", "", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: str) -> set[str]:
    text = _FENCE.sub("", _read(path))
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


def test_the_first_screen_fits_before_the_links() -> None:
    screen = _screen()
    assert len(screen) <= SCREEN, f"{len(screen)} lines before the first list of links"
    total = len(_read("README.md").splitlines())
    assert total <= SCREEN + MORE + 10, f"the README has {total} lines"


@pytest.mark.parametrize("line", [QUICKSTART, TESTS], ids=["quickstart", "tests"])
def test_each_command_line_is_verbatim_in_its_own_bash_block_on_the_first_screen(
    line: str,
) -> None:
    text = _read("README.md")
    blocks = [body for lang, body in _FENCE.findall(text) if lang == "bash"]
    assert [line] in [b.strip().splitlines() for b in blocks], f"no bash block is just {line!r}"
    assert line in _screen()
    # The quickstart comes first, the test command second (.ci/run: "the README's second
    # command line").
    assert [b.strip() for b in blocks[:2]] == [QUICKSTART, TESTS]


def test_ci_runs_the_readme_test_line() -> None:
    assert TESTS in _read(".ci/run").splitlines()


def test_the_first_screen_has_the_real_node_command_the_folder_and_the_four_lines() -> None:
    screen = "\n".join(_screen())
    assert "python -m rayspec.tune experiments/eagle3.yaml" in screen
    assert "server.model_path=" in screen and "server.draft_model_path=" in screen
    for name in ("best.sh", "best.yaml", "report.md", "trials/", "requests/", "optuna.journal"):
        assert f"`{name}" in screen, name
    # The four lines as the study prints them: the quickstart's own, as docs/output.md shows
    # its whole output, and in the form the code writes them.
    (sample,) = [body for lang, body in _FENCE.findall(screen + "\n") if lang == ""]
    lines = sample.splitlines()
    output = _read("docs/output.md")
    stopped = "stopped: converged: P(the likeliest of "
    printed = [  # each line's start, and the code that writes it
        (stopped, "tune/__main__.py", 'f"stopped: {'),
        (stopped, "search/_structured.py", 'f"P(the likeliest of'),
        ("the pick is tied within noise with ", "results/_sure.py", 'f"the pick is tied within'),
        ("best: ", "tune/__main__.py", 'f"best: {best.label} ('),
        ("  launch it:  ", "tune/__main__.py", 'f"  launch it:  {'),
    ]
    assert len(lines) == 4
    for prefix, source, code in printed:
        (line,) = [line for line in lines if line.startswith(prefix)]
        assert line in output.splitlines(), f"docs/output.md's sample has no line {line!r}"
        assert code in _read(os.path.join("rayspec", source)), (prefix, source)
    for word in ("`best:`", "`launch it:`", "`stopped:`", "tie line"):
        assert word in screen, word


def test_the_readme_links_every_page_its_sections_moved_to() -> None:
    linked = {target.split("#")[0] for target in _LINK.findall(_read("README.md"))}
    assert sorted(set(HOMES) - linked) == []


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_of_a_page_exists(page: str) -> None:
    """A link to a file resolves from the page's folder; one to a section of a markdown page
    names a heading it has."""
    broken = []
    folder = os.path.dirname(page)
    for target in _LINK.findall(_read(page)):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        where = os.path.normpath(os.path.join(folder, path)) if path else page
        if not os.path.exists(os.path.join(REPO, where)):
            broken.append(f"{target}: no {where}")
        elif anchor and where.endswith(".md") and anchor not in _anchors(where):
            broken.append(f"{target}: {where} has no section #{anchor}")
    assert broken == [], f"{page}: " + "; ".join(broken)


def test_the_quickstarts_time_is_one_measured_figure() -> None:
    # The experiment said "about six minutes", the README "about three": one figure, measured,
    # stated where the run is described and quoted by the README.
    assert not re.search(r"\bminutes?\b", _read("experiments/eagle3-twin.yaml"))
    measured = re.search(r"(\d+ min \d+ s) in all", _read("docs/output.md"))
    assert measured is not None
    line = next(line for line in _screen() if line.startswith("On the twin"))
    assert f"{measured.group(1)} on a quiet 2-core machine in one measured run" in line
