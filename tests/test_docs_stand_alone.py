"""The product stands alone: no file of the repository cites the team's design documents
(which are not in it), and every citation of a section of ``docs/`` names a real heading."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from tests.helpers import REPO

# The design documents' names and their section sign, as the code once cited them.
_OUTSIDE = re.compile(
    r"reference/|sglang-contract|stack-notes|(?<![\w-])sglang-cpu\.md|DESIGN\.md|(?<!docs/)twin-model\.md"
    r"|twin-model §|§"
)
_CITATION = re.compile(r"(docs/[\w.-]+\.md)`*,? \*([^*\n]+)\*")


def _tracked() -> list[str]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
        ).stdout.decode()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    here = os.path.relpath(__file__, REPO)
    return [p for p in out.split("\0") if p and p != here and not p.endswith((".png", ".json"))]


def _text(path: str) -> str:
    try:
        with open(os.path.join(REPO, path), encoding="utf-8") as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError):
        return ""


def test_no_file_cites_the_design_documents() -> None:
    found = [
        f"{path}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
        for path in _tracked()
        for text in [_text(path)]
        for m in _OUTSIDE.finditer(text)
    ]
    assert not found, "\n".join(found[:40])


def test_every_cited_section_of_docs_exists() -> None:
    headings: dict[str, set[str]] = {}
    cited = 0
    for path in _tracked():
        for m in _CITATION.finditer(_text(path)):
            doc, section = m.group(1), m.group(2)
            if doc not in headings:
                text = _text(doc)
                assert text, f"{path} cites {doc}, which is not in the repository"
                headings[doc] = set(re.findall(r"^#+ (.+)$", text, re.M))
            assert section in headings[doc], f"{path}: {doc} has no section {section!r}"
            cited += 1
    assert cited >= 20  # the code cites docs/sglang.md and docs/twin-model.md throughout
