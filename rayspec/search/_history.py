"""The measured trials as the search sees them, and the pick they support (pure).

An :class:`Observation` is one finished trial. Observations of the same configuration (same
:func:`~rayspec.search.canonical_key`) are one *point*; each launched trial of it is one server
*start* (:class:`~rayspec.search._posterior.Start`). :func:`weigh` turns them into
posteriors with the noise that is really there (``_posterior``), and :func:`pick` chooses what to
deploy: the best posterior mean, never below a configuration the user enqueued (or the baseline)
unless the evidence says it beats it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rayspec._plural import plural
from rayspec._types import Candidate
from rayspec._types import SpecSettings
from rayspec._types import TrialState
from rayspec.search._posterior import Estimate
from rayspec.search._posterior import Noise
from rayspec.search._posterior import Start
from rayspec.search._posterior import estimate
from rayspec.search._posterior import estimate_noise
from rayspec.search._posterior import prob_positive
from rayspec.search._posterior import within_var
from rayspec.search._space import canonical_key
from rayspec.search._surface import Surface
from rayspec.search._surface import spec_features

__all__ = [
    "Equivalence",
    "Evidence",
    "Observation",
    "Pick",
    "Point",
    "feasible_only",
    "lower_bound",
    "pick",
    "weigh",
]

# The pick leaves a floor (the baseline, an enqueued configuration) only with this confidence
# that the new configuration is faster: a hand-tuned setting is a floor, not a ceiling.
FLOOR_CONFIDENCE = 0.975
FLOOR_STARTS = 2  # ... for a configuration started at least this often; started fewer times,
FLOOR_CONFIDENCE_ONE_START = 0.999  # ... only with this confidence
# The pick ranks configurations by a lower bound, mean - PICK_Z sd (log scale): a rival leads
# only once its evidence outweighs its uncertainty, so one lucky start (whose sd carries the
# whole between-start noise) does not displace a configuration started twice as close.
PICK_Z = 1.0
_UNMEASURED = 3.0  # before any repeated start, one start is judged at this many times its sd
# The surface is fitted to the speculative points of one NCCL set within this (log) distance
# of their best, once there are at least this many.
_SURFACE_SPAN = 0.10
_SURFACE_MIN_POINTS = 3
# The cycle time's surface has a linear mean in the draft steps and the draft tokens (the
# twin's cost form, docs/twin-model.md: c0 + gamma (N - 1) + beta k; spec_features' columns).
_CYCLE_TREND = (0, 2)
# ... and what the trend leaves is small (the twin's cost is linear; a real node's verify
# width steps at graph sizes): its residual's prior sds (log scale) start at 0.5 %.
_CYCLE_SIGNAL_SD = (0.005, 0.01, 0.02, 0.05)
_MIN_ACCEPT_SD = 0.002  # a run's accept length is never taken as known better than 0.2 %


Env = tuple[tuple[str, str], ...]
Lattice = tuple[Env, tuple[str, ...]]  # (NCCL set, flags and scheduler knobs)
Equivalence = Callable[[Env], Env]  # an NCCL set -> the set that stands for its screen class
Difference = Callable[["Point", "Point"], tuple[float, float]]  # log mean difference, its sd


def _same(env: Env) -> Env:
    return env


@dataclass(frozen=True)
class Observation:
    """One finished trial.

    Attributes:
        trial: the trial number.
        candidate: what it ran.
        state: COMPLETE, PRUNED or FAIL.
        runs: the objective's per-run values (COMPLETE and PRUNED trials).
        failure: the failure reason of a FAIL (a ``FailureReason`` value).
        role: ``baseline``, ``enqueued[i]`` or ``""`` (chosen by the search).
        launched: whether a server was started (False: a reused result, or never launched).
        accept_length: the trial's mean accept length (NaN without speculation).
        accept_histogram: its measured verify steps by drafts accepted (None without
            speculation or when the engine does not report it).
        feasible: False when it missed ``study.slo`` (its p99s over its requests).
    """

    trial: int
    candidate: Candidate
    state: TrialState
    runs: tuple[float, ...] = ()
    failure: str | None = None
    role: str = ""
    launched: bool = True
    accept_length: float = math.nan
    accept_histogram: tuple[int, ...] | None = None
    feasible: bool = True

    @property
    def key(self) -> str:
        return canonical_key(self.candidate)

    @property
    def measured(self) -> bool:
        return (
            self.launched
            and self.state in (TrialState.COMPLETE, TrialState.PRUNED)
            and any(v > 0 and math.isfinite(v) for v in self.runs)
        )

    @property
    def is_floor(self) -> bool:
        return self.role == "baseline" or self.role.startswith("enqueued")


@dataclass(frozen=True)
class Point:
    """A measured configuration: its candidate, its posterior and where it came from."""

    key: str
    candidate: Candidate
    estimate: Estimate
    trials: tuple[int, ...]
    floor: bool  # the baseline or an enqueued configuration
    complete: bool  # at least one start ran every planned run (not only pruned ones)
    lattice: Lattice = ((), ())  # the surface it lies on: (NCCL class, flags)
    feasible: bool = True  # every start of it met study.slo (one miss: it may miss in service)


def _fit_surfaces(
    points: dict[str, Point], groups: Mapping[str, list[Start]], noise: Noise
) -> dict[Lattice, tuple[Surface, frozenset[str]]]:
    """One surface per NCCL set and flags, over the speculative points near its best.

    Points of one NCCL set (and the same flags) whose settings differ only in steps, topk and
    draft tokens lie on one smooth surface (:class:`~rayspec.search._surface.Surface`). It is
    fitted to the starts of the points within ``_SURFACE_SPAN`` of the set's best, once there
    are ``_SURFACE_MIN_POINTS`` of them.
    """
    lattices: dict[Lattice, list[Point]] = {}
    for p in points.values():
        if p.candidate.spec is not None:
            lattices.setdefault(p.lattice, []).append(p)
    surfaces: dict[Lattice, tuple[Surface, frozenset[str]]] = {}
    for lattice, members in lattices.items():
        top = max(p.estimate.log_mean for p in members)
        near = [p for p in members if p.estimate.log_mean >= top - _SURFACE_SPAN]
        if len(near) < _SURFACE_MIN_POINTS:
            continue
        feats, ys, vs = [], [], []
        for p in near:
            assert p.candidate.spec is not None
            f = spec_features(p.candidate.spec)
            for st in groups[p.key]:
                logs = st.logs
                if logs:
                    feats.append(f)
                    ys.append(sum(logs) / len(logs))
                    vs.append(noise.between**2 + p.estimate.within**2 / len(logs))
        surfaces[lattice] = (Surface(feats, ys, vs), frozenset(p.key for p in near))
    return surfaces


def _time_within(
    points: Mapping[str, Point], groups: Mapping[str, list[Start]], noise: Noise
) -> float:
    """The run-to-run sd of a cycle's time: the within-start sd of the configurations without
    speculation (their runs vary by timing alone, no acceptance draw); the pooled within-start
    sd (an upper bound) when none was measured twice in a start."""
    ss, df = 0.0, 0.0
    for key, p in points.items():
        if p.candidate.spec is None:
            s, d = within_var(groups[key])
            ss, df = ss + s, df + d
    return math.sqrt(ss / df) if df > 0 else noise.within


@dataclass(frozen=True)
class _RateSplit:
    """One lattice's rate split in two surfaces: the accept length's (log) and the cycle
    time's (relative to ``level``, the points' typical log cycle time)."""

    lengths: Surface
    cycles: Surface
    level: float
    keys: frozenset[str]

    def log_rates(self, specs: Sequence[SpecSettings]) -> tuple[list[float], np.ndarray]:
        """The log rates at ``specs`` and their covariance: log accept length minus log cycle
        time (the delta method), the two surfaces' errors independent."""
        x = [spec_features(s) for s in specs]
        lengths, length_cov = self.lengths.predict_joint(x)
        cycles, cycle_cov = self.cycles.predict_joint(x)
        cycles = np.maximum(cycles, 1e-6)
        logs = [float(n) - self.level - math.log(c) for n, c in zip(lengths, cycles, strict=True)]
        return logs, length_cov + cycle_cov / np.outer(cycles, cycles)


def _fit_splits(
    surfaces: Mapping[Lattice, tuple[Surface, frozenset[str]]],
    points: Mapping[str, Point],
    groups: Mapping[str, list[Start]],
    accept: Mapping[int, float],
    noise: Noise,
) -> dict[Lattice, _RateSplit]:
    """Split each surface's rate into what a start's noise cannot touch and what it can.

    A speculative rate is ``accept length / cycle time``. The accept length comes from the
    engine's per-request counts and does not move with a server start (its noise is the
    requests' acceptance draws, run to run); the start's offset (clocks, placement) scales the
    cycle time alone, which varies little run to run. Each has its own surface with its own
    noise: a start's accept length is known to its runs' acceptance noise, its cycle time to
    the between-start noise. The cycle time is nearly linear in the draft steps and the verify
    width (a linear mean), so its surface pools every start of the lattice; two neighbours'
    cycle times then differ by far less than either is uncertain (:meth:`Evidence.difference`).
    The splits judge a configuration against a floor only: the ranking keeps the rate's
    surface (ranking trees by the split cost the dense NVLink node's full space 1-4 of 40
    seeds' finals, benchmarks/results/search_noise.txt).
    """
    time_within = _time_within(points, groups, noise)
    out: dict[Lattice, _RateSplit] = {}
    for lattice, (_, keys) in surfaces.items():
        feats: list[tuple[float, float, float]] = []
        log_lengths: list[float] = []
        length_vars: list[float] = []
        log_cycles: list[float] = []
        cycle_vars: list[float] = []
        complete = True
        for key in keys:
            p = points[key]
            assert p.candidate.spec is not None
            accept_var = max(p.estimate.within**2 - time_within**2, _MIN_ACCEPT_SD**2)
            for st in groups[key]:
                logs = st.logs
                length = accept.get(st.trial, math.nan)
                if not logs:
                    continue
                if not (length > 0 and math.isfinite(length)):
                    complete = False
                    break
                feats.append(spec_features(p.candidate.spec))
                log_lengths.append(math.log(length))
                length_vars.append(accept_var / len(logs))
                log_cycles.append(math.log(length) - sum(logs) / len(logs))
                cycle_vars.append(noise.between**2 + time_within**2 / len(logs))
        if not complete or not feats:
            continue  # an engine without accept lengths: the rate's own surface stands
        # The cost form is linear in time, not in log time: the cycle surface is of the time
        # relative to the typical one, each value's (relative) variance scaled to it.
        level = sum(log_cycles) / len(log_cycles)
        rel = [math.exp(y - level) for y in log_cycles]
        rel_var = [v * r * r for v, r in zip(cycle_vars, rel, strict=True)]
        out[lattice] = _RateSplit(
            Surface(feats, log_lengths, length_vars),
            Surface(feats, rel, rel_var, trend=_CYCLE_TREND, signals=_CYCLE_SIGNAL_SD),
            level,
            keys,
        )
    return out


def _smooth(
    points: dict[str, Point], surfaces: Mapping[Lattice, tuple[Surface, frozenset[str]]]
) -> dict[str, Point]:
    """Each speculative point the surface was fitted to takes the surface's posterior there,
    which pools the starts of its neighbours. Points far below the top keep their own."""
    out = dict(points)
    for p in points.values():
        fitted = surfaces.get(p.lattice)
        if fitted is None or p.candidate.spec is None or p.key not in fitted[1]:
            continue
        surface = fitted[0]
        means, sds = surface.predict([spec_features(p.candidate.spec)])
        e = p.estimate
        smoothed = Estimate(math.exp(float(means[0])), float(sds[0]), e.starts, e.runs, e.within)
        out[p.key] = dataclasses.replace(p, estimate=smoothed)
    return out


@dataclass(frozen=True)
class Evidence:
    """What the observations say: each point's posterior, the noise, and the surfaces.

    Attributes:
        points: every measured configuration, by canonical key.
        noise: the within- and between-start noise they were judged with.
        surfaces: the fitted surfaces, by (NCCL set, flags); they also predict configurations
            not measured yet.
    """

    points: dict[str, Point]
    noise: Noise
    surfaces: dict[Lattice, tuple[Surface, frozenset[str]]]
    equivalent: Equivalence = _same
    fit_splits: Callable[[], dict[Lattice, _RateSplit]] | None = dataclasses.field(
        default=None, repr=False, compare=False
    )

    @functools.cached_property
    def splits(self) -> dict[Lattice, _RateSplit]:
        """The surfaces' splits (:func:`_fit_splits`), fitted when a floor is first judged."""
        return self.fit_splits() if self.fit_splits is not None else {}

    def difference(self, a: Point, b: Point) -> tuple[float, float]:
        """The log ratio of ``a``'s rate to ``b``'s and its sd.

        Two speculative points of one surface are compared through its split
        (:func:`_fit_splits`): their accept lengths as measured (pooled with neighbours), their
        cycle times jointly, so the start noise they share through the cycle surface cancels
        in the ratio. Any other pair: the two posteriors, independent.
        """
        split = self.splits.get(a.lattice) if a.lattice == b.lattice else None
        if split is None or a.key not in split.keys or b.key not in split.keys:
            return _independent(a, b)
        assert a.candidate.spec is not None and b.candidate.spec is not None
        logs, cov = split.log_rates([a.candidate.spec, b.candidate.spec])
        var = float(cov[0, 0] + cov[1, 1] - 2.0 * cov[0, 1])
        return logs[0] - logs[1], math.sqrt(max(var, 0.0))

    def key_of(self, candidate: Candidate) -> str:
        """The key of the point ``candidate`` belongs to (its NCCL set by its class)."""
        return canonical_key(_normalise(candidate, self.equivalent))

    def one_start_between(self) -> float:
        """The between-start sd one start is judged with: the measured one, or ``_UNMEASURED``
        times the prior's while no configuration was started twice (the prior may be a third
        of the node's, as the pick's floor guard assumes)."""
        measured = _start_noise_measured(self.points.values())
        return self.noise.between * (1.0 if measured else _UNMEASURED)

    def predict(self, candidate: Candidate) -> Estimate | None:
        """The posterior of a configuration: measured, or predicted by its surface."""
        key = self.key_of(candidate)
        if key in self.points:
            return self.points[key].estimate
        fitted = self.surfaces.get(
            (self.equivalent(candidate.nccl_env), candidate.server_settings)
        )
        if fitted is None or candidate.spec is None:
            return None
        means, sds = fitted[0].predict([spec_features(candidate.spec)])
        return Estimate(math.exp(float(means[0])), float(sds[0]), 0, 0, self.noise.within)


def _normalise(candidate: Candidate, equivalent: Equivalence) -> Candidate:
    return Candidate(
        nccl_env=equivalent(candidate.nccl_env),
        spec=candidate.spec,
        flags=candidate.flags,
        scheduler=candidate.scheduler,
    )


def weigh(
    observations: Iterable[Observation],
    *,
    start_noise: float = 0.01,
    equivalent: Equivalence | None = None,
) -> Evidence:
    """Every measured configuration's posterior, with the noise that is really there.

    Args:
        observations: the finished trials.
        start_noise: the prior between-start relative sd (``study.start_noise``).
        equivalent: maps an NCCL set to the set standing for its class (the NCCL screen's):
            configurations that differ only by equivalent NCCL sets are one point, their
            starts pooled. The point keeps the first measured configuration as its candidate
            (an enqueued hand-tuned set stays what the user wrote).
    """
    same = equivalent or _same
    groups: dict[str, list[Start]] = {}
    info: dict[str, tuple[Candidate, list[int], bool, bool]] = {}
    infeasible: set[str] = set()
    accept: dict[int, float] = {}
    for o in observations:
        if not o.measured:
            continue
        accept[o.trial] = o.accept_length
        key = canonical_key(_normalise(o.candidate, same))
        runs = tuple(v for v in o.runs if v > 0 and math.isfinite(v))
        groups.setdefault(key, []).append(Start(o.trial, runs))
        if not o.feasible:
            infeasible.add(key)
        cand, trials, floor, complete = info.get(key, (o.candidate, [], False, False))
        info[key] = (
            cand,
            [*trials, o.trial],
            floor or o.is_floor,
            complete or o.state is TrialState.COMPLETE,
        )
    noise = estimate_noise(groups, prior_between=start_noise)
    points: dict[str, Point] = {}
    for key, starts in groups.items():
        est = estimate(starts, noise)
        if est is None:
            continue
        cand, trials, floor, complete = info[key]
        lattice = (same(cand.nccl_env), cand.server_settings)
        points[key] = Point(key, cand, est, tuple(trials), floor, complete, lattice,
                            feasible=key not in infeasible)  # fmt: skip
    surfaces = _fit_surfaces(points, groups, noise)
    splits = functools.partial(_fit_splits, surfaces, points, groups, accept, noise)
    return Evidence(_smooth(points, surfaces), noise, surfaces, same, splits)


@dataclass(frozen=True)
class Pick:
    """What to deploy, and why.

    Attributes:
        point: the chosen configuration.
        best: the configuration with the best posterior mean (differs from ``point`` when
            the evidence is not strong enough to leave a floor, or a cheaper one was asked for).
        note: one line explaining a choice other than ``best``; empty otherwise.
    """

    point: Point
    best: Point
    note: str = ""


def _start_noise_measured(points: Iterable[Point]) -> bool:
    """Whether any configuration was started twice: the between-start noise rests on data,
    not only on the prior."""
    return any(p.estimate.starts >= 2 for p in points)


def lower_bound(p: Point) -> float:
    """The log lower bound the pick ranks by: posterior log mean - ``PICK_Z`` sd."""
    return p.estimate.log_mean - PICK_Z * p.estimate.sd


def pick(
    points: Mapping[str, Point],
    *,
    cheaper_margin: float = 0.0,
    cost: Mapping[str, tuple[int, int]] | None = None,
    difference: Difference | None = None,
    noise: Noise | None = None,
) -> Pick | None:
    """The configuration to deploy: the best lower bound, guarded by the floors.

    Configurations rank by ``log mean - PICK_Z x sd`` (:func:`lower_bound`), so the pick moves
    to a rival only when the rival's lead exceeds what its extra uncertainty allows: a single
    start, which carries the whole between-start noise, rarely displaces a configuration
    started twice until it is started again. ``best`` stays the best posterior mean.

    A floor is the baseline or a configuration the user enqueued. A point replaces the best
    floor only with ``P(point > floor) >= 0.975`` and at least two server starts (one lucky
    start must not displace a known setting), or ``>= 0.999`` on one start; the pick is the
    best such point, or the floor. With ``cheaper_margin > 0`` (an explicit request), the
    cheapest point (``cost``: fewer draft tokens, then fewer steps) whose mean is within that
    fraction of the chosen one is chosen instead. Before any configuration was started twice
    the between-start noise is the prior's, so one start is judged at 3x its sd.
    ``difference`` (:meth:`Evidence.difference`) judges a point against a floor through the
    rate's split (accept lengths and a shared cycle surface); without it the two posteriors
    are taken as independent. ``noise`` (the evidence's) judges a point started once at the
    between-start sd's predictive variance once that was measured (:func:`prob_positive`);
    without it, at the sd's median.

    Only points with at least one complete start compete (a pruned start is evidence
    against a point, never enough for it), and of those only the ones that met ``study.slo``
    while any did (:func:`feasible_only`); when none did, the note says so.
    """
    complete = [p for p in points.values() if p.complete]
    if not complete:
        return None
    complete, slo_note = feasible_only(complete)
    ranked = sorted(complete, key=lambda p: -lower_bound(p))
    best = max(complete, key=lambda p: p.estimate.log_mean)
    chosen, note = ranked[0], ""
    measured = _start_noise_measured(points.values())
    widen = 1.0
    diff = difference or _independent
    floors = [p for p in ranked if p.floor]
    floor = max(floors, key=lambda p: p.estimate.log_mean) if floors else None
    if floor is not None and not chosen.floor:
        chosen = next(
            p for p in ranked if p.floor or _beats_floor(p, floor, measured, widen, diff, noise)
        )
    if chosen.key != best.key:
        if (
            floor is not None
            and not best.floor
            and not _beats_floor(best, floor, measured, widen, diff, noise)
        ):
            confidence = _floor_confidence(best, floor, widen, diff, noise)
            if best.estimate.starts < FLOOR_STARTS and not measured:  # judged at 3x the noise
                confidence = _floor_confidence(best, floor, widen * _UNMEASURED, diff)
            why = (
                f"has one server start and beats {_trials(floor)} with {confidence:.1%} "
                f"confidence (needs {FLOOR_CONFIDENCE_ONE_START:.1%}"
                + ("" if measured else " at 3x the prior's start noise, none measured yet")
                + ", or a second start)"
                if best.estimate.starts < FLOOR_STARTS
                else f"beats {_trials(floor)} with only {confidence:.1%} confidence "
                f"(needs {FLOOR_CONFIDENCE:.1%})"
            )
        else:
            why = (
                f"is less sure on {plural(best.estimate.starts, 'start')} (mean - "
                f"{PICK_Z:g} sd: {math.exp(lower_bound(best)):.1f} against "
                f"{math.exp(lower_bound(chosen)):.1f})"
            )
        note = (
            f"picked {_trials(chosen)}: the best mean ({_trials(best)}, "
            f"{best.estimate.mean:.1f}) {why}"
        )
    if cheaper_margin > 0 and cost is not None:
        limit = chosen.estimate.log_mean + math.log1p(-cheaper_margin)
        within = [p for p in ranked if p.estimate.log_mean >= limit]
        cheapest = min(within, key=lambda p: (cost.get(p.key, (0, 0)), -p.estimate.log_mean))
        if cheapest.key != chosen.key:
            note = (
                f"{_trials(cheapest)} is within {cheaper_margin:.0%} of {_trials(chosen)} and "
                "cheaper (fewer draft tokens / steps): picked, as study.pick_margin asks"
            )
            chosen = cheapest
    if slo_note:
        note = f"{slo_note}; {note}" if note else slo_note
    return Pick(chosen, best, note)


def feasible_only(points: Sequence[Point]) -> tuple[list[Point], str]:
    """The points that met ``study.slo``, or all of them with a note when none did."""
    feasible = [p for p in points if p.feasible]
    if feasible:
        return feasible, ""
    return list(points), (
        "no configuration met study.slo: the pick is the best of the infeasible ones"
        if points
        else ""
    )


def _independent(a: Point, b: Point) -> tuple[float, float]:
    return a.estimate.log_mean - b.estimate.log_mean, math.hypot(a.estimate.sd, b.estimate.sd)


def _floor_confidence(
    p: Point, floor: Point, widen: float, difference: Difference, noise: Noise | None = None
) -> float:
    """P(``p`` beats ``floor``), their difference's sd ``widen`` times wider.

    A point started once rests on one start's offset: with ``noise`` it is judged at the
    between-start sd's predictive variance (:func:`prob_positive`), not at its median."""
    diff, sd = difference(p, floor)
    one_start = widen == 1.0 and p.estimate.starts < FLOOR_STARTS
    offsets = 1.0 / p.estimate.starts + 1.0 / max(floor.estimate.starts, 1) if one_start else 0.0
    return prob_positive(diff, widen * sd, noise, offsets)


def _beats_floor(
    p: Point,
    floor: Point,
    noise_measured: bool,
    widen: float,
    difference: Difference,
    noise: Noise | None = None,
) -> bool:
    """Enough evidence to deploy ``p`` instead of a floor (the baseline, an enqueued one)."""
    if p.estimate.starts >= FLOOR_STARTS:
        return _floor_confidence(p, floor, widen, difference) >= FLOOR_CONFIDENCE
    # Nothing started twice: the between-start noise is the prior's, which may be a third of
    # the node's, so one start leaves a floor only if it would at 3x the noise.
    widen = widen if noise_measured else _UNMEASURED
    return _floor_confidence(p, floor, widen, difference, noise) >= FLOOR_CONFIDENCE_ONE_START


def _trials(p: Point) -> str:
    return "trial " + "+".join(str(t) for t in p.trials)
