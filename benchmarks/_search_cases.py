"""The search benchmark's cases whose truth the search's model did not write.

Two kinds, beside ``search_efficiency.py``'s twin-form cases (the twin's model with other
constants, which is the search's own online model's form):

- **Outside the form** (:data:`VARIANTS`): the field node (``kimi-k2.5-tp8-pcie``) with one
  mechanism changed that a real node has and the search's online model
  (``rayspec/search/_online.py``) does not: a CUDA-graph staircase in the verify cost, an
  acceptance that is not geometric in depth, a draft step super-linear in topk, a tree's verify
  paying a masked attention path (docs/twin-model.md, *Model variants*). Each is a profile the
  benchmark derives from the field's and writes into a cache folder (content-addressed, so every
  worker process reads the same file); its parameters are the benchmark's: the search never
  reads a profile, and none of its constants is set on these cases.
- **Real** (``real/<drafter>``): a real engine's recorded landscape
  (``benchmarks/landscapes/cpu-<drafter>.parquet``), replayed (:class:`rayspec.testing.
  ReplayedTrials`); the truth of a setting is its mean over every recorded start. Its space is
  ``cpu-landscape.yaml`` beside it or in ``benchmarks/spaces/`` when one exists, else the
  recorded settings' steps, topks and budgets; its protocol is the recording's (warm-ups and
  runs per start, the output length of its metadata).

And the stop rule's calibration: a study that stopped by itself on a stop line saying
P(a rival beats the pick by > 1 %) < 20 % should truly have such a rival in under 20 % of seeds.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import os
import re
import statistics
import tempfile
from collections.abc import Sequence
from importlib import resources
from typing import Any

import yaml

from rayspec._types import Candidate
from rayspec.testing import ReplayedTrials
from rayspec.testing._replay import RecordedStart

HERE = os.path.dirname(os.path.abspath(__file__))
LANDSCAPES = os.path.join(HERE, "landscapes")
LANDSCAPE_SPACE = os.path.join(HERE, "spaces", "cpu-landscape.yaml")
FIELD_PROFILE = "kimi-k2.5-tp8-pcie"
# Derived files (variant profiles, replay experiments): content-addressed, shared by processes.
CACHE = os.path.join(tempfile.gettempdir(), "rayspec-search-cases")

# The SGLang 0.5 default CUDA-graph sizes, taken as token counts (docs/twin-model.md, *Model
# variants*): a verify of N = 3 at batch 1 costs as 4 tokens, N = 5-7 as 8, 9-12 as 12.
GRAPH_SIZES = [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256]
# name -> (what it breaks, the profile keys it sets over the field profile's).
VARIANTS: dict[str, tuple[str, dict[str, dict[str, Any]]]] = {
    "graphs": (
        "verify cost in CUDA-graph steps (not linear in the draft tokens)",
        {"forward": {"graph_token_sizes": GRAPH_SIZES}},
    ),
    "plateau": (
        "acceptance that drops after depth 1 and then holds (not geometric in depth)",
        {
            "drafter": {
                "acceptance": {
                    "kind": "per_depth",
                    "a": [0.70, 0.46, 0.44, 0.42, 0.40, 0.38, 0.36, 0.34],
                }
            }
        },
    ),  # fmt: skip
    "topkcost": (
        "a draft step costing 0.05 ms x (topk^2 - 1) more (super-linear in topk)",
        {"speculative": {"topk_step_ms": 0.05, "topk_power": 2.0}},
    ),
    "treemask": (
        "a tree's verify paying 0.1 ms per token more than a chain's (its attention path)",
        {"speculative": {"tree_verify_ms_per_token": 0.1}},
    ),
}
_STOP_P = re.compile(r"P\(.*?\) = ([0-9.]+) %")
BAND = 1.01  # "a rival better by more than 1 %"
CALIBRATED_BELOW = 20.0  # the stop line's P, in %


def _cached(name: str, text: str) -> str:
    """Write ``text`` once as ``CACHE/<name>-<hash>.yaml`` (atomic); return its path."""
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    path = os.path.join(CACHE, f"{name}-{digest}.yaml")
    if not os.path.isfile(path):
        os.makedirs(CACHE, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    return path


def variant_data(name: str) -> dict[str, Any]:
    """The field profile with variant ``name``'s keys set (a profile document)."""
    ref = resources.files("rayspec.twin").joinpath("profiles", f"{FIELD_PROFILE}.yaml")
    data: dict[str, Any] = yaml.safe_load(ref.read_text(encoding="utf-8"))
    for section, keys in VARIANTS[name][1].items():
        data[section].update(keys)
    data["profile"] = f"{FIELD_PROFILE}-{name}"
    return data


@functools.cache
def variant_profile(name: str) -> str:
    """The path of variant ``name``'s profile file (written on first use)."""
    return _cached(f"profile-{name}", yaml.safe_dump(variant_data(name), sort_keys=False))


def variant_cases(protocol: Sequence[str], full_space: str) -> dict[str, list[str]]:
    """``<variant>/quick`` and ``<variant>/full`` per variant: the field's protocol and spaces."""
    out: dict[str, list[str]] = {}
    for name in VARIANTS:
        profile = f"server.twin.profile={variant_profile(name)}"
        out[f"{name}/quick"] = [*protocol, profile]
        out[f"{name}/full"] = [full_space, *protocol, profile]
    return out


# ------------------------------------------------------------------------- real landscapes


def landscape_files(folder: str = LANDSCAPES) -> dict[str, str]:
    """``real/<drafter>`` -> its landscape file, for every ``cpu-<drafter>.parquet``."""
    found = sorted(glob.glob(os.path.join(folder, "cpu-*.parquet")))
    return {f"real/{os.path.basename(p)[4:-8]}": p for p in found}


@functools.cache
def replay(path: str) -> ReplayedTrials:
    """The landscape read once per process (for truths; each study gets a fresh replay)."""
    return ReplayedTrials(path)


def _space_yaml(path: str) -> str:
    """The recorded space: ``cpu-landscape.yaml`` beside the landscape, or
    ``benchmarks/spaces/``'s for a landscape of ``benchmarks/landscapes/`` (the recorder's),
    else the recorded settings' steps, topks and tree budgets (written to the cache; a chain's
    budget is its steps + 1)."""
    beside = os.path.join(os.path.dirname(path), "cpu-landscape.yaml")
    recorders = (
        os.path.samefile(os.path.dirname(path) or ".", LANDSCAPES)
        if os.path.isdir(LANDSCAPES)
        else False
    )
    for space_file in (beside, LANDSCAPE_SPACE if recorders else ""):
        if space_file and os.path.isfile(space_file):
            return space_file
    rows = replay(path).landscape.rows
    spec = [r for r in rows if r.mode != "off"]
    chains = {int(r.num_steps or 0) for r in spec}
    trees = {int(r.num_draft_tokens or 0) for r in spec if (r.eagle_topk or 1) > 1}
    space = {
        "search": {
            "speculative": {
                "modes": ["off", "EAGLE3"] if any(r.mode == "off" for r in rows) else ["EAGLE3"],
                "num_steps": sorted(chains),
                "eagle_topk": sorted({int(r.eagle_topk or 1) for r in spec}),
                "num_draft_tokens": sorted(trees) or sorted(k + 1 for k in chains),
            }
        }
    }
    return _cached("space", yaml.safe_dump(space, sort_keys=True))


def _protocol(path: str) -> list[str]:
    """The recording's protocol: warm-up requests and measured runs per start, output length."""
    land = replay(path)
    starts = [s for label in land.settings for s in land.starts(label)]
    warmup = max((len(s.runs.get(-1, ())) for s in starts), default=0)
    runs = int(statistics.median(len(s.measured) for s in starts))
    tokens = int(land.landscape.meta.get("max_tokens") or
                 max(r.completion_tokens for r in land.landscape.rows))  # fmt: skip
    return [f"bench.warmup={warmup}", f"bench.repeats={runs}", f"bench.max_tokens={tokens}"]


@functools.cache
def replay_experiment() -> str:
    """The experiment a replayed study runs: one scenario at concurrency 1, no NCCL (the
    engine and profile named are never started: the replay serves every trial)."""
    doc = {
        "study": {"name": "replay", "max_restarts": 40, "sampler": "structured", "seed": 0},
        "server": {"engine": "twin", "tp_size": 1, "twin": {"profile": FIELD_PROFILE}},
        "bench": {"warmup": 1, "repeats": 5, "concurrency": 1},
        "output": {"dir": "runs"},
    }
    return _cached("replay-experiment", yaml.safe_dump(doc, sort_keys=True))


def real_overrides(path: str) -> list[str]:
    """The overrides of a real case over :func:`replay_experiment`."""
    return [_space_yaml(path), *_protocol(path), "server.engine=twin", "server.tp_size=1"]


def real_truth(path: str, candidate: Candidate) -> float:
    """A real case's truth: the setting's mean over its recorded starts (0: not recorded)."""
    try:
        return replay(path).truth(candidate)
    except KeyError:
        return 0.0


def start_noise(starts: Sequence[RecordedStart]) -> float:
    """The relative sd of a setting's start means (0 with fewer than two starts)."""
    means = [statistics.mean(s.run_tok_s(r) for r in s.measured) for s in starts]
    if len(means) < 2:
        return 0.0
    return statistics.stdev(means) / statistics.mean(means)


def landscape_shape(path: str) -> str:
    """One line: the best recorded setting, its gain over no speculation, the start noise."""
    land = replay(path)
    best = max(land.settings, key=land.truth)
    off = next((s for s in land.settings if s.startswith("no speculation")), None)
    noise = sorted(start_noise(land.starts(s)) for s in land.settings)
    gain = f", {100 * (land.truth(best) / land.truth(off) - 1):+.1f} % over no speculation"
    return (
        f"{len(land.settings)} settings x {min(len(land.starts(s)) for s in land.settings)}+ "
        f"starts; best {best} ({land.truth(best):.2f} tok/s{gain if off else ''}); start-to-start "
        f"sd {100 * statistics.median(noise):.1f} % median, {100 * noise[-1]:.1f} % at most"
    )


# ------------------------------------------------------------------------- calibration


def stop_probability(stopped: str) -> float | None:
    """The stop line's P(a rival beats the pick by > 1 %), in %, or None when it names none."""
    m = _STOP_P.search(stopped)
    return float(m.group(1)) if m else None


def calibration(
    finals: Sequence[float], stop_ps: Sequence[float | None], optimum: float
) -> tuple[int, int]:
    """(seeds truly beaten by > 1 %, seeds whose study stopped saying P < 20 %): of the studies
    whose stop line put the chance of a rival > 1 % better below 20 %, how many ended on a pick
    the optimum truly beats by more than 1 %."""
    said = [f for f, p in zip(finals, stop_ps, strict=True)
            if p is not None and p < CALIBRATED_BELOW]  # fmt: skip
    return sum(optimum > BAND * f for f in said), len(said)


def describe() -> list[str]:
    """One line per outside-the-form variant: what it breaks and its keys (for the output)."""
    return [f"{name}: {what} ({json.dumps(keys, sort_keys=True)})"
            for name, (what, keys) in VARIANTS.items()]  # fmt: skip
