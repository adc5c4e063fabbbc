"""From screen measurements to the NCCL sets worth a restart (pure, apart from the screen call).

- :func:`screen_space` decides which sets of the search space to measure: all of them when the
  space is small enough (``max_sets``), otherwise a coordinate descent from NCCL's defaults
  (each variable in turn set to its best value, repeated until nothing changes), which is what
  a person would do by hand, at a few seconds per set.
- :class:`ScreenReport` groups the sets the screen cannot tell apart (within ``tolerance`` at
  every size) into classes. One class is one point for the search: its representative (the
  member that sets the fewest variables) is what gets launched, and a trial of any member
  counts for the class. ``best_for(nbytes)`` picks the fastest class at a message size, so a
  candidate that verifies N tokens gets the set that is fastest at N tokens.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rayspec.screen._base import BaseNcclScreen
from rayspec.screen._base import Env
from rayspec.screen._base import ScreenResult
from rayspec.screen._base import ScreenStatus

__all__ = ["NcclClass", "ScreenReport", "screen_space"]

UNSET = "unset"
_MAX_PASSES = 4
_BATCH = 64


def _score(result: ScreenResult) -> float:
    """Mean log latency over the measured sizes (lower is better; inf when not ok)."""
    if not result.ok:
        return math.inf
    return sum(math.log(max(t, 1e-9)) for _, t in result.latency_us) / len(result.latency_us)


@dataclass(frozen=True)
class NcclClass:
    """Sets the screen cannot tell apart, fastest-measured first.

    Attributes:
        index: rank of the class by its mean latency over the sizes (0 = fastest).
        members: the sets, the representative first (fewest variables set, then fastest).
        result: the measurement that anchors the class (its fastest member's).
    """

    index: int
    members: tuple[Env, ...]
    result: ScreenResult

    @property
    def representative(self) -> Env:
        return self.members[0]

    def latency_at(self, nbytes: float) -> float:
        return self.result.latency_at(nbytes)

    def label(self) -> str:
        rep = " ".join(f"{k.removeprefix('NCCL_')}={v}" for k, v in self.representative)
        return rep or "NCCL default"


def _group(results: Sequence[ScreenResult], tolerance: float) -> tuple[NcclClass, ...]:
    ok = sorted((r for r in results if r.ok), key=lambda r: (_score(r), len(r.env), r.env))
    limit = math.log1p(tolerance)
    groups: list[list[ScreenResult]] = []
    for r in ok:
        for g in groups:
            anchor = g[0]
            if len(anchor.latency_us) == len(r.latency_us) and all(
                abs(math.log(max(a, 1e-9)) - math.log(max(b, 1e-9))) <= limit
                for (_, a), (_, b) in zip(anchor.latency_us, r.latency_us, strict=True)
            ):
                g.append(r)
                break
        else:
            groups.append([r])
    classes = []
    for i, g in enumerate(groups):
        members = sorted(g, key=lambda r: (len(r.env), _score(r), r.env))
        classes.append(NcclClass(i, tuple(m.env for m in members), g[0]))
    return tuple(classes)


@dataclass(frozen=True)
class ScreenReport:
    """The screen's results over a search space, grouped into classes.

    Attributes:
        results: every measured set (failed and hung ones included).
        sizes: the message sizes measured, bytes.
        tolerance: relative latency difference below which two sets are one class.
        source: what answered (the screen's description).
    """

    results: tuple[ScreenResult, ...]
    sizes: tuple[int, ...]
    tolerance: float
    source: str = ""

    @functools.cached_property
    def classes(self) -> tuple[NcclClass, ...]:
        """The ok sets grouped, fastest class first."""
        return _group(self.results, self.tolerance)

    @functools.cached_property
    def _lookup(self) -> dict[Env, NcclClass]:
        return {m: c for c in self.classes for m in c.members}

    def class_of(self, env: Env) -> NcclClass | None:
        """The class ``env`` belongs to (None: not screened, or it failed)."""
        return self._lookup.get(env)

    def representative(self, env: Env) -> Env:
        """The set that stands for ``env``'s class (``env`` itself when not in a class)."""
        cls = self.class_of(env)
        return cls.representative if cls is not None else env

    def failed(self) -> list[ScreenResult]:
        return [r for r in self.results if not r.ok]

    def best_for(self, nbytes: float, *, banned: Iterable[Env] = ()) -> tuple[NcclClass, Env]:
        """The fastest class at ``nbytes`` and the member to launch (never a banned one).

        Raises:
            LookupError: every screened set failed or is banned.
        """
        ban = set(banned)
        ranked = sorted(self.classes, key=lambda c: (c.latency_at(nbytes), c.index))
        for cls in ranked:
            for member in cls.members:
                if member not in ban:
                    return cls, member
        raise LookupError("no NCCL set passed the screen")

    def ranking(self, nbytes: float) -> list[NcclClass]:
        return sorted(self.classes, key=lambda c: (c.latency_at(nbytes), c.index))

    # -- persistence ----------------------------------------------------------------------
    def to_json(self, fingerprint: str = "") -> str:
        return json.dumps(
            {
                "fingerprint": fingerprint,
                "source": self.source,
                "sizes": list(self.sizes),
                "tolerance": self.tolerance,
                "results": [
                    {
                        "env": [list(kv) for kv in r.env],
                        "status": r.status.value,
                        "latency_us": [list(p) for p in r.latency_us],
                        "detail": r.detail,
                        "elapsed_s": r.elapsed_s,
                    }
                    for r in self.results
                ],
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str) -> tuple[ScreenReport, str]:
        """A report and the fingerprint it was saved with.

        Raises:
            ValueError: the text is not a saved report.
        """
        try:
            data: dict[str, Any] = json.loads(text)
            results = tuple(
                ScreenResult(
                    env=tuple((str(k), str(v)) for k, v in r["env"]),
                    status=ScreenStatus(r["status"]),
                    latency_us=tuple((int(s), float(t)) for s, t in r["latency_us"]),
                    detail=str(r.get("detail", "")),
                    elapsed_s=float(r.get("elapsed_s", 0.0)),
                )
                for r in data["results"]
            )
            report = cls(
                results=results,
                sizes=tuple(int(s) for s in data["sizes"]),
                tolerance=float(data["tolerance"]),
                source=str(data.get("source", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a saved NCCL screen: {exc}") from exc
        return report, str(data.get("fingerprint", ""))


def _env_of(assignment: Mapping[str, str]) -> Env:
    return tuple(sorted((k, v) for k, v in assignment.items() if v != UNSET))


def screen_space(
    screen: BaseNcclScreen,
    variables: Sequence[tuple[str, Sequence[str]]],
    full_env: Callable[[Env], Mapping[str, str]],
    sizes: Sequence[int],
    *,
    max_sets: int,
    timeout_s: float,
    tolerance: float,
    also: Iterable[Env] = (),
    progress: Callable[[str], None] | None = None,
) -> ScreenReport:
    """Measure the space's NCCL sets (all of them, or a coordinate descent) and rank them.

    Args:
        screen: what measures.
        variables: the searched variables and their choices (``unset`` included).
        full_env: a set's complete server environment (fixed variables added).
        sizes: message sizes, bytes.
        max_sets: measure every set when the space has at most this many, else descend.
        timeout_s: per set.
        tolerance: sets within this relative latency at every size are one class.
        also: sets to measure in any case (e.g. the enqueued configurations').
        progress: called with a line now and then.
    """
    say = progress or (lambda _line: None)
    sizes = sorted(set(int(s) for s in sizes))
    done: dict[Env, ScreenResult] = {}

    def run(envs: Iterable[Env]) -> None:
        todo = list(dict.fromkeys(e for e in envs if e not in done))
        for i in range(0, len(todo), _BATCH):
            batch = todo[i : i + _BATCH]
            results = screen.measure([full_env(e) for e in batch], sizes, timeout_s=timeout_s)
            for env, res in zip(batch, results, strict=True):
                done[env] = dataclasses.replace(res, env=env)
            if len(todo) > _BATCH:
                say(f"NCCL screen: {min(i + _BATCH, len(todo))}/{len(todo)} sets measured")

    total = math.prod(len(c) for _, c in variables) if variables else 1
    if total <= max_sets:
        names = [n for n, _ in variables]
        run(
            _env_of(dict(zip(names, combo, strict=True)))
            for combo in itertools.product(*(c for _, c in variables))
        )
        run(also)
    else:
        current: dict[str, str] = {n: UNSET for n, _ in variables}
        run([_env_of(current), *also])
        for _ in range(_MAX_PASSES):
            changed = False
            for name, choices in variables:
                if len(done) >= max_sets:
                    break
                trial = {c: _env_of({**current, name: c}) for c in choices}
                run(trial.values())
                best = min(choices, key=lambda c: (_score(done[trial[c]]), c != current[name]))
                if best != current[name]:
                    current[name] = best
                    changed = True
            if not changed or len(done) >= max_sets:
                break
    return ScreenReport(tuple(done.values()), tuple(sizes), tolerance, screen.describe())
