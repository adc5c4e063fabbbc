"""The NCCL screen: the twin's answers, the space's classes, persistence."""

from __future__ import annotations

import math

import pytest

from rayspec.screen import ScreenReport
from rayspec.screen import ScreenStatus
from rayspec.screen import TwinNcclScreen
from rayspec.screen import screen_space

KB14 = 14336
SIZES = [KB14, 3 * KB14, 6 * KB14]
SPACE = [
    ("NCCL_PROTO", ["unset", "LL", "Simple"]),
    ("NCCL_ALGO", ["unset", "Ring", "Tree"]),
    ("NCCL_P2P_LEVEL", ["unset", "PHB", "SYS"]),
    ("NCCL_BUFFSIZE", ["unset", "4194304"]),
]


@pytest.fixture(scope="module")
def twin() -> TwinNcclScreen:
    return TwinNcclScreen("kimi-k2.5-tp8-pcie")


def test_the_twin_answers_with_its_nccl_model(twin: TwinNcclScreen) -> None:
    tuned, default, typo, nothing = twin.measure(
        [{"NCCL_PROTO": "LL", "NCCL_P2P_LEVEL": "SYS"}, {}, {"NCCL_PROTO": "LL256"},
         {"NCCL_ALGO": "CollNetDirect"}],
        SIZES, timeout_s=10,
    )  # fmt: skip
    assert tuned.ok and math.isclose(tuned.latency_at(KB14), 24.5)
    assert math.isclose(default.latency_at(KB14), 61.14, rel_tol=1e-3)
    assert typo.status is ScreenStatus.ERROR and typo.detail.startswith("nccl_init")
    assert nothing.status is ScreenStatus.ERROR
    assert nothing.detail.startswith("nccl_first_collective")
    assert not typo.ok and typo.latency_at(KB14) == math.inf


def test_a_forbidden_multicast_set_is_an_error_not_a_launch() -> None:
    screen = TwinNcclScreen("h200-nvlink-tp8-dense")
    [r] = screen.measure([{"NCCL_NVLS_ENABLE": "1"}], SIZES, timeout_s=10)
    assert r.status is ScreenStatus.ERROR


def test_latency_between_sizes_is_interpolated(twin: TwinNcclScreen) -> None:
    [r] = twin.measure([{}], SIZES, timeout_s=10)
    mid = r.latency_at(2 * KB14)
    assert r.latency_at(KB14) <= mid <= r.latency_at(3 * KB14)


def test_small_space_every_set_and_classes_of_equivalents(twin: TwinNcclScreen) -> None:
    report = screen_space(twin, SPACE, dict, SIZES, max_sets=1000, timeout_s=10,
                          tolerance=0.03)  # fmt: skip
    assert len(report.results) == 3 * 3 * 3 * 2
    best = report.classes[0]
    assert best.representative == (("NCCL_P2P_LEVEL", "SYS"), ("NCCL_PROTO", "LL"))
    # ALGO=Ring and BUFFSIZE are no-ops here: 2 x 2 equivalent sets, the fewest-variables first.
    assert len(best.members) == 4
    assert report.class_of((("NCCL_ALGO", "Ring"), ("NCCL_P2P_LEVEL", "SYS"),
                            ("NCCL_PROTO", "LL"))) is best  # fmt: skip
    cls, env = report.best_for(6 * KB14)
    assert cls is best and env == best.representative
    _, other = report.best_for(6 * KB14, banned=[best.representative])
    assert other in best.members and other != best.representative


def test_large_space_coordinate_descent_finds_the_best(twin: TwinNcclScreen) -> None:
    report = screen_space(twin, SPACE, dict, SIZES, max_sets=10, timeout_s=10,
                          tolerance=0.03)  # fmt: skip
    assert len(report.results) < 54
    assert report.classes[0].representative == (("NCCL_P2P_LEVEL", "SYS"), ("NCCL_PROTO", "LL"))


def test_failed_sets_are_kept_apart_and_the_report_round_trips(twin: TwinNcclScreen) -> None:
    space = [("NCCL_PROTO", ["unset", "LL", "LL256"])]
    report = screen_space(twin, space, dict, SIZES, max_sets=10, timeout_s=10, tolerance=0.03)
    assert [r.env for r in report.failed()] == [(("NCCL_PROTO", "LL256"),)]
    assert report.class_of((("NCCL_PROTO", "LL256"),)) is None
    again, fingerprint = ScreenReport.from_json(report.to_json("fp"))
    assert fingerprint == "fp" and again.results == report.results
    assert [c.members for c in again.classes] == [c.members for c in report.classes]
    with pytest.raises(ValueError):
        ScreenReport.from_json("{}")
