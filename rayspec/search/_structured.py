"""rayspec's default search: settle NCCL without restarts, search speculation by its structure,
and re-launch the contenders before calling one best.

Every restart on a real node costs minutes, so the strategy spends them where the structure of
the problem says the answer is (docs/search.md, *How it searches*):

1. **NCCL from the screen.** Each candidate runs with the NCCL class the screen found fastest
   at its own message size (a verify of N tokens moves N x hidden x bytes). Sets the screen
   cannot tell apart are one point; a set that failed a launch on an NCCL cause is banned.
2. **The online model** (``_online``): from the first chain on, the node's own acceptance and
   cycle cost, fitted from every start's accept histogram and rate, propose the setting it
   predicts best while that is unmeasured (the measurement decides; one chain predicts chains
   on a prior cost slope, two chains trees too, on an even split of it); once a tree split
   the cost, a ladder's rung it puts more than 5 % below the best is skipped, its
   prediction informs the unmeasured neighbours' chances, and its ratio of a rival to the pick
   (two trees or two chains) is pooled into every rival's chance to beat the pick, so a
   setting measured once on an unlucky start that it puts above a lucky pick is started again
   (trusted less where the measured settings scatter about it). This goes before settling a duel
   for the pick, which a setting predicted better than both would end; and when the first chain
   barely beats no speculation, no speculation with the screened NCCL set is measured at once.
   Chains, trees and the rest below fill in around it.
3. **Chains** (topk 1, so draft tokens = steps + 1): a bracketing ladder over the step counts,
   throughput being unimodal-ish in steps: step away from the start while it improves (with
   growing strides), then bisect back to the best.
4. **No speculation**: one point.
5. **Trees**: at the best chain's depth and a middle topk, a ladder over the draft-token budgets
   the tree can hold, starting near twice the chain's verify width.
6. **Local refinement** around the best tree: the neighbouring budget, depth and topk.
7. **Searched flags**: each value once, at the best configuration.
8. **Scheduler knobs** (``search.scheduler``): each value of each knob once, at the best
   configuration (its flags and other knobs kept); a graph cap above the running cap is the
   capped point, never launched twice.
8. **Confirmation**: the pick is re-launched (a fresh server start) and so is any configuration
   that could still beat it by more than ``band``, until none is likely to (below
   ``stop_below``), no restart is expected to gain the pick ``gain_below`` (a quarter of the
   band), or each has ``max_starts`` (:meth:`StructuredSearch.stop_reason` says the number).
   A duel with a floor gets more starts where the measured start noise is above the prior's
   (:meth:`StructuredSearch.duel_starts`), fought by the setting the online model, pooled
   with the measurements, puts highest (:meth:`StructuredSearch._challenger`); and while the
   start noise rests on one configuration's two starts, the likeliest rival measured once is
   started again first.

The strategy is a pure function of the observations (nothing to save or restore): a resumed
study, or another driver, proposes exactly what this one would. ``propose`` returns None when
nothing is left that could change the answer. As the study loop's :class:`~rayspec.search.Strategy`
it queues each proposal into the Optuna study (:meth:`StructuredSearch.ask`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from collections.abc import Collection
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Any

from rayspec._config import ADAPTIVE_SUFFIX
from rayspec._config import SPEC_OFF
from rayspec._exceptions import NOT_THE_CONFIG
from rayspec._exceptions import FailureReason
from rayspec._plural import plural
from rayspec._types import Candidate
from rayspec._types import SpecSettings
from rayspec._types import TrialState
from rayspec.screen import ScreenReport
from rayspec.search._history import FLOOR_STARTS
from rayspec.search._history import Env
from rayspec.search._history import Evidence
from rayspec.search._history import Observation
from rayspec.search._history import Point
from rayspec.search._history import feasible_only
from rayspec.search._history import pick
from rayspec.search._history import weigh
from rayspec.search._online import Measured
from rayspec.search._online import OnlineModel
from rayspec.search._online import fit_model
from rayspec.search._posterior import Estimate
from rayspec.search._posterior import Noise
from rayspec.search._posterior import Start
from rayspec.search._posterior import estimate
from rayspec.search._posterior import expected_gain
from rayspec.search._posterior import prob_better
from rayspec.search._posterior import prob_positive
from rayspec.search._space import FLAG_OFF
from rayspec.search._space import FLAG_ON
from rayspec.search._space import P_MODE
from rayspec.search._space import P_OVERLAP
from rayspec.search._space import SCHED_PREFIX
from rayspec.search._space import SearchSpace
from rayspec.search._space import canonical_key
from rayspec.search._space import effective_knobs
from rayspec.search._space import is_adaptive
from rayspec.search._strategy import Strategy
from rayspec.search._strategy import Wait

if TYPE_CHECKING:
    from rayspec.search._study import StudyHandle
    from rayspec.search._study import TrialHandle

__all__ = ["Proposal", "StructuredSearch"]

# A failure of these kinds condemns the NCCL set, not the speculative settings.
# (A wrong output is counted here too: greedy speculation is lossless, so a corrupting setting is
# the NCCL set's, e.g. LL128 forced on a PCIe ring.)
NCCL_FAILURES = ("nccl_init", "nccl_first_collective", "wrong_output")
# A configuration whose launches lost their node this many times is not proposed again: a
# lost launch costs no restart, so one that takes its node down (host OOM) would otherwise be
# launched for ever.
_MAX_NODES_LOST = 2
_PREFERRED_TOPK = 4
_EXPLORE_AROUND = 3  # unmeasured neighbours of this many best configurations are candidates
# An unmeasured neighbour no surface predicts is taken as its measured neighbour's level with
# this much more (relative) uncertainty: one step on an axis moves throughput by a few %.
_NEIGHBOUR_SD = 0.03
# The first chain "barely beats" no speculation below this ratio to the baseline: the baseline
# runs NCCL's defaults and the screened set is the fastest at a decode's size, so no
# speculation with it can only be faster, and is measured at once. Not higher: on the weak
# drafter's node (chain 1.31x the baseline, a tree the optimum) measuring it early cost 1.5
# restarts to 1 % (search_efficiency, weak/quick, 4 seeds: 6 / 10 against 4.5 / 5).
_BARELY = 1.25
# The online model proposes its argmax only when it predicts at least this gain over the best.
_MODEL_GAIN = 1.01
# Once a tree has split its costs, the model predicts unseen settings within a few % (the
# twin's MoE verify is not exactly linear in its width): it is taken with this relative sd for
# an unmeasured neighbour and a ladder's next rung, and a rung it predicts more than
# _MODEL_SKIP below the best (or unlikely to beat the pick by the band) is not launched (on the
# field node, the chain ladder's 1-, 4- and 5-step rungs after the trees: 8-16 % below, each a
# restart).
_MODEL_SD = 0.03
_MODEL_SKIP = 0.05
# The split model's level errs by a few % (it is fitted to a few lucky or unlucky starts), but
# its ratio of two settings of one kind (two trees, two chains) errs by well under 1 % on the
# twin's nodes (two chains and one tree of the field node: 2-token trees 0.5 % apart, nvlink's
# 1-2 %): pooled at this sd into a rival's gap to the pick (its chance to beat it), it restarts
# a setting measured once on an unlucky start that the model puts above a lucky pick.
_MODEL_REL_SD = 0.01
_RUNS = 5  # the runs of a start the search has not made yet (the field protocol's repeats)
# A measured configuration whose last this many starts failed is not started again.
_FAILED_STARTS = 2


@dataclass(frozen=True)
class Proposal:
    """The next configuration to launch, and why (shown in the progress line and the table).

    Attributes:
        candidate: what to launch.
        reason: one short phrase (``chain ladder``, ``confirm trial 7``, ...).
        repeat_of: set for a re-launch of a measured configuration (a new server start that
            is pooled with the earlier ones; never a reuse of the old result).
    """

    candidate: Candidate
    reason: str
    repeat_of: int | None = None


@dataclass(frozen=True)
class _Rival:
    """A restart the search could spend: its chance to beat the pick by more than the band."""

    risk: float
    proposal: Proposal
    point: Point | None  # the measured configuration; None for an unmeasured neighbour
    what: str
    gain: float = math.inf  # the expected gain (relative) of the pick after its start


@dataclass(frozen=True)
class _View:
    """What the observations say, computed once per proposal."""

    evidence: Evidence
    points: dict[str, Point]
    failed: set[str]  # canonical keys that failed (not on an NCCL cause), or lost 2 nodes
    banned: set[tuple[tuple[str, str], ...]]  # NCCL sets that failed a launch
    busy: set[str]  # keys pending (running in another slot), or never started again
    by_spec: dict[SpecSettings | None, list[Observation]]
    noise: Noise
    fallback_nccl: tuple[tuple[str, str], ...]  # without a screen: the best measured set


class StructuredSearch(Strategy):
    """Propose the next configuration from what has been measured.

    Args:
        space: the search space.
        screen: the NCCL screen's report (None: NCCL is not searched; the default and the
            enqueued sets are all that is launched).
        token_bytes: all-reduce bytes of one token's activation (hidden size x bytes).
        concurrency: the objective scenario's concurrency (message sizes scale with it).
        start_noise: the prior between-start relative sd (``study.start_noise``).
        max_starts: at most this many starts of one configuration.
        confident: how sure a ladder must be that a neighbour is worse to stop there (an
            uncertain drop is looked past once).
        band: the gain that matters (relative): a rival counts by its chance to beat the pick
            by more than this.
        stop_below: the search is done once no rival beats the pick by more than ``band``
            with at least this probability (and the pick was started twice).
        gain_below: ... or once no restart is expected to gain the pick this much (relative,
            :func:`~rayspec.search._posterior.expected_gain`; 0.25 %, a quarter of the band):
            on a node whose starts vary by 3 %, a third start of a rival tied with the pick
            moves it little, though its chance to beat the pick by the band stays above 20 %.
        loads: how many loads (distinct concurrencies) the study measures; with several, no
            speculation is measured in full (the adaptive tiers need it at every load).
    """

    def __init__(
        self,
        space: SearchSpace,
        screen: ScreenReport | None,
        *,
        token_bytes: int,
        concurrency: int = 1,
        start_noise: float = 0.01,
        max_starts: int = 3,
        confident: float = 0.75,
        band: float = 0.01,
        stop_below: float = 0.2,
        gain_below: float = 0.0025,
        loads: int = 1,
        server_knobs: Mapping[str, int | None] | None = None,
        max_load: int | None = None,
    ) -> None:
        self.space = space
        self.screen = screen
        self.token_bytes = token_bytes
        self.concurrency = max(1, concurrency)
        self.start_noise = start_noise
        self.max_starts = max_starts
        self.confident = confident
        self.band = band
        self.stop_below = stop_below
        self.gain_below = gain_below
        self.loads = loads
        # The server's scheduler values (a candidate without a knob runs them) and the largest
        # load of the study (no batch grows past it): a knob value that changes neither is the
        # point already measured.
        self.server_knobs = dict(server_knobs or {})
        self.max_load = max_load
        algos = [m for m in space.modes if m != SPEC_OFF and not is_adaptive(m)]
        self.algorithm = algos[0] if algos else None
        # SGLang's adaptive steps: one point each (topk 1, its own start).
        self.adaptive_modes = [m for m in space.modes if is_adaptive(m)]
        # A chain's overlap scheduler: on unless only "off" is declared.
        self.overlap = FLAG_ON in space.overlap
        self.steps = sorted(space.num_steps)
        self.topks = sorted(space.eagle_topk)
        self.budgets = sorted(space.num_draft_tokens)

    # -- the strategy seam ---------------------------------------------------------------------
    def ask(
        self,
        study: StudyHandle,
        observations: Sequence[Observation],
        running: Sequence[Candidate],
    ) -> TrialHandle | Wait:
        """:meth:`propose`, queued into ``study`` with its reason (None: done once nothing
        runs, since a running trial's result may still change the answer)."""
        proposal = self.propose(observations, running)
        if proposal is None:
            if running:
                return Wait()
            return Wait(done=self.stop_reason(observations))
        return study.ask(proposal.candidate, reason=proposal.reason, repeat_of=proposal.repeat_of)

    def measured_in_full(self, candidate: Candidate) -> bool:
        """No speculation with several loads: pruned on the first load, it would leave the
        others without the point the adaptive tiers need (0 steps where speculation loses)."""
        return self.loads > 1 and candidate.spec is None

    # -- NCCL --------------------------------------------------------------------------------
    def _message_bytes(self, spec: SpecSettings | None) -> int:
        tokens = 1 if spec is None else spec.num_draft_tokens
        return self.concurrency * tokens * self.token_bytes

    def nccl_for(
        self,
        spec: SpecSettings | None,
        banned: Collection[tuple[tuple[str, str], ...]] = (),
        fallback: tuple[tuple[str, str], ...] = (),
    ) -> tuple[tuple[str, str], ...]:
        """The NCCL set to launch ``spec`` with: the screen's fastest class at its size.

        Without a screen, ``fallback``: the set of the best configuration measured so far
        (the hand-tuned one the user enqueued, typically), else NCCL's defaults.
        """
        if self.screen is None or not self.screen.classes:
            return fallback
        try:
            _, env = self.screen.best_for(self._message_bytes(spec), banned=banned)
        except LookupError:
            return fallback
        return env

    def equivalent(self, env: Env) -> Env:
        """The NCCL set standing for ``env``'s screen class (``env`` without a screen)."""
        return self.screen.representative(env) if self.screen is not None else env

    def _same_class(self, a: tuple[tuple[str, str], ...], b: tuple[tuple[str, str], ...]) -> bool:
        if a == b:
            return True
        if self.screen is None:
            return False
        ca, cb = self.screen.class_of(a), self.screen.class_of(b)
        return ca is not None and ca is cb

    def candidate(self, spec: SpecSettings | None, view: _View | None = None) -> Candidate:
        banned = view.banned if view is not None else set()
        fallback = view.fallback_nccl if view is not None else ()
        return Candidate(nccl_env=self.nccl_for(spec, banned, fallback), spec=spec)

    # -- the view ----------------------------------------------------------------------------
    def _view(self, observations: Sequence[Observation], pending: Sequence[Candidate]) -> _View:
        evidence = weigh(observations, start_noise=self.start_noise, equivalent=self.equivalent)
        points, noise = evidence.points, evidence.noise
        failed: set[str] = set()
        banned: set[tuple[tuple[str, str], ...]] = set()
        by_spec: dict[SpecSettings | None, list[Observation]] = {}
        lost: dict[str, int] = {}
        for o in observations:
            if o.failure in (FailureReason.NODE_LOST.value, FailureReason.ACTOR_LOST.value):
                lost[o.key] = lost.get(o.key, 0) + 1
                if lost[o.key] >= _MAX_NODES_LOST:
                    failed.add(o.key)
            if o.state is TrialState.FAIL and o.failure not in (None, *NOT_THE_CONFIG):
                if o.failure in NCCL_FAILURES:
                    banned.add(o.candidate.nccl_env)
                else:
                    failed.add(o.key)
            if o.state is TrialState.COMPLETE and o.launched and not o.measured:
                failed.add(o.key)  # measured to nothing (goodput 0: no request met study.slo)
            if o.measured and not o.candidate.server_settings:
                by_spec.setdefault(o.candidate.spec, []).append(o)
        busy = {evidence.key_of(c) for c in pending}
        busy |= _no_more_starts(observations, evidence, banned)  # never started again
        return _View(
            evidence=evidence,
            points=points,
            failed=failed,
            banned=banned,
            busy=busy,
            by_spec=by_spec,
            noise=noise,
            fallback_nccl=_best_nccl(points),
        )

    def spec_estimate(self, spec: SpecSettings | None, view: _View) -> Estimate | None:
        """A speculative setting's posterior at the NCCL class it would be launched with.

        Starts of any member of that class count (the screen cannot tell them apart), so an
        enqueued configuration with six tuned variables informs the same point as the two
        variables that matter.
        """
        env = self.nccl_for(spec, view.banned, view.fallback_nccl)
        starts = [
            Start(o.trial, o.runs)
            for o in view.by_spec.get(spec, [])
            if self._same_class(o.candidate.nccl_env, env)
        ]
        if not starts:
            return None
        return estimate(starts, view.noise)

    def _tried(self, spec: SpecSettings | None, view: _View) -> bool:
        """Measured, failed, running, or impossible: nothing more to learn by launching it."""
        cand = self.candidate(spec, view)
        if canonical_key(cand) in view.failed or view.evidence.key_of(cand) in view.busy:
            return True
        if spec is not None and not spec.fits_tree:
            return True
        if any(canonical_key(Candidate(nccl_env=o.candidate.nccl_env, spec=spec)) in view.failed
               for o in view.by_spec.get(spec, [])):  # fmt: skip
            return True
        return self.spec_estimate(spec, view) is not None

    # -- proposals ---------------------------------------------------------------------------
    def propose(
        self, observations: Sequence[Observation], pending: Sequence[Candidate] = ()
    ) -> Proposal | None:
        """The next configuration to launch, or None when the search is done."""
        view = self._view(observations, pending)
        stages: tuple[Callable[[_View], Proposal | None], ...] = (
            # The model's proposal first: settling a duel that a setting predicted better than
            # both would end is a restart spent on a question that no longer matters.
            self._predicted,
            self._settle,
            self._unless_ruled_out(self._chains),
            self._unless_ruled_out(self._trees),
            self._no_speculation,
            self._modes,
            self._improve,
            self._flags,
            self._knobs,
        )
        for stage in stages:
            proposal = stage(view)
            if proposal is not None:
                spec = proposal.candidate.spec
                if spec is not None and not self._in_space(spec):  # pragma: no cover - a bug
                    raise RuntimeError(f"the search proposed {spec}, outside the space")
                return proposal
        return None

    def _unless_ruled_out(
        self, stage: Callable[[_View], Proposal | None]
    ) -> Callable[[_View], Proposal | None]:
        """``stage``, skipped once a tree split the model's costs when its next rung is
        predicted more than ``_MODEL_SKIP`` below the best measured, or is unlikely (below
        ``stop_below``) to beat the pick by more than ``band`` with the model's prediction
        pooled into its surface's: the ladder has nothing left worth a restart."""

        def gated(view: _View) -> Proposal | None:
            proposal = stage(view)
            if proposal is None or proposal.candidate.spec is None:
                return proposal
            model, inc = self.online_model(view), self._incumbent(view)
            if model is None or not model.costs.split or inc is None:
                return proposal
            predicted = model.predict(proposal.candidate.spec)
            if predicted is not None and predicted < (1 - _MODEL_SKIP) * inc.estimate.mean:
                return None
            # A rung is a rival like any other: launched only while it could beat the pick by
            # more than the band (its surface and the model's prediction pooled).
            choice = pick(
                view.points, difference=view.evidence.difference, noise=view.evidence.noise
            )
            if predicted is None or predicted <= 0 or choice is None:
                return proposal
            surface = view.evidence.predict(proposal.candidate)
            est = (
                Estimate(predicted, _MODEL_SD, 0, 0, view.noise.within)
                if surface is None
                else _pooled(surface, predicted, _MODEL_SD)
            )
            if prob_better(est, choice.point.estimate, margin=self.band) < self.stop_below:
                return None
            return proposal

        return gated

    def _spec(self, k: int, m: int, n: int, overlap: bool | None = None) -> SpecSettings:
        assert self.algorithm is not None
        if m > 1:
            return SpecSettings(self.algorithm, k, m, n)
        overlap = self.overlap if overlap is None else overlap
        return SpecSettings(self.algorithm, k, 1, k + 1, overlap=overlap)

    def _best_chain(self, view: _View) -> int | None:
        if self.algorithm is None or 1 not in self.topks:
            return None
        best: tuple[float, int] | None = None
        for k in self.steps:
            est = self.spec_estimate(self._spec(k, 1, k + 1), view)
            if est is not None and (best is None or est.log_mean > best[0]):
                best = (est.log_mean, k)
        return best[1] if best else None

    def _settle(self, view: _View) -> Proposal | None:
        """A better mean held back by a floor for want of a second start gets it at once."""
        choice = pick(view.points, difference=view.evidence.difference, noise=view.evidence.noise)
        if choice is None or choice.point.key == choice.best.key:
            return None
        best = choice.best
        if best.estimate.starts >= FLOOR_STARTS or best.key in view.busy:
            return None
        if prob_better(best.estimate, choice.point.estimate) < 0.5:
            return None
        return Proposal(
            best.candidate,
            f"confirm the best (trial {best.trials[0]}) before it "
            f"replaces trial {choice.point.trials[0]}",
            repeat_of=best.trials[0],
        )

    def online_model(self, view: _View) -> OnlineModel | None:
        """The node's own model (``_online``) fitted to the speculative starts measured at the
        NCCL class each would be launched with (None: not enough of them yet)."""
        measured: list[Measured] = []
        for spec, obs in view.by_spec.items():
            if spec is None or spec.adaptive or not self._in_space(spec):
                continue
            env = self.nccl_for(spec, view.banned, view.fallback_nccl)
            for o in obs:
                if o.accept_histogram and self._same_class(o.candidate.nccl_env, env):
                    runs = [v for v in o.runs if v > 0 and math.isfinite(v)]
                    measured.append(
                        Measured(
                            spec,
                            math.exp(sum(math.log(v) for v in runs) / len(runs)),
                            o.accept_histogram,
                        )
                    )
        return fit_model(measured)

    def _predicted(self, view: _View) -> Proposal | None:
        """What the starts already tell: no speculation early when the first chain barely
        beats it, then the online model's best setting of the space, while it is unmeasured
        and predicted better than the best measured (the measurement decides)."""
        if self.algorithm is None:
            return None
        chains = [s for s in view.by_spec if s is not None and s.eagle_topk == 1]
        if chains and SPEC_OFF in self.space.modes and not self._tried(None, view):
            best_off = max((p.estimate.mean for p in view.points.values()
                            if p.candidate.spec is None and p.complete), default=0.0)  # fmt: skip
            best_chain = max(
                (e.mean for e in (self.spec_estimate(s, view) for s in chains) if e is not None),
                default=0.0,
            )
            if 0 < best_chain < _BARELY * best_off:
                return Proposal(
                    self.candidate(None, view),
                    "no speculation with the screened NCCL set: the first chain barely beats it",
                )
        model = self.online_model(view)
        inc = self._incumbent(view)
        if model is None or inc is None:
            return None
        scored = [(t, s) for s in self._model_space() if (t := model.predict(s)) is not None]
        if not scored:
            return None
        tok_s, spec = max(scored, key=lambda ts: ts[0])
        if self._tried(spec, view) or tok_s < _MODEL_GAIN * inc.estimate.mean:
            return None
        return Proposal(
            self.candidate(spec, view),
            f"the online model's best: {plural(spec.num_steps, 'step')}, topk {spec.eagle_topk}, "
            f"{plural(spec.num_draft_tokens, 'token')} (predicted {tok_s:.1f} tok/s)",
        )

    def _model_space(self) -> list[SpecSettings]:
        """Every static setting of the space the online model can predict."""
        out = [self._spec(k, 1, k + 1) for k in self.steps] if 1 in self.topks else []
        out += [self._spec(k, m, n) for k in self.steps for m in self.topks if m > 1
                for n in self.budgets if self._spec(k, m, n).fits_tree]  # fmt: skip
        return out

    def _chains(self, view: _View) -> Proposal | None:
        if self.algorithm is None or 1 not in self.topks:
            return None
        start = 2 if 2 in self.steps else self.steps[min(1, len(self.steps) - 1)]
        # Upwards from two steps only: a one-step chain is rarely the answer, and the tree
        # refinement still looks one step shallower around the best tree.
        k = self._ladder(self.steps, lambda k: self._spec(k, 1, k + 1), start, view, down=False)
        if k is None:
            return None
        return Proposal(
            self.candidate(self._spec(k, 1, k + 1), view), f"chain ladder: {plural(k, 'step')}"
        )

    def _no_speculation(self, view: _View) -> Proposal | None:
        if SPEC_OFF not in self.space.modes or self._tried(None, view):
            return None
        return Proposal(self.candidate(None, view), "no speculation with the screened NCCL set")

    def _modes(self, view: _View) -> Proposal | None:
        """SGLang's adaptive steps, then the best chain with the overlap scheduler toggled.

        Each is one measurement that answers a question of its own (adaptive or a tuned static
        configuration; does the overlap scheduler pay here); the rest of the way around them
        is the improvement stage's, through :meth:`_neighbours`.
        """
        for mode in self.adaptive_modes:
            params: dict[str, Any] = {P_MODE: mode}
            if self.space.overlap_searched:
                params[P_OVERLAP] = FLAG_ON if self.overlap else FLAG_OFF
            spec = self.space.candidate(params).spec
            if spec is not None and not self._tried(spec, view):
                return Proposal(self.candidate(spec, view), f"SGLang's adaptive steps ({mode})")
        k = self._best_chain(view)
        if k is None or not self.space.overlap_searched:
            return None
        toggled = self._spec(k, 1, k + 1, overlap=not self.overlap)
        if self._tried(toggled, view):
            return None
        state = "on" if toggled.overlap else "off"
        return Proposal(
            self.candidate(toggled, view),
            f"the best chain ({plural(k, 'step')}) with overlap {state}",
        )

    def _tree_shape(self, view: _View) -> tuple[int, int] | None:
        trees = [m for m in self.topks if m > 1]
        if self.algorithm is None or not trees:
            return None
        m = min(trees, key=lambda t: (abs(math.log(t / _PREFERRED_TOPK)), -t))
        k = self._best_chain(view)
        if k is None:
            k = 2 if 2 in self.steps else self.steps[0]
        return k, m

    def _trees(self, view: _View) -> Proposal | None:
        shape = self._tree_shape(view)
        if shape is None:
            return None
        k, m = shape
        budgets = [n for n in self.budgets if n > k + 1 and self._spec(k, m, n).fits_tree]
        if not budgets:
            return None
        target = 2 * k + 1
        start = min(budgets, key=lambda n: (abs(n - target), -n))
        n = self._ladder(budgets, lambda n: self._spec(k, m, n), start, view)
        if n is None:
            return None
        return Proposal(
            self.candidate(self._spec(k, m, n), view),
            f"tree ladder: {plural(k, 'step')}, topk {m}, {plural(n, 'token')}",
        )

    def _incumbent(self, view: _View) -> Point | None:
        complete, _ = feasible_only([p for p in view.points.values() if p.complete])
        return max(complete, key=lambda p: p.estimate.log_mean) if complete else None

    def _neighbours(self, spec: SpecSettings) -> list[SpecSettings]:
        """Settings one step away on each axis (steps, topk, draft tokens, overlap)."""
        k, m, n = spec.num_steps, spec.eagle_topk, spec.num_draft_tokens
        out: list[SpecSettings] = []
        if m == 1 and self.space.overlap_searched:
            out.append(dataclasses.replace(spec, overlap=not spec.overlap))
        if spec.adaptive:  # one point: only its overlap scheduler can move
            return [s for s in out if self._in_space(s)]
        for kb in _adjacent(self.steps, k):
            out.append(self._spec(kb, m, n, overlap=spec.overlap))
        for mb in _adjacent(self.topks, m):
            if mb == 1 or m > 1:
                out.append(self._spec(k, mb, n, overlap=spec.overlap))
            else:  # from a chain to a tree: the budget nearest the chain's verify width
                budget = min(self.budgets, key=lambda b: (abs(b - (k + 1)), b))
                out.append(self._spec(k, mb, budget))
        if m > 1:
            for nb in _adjacent(self.budgets, n):
                out.append(self._spec(k, m, nb))
        return [s for s in out if s.fits_tree and self._in_space(s)]

    def _in_space(self, spec: SpecSettings) -> bool:
        """Whether the space can express ``spec`` (a chain's forced budget needs no choice)."""
        if (
            spec.eagle_topk == 1
            and (FLAG_ON if spec.overlap else FLAG_OFF) not in self.space.overlap
        ):
            return False
        if spec.adaptive:
            return spec.algorithm + ADAPTIVE_SUFFIX in self.adaptive_modes
        return (
            spec.num_steps in self.steps
            and spec.eagle_topk in self.topks
            and (spec.eagle_topk == 1 or spec.num_draft_tokens in self.budgets)
        )

    def _improve(self, view: _View) -> Proposal | None:
        """Around the top: measure what is most likely to beat the pick by more than the band.

        The candidates are the measured configurations (a re-launch pools another start) and
        the unmeasured neighbours of the best few speculative ones (predicted by the fitted
        surface, else by the point they neighbour with ``_NEIGHBOUR_SD`` more uncertainty).
        The one most likely to beat the pick by more than ``band`` is launched; when that is a
        measured rival, the one of the two with fewer starts goes first. A floor (baseline,
        enqueued) or a surer configuration holding the pick against a better mean is settled
        the same way. The search is done (:meth:`stop_reason`) once no candidate beats the
        pick by more than ``band`` with probability ``stop_below`` or more, and the pick was
        started twice.
        """
        inc = self._incumbent(view)
        choice = pick(view.points, difference=view.evidence.difference, noise=view.evidence.noise)
        if inc is None or choice is None:
            return None
        if choice.point.key != inc.key:
            # The pick holds against a better mean: more starts of the two settle it.
            # Against a floor, more starts each (:meth:`duel_starts`): at 3 % start noise,
            # four starts a side cannot show a 5 % lead with the floor's confidence.
            cap = self.duel_starts(view.noise) if choice.point.floor else self.max_starts
            duelist = self._challenger(view, inc) if choice.point.floor else inc
            for p in sorted((choice.point, duelist), key=lambda p: p.estimate.starts):
                if p.estimate.starts < cap and p.key not in view.busy:
                    return Proposal(
                        p.candidate, f"settle the best against trial {choice.point.trials[0]}",
                        repeat_of=p.trials[0],
                    )  # fmt: skip
        ref = choice.point
        options = self._rivals(view, ref)
        best = max(options, key=lambda r: r.risk, default=None)
        gain = max((r.gain for r in options), default=0.0)
        if best is not None and best.risk >= self.stop_below and gain >= self.gain_below:
            rival = best.point
            if rival is not None and ref.estimate.starts <= rival.estimate.starts:
                if ref.key not in view.busy and ref.estimate.starts < self.max_starts:
                    return Proposal(ref.candidate, f"confirm the best (trial {ref.trials[0]})",
                                    repeat_of=ref.trials[0])  # fmt: skip
            return best.proposal
        if ref.estimate.starts < 2 and ref.key not in view.busy:
            return Proposal(ref.candidate, f"confirm the best (trial {ref.trials[0]})",
                            repeat_of=ref.trials[0])  # fmt: skip
        return self._second_pair(view, options)

    def _challenger(self, view: _View, inc: Point) -> Point:
        """Who duels a floor for the pick: the configuration the split model, pooled with the
        measurements, puts highest (the best mean ``inc`` unless the model puts another of its
        kind above it).

        Means that differ by less than the start noise rank by luck, and the starts a duel
        needs grow with one over the lead squared (field3x/quick seed 2: a 4-token tree, 2.8 %
        above the hand-tuned chain, dueled it for 9 starts a side while the 6-token tree, 5 %
        above it and measured 0.1 % below the 4-token one, waited); the model's ratio of two
        trees rests on their accept lengths, which no start moves.
        """
        model = self.online_model(view)
        if model is None or not model.costs.split:
            return inc
        rel_sd = self._model_scatter(model, view)
        complete, _ = feasible_only(
            [p for p in view.points.values() if p.complete and not p.floor]
        )
        best, best_gap = inc, 0.0
        for p in complete:
            if p.key == inc.key:
                continue
            gap, _ = self._pooled_gap(p.estimate, p.candidate, inc, model, view, rel_sd)
            if gap > best_gap:
                best, best_gap = p, gap
        return best

    def _second_pair(self, view: _View, options: Sequence[_Rival]) -> Proposal | None:
        """Before the search stops on a start noise measured from one configuration's two
        starts, the likeliest rival measured on one start is started again.

        Every chance above rests on the between-start noise, and one pair of starts (one
        degree of freedom) that agree by chance reads a node whose starts vary by 3 % as a
        quiet one: the field profile at 3x its start noise (seeds 20-39) stopped on the
        hand-tuned floor, started twice 0.2 % apart, after 7 restarts, while trees measured
        once 5 % low were truly 2-5 % faster.
        """
        if sum(1 for p in view.points.values() if p.estimate.starts >= 2) >= 2:
            return None
        once = [r for r in options if r.point is not None and r.point.estimate.starts < 2]
        again = max(once, key=lambda r: r.risk, default=None)
        if again is None or again.point is None:
            return None
        return Proposal(
            again.point.candidate,
            f"measure the start noise on a second configuration (trial {again.point.trials[0]})",
            repeat_of=again.point.trials[0],
        )

    def duel_starts(self, noise: Noise) -> int:
        """Starts each side of a duel with a floor may get: ``max_starts`` plus the square of
        the measured between-start noise over ``study.start_noise``, rounded (at least one more,
        at most ``2 x max_starts`` more: 4 at the prior's 1 %, 7 at 2 %, 9 at 3 %).

        The floor leaves only with 97.5 % confidence, and n starts measure a configuration to
        the start noise over sqrt(n), so the starts a duel needs grow with the noise squared:
        at 3x the prior's noise, four starts a side left the field profile's 5 % lead
        undecided and the pick on the floor for the rest of the budget (field3x/quick, 3 of 20
        seeds).
        """
        ratio = noise.between / self.start_noise if self.start_noise > 0 else 1.0
        extra = min(2 * self.max_starts, max(1, round(ratio**2)))
        return self.max_starts + extra

    def _rivals(self, view: _View, ref: Point) -> list[_Rival]:
        """What another restart could spend itself on, each with its chance to beat ``ref``
        (the pick) by more than ``band``: the measured configurations below ``max_starts``
        and the unmeasured neighbours of the best few speculative ones."""
        out: list[_Rival] = []
        model = self.online_model(view)
        if model is not None and not model.costs.split:
            model = None  # a tree's lower bound is no prediction of a neighbour
        rel_sd = self._model_scatter(model, view)
        for p in view.points.values():
            # A pruned start is evidence, not a verdict: a point with only pruned starts may
            # still be started again if it could beat the pick.
            if p.key == ref.key or p.key in view.busy or p.estimate.starts >= self.max_starts:
                continue
            if ref.feasible and not p.feasible:  # another start cannot undo a missed SLO
                continue
            proposal = Proposal(p.candidate, f"re-measure a contender (trial {p.trials[0]})",
                                repeat_of=p.trials[0])  # fmt: skip
            risk = self._beyond_band(
                *self._pooled_gap(p.estimate, p.candidate, ref, model, view, rel_sd)
            )
            runs = max(1.0, p.estimate.runs / max(1, p.estimate.starts))
            var = view.noise.between**2 + p.estimate.within**2 / runs
            gain = expected_gain(p.estimate, ref.estimate, var)
            out.append(_Rival(risk, proposal, p, f"trial {p.trials[0]}", gain))
        specs, _ = feasible_only(
            [p for p in view.points.values() if p.candidate.spec is not None and p.complete]
        )
        specs.sort(key=lambda p: -p.estimate.log_mean)
        seen: set[str] = set()
        for p in specs[:_EXPLORE_AROUND]:
            assert p.candidate.spec is not None
            for nb in self._neighbours(p.candidate.spec):
                cand = self.candidate(nb, view)
                key = canonical_key(cand)
                if key in seen or self._tried(nb, view):
                    continue
                seen.add(key)
                predicted = view.evidence.predict(cand)
                if predicted is None:  # no surface there: like its neighbour, less sure
                    e = p.estimate
                    predicted = Estimate(e.mean, math.hypot(e.sd, _NEIGHBOUR_SD), 0, 0, e.within)
                tok_s = model.predict(nb) if model is not None else None
                if (
                    tok_s is not None
                    and tok_s > 0
                    and self._model_ratio(cand, ref, model, view) is None
                ):
                    predicted = _pooled(predicted, tok_s, _MODEL_SD)
                what = (
                    f"{plural(nb.num_steps, 'step')}, topk {nb.eagle_topk}, "
                    f"{plural(nb.num_draft_tokens, 'token')}"
                )
                what += "" if nb.overlap else ", overlap off"
                what = nb.label() if nb.adaptive else what
                risk = self._beyond_band(
                    *self._pooled_gap(predicted, cand, ref, model, view, rel_sd)
                )
                proposal = Proposal(cand, f"explore next to the best: {what}")
                var = view.noise.between**2 + view.noise.within**2 / _RUNS
                gain = expected_gain(predicted, ref.estimate, var)
                out.append(_Rival(risk, proposal, None, what, gain))
        return out

    def _model_ratio(
        self, cand: Candidate, ref: Point, model: OnlineModel | None, view: _View
    ) -> float | None:
        """The split model's log ratio of ``cand`` to the pick, where it predicts both at the
        NCCL class it was fitted at (None elsewhere)."""
        if model is None or cand.spec is None or ref.candidate.spec is None:
            return None
        if (cand.spec.eagle_topk == 1) != (ref.candidate.spec.eagle_topk == 1):
            return None  # a chain against a tree rests on the fitted tree shape: less sure
        tok: list[float] = []
        for c in (cand, ref.candidate):
            if c.spec is None or c.flags:
                return None
            if not self._same_class(
                c.nccl_env, self.nccl_for(c.spec, view.banned, view.fallback_nccl)
            ):
                return None
            t = model.predict(c.spec)
            if t is None or t <= 0:
                return None
            tok.append(t)
        return math.log(tok[0] / tok[1])

    def _model_scatter(self, model: OnlineModel | None, view: _View) -> float:
        """How far the measured settings sit from the model's ratios: the sd of their log
        residuals about the model's level (their start noise included, so it errs wide), at
        least ``_MODEL_REL_SD``. On a node whose starts scatter by 3-5 % (the deep drafter's) the
        model, fitted to those starts, is trusted that much less."""
        if model is None:
            return _MODEL_REL_SD
        residuals = []
        for p in view.points.values():
            spec = p.candidate.spec
            if spec is None or p.candidate.flags or not p.complete:
                continue
            if not self._same_class(
                p.candidate.nccl_env, self.nccl_for(spec, view.banned, view.fallback_nccl)
            ):
                continue
            t = model.predict(spec)
            if t is not None and t > 0:
                residuals.append(p.estimate.log_mean - math.log(t))
        if len(residuals) < 2:
            return _MODEL_REL_SD
        mean = sum(residuals) / len(residuals)
        var = sum((r - mean) ** 2 for r in residuals) / (len(residuals) - 1)
        return max(_MODEL_REL_SD, math.sqrt(var))

    def _beyond_band(self, gap: float, var: float) -> float:
        """P(a log gap to the pick, normal with ``var``, exceeds ``band``): a rival's chance
        to beat the pick by more than the band (its gap from :meth:`_pooled_gap`)."""
        return prob_positive(gap - math.log1p(self.band), math.sqrt(max(var, 0.0)))

    def _pooled_gap(
        self,
        est: Estimate,
        cand: Candidate,
        ref: Point,
        model: OnlineModel | None,
        view: _View,
        rel_sd: float,
    ) -> tuple[float, float]:
        """The log gap of ``cand`` (posterior ``est``) over ``ref`` and its variance: the
        measured (or surface) gap, pooled with the split model's ratio at sd ``rel_sd`` where
        it predicts both. The model's level errs by a few % but cancels in a ratio of
        neighbours, so it restarts a setting measured once on an unlucky start that it puts
        above a lucky pick."""
        gap = est.log_mean - ref.estimate.log_mean
        var = est.sd**2 + ref.estimate.sd**2
        ratio = self._model_ratio(cand, ref, model, view)
        if ratio is not None:
            w, wm = 1.0 / max(var, 1e-12), 1.0 / rel_sd**2
            gap, var = (w * gap + wm * ratio) / (w + wm), 1.0 / (w + wm)
        return gap, var

    def stop_reason(self, observations: Sequence[Observation]) -> str:
        """Why the search is done, with the number it stopped on."""
        view = self._view(observations, ())
        choice = pick(view.points, difference=view.evidence.difference, noise=view.evidence.noise)
        if choice is None:
            return "converged: no configuration left that could be measured"
        rivals = self._rivals(view, choice.point)
        band = f"{100 * self.band:g} %"
        if not rivals:
            return (f"converged: no rival left to start again (each has {self.max_starts} "
                    f"starts or failed); the pick is trial {choice.point.trials[0]}")  # fmt: skip
        top = max(rivals, key=lambda r: r.risk)
        likeliest = (
            f"P(the likeliest of {plural(len(rivals), 'rival')} ({top.what}) beats the pick, "
            f"trial {choice.point.trials[0]}, by >{band}) = {100 * top.risk:.1f} %"
        )
        if top.risk < self.stop_below:
            return f"converged: {likeliest} < {100 * self.stop_below:g} %"
        most = max(rivals, key=lambda r: r.gain)
        return (
            f"converged: another restart is expected to gain the pick {100 * most.gain:.2f} % "
            f"at most ({most.what}) < {100 * self.gain_below:g} %, though {likeliest}"
        )

    def _flags(self, view: _View) -> Proposal | None:
        if not self.space.flags:
            return None
        inc = self._incumbent(view)
        if inc is None:
            return None
        base = Candidate(nccl_env=inc.candidate.nccl_env, spec=inc.candidate.spec)
        for flag, choices in self.space.flags:
            for value in choices:
                if value == FLAG_OFF:
                    continue
                params = self.space.params_of(base)
                params[f"flags.{flag}"] = value
                cand = self.space.candidate(params)
                key = view.evidence.key_of(cand)
                if key in view.points or canonical_key(cand) in view.failed or key in view.busy:
                    continue
                return Proposal(cand, f"flag {flag} {value} at the best configuration")
        return None

    def _knobs(self, view: _View) -> Proposal | None:
        if not self.space.scheduler:
            return None
        inc = self._incumbent(view)
        if inc is None:
            return None
        seen = {self._behaviour(p.candidate) for p in view.points.values()}
        for knob, values in self.space.scheduler:
            for value in values:
                params = self.space.params_of(inc.candidate)
                params[f"{SCHED_PREFIX}{knob}"] = value
                cand = self.space.candidate(params)
                key = view.evidence.key_of(cand)
                if key in view.points or canonical_key(cand) in view.failed or key in view.busy:
                    continue
                if self._behaviour(cand) in seen:  # the server's value, or past every load
                    continue
                return Proposal(cand, f"{knob} {value} at the best configuration")
        return None

    def _behaviour(self, candidate: Candidate) -> tuple[str, tuple[tuple[str, int | None], ...]]:
        """What a candidate runs as at the study's loads: its settings without the knobs, and
        the knobs as the launch sets them (the server's where absent; the graph cap following
        the running cap), the two caps clamped to the largest load."""
        knobs = candidate.knobs
        running = knobs.get("max_running_requests", self.server_knobs.get("max_running_requests"))
        graph = knobs.get(
            "cuda_graph_max_bs", self.server_knobs.get("cuda_graph_max_bs") or running
        )
        caps = effective_knobs(
            {k: v for k, v in (("max_running_requests", running), ("cuda_graph_max_bs", graph))
             if v is not None}
        )  # fmt: skip
        if self.max_load is not None:
            caps = {k: min(v, self.max_load) for k, v in caps.items()}
        chunk = knobs.get("chunked_prefill_size", self.server_knobs.get("chunked_prefill_size"))
        rest = dataclasses.replace(candidate, scheduler=())
        return canonical_key(rest), (*sorted(caps.items()), ("chunked_prefill_size", chunk))

    # -- the ladder --------------------------------------------------------------------------
    def _ladder(
        self,
        values: list[int],
        spec_of: Callable[[int], SpecSettings],
        start: int,
        view: _View,
        *,
        down: bool = True,
    ) -> int | None:
        """The next value to measure to bracket the best of a unimodal-ish sequence.

        ``down=False`` never probes below the lowest value measured (only bisects).
        """
        est = {i: self.spec_estimate(spec_of(v), view) for i, v in enumerate(values)}
        blocked = {
            i for i, v in enumerate(values) if est[i] is None and self._tried(spec_of(v), view)
        }
        measured = {i: e for i, e in est.items() if e is not None}
        if not measured:
            order = sorted(range(len(values)), key=lambda i: abs(values[i] - start))
            free = [i for i in order if i not in blocked]
            return values[free[0]] if free else None
        best = max(measured, key=lambda i: measured[i].log_mean)
        for direction in (1, -1):
            if direction < 0 and not down and best == min(measured):
                continue
            i = self._side(values, measured, blocked, best, direction)
            if i is not None:
                return values[i]
        return None

    def _side(
        self,
        values: list[int],
        measured: dict[int, Estimate],
        blocked: set[int],
        best: int,
        d: int,
    ) -> int | None:
        def inside(i: int) -> bool:
            return 0 <= i < len(values)

        def free(i: int) -> bool:
            return inside(i) and i not in measured and i not in blocked

        beyond = sorted((i for i in measured if (i - best) * d > 0), key=lambda i: abs(i - best))
        if not beyond:
            back = [i for i in measured if (i - best) * d < 0]
            stride = 1
            if back:
                nearest = min(back, key=lambda i: abs(i - best))
                if measured[nearest].log_mean < measured[best].log_mean:
                    stride = 2 * abs(best - nearest)
            target = best + d * stride
            target = max(0, min(len(values) - 1, target))
            while (target - best) * d > 0 and not free(target):
                target -= d
            return target if (target - best) * d > 0 else None
        nxt = beyond[0]
        if abs(nxt - best) > 1:
            mid = best + d * (abs(nxt - best) // 2)
            while (mid - best) * d > 0 and not free(mid):
                mid -= d
            if (mid - best) * d > 0:
                return mid
        if prob_better(measured[best], measured[nxt]) >= self.confident:
            return None
        further = nxt + d
        return further if free(further) else None


def _no_more_starts(
    observations: Sequence[Observation],
    evidence: Evidence,
    banned: Collection[tuple[tuple[str, str], ...]],
) -> set[str]:
    """Measured configurations never started again (held as if busy): those whose last
    ``_FAILED_STARTS`` launches failed (a failed start is retried once, as any crash may be
    the node's; a second in a row ends its starts), and those whose NCCL set was banned since
    (its launch would be refused). Proposed anyway, each would be asked for again and again,
    since a refused or failed start changes nothing the search weighs."""
    streak: dict[str, int] = {}
    for o in observations:
        key = evidence.key_of(o.candidate)
        if o.measured:
            streak[key] = 0
        elif o.launched and o.state is TrialState.FAIL and o.failure not in NOT_THE_CONFIG:
            streak[key] = streak.get(key, 0) + 1
    return {
        key for key, p in evidence.points.items()
        if streak.get(key, 0) >= _FAILED_STARTS or p.candidate.nccl_env in banned
    }  # fmt: skip


def _best_nccl(points: dict[str, Point]) -> tuple[tuple[str, str], ...]:
    """The NCCL set of the best measured configuration (NCCL's defaults when none)."""
    complete = [p for p in points.values() if p.complete]
    if not complete:
        return ()
    return max(complete, key=lambda p: p.estimate.log_mean).candidate.nccl_env


def _pooled(e: Estimate, tok_s: float, sd: float) -> Estimate:
    """``e`` combined with an independent prediction ``tok_s`` of relative sd ``sd`` (precision
    weighted on the log scale)."""
    if e.sd <= 0:
        return e
    wa, wb = 1.0 / e.sd**2, 1.0 / sd**2
    log_mean = (wa * e.log_mean + wb * math.log(tok_s)) / (wa + wb)
    return Estimate(math.exp(log_mean), math.sqrt(1.0 / (wa + wb)), e.starts, e.runs, e.within)


def _adjacent(values: Sequence[int], value: int) -> list[int]:
    """The values just above and below ``value`` in a sorted list."""
    ordered = sorted(values)
    if value not in ordered:
        return []
    i = ordered.index(value)
    return [ordered[j] for j in (i + 1, i - 1) if 0 <= j < len(ordered)]


def wants_more_runs(
    runs: Sequence[float],
    points: dict[str, Point],
    noise: Noise,
    *,
    key: str,
    floor: bool,
) -> bool:
    """Whether a trial that finished its planned runs should measure more on the same start.

    More runs cost seconds, a restart minutes: a start close to the best (or a floor, or a
    re-launch of a contender) keeps measuring while its own run noise is still above half the
    between-start noise (0.6 of it), past which only another start helps much.
    """
    logs = [math.log(v) for v in runs if v > 0 and math.isfinite(v)]
    if len(logs) < 2:
        return False
    mean = sum(logs) / len(logs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1))
    se = sd / math.sqrt(len(logs))
    if se <= 0.6 * noise.between:
        return False
    if floor or key in points:
        return True
    complete = [p for p in points.values() if p.complete]
    if not complete:
        return False
    best = max(complete, key=lambda p: p.estimate.log_mean)
    reach = 3.0 * math.sqrt(se**2 + noise.between**2 + best.estimate.sd**2)
    return mean >= best.estimate.log_mean - reach
