"""Which strategy a study runs (``study.sampler``), built once before the first ask.

The driver's one reader of ``study.sampler``: the study loop sees a
:class:`~rayspec.search.Strategy` and nothing else (Optuna's sampler itself is built with the
study, by :func:`~rayspec.search.open_study`). The structured search needs the NCCL screen's
ranking, so building it runs (or loads) the screen.
"""

from __future__ import annotations

from collections.abc import Callable

from rayspec._config import ExperimentConfig
from rayspec._config import Sampler
from rayspec.results import load_equivalence
from rayspec.screen import BaseNcclScreen
from rayspec.search import BeliefSearch
from rayspec.search import Equivalence
from rayspec.search import SamplerStrategy
from rayspec.search import SearchSpace
from rayspec.search import Strategy
from rayspec.search import StructuredSearch
from rayspec.tune._screen import run_screen
from rayspec.tune._screen import token_bytes

__all__ = ["make_strategy", "stored_equivalence"]


def make_strategy(
    cfg: ExperimentConfig,
    space: SearchSpace,
    printer: Callable[[str], None],
    screen: BaseNcclScreen | None = None,
) -> Strategy:
    """The study's strategy: the structured search (after the NCCL screen), or Optuna's
    sampler (``tpe``, ``random``, ``grid``; the sampler itself is the study's)."""
    if cfg.study.sampler not in (Sampler.structured, Sampler.belief):
        return SamplerStrategy()
    report = run_screen(cfg, space, printer, screen)
    if cfg.study.sampler is Sampler.belief:
        return BeliefSearch(
            space, report, token_bytes=token_bytes(cfg) if report else 1,
            concurrency=cfg.scenarios()[0].concurrency, start_noise=cfg.study.start_noise,
            runs=cfg.bench.repeats, loads=len({sc.concurrency for sc in cfg.scenarios()}),
            stop_gain=cfg.study.stop_gain,
        )  # fmt: skip
    return StructuredSearch(
        space, report, token_bytes=token_bytes(cfg) if report else 1,
        concurrency=cfg.scenarios()[0].concurrency, start_noise=cfg.study.start_noise,
        loads=len({sc.concurrency for sc in cfg.scenarios()}),
        server_knobs={
            "max_running_requests": cfg.server.max_running_requests,
            "cuda_graph_max_bs": cfg.server.cuda_graph_max_bs,
        },
        max_load=max(sc.concurrency for sc in cfg.scenarios()),
    )  # fmt: skip


def stored_equivalence(cfg: ExperimentConfig) -> Equivalence | None:
    """The pooling of NCCL sets the study's strategy used, read from the study folder (a
    report of a study with nothing left to run builds no strategy, and runs no screen)."""
    screened = cfg.study.sampler in (Sampler.structured, Sampler.belief)
    return load_equivalence(cfg.out_dir) if screened else None
