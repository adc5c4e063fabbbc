"""The search space: the only place the YAML ``search`` section becomes Optuna parameters.

Parameter names are dotted paths: ``spec.mode``, ``spec.num_steps``, ``spec.eagle_topk``,
``spec.num_draft_tokens``, ``nccl.NCCL_PROTO``, ``flags.--mem-fraction-static``,
``sched.max_running_requests``. Every parameter is categorical, so a value is always one the user
wrote.

SGLang's rules are built in (docs/sglang.md, *Speculative rules*):

- the speculative numbers are sampled together or not at all (``spec.mode: off`` samples none);
- an adaptive mode (``EAGLE3-adaptive``) is one point: topk 1, starting at
  :data:`ADAPTIVE_START_STEPS` (SGLang's own start, the middle of its default candidate steps);
  ``spec.overlap`` (the speculative overlap scheduler on/off) exists for topk 1 only, and is a
  parameter only when both are declared;
- with ``eagle_topk == 1`` SGLang forces ``num_draft_tokens = num_steps + 1``, so the draft-token
  parameter is not sampled at all: those candidates are one point, not many;
- a scheduler knob (``sched.*``) absent from a parameter set runs the server's value (the
  baseline has none); SGLang clamps the decode CUDA-graph cap to the running cap, so a
  ``cuda_graph_max_bs`` above ``max_running_requests`` is the same candidate as one equal to it
  (:func:`canonical_key`, docs/sglang.md, *Scheduler knobs*);
- a draft budget the tree cannot hold (``ndt - 1 > topk + (steps - 1) * topk**2``), or one short
  of the tree's accepted path (``ndt < steps + 1``, topk > 1), yields a candidate whose
  ``spec.fits_tree`` is False; the driver records it as infeasible and never launches it.

:func:`canonical_key` names equivalent candidates identically, so a repeat costs no restart.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any

from rayspec._config import ADAPTIVE_SUFFIX
from rayspec._config import SCHEDULER_KNOBS
from rayspec._config import SPEC_OFF
from rayspec._config import UNSET
from rayspec._config import SearchConfig
from rayspec._exceptions import ConfigError
from rayspec._types import Candidate
from rayspec._types import SpecSettings

if TYPE_CHECKING:
    import optuna

__all__ = [
    "ADAPTIVE_START_STEPS",
    "FLAG_OFF",
    "FLAG_ON",
    "P_MODE",
    "P_NDT",
    "P_OVERLAP",
    "P_STEPS",
    "P_TOPK",
    "SCHED_PREFIX",
    "SearchSpace",
    "canonical_key",
]

P_MODE = "spec.mode"
P_STEPS = "spec.num_steps"
P_TOPK = "spec.eagle_topk"
P_NDT = "spec.num_draft_tokens"
P_OVERLAP = "spec.overlap"
# SGLang starts adaptive steps at the middle of its candidate steps, [0, 1, 3, 5, 7] by default
# (0.5.23 speculative_hook._init_adaptive_speculative_params).
ADAPTIVE_START_STEPS = 3
ATTR_QUEUED = "queued_params"  # user attribute of an enqueued trial: the parameters it fixes
FLAG_ON = "on"
FLAG_OFF = "off"
SCHED_PREFIX = "sched."


def is_adaptive(mode: str) -> bool:
    return mode.endswith(ADAPTIVE_SUFFIX)


def _nccl_param(name: str) -> str:
    return f"nccl.{name}"


def _flag_param(flag: str) -> str:
    return f"flags.{flag}"


def _sched_param(knob: str) -> str:
    return f"{SCHED_PREFIX}{knob}"


def effective_knobs(knobs: Mapping[str, int]) -> dict[str, int]:
    """The knobs as SGLang runs them: the decode graph cap clamped to the running cap."""
    out = dict(knobs)
    mrr, graph = out.get("max_running_requests"), out.get("cuda_graph_max_bs")
    if mrr is not None and graph is not None and graph > mrr:
        out["cuda_graph_max_bs"] = mrr
    return out


@dataclasses.dataclass(frozen=True)
class SearchSpace:
    """The declared choices, in the user's order (``unset`` first for NCCL variables)."""

    modes: tuple[str, ...]
    num_steps: tuple[int, ...]
    eagle_topk: tuple[int, ...]
    num_draft_tokens: tuple[int, ...]
    nccl: tuple[tuple[str, tuple[str, ...]], ...]
    flags: tuple[tuple[str, tuple[str, ...]], ...]
    overlap: tuple[str, ...] = (FLAG_ON,)
    scheduler: tuple[tuple[str, tuple[int, ...]], ...] = ()

    @classmethod
    def from_config(cls, search: SearchConfig) -> SearchSpace:
        sp = search.speculative
        return cls(
            modes=tuple(dict.fromkeys(sp.modes)),
            num_steps=tuple(dict.fromkeys(sp.num_steps)),
            eagle_topk=tuple(dict.fromkeys(sp.eagle_topk)),
            num_draft_tokens=tuple(dict.fromkeys(sp.num_draft_tokens)),
            nccl=tuple((k, tuple(v)) for k, v in search.nccl.items()),
            flags=tuple((k, tuple(v)) for k, v in search.flags.items()),
            overlap=tuple(dict.fromkeys(sp.overlap)),
            scheduler=tuple(
                (knob, tuple(dict.fromkeys(int(v) for v in values)))
                for knob in SCHEDULER_KNOBS
                if (values := getattr(search.scheduler, knob))
            ),
        )

    def to_json(self) -> str:
        """The declared choices as JSON, for :meth:`from_json` (a study folder keeps it, so a
        report rebuilds candidates without the experiment file)."""
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> SearchSpace:
        """The space :meth:`to_json` wrote.

        Raises:
            ConfigError: ``text`` is not such a space.
        """
        try:
            doc = json.loads(text)
            return cls(
                modes=tuple(doc["modes"]),
                num_steps=tuple(int(k) for k in doc["num_steps"]),
                eagle_topk=tuple(int(m) for m in doc["eagle_topk"]),
                num_draft_tokens=tuple(int(n) for n in doc["num_draft_tokens"]),
                nccl=tuple((str(k), tuple(v)) for k, v in doc["nccl"]),
                flags=tuple((str(k), tuple(v)) for k, v in doc["flags"]),
                overlap=tuple(doc["overlap"]),
                scheduler=tuple(
                    (str(k), tuple(int(v) for v in vals)) for k, vals in doc.get("scheduler", ())
                ),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"not a search space: {exc}") from exc

    @classmethod
    def from_grid(cls, grid: Mapping[str, list[Any]]) -> SearchSpace:
        """The space :meth:`grid` describes (what an older study recorded). The grid keeps
        neither the flags' declared order (flags read in name order) nor a single overlap
        choice (it reads as on)."""
        return cls(
            modes=tuple(grid[P_MODE]),
            num_steps=tuple(grid.get(P_STEPS, ())),
            eagle_topk=tuple(grid.get(P_TOPK, ())),
            num_draft_tokens=tuple(grid.get(P_NDT, ())),
            nccl=tuple((k.removeprefix("nccl."), tuple(v)) for k, v in grid.items()
                       if k.startswith("nccl.")),
            flags=tuple((k.removeprefix("flags."), tuple(v)) for k, v in grid.items()
                        if k.startswith("flags.")),
            overlap=tuple(grid.get(P_OVERLAP, (FLAG_ON,))),
            scheduler=tuple((k.removeprefix(SCHED_PREFIX), tuple(int(x) for x in v))
                            for k, v in grid.items() if k.startswith(SCHED_PREFIX)),
        )  # fmt: skip

    @property
    def overlap_searched(self) -> bool:
        return len(self.overlap) > 1

    # -- sampling -------------------------------------------------------------------------
    def suggest(self, trial: optuna.Trial) -> Candidate:
        """Ask ``trial`` for a candidate (define-by-run: conditional parameters)."""
        params: dict[str, Any] = {}
        mode = trial.suggest_categorical(P_MODE, list(self.modes))
        params[P_MODE] = mode
        if mode != SPEC_OFF and not is_adaptive(mode):
            params[P_STEPS] = trial.suggest_categorical(P_STEPS, list(self.num_steps))
            params[P_TOPK] = trial.suggest_categorical(P_TOPK, list(self.eagle_topk))
            if params[P_TOPK] > 1:
                ndt_name, budgets = self.ndt_param(params[P_STEPS], params[P_TOPK])
                # A queued configuration keeps the name it was queued under (an impossible
                # tree queued on purpose is recorded as infeasible, not silently changed).
                queued = trial.user_attrs.get(ATTR_QUEUED) or {}
                if P_NDT in queued and ndt_name != P_NDT:
                    ndt_name, budgets = P_NDT, list(self.num_draft_tokens)
                params[ndt_name] = trial.suggest_categorical(ndt_name, budgets)
        if self._has_overlap_param(params):
            params[P_OVERLAP] = trial.suggest_categorical(P_OVERLAP, list(self.overlap))
        for name, choices in self.nccl:
            params[_nccl_param(name)] = trial.suggest_categorical(_nccl_param(name), list(choices))
        for flag, choices in self.flags:
            params[_flag_param(flag)] = trial.suggest_categorical(_flag_param(flag), list(choices))
        # A queued configuration that names no knob (the baseline, a speculative setting
        # queued before the knobs) runs the server's values.
        queued_knobs = trial.user_attrs.get(ATTR_QUEUED)
        for knob, values in self.scheduler:
            name = _sched_param(knob)
            if queued_knobs is not None and name not in queued_knobs:
                continue
            params[name] = trial.suggest_categorical(name, list(values))
        return self.candidate(params)

    def _has_overlap_param(self, params: Mapping[str, Any]) -> bool:
        """Whether ``params`` (mode, steps, topk) take ``spec.overlap``: topk 1, both declared."""
        mode = str(params.get(P_MODE, SPEC_OFF))
        if not self.overlap_searched or mode == SPEC_OFF:
            return False
        return is_adaptive(mode) or int(params.get(P_TOPK, 0)) == 1

    def ndt_param(self, steps: int, topk: int) -> tuple[str, list[int]]:
        """The draft-token parameter for a tree of ``steps`` x ``topk``, and its choices.

        Only budgets SGLang can run the tree with are offered (:attr:`SpecSettings.fits_tree`:
        at most the tree's nodes + 1, at least its accepted path, ``steps + 1``), so the
        sampler never proposes an impossible tree (a failed trial would teach TPE nothing and
        it would ask again). The parameter is named by those limits
        (``spec.num_draft_tokens.upto7``, ``spec.num_draft_tokens.from4``, both:
        ``spec.num_draft_tokens.from4.upto7``) because Optuna needs one fixed choice list per
        name; when every declared budget fits, it is plain ``spec.num_draft_tokens``.
        """
        limit = topk + (steps - 1) * topk**2 + 1
        low = steps + 1
        declared = list(self.num_draft_tokens)
        fit = [n for n in declared if low <= n <= limit]
        if not fit or len(fit) == len(declared):
            return P_NDT, declared
        name = P_NDT
        if any(n < low for n in declared):
            name += f".from{low}"
        if any(n > limit for n in declared):
            name += f".upto{limit}"
        return name, fit

    def grid(self) -> dict[str, list[Any]]:
        """Every declared parameter with its choices: the space's fingerprint (a study keeps it,
        :meth:`from_grid` reads it back). Not the grid sampler's points: the draft-token
        parameter is conditional and tree-dependent, see :meth:`grid_points`."""
        grid: dict[str, list[Any]] = {P_MODE: list(self.modes)}
        if any(m != SPEC_OFF and not is_adaptive(m) for m in self.modes):
            grid[P_STEPS] = list(self.num_steps)
            grid[P_TOPK] = list(self.eagle_topk)
            if any(t > 1 for t in self.eagle_topk):
                grid[P_NDT] = list(self.num_draft_tokens)
        if self.overlap_searched and any(m != SPEC_OFF for m in self.modes):
            grid[P_OVERLAP] = list(self.overlap)
        for name, choices in self.nccl:
            grid[_nccl_param(name)] = list(choices)
        for flag, choices in self.flags:
            grid[_flag_param(flag)] = list(choices)
        for knob, values in self.scheduler:
            grid[_sched_param(knob)] = list(values)
        return grid

    def grid_points(self) -> list[dict[str, Any]]:
        """Every launchable candidate once (canonical, feasible: :meth:`size` of them), each as
        the parameters :meth:`suggest` asks for it, in the order of Optuna's own grid
        (``itertools.product`` over the sorted names, a parameter left out ordering first).

        The points are not a product: the draft-token parameter exists for trees only, named by
        the tree (:meth:`ndt_param`), and ``spec.overlap`` for topk 1 only; a draft budget the
        tree cannot hold is no point at all.
        """
        spec_points: dict[str, dict[str, Any]] = {}
        for mode in self.modes:
            base: list[dict[str, Any]] = []
            if mode == SPEC_OFF or is_adaptive(mode):
                base.append({P_MODE: mode})
            else:
                for k in self.num_steps:
                    for m in self.eagle_topk:
                        if m == 1:
                            base.append({P_MODE: mode, P_STEPS: k, P_TOPK: m})
                            continue
                        name, budgets = self.ndt_param(k, m)
                        fit = [n for n in budgets if SpecSettings(mode, k, m, n).fits_tree]
                        base.extend({P_MODE: mode, P_STEPS: k, P_TOPK: m, name: n} for n in fit)
            for params in base:
                variants = [params]
                if self._has_overlap_param(params):
                    variants = [{**params, P_OVERLAP: o} for o in self.overlap]
                for point in variants:
                    spec_points.setdefault(canonical_key(self.candidate(point)), point)
        others: list[tuple[str, list[Any]]]
        others = [(_nccl_param(k), list(dict.fromkeys(v))) for k, v in self.nccl]
        others += [(_flag_param(k), list(dict.fromkeys(v))) for k, v in self.flags]
        others += [(_sched_param(k), list(v)) for k, v in self.scheduler]
        points = [
            {**spec, **dict(zip((name for name, _ in others), values, strict=True))}
            for spec in spec_points.values()
            for values in itertools.product(*(choices for _, choices in others))
        ]
        if self.scheduler:  # a graph cap above the running cap repeats the capped point
            unique: dict[str, dict[str, Any]] = {}
            for point in points:
                unique.setdefault(canonical_key(self.candidate(point)), point)
            points = list(unique.values())
        order: dict[str, dict[Any, int]] = {}
        for point in points:
            for name, value in point.items():
                order.setdefault(name, {}).setdefault(value, len(order[name]))
        names = sorted(order)
        points.sort(key=lambda p: tuple(order[n][p[n]] if n in p else -1 for n in names))
        return points

    # -- params <-> candidates ------------------------------------------------------------
    def candidate(self, params: Mapping[str, Any]) -> Candidate:
        """The candidate a parameter set describes; missing NCCL/flag params mean unset/off.

        Raises:
            ConfigError: a value is not among the declared choices.
        """
        self.check(params)
        mode = str(params.get(P_MODE, SPEC_OFF))
        spec = None
        overlap = str(params.get(P_OVERLAP, self.overlap[0])) == FLAG_ON
        if is_adaptive(mode):
            k = ADAPTIVE_START_STEPS
            algorithm = mode.removesuffix(ADAPTIVE_SUFFIX)
            spec = SpecSettings(algorithm, k, 1, k + 1, adaptive=True, overlap=overlap)
        elif mode != SPEC_OFF:
            steps = int(params[P_STEPS])
            topk = int(params[P_TOPK])
            # topk 1: SGLang forces ndt = steps + 1 (docs/sglang.md, *Speculative rules*).
            ndt = steps + 1 if topk == 1 else int(params[_ndt_key(params)])
            # Only topk 1 has the speculative overlap scheduler to turn off.
            spec = SpecSettings(mode, steps, topk, ndt, overlap=overlap or topk > 1)
        nccl = tuple(
            sorted(
                (name, str(params[_nccl_param(name)]))
                for name, _ in self.nccl
                if params.get(_nccl_param(name), UNSET) != UNSET
            )
        )
        flags: list[str] = []
        for flag, _ in self.flags:
            value = str(params.get(_flag_param(flag), FLAG_OFF))
            if value == FLAG_ON:
                flags.append(flag)
            elif value != FLAG_OFF:
                flags.extend((flag, value))
        knobs = tuple(
            (knob, int(params[_sched_param(knob)]))
            for knob, _ in sorted(self.scheduler)
            if _sched_param(knob) in params
        )
        return Candidate(nccl_env=nccl, spec=spec, flags=tuple(flags), scheduler=knobs)

    def coerce(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Parameters with the speculative numbers as ints (YAML and overrides give text)."""
        out = dict(params)
        knob_keys = (k for k in out if k.startswith(SCHED_PREFIX))
        for key in (P_STEPS, P_TOPK, *(k for k in out if k.startswith(P_NDT)), *knob_keys):
            if key in out:
                try:
                    out[key] = int(out[key])
                except (TypeError, ValueError):
                    raise ConfigError(f"{key}: {out[key]!r} is not an integer") from None
        for key, value in out.items():
            if key.startswith(("nccl.", "flags.")) or key == P_MODE:
                out[key] = str(value)
        return out

    def check(self, params: Mapping[str, Any]) -> None:
        """Raise :class:`ConfigError` for an unknown parameter or an undeclared value."""
        allowed: dict[str, tuple[Any, ...]] = {
            P_MODE: self.modes,
            P_STEPS: self.num_steps,
            P_TOPK: self.eagle_topk,
            P_NDT: self.num_draft_tokens,
            P_OVERLAP: self.overlap,
        }
        for k in self.num_steps:
            for m in self.eagle_topk:
                name, choices = self.ndt_param(k, m)
                allowed[name] = tuple(choices)
        allowed.update({_nccl_param(k): v for k, v in self.nccl})
        allowed.update({_flag_param(k): v for k, v in self.flags})
        allowed.update({_sched_param(k): v for k, v in self.scheduler})
        for key, value in params.items():
            if key not in allowed:
                raise ConfigError(f"{key}: not a parameter of the search space")
            if value not in allowed[key]:
                # unset/off are always implied choices even when not declared.
                if key.startswith("flags.") and value == FLAG_OFF:
                    continue
                if key.startswith("nccl.") and value == UNSET:
                    continue
                listed = ", ".join(map(str, allowed[key]))
                raise ConfigError(f"{key}: {value!r} is not one of the choices [{listed}]")
        mode = str(params.get(P_MODE, SPEC_OFF))
        if mode != SPEC_OFF and not is_adaptive(mode):
            for key in (P_STEPS, P_TOPK):
                if key not in params:
                    raise ConfigError(f"{key}: required with {P_MODE}={mode}")
            if int(params[P_TOPK]) > 1 and not any(k.startswith(P_NDT) for k in params):
                raise ConfigError(f"{P_NDT}: required with {P_TOPK} > 1")

    def params_of(self, candidate: Candidate) -> dict[str, Any]:
        """The parameters that describe ``candidate`` (the inverse of :meth:`candidate`)."""
        params: dict[str, Any] = {}
        if candidate.spec is None:
            params[P_MODE] = SPEC_OFF
        elif candidate.spec.adaptive:
            params[P_MODE] = candidate.spec.algorithm + ADAPTIVE_SUFFIX
        else:
            params[P_MODE] = candidate.spec.algorithm
            params[P_STEPS] = candidate.spec.num_steps
            params[P_TOPK] = candidate.spec.eagle_topk
            if candidate.spec.eagle_topk > 1:
                name, choices = self.ndt_param(candidate.spec.num_steps, candidate.spec.eagle_topk)
                if candidate.spec.num_draft_tokens not in choices:
                    name = P_NDT  # a budget the tree cannot hold: only the full list names it
                params[name] = candidate.spec.num_draft_tokens
        if candidate.spec is not None and self._has_overlap_param(
            {**params, P_TOPK: candidate.spec.eagle_topk}
        ):
            params[P_OVERLAP] = FLAG_ON if candidate.spec.overlap else FLAG_OFF
        env = candidate.env
        for name, _ in self.nccl:
            params[_nccl_param(name)] = env.get(name, UNSET)
        flags = list(candidate.flags)
        for flag, _ in self.flags:
            if flag not in flags:
                params[_flag_param(flag)] = FLAG_OFF
                continue
            i = flags.index(flag)
            nxt = flags[i + 1] if i + 1 < len(flags) else None
            params[_flag_param(flag)] = (
                nxt if nxt is not None and not nxt.startswith("--") else FLAG_ON
            )
        knobs = candidate.knobs
        for knob, _ in self.scheduler:
            if knob in knobs:
                params[_sched_param(knob)] = knobs[knob]
        return params

    def baseline(self) -> Candidate:
        """No speculation, every NCCL variable unset, every searched flag off."""
        return Candidate()

    def size(self) -> int:
        """The number of distinct launchable candidates (canonical, feasible)."""
        spec_points = 0
        for mode in self.modes:
            if mode == SPEC_OFF:
                spec_points += 1
                continue
            if is_adaptive(mode):
                spec_points += len(self.overlap)
                continue
            for k in self.num_steps:
                for m in self.eagle_topk:
                    ndts = [k + 1] if m == 1 else list(self.num_draft_tokens)
                    fit = sum(1 for n in ndts if SpecSettings(mode, k, m, n).fits_tree)
                    spec_points += fit * (len(self.overlap) if m == 1 else 1)
        total = spec_points
        for _, choices in (*self.nccl, *self.flags):
            total *= len(choices)
        if self.scheduler:
            names = [k for k, _ in self.scheduler]
            combos = {
                tuple(sorted(effective_knobs(dict(zip(names, values, strict=True))).items()))
                for values in itertools.product(*(v for _, v in self.scheduler))
            }
            total *= len(combos)
        return total


def _ndt_key(params: Mapping[str, Any]) -> str:
    return next((k for k in params if k.startswith(P_NDT)), P_NDT)


def canonical_key(candidate: Candidate) -> str:
    """A stable identity: equivalent candidates (as SGLang resolves them) share it."""
    spec = dataclasses.asdict(candidate.spec) if candidate.spec else None
    if spec is not None:  # the defaults stay out, so keys written before the modes still match
        for name, default in (("adaptive", False), ("overlap", True)):
            if spec[name] == default:
                del spec[name]
    doc: dict[str, Any] = {
        "spec": spec, "env": list(candidate.nccl_env), "flags": list(candidate.flags),
    }  # fmt: skip
    if candidate.scheduler:  # absent when not searched: keys written before the knobs match
        doc["scheduler"] = sorted(effective_knobs(candidate.knobs).items())
    if candidate.adaptive_tiers:  # a plan: its tiers are part of what runs
        doc["tiers"] = [[bs, list(steps)] for bs, steps in candidate.adaptive_tiers]
    return json.dumps(doc, sort_keys=True)
