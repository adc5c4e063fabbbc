"""The experiment's rules beyond types: every check of a loaded config, one line each.

Each problem is one :class:`~rayspec.ConfigError` naming the key or value and what is expected;
the flag rules (what rayspec manages, what turns NVLink multicast on, how SGLang's parser reads
an abbreviation) are the engine object's (:mod:`rayspec.engines`).
"""

from __future__ import annotations

import dataclasses
import keyword
import math
import re
import types
import typing
from typing import Any

from rayspec._exceptions import ConfigError
from rayspec._schema import ADAPTIVE_SUFFIX
from rayspec._schema import OBJECTIVES
from rayspec._schema import OVERLAP_CHOICES
from rayspec._schema import SLO_KEYS
from rayspec._schema import SPEC_MODES
from rayspec._schema import SPEC_OFF
from rayspec._schema import UNSET
from rayspec._schema import BenchConfig
from rayspec._schema import Engine
from rayspec._schema import ExperimentConfig
from rayspec._schema import rate_rung_name
from rayspec._text import unsafe_char
from rayspec.engines import engine_named
from rayspec.engines import flag_name

__all__ = ["RAY_CLIENT_PORT", "check_types", "cluster_endpoint", "normalise", "short", "validate"]

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RESOURCE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.:/-]*$")
_RAY_BUILTIN_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")
_VERSION = re.compile(r"^\d+\.\d+(\.\d+)?([.\w]*)$")
MAX_NAME_LEN = 128
MAX_SEED = 2**32 - 1  # NumPy's and Optuna's samplers take 32-bit seeds

# YAML 1.1 reads unquoted on/off/yes/no as booleans; OmegaConf then stores "True"/"False".
_YAML_BOOL = {"True": "on", "False": "off", "true": "on", "false": "off"}


def normalise(cfg: ExperimentConfig) -> None:
    """Undo YAML's on/off booleans; put ``unset``/``off`` first in choices; drop duplicates."""
    sp = cfg.search.speculative
    sp.modes = [_YAML_BOOL.get(m, m) if _YAML_BOOL.get(m) == SPEC_OFF else m for m in sp.modes]
    sp.overlap = list(dict.fromkeys(_YAML_BOOL.get(str(v), str(v)) for v in sp.overlap))
    for name, choices in list(cfg.search.nccl.items()):
        values = [str(v) for v in choices]
        rest = [v for v in dict.fromkeys(values) if v != UNSET]
        cfg.search.nccl[name] = [UNSET, *rest]
    for flag, flag_choices in list(cfg.search.flags.items()):
        values = [_YAML_BOOL.get(str(v), str(v)) for v in flag_choices]
        # "off" (SGLang's default: the flag is not passed) is always a choice, as "unset" is
        # for NCCL variables: the baseline needs it.
        cfg.search.flags[flag] = ["off", *(v for v in dict.fromkeys(values) if v != "off")]


def _fail(key: str, message: str) -> ConfigError:
    return ConfigError(f"{key}: {message}")


def _leaves(value: Any, key: str) -> list[tuple[str, Any]]:
    """Every value of the config tree with its dotted key; a mapping's keys are values too."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: list[tuple[str, Any]] = []
        for f in dataclasses.fields(value):
            out += _leaves(getattr(value, f.name), f"{key}.{f.name}" if key else f.name)
        return out
    if isinstance(value, dict):
        out = []
        for k, v in value.items():
            out.append((f"{key} key", k))
            out += _leaves(v, f"{key}.{k}")
        return out
    if isinstance(value, list | tuple):
        return [leaf for i, v in enumerate(value) for leaf in _leaves(v, f"{key}[{i}]")]
    return [(key, value)]


def _type_error(value: Any, hint: Any, key: str) -> str | None:
    """Where ``value`` is not of the declared type ``hint`` (OmegaConf lets a list through
    into a ``dict[str, str]`` from an override): the first such key and what it holds."""
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint) and isinstance(value, hint):  # type: ignore[arg-type]
        hints = typing.get_type_hints(hint)
        for f in dataclasses.fields(hint):
            found = _type_error(
                getattr(value, f.name), hints[f.name], f"{key}.{f.name}".lstrip(".")
            )
            if found:
                return found
        return None
    if origin in (types.UnionType, typing.Union):
        errors = [_type_error(value, arg, key) for arg in typing.get_args(hint)]
        return None if any(e is None for e in errors) else errors[0]
    if hint is type(None):
        return None if value is None else f"{key}: expected nothing, got {type(value).__name__}"
    if hint is Any:
        return None
    if origin is dict:
        if not isinstance(value, dict):
            return f"{key}: expected a mapping, got {type(value).__name__}"
        k_hint, v_hint = typing.get_args(hint)
        for k, v in value.items():
            found = _type_error(k, k_hint, f"{key} key") or _type_error(v, v_hint, f"{key}.{k}")
            if found:
                return found
        return None
    if origin is list:
        if not isinstance(value, list):
            return f"{key}: expected a list, got {type(value).__name__}"
        (item_hint,) = typing.get_args(hint)
        for i, item in enumerate(value):
            found = _type_error(item, item_hint, f"{key}[{i}]")
            if found:
                return found
        return None
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return None
    if isinstance(hint, type) and not isinstance(value, hint):
        return f"{key}: expected {hint.__name__}, got {type(value).__name__} {short(str(value))}"
    return None


def short(value: str) -> str:
    text = ascii(value)
    return text if len(text) <= 60 else f"{text[:57]}...'"


def check_types(cfg: ExperimentConfig) -> None:
    wrong = _type_error(cfg, ExperimentConfig, "")
    if wrong:
        raise ConfigError(wrong)


def _validate_values(cfg: ExperimentConfig) -> None:
    """Every value has its declared type, no string carries a control character, and every
    number is finite and fits 64 bits.

    Every string of the experiment can reach a server's argv or environment, ``best.sh`` or
    a progress line; a line break there ends a comment of ``best.sh`` (the next line would
    run). A NaN passes every ``x <= 0`` check (a NaN timeout never times out).
    """
    check_types(cfg)
    for key, value in _leaves(cfg, ""):
        if isinstance(value, str):
            bad = unsafe_char(value)
            if bad is not None:
                raise _fail(
                    key.replace(" key", ""),
                    f"{short(value)} holds the control character {ascii(bad)[1:-1]}; values "
                    "reach the server's command line, its environment and best.sh",
                )
        elif isinstance(value, float) and not math.isfinite(value):
            raise _fail(key, f"{value} is not a finite number")
        elif isinstance(value, int) and not -(2**63) <= value < 2**63:
            # Stored in Parquet's int64 columns and passed to C parsers: past it, a late crash.
            raise _fail(key, f"{value} is out of range (a 64-bit integer)")


def validate(cfg: ExperimentConfig) -> None:
    """Check the rules types alone cannot; raise the first problem as :class:`ConfigError`."""
    s, srv, b = cfg.study, cfg.server, cfg.bench
    _validate_values(cfg)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", s.name):
        raise _fail("study.name", f"{short(s.name)} must be letters, digits, '.', '_' or '-'")
    if len(s.name) > MAX_NAME_LEN:  # a folder and file-name prefix: file names end at 255
        raise _fail("study.name", f"{len(s.name)} characters: at most {MAX_NAME_LEN}")
    for seed_key, seed in (("study.seed", s.seed), ("server.twin.seed", srv.twin.seed)):
        if seed is not None and not 0 <= seed <= MAX_SEED:
            raise _fail(seed_key, f"{seed} must be between 0 and {MAX_SEED} (or empty)")
    _validate_storage(s.storage)
    _validate_cluster(cfg)
    if s.n_trials is not None and s.n_trials < 1:
        raise _fail("study.n_trials", f"{s.n_trials} must be at least 1 (or empty: no cap)")
    if s.max_restarts < 1:
        raise _fail("study.max_restarts", f"{s.max_restarts} must be at least 1")
    if s.max_wall_s is not None and not s.max_wall_s > 0:
        raise _fail("study.max_wall_s", f"{s.max_wall_s} must be a positive number of seconds")
    if not 0.0 < s.start_noise < 0.5:
        raise _fail("study.start_noise", f"{s.start_noise} must be in (0, 0.5), e.g. 0.01")
    if not 0.0 <= s.stop_gain < 0.5:
        raise _fail("study.stop_gain", f"{s.stop_gain} must be in [0, 0.5), e.g. 0.0025")
    if s.n_startup_trials < 0:
        raise _fail("study.n_startup_trials", "must be 0 or more")
    if not 1 <= srv.tp_size <= 64:
        raise _fail("server.tp_size", f"{srv.tp_size} must be between 1 and 64")
    if not 0 <= srv.port <= 65535:
        raise _fail("server.port", f"{srv.port} must be a TCP port (1-65535, or 0: a free one)")
    slots = max(1, cfg.cluster.max_concurrent_trials)
    if srv.port + slots - 1 > 65535:
        raise _fail(
            "server.port",
            f"{srv.port}: {slots} concurrent trials use ports {srv.port}-{srv.port + slots - 1}, "
            "past 65535; choose a lower server.port",
        )
    if not srv.host:
        raise _fail("server.host", "must not be empty (127.0.0.1 keeps the server on loopback)")
    if srv.max_running_requests < 1:
        raise _fail("server.max_running_requests", "must be at least 1")
    if srv.mem_fraction_static is not None and not 0.0 < srv.mem_fraction_static < 1.0:
        raise _fail("server.mem_fraction_static", f"{srv.mem_fraction_static} must be in (0, 1)")
    if srv.cuda_graph_max_bs is not None and srv.cuda_graph_max_bs < 1:
        raise _fail("server.cuda_graph_max_bs", "must be at least 1")
    for t_key, timeout in (
        ("server.startup_timeout_s", srv.startup_timeout_s),
        ("server.stop_timeout_s", srv.stop_timeout_s),
        ("bench.read_timeout_s", b.read_timeout_s),
        ("bench.request_timeout_s", b.request_timeout_s),
    ):
        if not timeout > 0:
            raise _fail(t_key, f"{timeout} must be a positive number of seconds")
    if not b.temperature >= 0:
        raise _fail("bench.temperature", f"{b.temperature} must be 0 (greedy) or more")
    if not _VERSION.match(srv.sglang_version):
        raise _fail(
            "server.sglang_version", f"{srv.sglang_version!r} is not a version like 0.5.23"
        )
    if not _VERSION.match(srv.twin.version):
        raise _fail("server.twin.version", f"{srv.twin.version!r} is not a version like 0.5.23")
    if srv.twin.startup_s < 0:
        raise _fail("server.twin.startup_s", "must be 0 or more")
    spec_on = [m for m in cfg.search.speculative.modes if m != SPEC_OFF]
    if srv.engine is Engine.sglang:
        if not srv.model_path:
            raise _fail(
                "server.model_path",
                "required for engine sglang (the target model's directory or hub id)",
            )
        if spec_on and not srv.draft_model_path:
            raise _fail(
                "server.draft_model_path",
                f"required when search.speculative.modes includes {spec_on[0]}",
            )
        if srv.twin.fault:
            raise _fail("server.twin.fault", "twin options need server.engine: twin")
    _validate_env(cfg)
    _validate_flags(cfg)
    _validate_space(cfg)
    if b.warmup < 0:
        raise _fail("bench.warmup", "must be 0 or more")
    if b.repeats < 1:
        raise _fail("bench.repeats", f"{b.repeats} must be at least 1")
    if b.gate_tokens < 1:
        raise _fail("bench.gate_tokens", f"{b.gate_tokens} must be at least 1")
    if s.expect_accept_length is not None and not s.expect_accept_length >= 1:
        raise _fail(
            "study.expect_accept_length",
            f"{s.expect_accept_length} must be at least 1 (tokens per verify cycle)",
        )
    if b.max_repeats is not None and b.max_repeats < b.repeats:
        raise _fail(
            "bench.max_repeats", f"{b.max_repeats} must be at least bench.repeats ({b.repeats})"
        )
    sc_cfg = cfg.search.nccl_screen
    if sc_cfg.max_sets < 1:
        raise _fail("search.nccl_screen.max_sets", "must be at least 1")
    if sc_cfg.timeout_s <= 0:
        raise _fail("search.nccl_screen.timeout_s", "must be a positive number of seconds")
    if not 0 <= sc_cfg.tolerance < 1:
        raise _fail("search.nccl_screen.tolerance", f"{sc_cfg.tolerance} must be in [0, 1)")
    if sc_cfg.hidden_size is not None and sc_cfg.hidden_size < 1:
        raise _fail("search.nccl_screen.hidden_size", "must be a positive integer")
    if sc_cfg.dtype_bytes not in (1, 2, 4):
        raise _fail("search.nccl_screen.dtype_bytes", "must be 1, 2 or 4")
    if b.max_tokens < 1:
        raise _fail("bench.max_tokens", f"{b.max_tokens} must be at least 1")
    if b.concurrency < 1:
        raise _fail("bench.concurrency", f"{b.concurrency} must be at least 1")
    names = [sc.name for sc in b.scenarios]
    for i, sc in enumerate(b.scenarios):
        key = f"bench.scenarios[{i}]"
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", sc.name) or names.count(sc.name) > 1:
            raise _fail(f"{key}.name", f"{sc.name!r} must be a unique name of letters and digits")
        if sc.concurrency < 1 or sc.requests_per_run < 1 or sc.max_tokens < 1:
            raise _fail(key, "concurrency, requests_per_run and max_tokens must be at least 1")
        for rng_key, rng in (("input_len", sc.input_len), ("output_len", sc.output_len)):
            if rng is not None and (len(rng) != 2 or not 1 <= rng[0] <= rng[1]):
                raise _fail(f"{key}.{rng_key}", f"{rng} must be [low, high] with 1 <= low <= high")
        if sc.request_rate is not None and not sc.request_rate > 0:
            raise _fail(f"{key}.request_rate", "must be a positive number of requests/s")
    _check_ladder(b)
    if s.objective not in OBJECTIVES:
        raise _fail("study.objective", f"{s.objective!r} is not one of {', '.join(OBJECTIVES)}")
    _validate_slo(cfg)
    if s.objective_scenario and s.objective_scenario not in [sc.name for sc in cfg.scenarios()]:
        raise _fail(
            "study.objective_scenario",
            f"{s.objective_scenario!r} is not a scenario of bench.scenarios or bench.ladder "
            f"(those are: {', '.join(sc.name for sc in cfg.scenarios())})",
        )
    if not 0 < s.alpha < 1:
        raise _fail("study.alpha", f"{s.alpha} must be in (0, 1)")
    if not 0 <= s.pick_margin < 1:
        raise _fail("study.pick_margin", f"{s.pick_margin} must be in [0, 1)")
    if s.prune_min_runs < 1:
        raise _fail("study.prune_min_runs", "must be at least 1")
    if not 0 <= s.verify_plan <= 5:
        raise _fail("study.verify_plan", f"{s.verify_plan} must be in [0, 5], e.g. 1")
    if cfg.cluster.max_concurrent_trials < 0:
        raise _fail("cluster.max_concurrent_trials", "must be 0 (auto) or more")
    if cfg.cluster.placement_timeout_s < 0:
        raise _fail(
            "cluster.placement_timeout_s",
            f"{cfg.cluster.placement_timeout_s} must be 0 (wait for ever) or more seconds",
        )
    if not cfg.cluster.dashboard_host:
        raise _fail("cluster.dashboard_host", "must not be empty")
    res = cfg.cluster.node_resource
    if res and (res in _RAY_BUILTIN_RESOURCES or not _RESOURCE_NAME.match(res)):
        raise _fail(
            "cluster.node_resource",
            f"{res!r} is not a custom resource name (letters, digits, _ . - / :; not "
            f"{', '.join(_RAY_BUILTIN_RESOURCES)}), e.g. node_resource=h200",
        )


def _validate_slo(cfg: ExperimentConfig) -> None:
    """``study.slo``: known keys, positive finite milliseconds; ``goodput`` needs one."""
    slo = cfg.study.slo
    for key, value in slo.items():
        if key not in SLO_KEYS:
            raise _fail(f"study.slo.{key}", f"unknown key; expected {' or '.join(SLO_KEYS)}")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _fail(f"study.slo.{key}", f"{value!r} must be a positive number of ms")
        if not (math.isfinite(value) and value > 0):
            raise _fail(f"study.slo.{key}", f"{value} must be a positive number of ms")
    if cfg.study.objective == "goodput" and not slo:
        raise _fail(
            "study.objective",
            f"goodput needs study.slo (one or more of {', '.join(SLO_KEYS)}, in ms)",
        )


def _validate_storage(storage: str) -> None:
    """The form of ``study.storage`` (what the file system says is preflight's job)."""
    if storage != storage.strip():
        raise _fail(
            "study.storage",
            f"{short(storage)} begins or ends with blanks; leave it empty for "
            "<output.dir>/<study.name>/optuna.journal",
        )
    if "://" not in storage:
        return
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError
    from sqlalchemy.exc import NoSuchModuleError

    try:
        url = make_url(storage)
        url.get_dialect()
    except (ArgumentError, NoSuchModuleError, ValueError) as exc:
        raise _fail(
            "study.storage",
            f"{short(storage)} is not a database URL rayspec can open ({exc}); use a journal "
            "file path or sqlite:///path/to/study.db",
        ) from None
    if url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:"):
        raise _fail(
            "study.storage",
            f"{short(storage)} is an in-memory database (nothing kept); use "
            "sqlite:///path/to/study.db",
        )


def _host_port(text: str, key: str, default_port: int | None = None) -> tuple[str, int]:
    host, sep, port_text = text.rpartition(":")
    if not sep:
        host, port_text = text, ""
    host = host.strip("[]")
    if not port_text and default_port is not None:
        return host, default_port
    if not host or not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise _fail(key, f"{short(text)} is not host:port (a TCP port 1-65535)")
    return host, int(port_text)


# Ray's client server (the port of a ray:// address when none is given).
RAY_CLIENT_PORT = 10001


def cluster_endpoint(address: str) -> tuple[str, int] | None:
    """``(host, port)`` that ``cluster.address`` connects to; None for "" and ``auto``.

    Raises:
        ConfigError: the address is not ``auto``, ``host:port`` or ``ray://host[:port]``.
    """
    if address in ("", "auto"):
        return None
    if address.startswith("ray://"):
        return _host_port(address.removeprefix("ray://"), "cluster.address", RAY_CLIENT_PORT)
    if "://" in address:
        raise _fail(
            "cluster.address",
            f"{short(address)}: expected auto, host:port (the head's GCS) or ray://host:port",
        )
    return _host_port(address, "cluster.address")


def _validate_cluster(cfg: ExperimentConfig) -> None:
    cl = cfg.cluster
    for count_key, count in (("cluster.num_gpus", cl.num_gpus), ("cluster.num_cpus", cl.num_cpus)):
        if count is not None and count < 0:
            raise _fail(count_key, f"{count} must be 0 or more (or empty: detected)")
    if not 0 <= cl.dashboard_port <= 65535:
        raise _fail(
            "cluster.dashboard_port",
            f"{cl.dashboard_port} must be a TCP port (1-65535, or 0: a free one)",
        )
    cluster_endpoint(cl.address)


def _validate_env(cfg: ExperimentConfig) -> None:
    names = [("server.env", n) for n in cfg.server.env]
    names += [("search.nccl", n) for n in cfg.search.nccl]
    for where, name in names:
        if not _ENV_NAME.match(name) or keyword.iskeyword(name):
            raise _fail(
                where,
                f"{short(name)} is not a valid environment variable name (letters, digits "
                "and _, not starting with a digit)",
            )
    for name in cfg.server.extra_nccl_vars:
        if not (name.startswith("NCCL_") and _ENV_NAME.match(name)):
            raise _fail("server.extra_nccl_vars", f"{short(name)} is not an NCCL_* name")
    for name in cfg.search.nccl:
        if not name.startswith("NCCL_"):
            raise _fail(f"search.nccl.{name}", "only NCCL_* variables can be searched here")
        if name in cfg.server.env:
            raise _fail(
                f"search.nccl.{name}",
                "is also fixed in server.env; remove it from one of the two",
            )
    if cfg.server.allow_nvlink_multicast:
        return
    nvls_env = cfg.server.env.get("NCCL_NVLS_ENABLE")
    if nvls_env is not None and nvls_env != "0":
        raise _fail(
            "server.env.NCCL_NVLS_ENABLE",
            f"{nvls_env!r} turns NVLink multicast on; only 0 is allowed unless "
            "server.allow_nvlink_multicast: true",
        )
    for value in cfg.search.nccl.get("NCCL_NVLS_ENABLE", []):
        if value not in (UNSET, "0"):
            raise _fail(
                "search.nccl.NCCL_NVLS_ENABLE",
                f"choice {value!r} turns NVLink multicast on; only 0 is allowed unless "
                "server.allow_nvlink_multicast: true",
            )
    algo_values = list(cfg.search.nccl.get("NCCL_ALGO", []))
    if "NCCL_ALGO" in cfg.server.env:
        algo_values.append(cfg.server.env["NCCL_ALGO"])
    for value in algo_values:
        if _enables_nvls(value):
            raise _fail(
                "search.nccl.NCCL_ALGO",
                f"choice {value!r} uses NVLS (NVLink multicast); refused unless "
                "server.allow_nvlink_multicast: true",
            )


def _enables_nvls(algo: str) -> bool:
    """Whether an ``NCCL_ALGO`` value asks for NVLS by name. NCCL's syntax: ``;``-separated
    entries, each ``[function:]names``; ``^names`` means every algorithm but those (so
    ``^NVLS`` turns it off)."""
    for entry in algo.split(";"):
        names = entry.rsplit(":", 1)[-1]
        if names.startswith("^"):
            continue
        if {t.strip().lower() for t in names.split(",")} & {"nvls", "nvlstree"}:
            return True
    return False


def _spelled(flag: str, meant: str, label: str) -> str:
    name = flag_name(flag)
    if name == meant:
        return meant
    return f"{name} ({label} reads it as {meant}: its parser takes unique prefixes)"


def _validate_flags(cfg: ExperimentConfig) -> None:
    # The engine's tables and parser: a flag is checked as the engine will read it.
    engine = engine_named(cfg.server.engine.value)
    tables, label = engine.flags, engine.label
    extra = [a for a in cfg.server.extra_flags if a.startswith("-")]
    searched = list(cfg.search.flags)
    for where, flags in (("server.extra_flags", extra), ("search.flags", searched)):
        for flag in flags:
            name = flag_name(flag)
            if not name.startswith("--"):
                raise _fail(where, f"{short(flag)} must be a long flag starting with --")
            multicast = engine.reads_as(flag, tables.multicast)
            if multicast and not cfg.server.allow_nvlink_multicast:
                raise _fail(
                    where,
                    f"{_spelled(flag, multicast, label)} turns NVLink multicast on; refused "
                    "unless server.allow_nvlink_multicast: true",
                )
            managed = engine.reads_as(flag, tables.managed)
            if managed:
                raise _fail(
                    where,
                    f"{_spelled(flag, managed, label)} is set by rayspec from server.*, "
                    "search.speculative and search.scheduler; set it there instead",
                )
            from_file = engine.reads_as(flag, tables.from_file)
            if from_file:
                raise _fail(
                    where,
                    f"{_spelled(flag, from_file, label)} makes {label} read more flags from a "
                    "file, "
                    "past rayspec's checks; give the flags themselves in server.extra_flags",
                )
            secret = engine.reads_as(flag, tables.secret)
            if secret:
                raise _fail(
                    where,
                    f"{_spelled(flag, secret, label)} takes a key rayspec's benchmark client "
                    "does not send (every request would be refused), and its value would be "
                    "written in best.sh, the trial rows and the logs; tune without it and add "
                    "it to the launch line when you deploy",
                )
            dead = engine.reads_as(flag, tables.dead)
            if dead:
                raise _fail(
                    where,
                    f"{_spelled(flag, dead, label)} is parsed but never read by {label}; "
                    "searching it measures only noise",
                )
    for flag in searched:
        if "=" in flag:
            raise _fail(f"search.flags.{flag}", "name the flag alone; its values are the choices")
        if flag in extra:
            raise _fail(f"search.flags.{flag}", "is also fixed in server.extra_flags")
        if not cfg.search.flags[flag]:
            raise _fail(f"search.flags.{flag}", "needs at least one choice")
        for choice in cfg.search.flags[flag]:
            if choice.startswith("--"):
                raise _fail(
                    f"search.flags.{flag}",
                    f"choice {short(choice)} would be read as a flag of its own",
                )


def _validate_space(cfg: ExperimentConfig) -> None:
    sp = cfg.search.speculative
    if SPEC_OFF not in sp.modes:
        raise _fail(
            "search.speculative.modes",
            f"{sp.modes} must include off: the baseline (no speculation) is trial 0 and "
            "every trial is compared with it",
        )
    for mode in sp.modes:
        if mode != SPEC_OFF and mode not in SPEC_MODES:
            raise _fail(
                "search.speculative.modes",
                f"{mode!r} is not one of {', '.join((SPEC_OFF, *SPEC_MODES))}",
            )
    if not sp.overlap:
        raise _fail("search.speculative.overlap", "needs at least one of on, off")
    for value in sp.overlap:
        if value not in OVERLAP_CHOICES:
            raise _fail("search.speculative.overlap", f"{value!r} is not one of on, off")
    engine = engine_named(cfg.server.engine.value)
    adaptive = [m for m in sp.modes if m.endswith(ADAPTIVE_SUFFIX)]
    version = cfg.server.version
    if "off" in sp.overlap and (why := engine.unsupported_overlap_off(version)):
        raise _fail("search.speculative.overlap", f"off {why}")
    if adaptive and (why := engine.unsupported_adaptive_steps(version)):
        raise _fail("search.speculative.modes", f"{adaptive[0]} {why}")
    if any(m != SPEC_OFF for m in sp.modes):
        for key, values, low in (
            ("num_steps", sp.num_steps, 1),
            ("eagle_topk", sp.eagle_topk, 1),
            ("num_draft_tokens", sp.num_draft_tokens, 2),
        ):
            if not values:
                raise _fail(f"search.speculative.{key}", "needs at least one choice")
            bad = [v for v in values if v < low]
            if bad:
                raise _fail(f"search.speculative.{key}", f"{bad[0]} must be at least {low}")
    for name, choices in cfg.search.nccl.items():
        for value in choices:
            if not value or any(c in value for c in "\n\0"):
                raise _fail(f"search.nccl.{name}", f"choice {value!r} is not a usable value")
    _validate_scheduler(cfg)


def _validate_scheduler(cfg: ExperimentConfig) -> None:
    """``search.scheduler``: SGLang's rules for its knobs (docs/sglang.md, *Scheduler knobs*)."""
    sch, srv = cfg.search.scheduler, cfg.server
    key = "search.scheduler"
    for value in sch.max_running_requests:
        if value < 1:
            raise _fail(f"{key}.max_running_requests", f"{value} must be at least 1")
    for value in sch.cuda_graph_max_bs:
        if value < 1:
            raise _fail(f"{key}.cuda_graph_max_bs", f"{value} must be at least 1")
    for value in sch.chunked_prefill_size:
        if value != -1 and value < 1:
            raise _fail(
                f"{key}.chunked_prefill_size",
                f"{value} must be a positive number of tokens, or -1 (chunked prefill off)",
            )
    # SGLang captures no graph above the running cap (it clamps to the request pool): such a
    # value only repeats the capped one.
    cap = max(sch.max_running_requests or [srv.max_running_requests])
    where = f"{key}.max_running_requests"
    if not sch.max_running_requests:
        where = "server.max_running_requests"
    for value in sch.cuda_graph_max_bs:
        if value > cap:
            raise _fail(
                f"{key}.cuda_graph_max_bs",
                f"{value} is above the running cap ({where}: {cap}); SGLang clamps the graph "
                "to it, so the value only repeats a smaller one",
            )
    if sch.chunked_prefill_size:
        engine = engine_named(srv.engine.value)
        for where, flags in (("server.extra_flags", srv.extra_flags),
                             ("search.flags", list(cfg.search.flags))):  # fmt: skip
            for flag in flags:
                if flag.startswith("-") and engine.reads_as(flag, ("--chunked-prefill-size",)):
                    raise _fail(
                        where,
                        f"{short(flag)} is searched in {key}.chunked_prefill_size; "
                        "set it in one place",
                    )


def _check_ladder(b: BenchConfig) -> None:
    ladder = b.ladder
    if ladder.requests_per_run is not None and ladder.requests_per_run < 1:
        raise _fail("bench.ladder.requests_per_run", f"{ladder.requests_per_run} is below 1")
    if ladder.max_concurrency < 1:
        raise _fail("bench.ladder.max_concurrency", f"{ladder.max_concurrency} is below 1")
    if not (ladder.concurrency or ladder.request_rate):
        return
    if b.scenarios:
        raise _fail("bench.ladder", "set bench.ladder or bench.scenarios, not both")
    if any(n < 1 for n in ladder.concurrency) or len(set(ladder.concurrency)) < len(
        ladder.concurrency
    ):
        raise _fail(
            "bench.ladder.concurrency",
            f"{ladder.concurrency} must be distinct integers of 1 or more",
        )
    names = [rate_rung_name(r) for r in ladder.request_rate]
    if any(not (math.isfinite(r) and r > 0) for r in ladder.request_rate) or len(set(names)) < len(
        names
    ):
        raise _fail(
            "bench.ladder.request_rate",
            f"{ladder.request_rate} must be distinct positive numbers of requests/s",
        )
