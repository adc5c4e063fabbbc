"""The surface over speculative settings pools neighbours."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from rayspec import SpecSettings
from rayspec.search._surface import Surface
from rayspec.search._surface import spec_features


def _truth(k: float, logm: float, n: float) -> float:
    # A smooth landscape with its best at n = 6: log tok/s, as the field's trees.
    return math.log(100.0) - 0.004 * (n - 6) ** 2 - 0.005 * (k - 2) ** 2 + 0.002 * logm


def test_features() -> None:
    assert spec_features(SpecSettings("EAGLE3", 2, 4, 6)) == (2.0, 2.0, 6.0)
    assert spec_features(SpecSettings("EAGLE3", 3, 1, 4)) == (3.0, 0.0, 4.0)


def test_pooling_beats_each_point_alone() -> None:
    """Over many noisy studies of a 3 x 3 grid (two starts each), the surface's estimates are
    closer to the truth than each point's own mean, and it finds the best budget."""
    points = [(k, 2.0, n) for k in (2, 3, 4) for n in (4, 6, 8)]
    noise = 0.015
    err_surface, err_raw, peaks = [], [], 0
    for seed in range(12):
        rng = random.Random(seed)
        feats, ys = [], []
        for p in points:
            for _ in range(2):
                feats.append(p)
                ys.append(_truth(*p) + rng.gauss(0, noise))
        surface = Surface(feats, ys, [noise**2] * len(ys))
        means, sds = surface.predict(points)
        raw = [np.mean([y for f, y in zip(feats, ys, strict=True) if f == p]) for p in points]
        err_surface += [abs(m - _truth(*p)) for m, p in zip(means, points, strict=True)]
        err_raw += [abs(r - _truth(*p)) for r, p in zip(raw, points, strict=True)]
        assert all(sd < noise for sd in sds)  # two starts each, plus the neighbours
        peaks += points[int(np.argmax(means))][2] == 6
    assert np.mean(err_surface) < 0.9 * np.mean(err_raw)
    assert peaks >= 9  # the best budget, most of the time


def test_far_from_the_data_the_surface_is_unsure() -> None:
    surface = Surface([(2.0, 2.0, 6.0)] * 3, [4.6, 4.61, 4.59], [1e-4] * 3)
    _, near = surface.predict([(2.0, 2.0, 6.0)])
    _, far = surface.predict([(8.0, 3.0, 16.0)])
    assert far[0] > 3 * near[0]


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError):
        Surface([], [], [])
