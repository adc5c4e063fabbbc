"""The NCCL screen in a study: which screen answers, at which sizes, kept across resumes.

The screen runs once per study, before the first trial, and its report is saved as
``<out>/nccl_screen.json`` (a resumed study reuses it when the NCCL space, the fixed
environment and the sizes are unchanged; a report reads its classes back with
:func:`rayspec.results.load_equivalence`).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable

from rayspec._atomic import write_atomic
from rayspec._config import UNSET
from rayspec._config import Engine
from rayspec._config import ExperimentConfig
from rayspec._exceptions import ConfigError
from rayspec._exceptions import LaunchError
from rayspec._plural import plural
from rayspec._secrets import redact_env
from rayspec._types import Candidate
from rayspec.screen import BaseNcclScreen
from rayspec.screen import RayNcclScreen
from rayspec.screen import ScreenReport
from rayspec.screen import TwinNcclScreen
from rayspec.screen import screen_space
from rayspec.search import SearchSpace
from rayspec.server import server_env
from rayspec.store import StudyFolder

__all__ = ["message_sizes", "run_screen", "token_bytes"]

Printer = Callable[[str], None]
# A saved screen of 256 sets is ~150 KiB; one far larger was not written by a screen.
_MAX_SAVED_BYTES = 16 * 1024 * 1024


def _model_hidden_size(model_path: str) -> int | None:
    """``hidden_size`` from a local model's config.json (``text_config`` first: multimodal)."""
    path = os.path.join(os.path.expanduser(model_path), "config.json")
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    for section in (data.get("text_config") or {}, data):
        value = section.get("hidden_size") if isinstance(section, dict) else None
        if isinstance(value, int) and value > 0:
            return value
    return None


def token_bytes(cfg: ExperimentConfig) -> int:
    """All-reduce bytes of one token's activation: hidden size x bytes per element.

    Raises:
        ConfigError: the hidden size is neither configured nor readable from the model.
    """
    sc = cfg.search.nccl_screen
    hidden = sc.hidden_size
    if hidden is None and cfg.server.engine is Engine.twin:
        from rayspec.twin import load_profile

        hidden = load_profile(cfg.server.twin.profile).model.hidden
    if hidden is None:
        hidden = _model_hidden_size(cfg.server.model_path)
    if hidden is None:
        raise ConfigError(
            "search.nccl_screen.hidden_size: not set and not readable from "
            f"{cfg.server.model_path}/config.json; set the model's hidden size "
            "(e.g. search.nccl_screen.hidden_size=7168)"
        )
    return hidden * sc.dtype_bytes


def message_sizes(cfg: ExperimentConfig, space: SearchSpace) -> list[int]:
    """The decode all-reduce sizes of the space: tokens per step x concurrency x token bytes.

    Tokens per step: 1 (a decode step), every draft-token budget and chain length (a verify),
    every topk (a draft step).
    """
    concurrency = cfg.scenarios()[0].concurrency
    tokens = {1, *space.num_draft_tokens, *space.eagle_topk, *(k + 1 for k in space.num_steps)}
    per_token = token_bytes(cfg)
    return sorted(concurrency * t * per_token for t in tokens)


def _make_screen(cfg: ExperimentConfig) -> BaseNcclScreen | None:
    if cfg.server.engine is Engine.twin:
        return TwinNcclScreen(cfg.server.twin.profile)
    if cfg.server.engine is Engine.sglang:
        # The all-reduce microbenchmark on a node, holding a trial's GPUs, under the servers'
        # interpreter; the driver calls the screen once Ray is connected.
        return RayNcclScreen(
            world_size=cfg.server.tp_size, python=cfg.server.python or sys.executable,
            node_resource=cfg.cluster.node_resource,
            place_timeout_s=cfg.cluster.placement_timeout_s,
        )  # fmt: skip
    return None


def _fingerprint(cfg: ExperimentConfig, space: SearchSpace, sizes: list[int]) -> str:
    return json.dumps(
        {
            "nccl": [[k, list(v)] for k, v in space.nccl],
            "env": sorted(redact_env(server_env(cfg, Candidate())[0]).items()),
            "sizes": sizes,
            "engine": cfg.server.engine.value,
            "profile": cfg.server.twin.profile if cfg.server.engine is Engine.twin else "",
            "tolerance": cfg.search.nccl_screen.tolerance,
            "max_sets": cfg.search.nccl_screen.max_sets,
        },
        sort_keys=True,
    )


def _not_of(report: ScreenReport, space: SearchSpace, sizes: list[int], tolerance: float) -> str:
    """Why a saved ranking is not one of this study's sets ("" when it is): a set naming a
    variable or value the space does not search, a size or latency that no screen measured."""
    if list(report.sizes) != sizes or report.tolerance != tolerance:
        return "other message sizes or tolerance than its fingerprint says"
    choices = {name: set(values) - {UNSET} for name, values in space.nccl}
    seen: set[tuple[tuple[str, str], ...]] = set()
    for r in report.results:
        names = [k for k, _ in r.env]
        if list(r.env) != sorted(r.env) or len(set(names)) != len(names) or r.env in seen:
            return f"set {r.env} is not in canonical form, or listed twice"
        seen.add(r.env)
        bad = [f"{k}={v}" for k, v in r.env if v not in choices.get(k, ())]
        if bad:
            return f"{' '.join(bad)} is not a choice of search.nccl"
        if r.ok and (
            [n for n, _ in r.latency_us] != sizes
            or not all(math.isfinite(t) and t > 0 for _, t in r.latency_us)
        ):
            named = " ".join(f"{k}={v}" for k, v in r.env) or "NCCL default"
            return f"{named} has no positive latency at each of the study's message sizes"
    return ""


def run_screen(
    cfg: ExperimentConfig,
    space: SearchSpace,
    printer: Printer,
    screen: BaseNcclScreen | None = None,
) -> ScreenReport | None:
    """Rank the space's NCCL sets (or load the ranking a previous run saved).

    Returns None when the screen is off, the space searches no NCCL variable, no screen is
    available for the engine, or the screen could not finish (its node died, its GPUs never
    came free): the search then launches only the default and enqueued sets.
    """
    sc = cfg.search.nccl_screen
    if not sc.enabled or not space.nccl:
        return None
    sizes = message_sizes(cfg, space)
    fingerprint = _fingerprint(cfg, space, sizes)
    path = StudyFolder(cfg.out_dir).nccl_screen
    if os.path.exists(path):
        try:
            with open(path, encoding="utf-8") as fh:
                saved, stored = ScreenReport.from_json(fh.read(_MAX_SAVED_BYTES))
            why = _not_of(saved, space, sizes, sc.tolerance) if stored == fingerprint else ""
            if stored == fingerprint and not why:
                printer(f"NCCL screen: {plural(len(saved.results), 'set')}, from {path}")
                return saved
        except (OSError, ValueError) as exc:
            why = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        if why:  # damaged or edited: the search would follow sets the study cannot launch
            printer(f"NCCL screen: {path} is not a ranking of this study's NCCL sets ({why}); "
                    "measured again")  # fmt: skip
    owned = screen is None
    screen = screen or _make_screen(cfg)
    if screen is None:
        printer("NCCL screen: none for this engine; only the default and enqueued NCCL sets run")
        return None
    enqueued = [space.candidate(space.coerce(p)).nccl_env for p in cfg.study.enqueue]
    t0 = time.monotonic()
    try:
        report = screen_space(
            screen,
            space.nccl,
            lambda env: server_env(cfg, Candidate(nccl_env=env))[0],
            sizes,
            max_sets=sc.max_sets,
            timeout_s=sc.timeout_s,
            tolerance=sc.tolerance,
            also=enqueued,
            progress=printer,
        )
    except LaunchError as exc:
        # The screen's node died or its GPUs never came free: no set is to blame, and the
        # study need not stop for it. Nothing is saved, so a resume screens again.
        printer(
            f"NCCL screen: stopped ({exc}); no ranking, so the search launches the default "
            "and enqueued NCCL sets only"
        )
        return None
    finally:
        if owned:
            screen.close()
    write_atomic(path, report.to_json(fingerprint))  # never through a link in the folder
    printer(_summary(report, time.monotonic() - t0, sizes))
    return report


def _summary(report: ScreenReport, elapsed_s: float, sizes: list[int]) -> str:
    failed = report.failed()
    line = (
        f"NCCL screen: {plural(len(report.results), 'set')} in {elapsed_s:.1f} s ({report.source})"
    )
    if report.classes:
        best = report.classes[0]
        line += (
            f"; fastest: {best.label()}, {best.latency_at(sizes[0]):.1f} µs at "
            f"{sizes[0] / 1024:.0f} KiB ({plural(len(best.members), 'equivalent set')})"
        )
    if failed:
        line += f"; {len(failed)} failed or hung, never launched"
    return line
