"""One exception tree: every exception class rayspec defines derives from RayspecError (as httpx
checks that every httpcore exception is mapped), and the tree drawn in ``_exceptions.py`` and
docs/CONTRACTS.md names every one."""

from __future__ import annotations

import importlib
import inspect
import pathlib

import pytest

import rayspec._exceptions
from rayspec import RayspecError

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Outside the tree on purpose (each says why in its own comment, and _exceptions.py's
# docstring): a stand-alone worker's error that never leaves its process, and the client's
# private control flow.
# Internal signals, never raised to a user: caught where they are made (SimulatedCrash: by
# rayspec.testing, which records the trial as crash_mid_benchmark).
OUTSIDE = {
    "rayspec.screen._allreduce.Unusable",
    "rayspec.bench._client._Partial",
    "rayspec.twin._load.SimulatedCrash",
    # The twin's HTTP layer: a request SGLang's tokenizer manager refuses, caught where the
    # answer is built and sent as SGLang's 400; never leaves the server.
    "rayspec.twin._native.Refused",
}


def _exception_classes() -> list[type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for path in sorted((ROOT / "rayspec").rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(rel[:-1] if rel[-1] == "__init__" else rel)
        if name.endswith("__main__"):
            continue
        module = importlib.import_module(name)
        for value in vars(module).values():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == name
            ):
                found[f"{name}.{value.__qualname__}"] = value
    return list(found.values())


CLASSES = _exception_classes()


def test_the_walk_finds_the_exceptions() -> None:
    names = {c.__name__ for c in CLASSES}
    assert {"RayspecError", "ClusterError", "NcclError", "Unusable", "_Partial"} <= names


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_every_exception_is_in_the_tree(cls: type[BaseException]) -> None:
    if f"{cls.__module__}.{cls.__qualname__}" in OUTSIDE:
        assert not issubclass(cls, RayspecError)
        return
    assert issubclass(cls, RayspecError)


@pytest.mark.parametrize(
    "text",
    [rayspec._exceptions.__doc__ or "", (ROOT / "docs" / "CONTRACTS.md").read_text("utf-8")],
    ids=["_exceptions.py", "CONTRACTS.md"],
)
def test_the_drawn_tree_names_every_exception(text: str) -> None:
    tree = [c.__name__ for c in CLASSES if issubclass(c, RayspecError)]
    assert [name for name in tree if f" {name}" not in text] == []


def test_a_reason_reads_as_its_value() -> None:
    from rayspec import FailureReason

    reason = FailureReason.NODE_LOST
    assert (str(reason), f"{reason}", reason) == ("node_lost", "node_lost", "node_lost")
