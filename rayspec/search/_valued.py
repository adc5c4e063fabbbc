"""``study.sampler: belief``: every restart is the start worth most under one belief.

One principle: a restart is a choice between "start configuration x once more (measured or
not)" and "stop and deploy", made from one posterior (:mod:`rayspec.search._belief`: the online
model as its prior mean, a discrepancy learned from the model's own leave-one-out errors, each
start's offset). Four rules, each one line of this module:

1. **Opening** (deterministic): the driver's baseline and enqueued configurations, then the
   first chain (two steps), which the online model needs before it can say anything.
2. **Sampling**: launch the configuration whose next start has the highest knowledge gradient
   (KG(*), :func:`rayspec.search._kg.kg_star`): the expected rise of the best deployable mean,
   per start, over a few starts of it together. Starting a measured configuration again and
   trying a new one are the same action, valued the same way.
3. **Stop**: when no start is expected to buy ``stop_gain`` (relative throughput per restart),
   the study stops: improvement < what a restart must buy (Optuna's Terminator's shape).
4. **Decision** (:func:`rayspec.search._belief.decide`): deploy the posterior's best, the floor
   a chance constraint (the pick is below the best-believed floor with probability <= 2.5 %).

What stays from the structured search: NCCL from the screen (each setting at the class the
screen found fastest at its message size), failures as a feasibility model (a configuration that
failed is not launched again; an NCCL failure bans the set), prune/extend within a start (the
driver's), and flags or scheduler knobs tried at the pick.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Any

import numpy as np

from rayspec._config import SPEC_OFF
from rayspec._exceptions import NOT_THE_CONFIG
from rayspec._exceptions import FailureReason
from rayspec._types import Candidate
from rayspec._types import SpecSettings
from rayspec._types import TrialState
from rayspec.screen import ScreenReport
from rayspec.search._belief import Belief
from rayspec.search._belief import Decision
from rayspec.search._belief import believe
from rayspec.search._belief import decide
from rayspec.search._history import Env
from rayspec.search._history import Observation
from rayspec.search._history import _normalise
from rayspec.search._kg import kg_star
from rayspec.search._space import FLAG_OFF
from rayspec.search._space import FLAG_ON
from rayspec.search._space import P_MODE
from rayspec.search._space import P_OVERLAP
from rayspec.search._space import SCHED_PREFIX
from rayspec.search._space import SearchSpace
from rayspec.search._space import canonical_key
from rayspec.search._space import is_adaptive
from rayspec.search._strategy import Strategy
from rayspec.search._strategy import Wait

if TYPE_CHECKING:
    from rayspec.search._study import StudyHandle
    from rayspec.search._study import TrialHandle

__all__ = ["BeliefSearch", "Valued"]

# Failures of these kinds condemn the NCCL set, not the speculative settings (greedy speculation
# is lossless, so a wrong output is the NCCL set's too).
NCCL_FAILURES = ("nccl_init", "nccl_first_collective", "wrong_output")
_MAX_FAILURES = 2  # a configuration that failed (or lost its node) this often is not launched
_BAND = 0.01  # the gain the stop line's probability is about (relative)
_RISK = 0.025  # the most the pick may be likely to be below the floor


@dataclass(frozen=True)
class Valued:
    """One restart the search could spend, and what it is expected to buy."""

    candidate: Candidate
    key: str
    value: float  # expected relative gain of the best deployable mean, per start
    starts: int  # over how many starts together that value is reached
    tok_s: float  # the belief's mean
    sd: float  # ... and sd (relative)
    measured: bool


@dataclass(frozen=True)
class _State:
    """What the observations say, computed once per ask."""

    belief: Belief
    decision: Decision | None
    options: tuple[Valued, ...]  # every restart, most valuable first


class BeliefSearch(Strategy):
    """Launch the start worth most under one belief; stop when none is worth a restart.

    Args:
        space: the search space.
        screen: the NCCL screen's report (None: the default and the enqueued sets only).
        token_bytes: all-reduce bytes of one token's activation (hidden size x bytes).
        concurrency: the objective scenario's concurrency (message sizes scale with it).
        start_noise: the between-start sd's prior median (``study.start_noise``).
        runs: the runs one start measures (``bench.repeats``).
        stop_gain: the relative throughput a restart must be expected to buy
            (``study.stop_gain``).
        loads: distinct concurrencies the study measures (no speculation is then measured in
            full: the adaptive tiers need it at every load).
    """

    def __init__(
        self,
        space: SearchSpace,
        screen: ScreenReport | None,
        *,
        token_bytes: int,
        concurrency: int = 1,
        start_noise: float = 0.01,
        runs: int = 5,
        stop_gain: float = 0.0025,
        loads: int = 1,
        server_knobs: Mapping[str, int | None] | None = None,
    ) -> None:
        self.space = space
        self.screen = screen
        self.token_bytes = token_bytes
        self.concurrency = max(1, concurrency)
        self.start_noise = start_noise
        self.runs = max(1, runs)
        self.stop_gain = stop_gain
        self.lifted_until = 0  # the stop rule is lifted until this many launches (extend)
        self.loads = loads
        self.server_knobs = dict(server_knobs or {})
        algos = [m for m in space.modes if m != SPEC_OFF and not is_adaptive(m)]
        self.algorithm = algos[0] if algos else None
        self.steps = sorted(space.num_steps)

    # -- the strategy seam ---------------------------------------------------------------------
    def ask(
        self,
        study: StudyHandle,
        observations: Sequence[Observation],
        running: Sequence[Candidate],
    ) -> TrialHandle | Wait:
        state = self.state(observations, running)
        opening = self._opening(state, observations, running)
        if opening is not None:
            return study.ask(opening, reason="the first chain: what the online model needs")
        top = state.options[0] if state.options else None
        lifted = sum(o.launched for o in observations) < self.lifted_until
        if top is None or (top.value < self.stop_gain and not lifted):
            return Wait() if running else Wait(done=self.stop_line(state))
        repeat_of = None
        if top.measured:
            repeat_of = next(
                (
                    o.trial
                    for o in observations
                    if o.measured and self._key(o.candidate) == top.key
                ),
                None,
            )
        return study.ask(top.candidate, reason=explain(state.options), repeat_of=repeat_of)

    def extend(self, until: int) -> None:
        """Spend the restarts asked for, each on the start worth most: the stop rule is
        lifted until ``until`` server launches."""
        self.lifted_until = until

    def measured_in_full(self, candidate: Candidate) -> bool:
        return self.loads > 1 and candidate.spec is None

    def equivalent(self, env: Env) -> Env:
        """The NCCL set standing for ``env``'s screen class (``env`` without a screen)."""
        return self.screen.representative(env) if self.screen is not None else env

    # -- the belief and the values -------------------------------------------------------------
    def _key(self, candidate: Candidate) -> str:
        return canonical_key(_normalise(candidate, self.equivalent))

    def nccl_for(self, spec: SpecSettings | None, banned: set[Env], fallback: Env) -> Env:
        """The screen's fastest NCCL class at ``spec``'s message size (``fallback``: the best
        measured configuration's set, when there is no screen)."""
        if self.screen is None or not self.screen.classes:
            return fallback
        tokens = 1 if spec is None else spec.num_draft_tokens
        try:
            _, env = self.screen.best_for(
                self.concurrency * tokens * self.token_bytes, banned=banned
            )
        except LookupError:
            return fallback
        return env

    def state(
        self, observations: Sequence[Observation], running: Sequence[Candidate] = ()
    ) -> _State:
        """The belief over everything that could be launched, the decision, and every
        restart's value, most valuable first."""
        failed, banned = _failures(observations, self._key)
        first = self._belief(observations, (), banned, set())
        decision = self._decide(first, observations)
        fallback = (
            first.candidates[first.index(decision.key)].nccl_env if decision is not None else ()
        )
        options = self._options(decision, first, banned, fallback)
        belief = self._belief(observations, options, banned, failed)
        decision = self._decide(belief, observations)
        busy = {self._key(c) for c in running}
        deployable = set(_deployable(observations, self._key)) & set(belief.keys)
        now = float(belief.mean[belief.index(decision.key)]) if decision is not None else None
        floor = decision.floor if decision is not None else None
        values: list[Valued] = []
        for i, (key, cand) in enumerate(zip(belief.keys, belief.candidates, strict=True)):
            if key in busy or key in failed or _banned(cand, banned):
                continue
            if cand.spec is not None and not cand.spec.fits_tree:
                continue
            pool = sorted(deployable | {key})
            idx = [belief.index(k) for k in pool]
            means = belief.mean[idx]
            value, starts = kg_star(
                means, belief.cov[np.ix_(idx, idx)], pool.index(key), belief.start_var[key],
                now=float(means.max()) if now is None else now,
                floor=pool.index(floor) if floor in pool else None, risk=_RISK,
                eligible_after=np.ones(len(pool), dtype=bool),
            )  # fmt: skip
            values.append(
                Valued(cand, key, value, starts, math.exp(float(belief.mean[i])),
                       math.sqrt(max(float(belief.cov[i, i]), 0.0)), key in belief.measured)
            )  # fmt: skip
        values.sort(key=lambda v: (-v.value, v.key))
        return _State(belief, decision, tuple(values))

    def _belief(
        self,
        observations: Sequence[Observation],
        extra: Sequence[Candidate],
        banned: set[Env],
        failed: set[str],
    ) -> Belief:
        del banned, failed
        return believe(
            observations, start_noise=self.start_noise, equivalent=self.equivalent,
            extra=extra, runs=self.runs,
        )  # fmt: skip

    def _decide(self, belief: Belief, observations: Sequence[Observation]) -> Decision | None:
        deployable = [k for k in _deployable(observations, self._key) if k in belief.keys]
        floors = {self._key(o.candidate) for o in observations if o.is_floor and o.measured}
        return decide(belief, deployable, floors, risk=_RISK)

    def _options(
        self, decision: Decision | None, belief: Belief, banned: set[Env], fallback: Env
    ) -> list[Candidate]:
        """Every configuration a restart could start: each static setting of the space at its
        screened NCCL class, no speculation, the adaptive modes, the chains with the overlap
        scheduler toggled, and each flag and scheduler value at the pick."""
        out: list[Candidate] = []

        def add(spec: SpecSettings | None) -> None:
            out.append(Candidate(nccl_env=self.nccl_for(spec, banned, fallback), spec=spec))

        if SPEC_OFF in self.space.modes:
            add(None)
        for spec in self._static_specs():
            add(spec)
        for mode in self.space.modes:
            if is_adaptive(mode):
                add(self.space.candidate({P_MODE: mode}).spec)
        if self.space.overlap_searched and self.algorithm is not None:
            for k in self.steps:
                for overlap in (FLAG_ON, FLAG_OFF):
                    params: dict[str, Any] = {
                        P_MODE: self.algorithm,
                        "spec.num_steps": k,
                        "spec.eagle_topk": 1,
                        P_OVERLAP: overlap,
                    }
                    if 1 in self.space.eagle_topk:
                        add(self.space.candidate(params).spec)
        if decision is not None:
            base = belief.candidates[belief.index(decision.key)]
            for flag, choices in self.space.flags:
                for value in choices:
                    if value != FLAG_OFF:
                        params = self.space.params_of(base)
                        params[f"flags.{flag}"] = value
                        out.append(self.space.candidate(params))
            for knob, values in self.space.scheduler:
                for v in values:
                    params = self.space.params_of(base)
                    params[f"{SCHED_PREFIX}{knob}"] = v
                    out.append(self.space.candidate(params))
        return out

    def _static_specs(self) -> list[SpecSettings]:
        if self.algorithm is None:
            return []
        out = []
        for k in self.steps:
            for m in sorted(self.space.eagle_topk):
                for n in [k + 1] if m == 1 else sorted(self.space.num_draft_tokens):
                    spec = SpecSettings(self.algorithm, k, m, n)
                    if spec.fits_tree:
                        out.append(spec)
        return out

    def _opening(
        self,
        state: _State,
        observations: Sequence[Observation],
        running: Sequence[Candidate],
    ) -> Candidate | None:
        """The first chain, until a chain with a histogram was measured (the model's need)."""
        if self.algorithm is None or 1 not in self.space.eagle_topk or running:
            return None
        if any(o.measured and o.accept_histogram and o.candidate.spec is not None
               and o.candidate.spec.eagle_topk == 1 for o in observations):  # fmt: skip
            return None
        k = 2 if 2 in self.steps else self.steps[0]
        spec = SpecSettings(self.algorithm, k, 1, k + 1)
        failed, banned = _failures(observations, self._key)
        fallback: Env = ()
        if state.decision is not None:
            fallback = state.belief.candidates[state.belief.index(state.decision.key)].nccl_env
        cand = Candidate(nccl_env=self.nccl_for(spec, banned, fallback), spec=spec)
        return None if self._key(cand) in failed else cand

    def stop_line(self, state: _State) -> str:
        """Why the search is done, with its numbers."""
        if state.decision is None:
            return "converged: no configuration left that could be measured"
        top = state.options[0] if state.options else None
        chance, rival = state.belief.rival_chance(state.decision.key, _BAND)
        rival_text = ""
        if rival:
            label = state.belief.candidates[state.belief.index(rival)].label()
            rival_text = f" (likeliest: {label})"
        best = (
            f"the most a restart is expected to buy is {100 * top.value:.2f} % "
            f"({top.candidate.label()})"
            if top is not None
            else "nothing is left to start"
        )
        return (
            f"converged: {best} < {100 * self.stop_gain:g} %; P(a rival beats the pick by "
            f">{100 * _BAND:g} %) = {100 * chance:.1f} %{rival_text}"
        )


def explain(options: Sequence[Valued]) -> str:
    """The progress line's why: the top three restarts by value, with their means and sds."""
    parts = []
    for v in options[:3]:
        again = "again" if v.measured else "new"
        parts.append(
            f"{v.candidate.spec.label() if v.candidate.spec else 'no speculation'} ({again}) "
            f"+{100 * v.value:.2f} %/start, {v.tok_s:.1f} ± {100 * v.sd:.1f} %"
        )
    return "worth most: " + "; ".join(parts)


def _deployable(observations: Sequence[Observation], key_of: Any) -> list[str]:
    """Keys with a complete measured start; those meeting study.slo when any does."""
    complete: dict[str, bool] = {}
    for o in observations:
        if o.measured and o.state is TrialState.COMPLETE:
            key = key_of(o.candidate)
            complete[key] = complete.get(key, True) and o.feasible
    feasible = [k for k, ok in complete.items() if ok]
    return feasible or list(complete)


def _failures(observations: Sequence[Observation], key_of: Any) -> tuple[set[str], set[Env]]:
    """Configurations not to launch again, and NCCL sets banned by an NCCL failure."""
    counts: dict[str, int] = {}
    banned: set[Env] = set()
    failed: set[str] = set()
    for o in observations:
        lost = o.failure in (FailureReason.NODE_LOST.value, FailureReason.ACTOR_LOST.value)
        if o.state is TrialState.FAIL and o.failure in NCCL_FAILURES:
            banned.add(o.candidate.nccl_env)
            continue
        if lost or (o.state is TrialState.FAIL and o.failure not in (None, *NOT_THE_CONFIG)):
            key = key_of(o.candidate)
            counts[key] = counts.get(key, 0) + 1
            # A failed first start condemns the configuration; a measured one that failed a
            # repeat is tried once more, then not again.
            measured = any(p.measured and key_of(p.candidate) == key for p in observations)
            if not measured or counts[key] >= _MAX_FAILURES or lost and counts[key] >= 2:
                failed.add(key)
        if o.state is TrialState.COMPLETE and o.launched and not o.measured:
            failed.add(key_of(o.candidate))
    return failed, banned


def _banned(candidate: Candidate, banned: set[Env]) -> bool:
    return candidate.nccl_env in banned and bool(candidate.nccl_env)
