"""The docs name the code as it is: every module path the contributor docs (docs/CONTRACTS.md,
docs/engines.md, CONTRIBUTING.md and its layout) and the user's pages (the README and the pages
its sections moved to) name exists, and the layout lists every package."""

from __future__ import annotations

import os
import re

import pytest

from tests.helpers import README_HOMES
from tests.helpers import REPO

PACKAGE = os.path.join(REPO, "rayspec")
SUBPACKAGES = sorted(
    d for d in os.listdir(PACKAGE) if os.path.isfile(os.path.join(PACKAGE, d, "__init__.py"))
)
# rayspec/x/_y.py, x/_y.py (x a subpackage, or a folder in one) and rayspec/_y.py.
_PATH = re.compile(
    r"(?<![\w/.-])(?:rayspec/)?((?:" + "|".join(SUBPACKAGES) + r")(?:/[\w]+)*/[\w]+\.py)"
    r"|(?<![\w/.-])rayspec/(_[\w]+\.py)"
)


def _read(name: str) -> str:
    with open(os.path.join(REPO, name), encoding="utf-8") as fh:
        return fh.read()


def _layout() -> str:
    text = _read("CONTRIBUTING.md")
    start = text.index("## Layout")
    return text[start : text.index("```", text.index("```", start) + 3)]


# The README and the pages its sections moved to (the contributor pages are checked apart).
USER_PAGES = [
    "README.md",
    *(p for p in README_HOMES if p not in ("docs/twin-model.md", "CONTRIBUTING.md")),
]


CONTRIBUTOR_PAGES = ["docs/CONTRACTS.md", "docs/engines.md", "CONTRIBUTING.md"]


@pytest.mark.parametrize("doc", [*CONTRIBUTOR_PAGES, *USER_PAGES])
def test_every_module_path_a_doc_names_exists(doc: str) -> None:
    named = {a or b for a, b in _PATH.findall(_read(doc))}
    missing = sorted(p for p in named if not os.path.exists(os.path.join(PACKAGE, p)))
    assert missing == [], f"{doc} names modules that do not exist"


def test_the_layout_lists_every_package() -> None:
    layout = _layout()
    listed = set(re.findall(r"^rayspec/(\w+)/", layout, re.M))
    assert sorted(set(SUBPACKAGES) - listed) == []
    assert sorted(listed - set(SUBPACKAGES)) == []


# The vLLM checklist of docs/engines.md names the class a vLLM engine would be: not code yet.
_NOT_CODE_YET = {"VLLMEngine"}


@pytest.mark.parametrize("doc", ["docs/CONTRACTS.md", "docs/engines.md"])
def test_every_call_a_doc_shows_is_defined(doc: str) -> None:
    """A backticked ``name(...)`` or ``obj.name(...)`` (not a quoted message) is a function or
    class of rayspec."""
    defined: set[str] = set()
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                text = _read(os.path.join(folder, name))
                defined.update(re.findall(r"^\s*(?:async\s+)?(?:def|class)\s+(\w+)", text, re.M))
    shown = {
        m.group(1)
        for code in re.findall(r"`([^`]+)`", _read(doc))
        if not code.startswith(('"', "'"))  # a quoted message, not code
        for m in re.finditer(r"(?:^|[.\s])([A-Za-z_]\w*)\(", code)
    }
    assert sorted(shown - defined - _NOT_CODE_YET) == []
