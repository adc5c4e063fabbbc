"""Each package's ``__all__`` lists exactly its public names (as httpx checks its own)."""

from __future__ import annotations

import importlib

import pytest

PACKAGES = ["rayspec", "rayspec.search", "rayspec.store", "rayspec.server", "rayspec.bench",
            "rayspec.twin", "rayspec.testing", "rayspec.metrics"]  # fmt: skip


@pytest.mark.parametrize("name", PACKAGES)
def test_all_is_exactly_the_public_names(name: str) -> None:
    module = importlib.import_module(name)
    public = {
        n for n, v in vars(module).items()
        if not n.startswith("_") and not isinstance(v, type(importlib))
        and getattr(v, "__module__", name).startswith("rayspec")
    }  # fmt: skip
    public -= {"annotations"}
    assert set(module.__all__) >= public - {"annotations"}
    for exported in module.__all__:
        assert hasattr(module, exported), f"{name}.{exported}"
