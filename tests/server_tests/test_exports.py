from __future__ import annotations

import rayspec.server


def test_all_is_exactly_the_public_names() -> None:
    public = {
        name for name in vars(rayspec.server) if not name.startswith("_") and name != "annotations"
    }
    assert set(rayspec.server.__all__) == public
    assert len(rayspec.server.__all__) == len(set(rayspec.server.__all__))
