"""The checks before a study is opened: whether a stored study may be resumed by this
experiment (its trials must be comparable with the ones the experiment would add, and Optuna
must be able to sample its space), a grid small enough to walk, queued configurations inside
the space.

Two measurements are comparable when the same server (engine and its version, model and draft
and their ``config.json``, the twin's profile file, tensor parallelism, the fixed server
settings and environment) served the same load (warm-up, runs, tokens, concurrency, scenarios
or ladder, API, temperature, the prompts' file) judged the same way (objective, SLO, the
correctness gate's settings). :func:`measurement_fingerprint` writes that down, one entry per
experiment key, and a new study keeps it (the study attribute ``measured_with``). A resume with
a different fingerprint is refused in one line naming the keys that changed; the keys of
:data:`RESUME_MAY_CHANGE` (budget, timeouts, where it runs, how the search decides) change
nothing that is measured and may change freely. The search space itself is checked as Optuna
needs it (the same parameters and choices).

A study kept before the fingerprint existed adopts the experiment's with one warning (nothing
it could be compared with was kept), as does an entry a newer rayspec added to the fingerprint.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import json
import os
from collections.abc import Mapping
from importlib import resources
from typing import Any

from optuna.trial import FrozenTrial

from rayspec._config import ExperimentConfig
from rayspec._config import Sampler
from rayspec._exceptions import ConfigError
from rayspec._text import one_line
from rayspec.search._space import SearchSpace
from rayspec.search._stored import load_stored

__all__ = [
    "ATTR_MEASURED_WITH",
    "GRID_MAX_POINTS",
    "IDENTITY_KEYS",
    "RESUME_MAY_CHANGE",
    "check_grid",
    "check_resumable",
    "check_same_experiment",
    "check_stored_choices",
    "measurement_fingerprint",
    "space_fingerprint",
    "validate_enqueue",
]

ATTR_MEASURED_WITH = "measured_with"  # the study attribute holding the fingerprint
# Keys whose change names another study (a new folder or storage), never a resume.
IDENTITY_KEYS = ("study.name", "output.dir", "study.storage")
# What a resume may change: nothing any trial measured depends on it
# (docs/config.md, *Resuming a study*).
RESUME_MAY_CHANGE = (
    # the budget
    "study.max_restarts", "study.max_wall_s", "study.n_trials", "study.verify_plan",
    # how the search decides what to measure next, and how the pick is read from what it did
    "study.sampler", "study.seed", "study.n_startup_trials", "study.enqueue", "study.pruning",
    "study.prune_min_runs", "study.alpha", "study.pick_margin", "study.start_noise",
    "study.stop_gain", "study.expect_accept_length", "bench.max_repeats", "search.nccl_screen.*",
    # timeouts
    "bench.read_timeout_s", "bench.request_timeout_s", "server.startup_timeout_s",
    "server.stop_timeout_s",
    # where and how it runs
    "cluster.*", "server.host", "server.port", "server.python", "server.enable_metrics",
    "server.trust_remote_code", "server.extra_nccl_vars", "server.twin.seed",
    "server.twin.startup_s",
)  # fmt: skip
# The searched space: checked as Optuna needs it (check_same_experiment, check_stored_choices).
SPACE_KEYS = ("search.nccl", "search.speculative.*", "search.flags", "search.scheduler.*")
# The most configurations study.sampler=grid may walk. Those in experiments/ have 25,515 each; a
# grid of millions would never finish, and Optuna holds and shuffles every point on each open.
GRID_MAX_POINTS = 100_000
_HASH_BYTES = 64 * 1024 * 1024  # a file hashed past this many bytes counts its size only
_CONTENT = "#content"  # an entry holding a file's hash, after the key that names the file


def _digest(path: str) -> str:
    """``sha256:`` of a file's first bytes and its size ("" when it cannot be read)."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            h.update(fh.read(_HASH_BYTES))
            size = os.fstat(fh.fileno()).st_size
    except OSError:
        return ""
    return f"sha256:{h.hexdigest()[:16]} ({size} bytes)"


def _secret_free(value: Any) -> str:
    """A value that may hold secrets (the fixed environment, extra flags) as its hash only."""
    text = json.dumps(value, sort_keys=True)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def _prompts_file(name_or_path: str) -> str:
    """The file a prompt set is read from (as ``bench.load_dataset`` resolves it)."""
    builtin = resources.files("rayspec.bench").joinpath("prompts", f"{name_or_path}.jsonl")
    if builtin.is_file():
        return str(builtin)
    return os.path.expanduser(name_or_path)


def _profile_file(name_or_path: str) -> str:
    """The file a twin profile is read from (a built-in name's, or the path)."""
    builtin = resources.files("rayspec.twin").joinpath("profiles", f"{name_or_path}.yaml")
    return str(builtin) if builtin.is_file() else name_or_path


def measurement_fingerprint(cfg: ExperimentConfig) -> dict[str, str]:
    """What makes this experiment's measurements comparable with a stored study's: experiment
    key -> its value as JSON (``key#content``: the hash of the file the key names, where it
    can be read; secrets-bearing values as their hash only)."""
    srv, bench, study = cfg.server, cfg.bench, cfg.study
    # Every key whatever the engine: the twin's keys of a real study (or SGLang's version of
    # a twin one) are the same on each run, and a key the engine ignores today may not be.
    plain: dict[str, Any] = {
        "server.engine": srv.engine.value,
        "server.sglang_version": srv.sglang_version,
        "server.twin.version": srv.twin.version,
        "server.twin.fault": srv.twin.fault,
        "server.model_path": srv.model_path,
        "server.draft_model_path": srv.draft_model_path,
        "server.tp_size": srv.tp_size,
        "server.attention_backend": srv.attention_backend,
        "server.max_running_requests": srv.max_running_requests,
        "server.cuda_graph_max_bs": srv.cuda_graph_max_bs,
        "server.mem_fraction_static": srv.mem_fraction_static,
        "server.allow_nvlink_multicast": srv.allow_nvlink_multicast,
        "bench.warmup": bench.warmup,
        "bench.repeats": bench.repeats,
        "bench.max_tokens": bench.max_tokens,
        "bench.concurrency": bench.concurrency,
        "bench.scenarios": [dataclasses.asdict(sc) for sc in bench.scenarios],
        **{f"bench.ladder.{k}": v for k, v in dataclasses.asdict(bench.ladder).items()},
        "bench.api": bench.api.value,
        "bench.temperature": bench.temperature,
        "bench.check_outputs": bench.check_outputs,
        "bench.gate_tokens": bench.gate_tokens,
        "study.objective": study.objective,
        "study.objective_scenario": study.objective_scenario,
        "study.slo": dict(sorted(study.slo.items())),
    }
    out = {key: json.dumps(value, sort_keys=True) for key, value in plain.items()}
    out["server.env"] = _secret_free(dict(srv.env))
    out["server.extra_flags"] = _secret_free(list(srv.extra_flags))
    files = {
        "bench.prompts": _prompts_file(bench.prompts),
        "server.twin.profile": _profile_file(srv.twin.profile),
    }
    for key, model in (("server.model_path", srv.model_path),
                       ("server.draft_model_path", srv.draft_model_path)):  # fmt: skip
        if model:
            files[key] = os.path.join(os.path.expanduser(model), "config.json")
    for key, path in files.items():
        digest = _digest(path) if os.path.isfile(path) else ""
        if digest:
            out[key + _CONTENT] = json.dumps(digest)
    # A prompt set or profile is its content: the same file under another name is the same.
    for key, name in (("bench.prompts", bench.prompts), ("server.twin.profile", srv.twin.profile)):
        if key + _CONTENT not in out:
            out[key] = json.dumps(name)
    return out


def _shown(value: Any) -> str:
    try:
        text = json.loads(value) if isinstance(value, str) else value
    except ValueError:
        text = value
    shown = text if isinstance(text, str) else json.dumps(text, sort_keys=True, default=str)
    shown = one_line(str(shown)) or "none"
    return shown if len(shown) <= 60 else shown[:59] + "…"


def fingerprint_changes(stored: Mapping[str, Any], current: Mapping[str, str]) -> list[str]:
    """The keys whose entries differ, each as ``key (was X, now Y)``; an entry on one side
    only is no change (unreadable there, or added by a newer rayspec)."""
    out = []
    for key in sorted(set(stored) & set(current)):
        old, new = stored[key], current[key]
        if old == new:
            continue
        if key.endswith(_CONTENT):
            name = key.removesuffix(_CONTENT)
            out.append(f"{name} (its file's content changed: {_shown(old)}, now {_shown(new)})")
        elif key in ("server.env", "server.extra_flags"):
            out.append(f"{key} (changed)")
        else:
            out.append(f"{key} (was {_shown(old)}, now {_shown(new)})")
    return out


def _check_fingerprint(cfg: ExperimentConfig, attrs: Mapping[str, Any], where: str) -> None:
    stored = attrs.get(ATTR_MEASURED_WITH)
    if not isinstance(stored, Mapping):
        return
    changes = fingerprint_changes(stored, measurement_fingerprint(cfg))
    if not changes:
        return
    keys = ", ".join(dict.fromkeys(c.split(" ", 1)[0] for c in changes))
    raise ConfigError(
        f"{keys}: {where} was measured with other settings, and its trials could not be "
        f"compared with new ones: {'; '.join(changes)}; restore them to resume it, or start a "
        "new study with another study.name (or output.dir)"
    )


def adopts_fingerprint(attrs: Mapping[str, Any], has_trials: bool) -> str:
    """The warning for a stored study without a fingerprint ("" when it has one, or nothing
    of it was measured yet)."""
    if ATTR_MEASURED_WITH in attrs or not has_trials:
        return ""
    return (
        "this study was kept by an older rayspec, without the settings its trials were "
        "measured with: it adopts this experiment's, so a change of any of them since (the "
        "load, the prompts, the model or profile, the objective) cannot be detected"
    )


def space_fingerprint(space: SearchSpace) -> str:
    """The searched parameters and their choices: Optuna cannot resume across a change."""
    return json.dumps(space.grid(), sort_keys=True)


def check_same_experiment(
    cfg: ExperimentConfig, space: SearchSpace, attrs: Mapping[str, Any]
) -> None:
    """Refuse a stored study measured otherwise, or of another engine or search space.

    Raises:
        ConfigError: one line naming the keys that changed.
    """
    where = f"study {cfg.study.name!r} in {cfg.storage_url}"
    engine = cfg.server.engine.value
    if attrs.get("engine", engine) != engine:
        raise ConfigError(
            f"server.engine: {where} was run with engine {attrs['engine']}; choose another "
            f"study.name for engine {engine}"
        )
    _check_fingerprint(cfg, attrs, where)
    stored = attrs.get("space")
    if stored is not None and stored != space_fingerprint(space):
        old, new = json.loads(stored), space.grid()
        changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        raise ConfigError(
            f"search: {where} was created with other choices for {', '.join(changed)}; "
            "restore them or choose another study.name (Optuna cannot resume a changed space)"
        )


def check_stored_choices(
    cfg: ExperimentConfig, space: SearchSpace, trials: list[FrozenTrial]
) -> None:
    """Every parameter the stored trials used must have the same choices in this space."""
    ours: dict[str, list[Any]] = dict(space.grid())
    for k in space.num_steps:
        for m in space.eagle_topk:
            name, budgets = space.ndt_param(k, m)
            ours[name] = list(budgets)
    changed = set()
    for t in trials:
        for name, dist in t.distributions.items():
            choices = getattr(dist, "choices", None)
            if name in ours and choices is not None and list(choices) != ours[name]:
                changed.add(name)
            elif name not in ours:
                changed.add(name)
    if changed:
        raise ConfigError(
            f"search: study {cfg.study.name!r} in {cfg.storage_url} was created with other "
            f"choices for {', '.join(sorted(changed))}; restore them or choose another "
            "study.name (Optuna cannot resume a changed space)"
        )


def check_resumable(cfg: ExperimentConfig, space: SearchSpace) -> list[str]:
    """Before anything starts: refuse to resume a stored study of another experiment.

    Returns:
        Warnings (a study kept without a fingerprint adopts this experiment's).

    Raises:
        ConfigError: one line naming what changed and how to start a new study instead.
    """
    stored = load_stored(cfg)
    if stored is None:
        return []
    attrs, trials = stored
    check_same_experiment(cfg, space, attrs)
    check_stored_choices(cfg, space, trials)
    warning = adopts_fingerprint(attrs, bool(trials))
    return [warning] if warning else []


def may_change(key: str) -> bool:
    """Whether a resume may change ``key`` (an experiment key, dotted)."""
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in RESUME_MAY_CHANGE)


def check_grid(cfg: ExperimentConfig, space: SearchSpace) -> None:
    """Refuse ``study.sampler: grid`` on a space too large to walk (before anything starts).

    Raises:
        ConfigError: one line naming ``study.sampler`` and the grid's size.
    """
    if cfg.study.sampler is not Sampler.grid:
        return
    points = space.size()
    if points > GRID_MAX_POINTS:
        raise ConfigError(
            f"study.sampler: grid would try {points:,} configurations (at most "
            f"{GRID_MAX_POINTS:,}); declare fewer choices under search, or use "
            "study.sampler=structured, tpe or random"
        )


def validate_enqueue(cfg: ExperimentConfig, space: SearchSpace) -> None:
    """Check ``study.enqueue`` against the space before anything starts."""
    for i, params in enumerate(cfg.study.enqueue):
        try:
            space.candidate(space.coerce(params))
        except ConfigError as exc:
            raise ConfigError(f"study.enqueue[{i}].{exc}") from exc
        except (KeyError, ValueError) as exc:
            raise ConfigError(f"study.enqueue[{i}]: {exc}") from exc
