"""The experiment schema and its only reader, :func:`load_config`.

An experiment is a YAML file merged over the typed defaults below, then dotted ``key=value``
overrides merged over the file (OmegaConf structured config). Everything downstream takes the
typed :class:`ExperimentConfig`; nothing else reads YAML or the environment.

Example::

    cfg = load_config("experiments/eagle3-twin.yaml", ["study.n_trials=40"])
    cfg.study.n_trials  # 40

Every problem is raised as one :class:`~rayspec.ConfigError` whose message names the key or
value and what is expected.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import keyword
import math
import os
import re
import types
import typing
from dataclasses import dataclass
from dataclasses import field
from typing import Any

import yaml
from omegaconf import MISSING
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rayspec._exceptions import ConfigError
from rayspec._text import unsafe_char
from rayspec.engines import engine_named
from rayspec.engines import flag_name

__all__ = [
    "BenchConfig",
    "ClusterConfig",
    "Engine",
    "ExperimentConfig",
    "NcclScreenConfig",
    "OutputConfig",
    "Sampler",
    "ScenarioConfig",
    "SearchConfig",
    "ServerConfig",
    "SpeculativeSpace",
    "StudyConfig",
    "TwinConfig",
    "UNSET",
    "load_config",
]

UNSET = "unset"
"""The search-space choice that leaves a variable out of the server's environment."""

SPEC_OFF = "off"
SPEC_ALGORITHMS = ("EAGLE3", "EAGLE")
# SGLang's adaptive speculative decoding (--speculative-adaptive): "<algorithm>-adaptive".
ADAPTIVE_SUFFIX = "-adaptive"
SPEC_MODES = (*SPEC_ALGORITHMS, *(f"{a}{ADAPTIVE_SUFFIX}" for a in SPEC_ALGORITHMS))
OVERLAP_CHOICES = ("on", "off")

# Per-trial metrics a study can maximise (output tok/s of the objective scenario).
OBJECTIVES = ("tok_s_mean", "tok_s_min", "tok_s_ci95_low", "tok_s_peak")

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RESOURCE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.:/-]*$")
_RAY_BUILTIN_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")
_VERSION = re.compile(r"^\d+\.\d+(\.\d+)?([.\w]*)$")
MAX_NAME_LEN = 128
MAX_SEED = 2**32 - 1  # NumPy's and Optuna's samplers take 32-bit seeds


class Engine(str, enum.Enum):
    sglang = "sglang"
    twin = "twin"


class Sampler(str, enum.Enum):
    structured = "structured"  # rayspec's search (search/_structured.py); Optuna records it
    tpe = "tpe"
    random = "random"
    grid = "grid"


@dataclass
class StudyConfig:
    """The Optuna study and its budget.

    The budget is counted in server launches (``max_restarts``): a reused result or a
    configuration refused before launch costs nothing. ``max_wall_s`` optionally bounds this
    invocation's wall time (no new trial starts after it); ``n_trials`` optionally caps the
    trials told to Optuna. ``storage`` empty means ``<out>/optuna.journal`` (a journal file
    optuna-dashboard opens). ``enqueue`` lists configurations tried first, after the baseline
    (no speculation, NCCL unset), each as ``{param: value}`` with the study's parameter names.
    """

    name: str = MISSING
    max_restarts: int = 30
    max_wall_s: float | None = None
    n_trials: int | None = None
    sampler: Sampler = Sampler.structured
    seed: int | None = 0
    storage: str = ""
    n_startup_trials: int = 6
    enqueue: list[dict[str, Any]] = field(default_factory=list)
    # The objective: a per-trial metric of one scenario ("" = the first), maximised.
    objective: str = "tok_s_mean"
    objective_scenario: str = ""
    # Stop a trial after a run once it cannot beat the incumbent (one-sided 99 % bound).
    pruning: bool = True
    prune_min_runs: int = 1
    # Significance level of the comparisons against the baseline and the incumbent.
    alpha: float = 0.05
    # 0: the pick is the best lower bound (posterior mean - 1 sd). Above 0 (an explicit cost
    # objective): the cheapest configuration (fewer draft tokens, then fewer steps) within this
    # fraction of it.
    pick_margin: float = 0.0
    # Relative sd of a configuration's throughput between server starts (clocks, thermals,
    # placement): the median of a weak prior (a factor of 3 is one sd) that the configurations
    # started more than once update.
    start_noise: float = 0.01
    # The accept length your drafter is known to give (e.g. its best chain's): a trial far below
    # it is flagged (a drafter wired to the wrong layers). Empty: judged by the best chain.
    expect_accept_length: float | None = None


@dataclass
class ClusterConfig:
    """Where trials run. An empty address starts a private local Ray (the embedded default)."""

    address: str = ""
    num_cpus: int | None = None
    # Local cluster only. None: Ray detects real GPUs; the twin declares tp_size fake GPUs.
    num_gpus: int | None = None
    include_dashboard: bool = True
    dashboard_host: str = "127.0.0.1"
    dashboard_port: int = 8265
    # Trials at once; 0: as many as the cluster holds (per node, its GPUs // tp_size).
    max_concurrent_trials: int = 1
    # A Ray custom resource every usable node declares (e.g. "h200": `ray start --resources
    # '{"h200": 1}'`); trials run only on such nodes. "": any node with the GPUs.
    node_resource: str = ""
    # How long a trial (or the NCCL screen) may wait for its GPUs on one node before it is
    # failed and the study stops: the room counted may be held by a job outside the study.
    # 0: wait for ever.
    placement_timeout_s: float = 600.0


@dataclass
class TwinConfig:
    """Options of the digital twin (``server.engine: twin``); passed as ``--twin-*`` flags."""

    profile: str = "kimi-k2.5-tp8-pcie"
    seed: int | None = None  # None: derived from study.seed and the trial number
    startup_s: float = 1.0
    fault: str = ""
    version: str = "0.5.23"


@dataclass
class ServerConfig:
    """How each trial's server is launched; the searched settings come from ``search``."""

    engine: Engine = Engine.sglang
    model_path: str = ""
    draft_model_path: str = ""
    tp_size: int = 8
    host: str = "127.0.0.1"
    port: int = 30000  # concurrent trials on one node use port, port+1, ...
    attention_backend: str = ""
    max_running_requests: int = 48
    cuda_graph_max_bs: int | None = None  # the decode graph cap; flag name by sglang_version
    mem_fraction_static: float | None = None
    trust_remote_code: bool = False
    enable_metrics: bool = True
    sglang_version: str = "0.5.23"
    python: str = ""  # interpreter that runs the server; empty: the one running rayspec
    extra_flags: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    startup_timeout_s: float = 1800.0
    stop_timeout_s: float = 30.0
    allow_nvlink_multicast: bool = False
    # NCCL_* names rayspec does not know that your NCCL reads (engine sglang refuses an
    # unknown one otherwise: NCCL ignores a misspelt variable silently).
    extra_nccl_vars: list[str] = field(default_factory=list)
    twin: TwinConfig = field(default_factory=TwinConfig)

    @property
    def version(self) -> str:
        """The SGLang version whose rules apply: the real one's, or the one the twin emulates."""
        return self.sglang_version if self.engine is Engine.sglang else self.twin.version


@dataclass
class SpeculativeSpace:
    """EAGLE-3 choices.

    ``modes`` holds ``off`` (the baseline), algorithm names (static steps/topk/draft tokens)
    and/or ``EAGLE3-adaptive`` (SGLang's adaptive steps, topk 1: one point of the space).
    ``overlap``: ``[on]`` keeps the speculative overlap scheduler on; ``[on, off]`` also tries
    it off for topk-1 configurations.
    """

    modes: list[str] = field(default_factory=lambda: [SPEC_OFF, "EAGLE3"])
    num_steps: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5, 6])
    eagle_topk: list[int] = field(default_factory=lambda: [1, 2, 4])
    num_draft_tokens: list[int] = field(default_factory=lambda: [2, 3, 4, 6, 8])
    overlap: list[str] = field(default_factory=lambda: ["on"])


@dataclass
class NcclScreenConfig:
    """The NCCL screen: all-reduce latency of each NCCL set before any restart.

    Every set of ``search.nccl`` is measured when there are at most ``max_sets``; otherwise a
    coordinate descent from NCCL's defaults. Sets within ``tolerance`` of each other at every
    message size are one point. ``hidden_size`` (the model's) sets the message sizes; empty:
    from the twin profile, or the model's config.json.
    """

    enabled: bool = True
    max_sets: int = 256
    timeout_s: float = 120.0
    tolerance: float = 0.03
    hidden_size: int | None = None
    dtype_bytes: int = 2


@dataclass
class SearchConfig:
    """The search space. ``unset`` is always a choice of every NCCL variable (added if absent).

    ``nccl`` maps each searched variable to its values; a file's mapping replaces the default
    (empty) one, so only what the experiment lists is searched. ``flags`` maps a server flag to
    its choices; a value ``on``/``off`` makes it a switch.
    """

    nccl: dict[str, list[str]] = field(default_factory=dict)
    speculative: SpeculativeSpace = field(default_factory=SpeculativeSpace)
    flags: dict[str, list[str]] = field(default_factory=dict)
    nccl_screen: NcclScreenConfig = field(default_factory=NcclScreenConfig)


@dataclass
class ScenarioConfig:
    """One load shape; empty ``bench.scenarios`` means one from the top-level bench keys.

    ``input_len``/``output_len`` are optional ``[low, high]`` ranges (words / tokens) drawn per
    request, deterministically; ``request_rate`` (requests/s, Poisson) is optional too.
    """

    name: str = "single"
    concurrency: int = 1
    requests_per_run: int = 1
    max_tokens: int = 500
    input_len: list[int] | None = None
    output_len: list[int] | None = None
    request_rate: float | None = None


@dataclass
class BenchConfig:
    """The measurement protocol; the default is the field's: 1 warm-up, 5 runs of 500 tokens."""

    warmup: int = 1
    repeats: int = 5
    # A result close to the best keeps measuring on the same server up to this many runs
    # (more runs cost seconds, a restart minutes); empty: 8 x repeats; = repeats: never.
    max_repeats: int | None = None
    max_tokens: int = 500
    # The correctness gate: each trial's greedy output against the baseline's; most outputs
    # differing within the first gate_tokens tokens fail the trial as wrong_output.
    check_outputs: bool = True
    gate_tokens: int = 32
    concurrency: int = 1
    prompts: str = "default"
    temperature: float = 0.0
    read_timeout_s: float = 60.0
    request_timeout_s: float = 900.0
    scenarios: list[ScenarioConfig] = field(default_factory=list)


@dataclass
class OutputConfig:
    """Everything of a study goes to ``<dir>/<study.name>/``."""

    dir: str = "runs"


@dataclass
class ExperimentConfig:
    study: StudyConfig = field(default_factory=StudyConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    bench: BenchConfig = field(default_factory=BenchConfig)
    output: OutputConfig = field(default_factory=OutputConfig)

    @property
    def out_dir(self) -> str:
        return os.path.join(self.output.dir, self.study.name)

    @property
    def storage_url(self) -> str:
        return self.study.storage or os.path.join(self.out_dir, "optuna.journal")

    @property
    def max_repeats(self) -> int:
        """The runs a close result may extend to (``bench.max_repeats``, default 8 x repeats)."""
        if self.bench.max_repeats is not None:
            return max(self.bench.max_repeats, self.bench.repeats)
        return 8 * self.bench.repeats

    def scenarios(self) -> list[ScenarioConfig]:
        """The load scenarios, the objective's first (so pruning can stop the rest)."""
        if self.bench.scenarios:
            first = self.study.objective_scenario or self.bench.scenarios[0].name
            ordered = sorted(self.bench.scenarios, key=lambda sc: sc.name != first)
            return list(ordered)
        return [
            ScenarioConfig(
                name="single" if self.bench.concurrency == 1 else f"c{self.bench.concurrency}",
                concurrency=self.bench.concurrency,
                requests_per_run=self.bench.concurrency,
                max_tokens=self.bench.max_tokens,
            )
        ]

    def to_yaml(self) -> str:
        return OmegaConf.to_yaml(OmegaConf.structured(self))


# An alias repeats a node without copying it, OmegaConf then copies every repeat: a file of
# nested aliases (a "billion laughs") would expand past memory. Refused above this many nodes.
YAML_MAX_NODES = 100_000


class _StrictLoader(yaml.SafeLoader):  # type: ignore[misc]
    """PyYAML's safe loader that refuses a key given twice in one mapping (YAML forbids it;
    PyYAML would keep the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` may be overridden
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: the base class says so
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping


def _expanded_nodes(root: yaml.Node) -> int:
    """How many nodes ``root`` holds once every alias is expanded (counted, not built).

    Raises:
        ValueError: an alias refers to a node that contains it (a recursive document).
    """
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:  # iterative: a deeply nested document must not hit the recursion limit
        node, children_done = stack.pop()
        key = id(node)
        if isinstance(node, yaml.ScalarNode):
            sizes[key] = 1
            continue
        children: list[yaml.Node] = (
            [n for pair in node.value for n in pair]
            if isinstance(node, yaml.MappingNode)
            else list(node.value)
        )
        if children_done:
            sizes[key] = 1 + sum(sizes[id(c)] for c in children)
            continue
        if key in sizes:
            if sizes[key] < 0:
                raise ValueError("an alias refers to a node that contains it")
            continue
        sizes[key] = -1  # in progress
        stack.append((node, True))
        for child in children:
            if sizes.get(id(child), 0) < 0:
                raise ValueError("an alias refers to a node that contains it")
            if id(child) not in sizes:
                stack.append((child, False))
    return sizes[id(root)]


def _load_yaml_text(text: str, where: str) -> Any:
    """``text`` as Python data, refusing duplicate keys and alias bombs (ConfigError)."""
    bad = unsafe_char(text.replace("\n", "").replace("\r", "").replace("\t", ""))
    if bad is not None:  # YAML refuses most of them too, with a position but not the key
        line = text[: text.index(bad)].count("\n") + 1
        raise ConfigError(f"{where}: line {line} holds the control character {ascii(bad)[1:-1]}")
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        try:
            nodes = _expanded_nodes(node)
        except ValueError as exc:
            raise ConfigError(f"{where}: invalid YAML: {exc}") from None
        if nodes > YAML_MAX_NODES:
            raise ConfigError(
                f"{where}: its aliases expand to {nodes:,} values (at most {YAML_MAX_NODES:,}); "
                "write the values out or use fewer aliases"
            )
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"{where}: invalid YAML{at}: {problem}") from exc
    except RecursionError:
        raise ConfigError(f"{where}: invalid YAML: nested too deeply") from None
    finally:
        loader.dispose()


def _read_yaml(path: str) -> dict[str, Any]:
    path = os.fspath(path)  # a pathlib.Path works too
    bad = unsafe_char(path)
    if bad is not None:
        raise ConfigError(
            f"{ascii(path)}: the file name holds a control character ({ascii(bad)}); rename it"
        )
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the experiment file ({exc.strerror})") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start}); "
            "save the experiment file as UTF-8"
        ) from None
    loaded = _load_yaml_text(text, path)
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(
            f"{path}: expected a mapping of sections (study, server, ...) at top level"
        )
    return loaded


@functools.lru_cache(maxsize=1)
def _schema_once() -> Any:
    return OmegaConf.structured(ExperimentConfig)


def _schema() -> Any:
    """The typed defaults, built once (OmegaConf takes tens of ms): a copy to merge into."""
    return copy.deepcopy(_schema_once())


def load_config(path: str, overrides: list[str] | tuple[str, ...] = ()) -> ExperimentConfig:
    """Read an experiment file and overrides into a validated :class:`ExperimentConfig`.

    Args:
        path: the experiment YAML.
        overrides: dotted ``key=value`` strings merged over the file, in order. An item without
            ``=`` that names a ``.yaml``/``.yml`` file is merged as a whole (for example a
            ``clusters/*.yaml`` section).

    Raises:
        ConfigError: one line naming the key or value and what is expected.
    """
    layers: list[tuple[str, dict[str, Any]]] = [(path, _read_yaml(path))]
    dotlist: list[str] = []
    for item in overrides:
        if "=" not in item and item.endswith((".yaml", ".yml")):
            layers.append((item, _read_yaml(item)))
            continue
        if "=" not in item or item.startswith(("=", "+")):
            raise ConfigError(
                f"override {item!r}: expected dotted.key=value (e.g. study.n_trials=40)"
            )
        key, _, value = item.partition("=")
        bad = unsafe_char(value)
        if bad is not None:
            raise ConfigError(
                f"{key}: {_short(value)} holds the control character {ascii(bad)[1:-1]}"
            )
        _load_yaml_text(value, f"override {key}")
        dotlist.append(item)
    source = path
    where = path
    try:
        merged = _schema()
        for name, layer in layers:
            source = name  # named in the error if this layer does not fit the schema
            for section, body in layer.items():  # one section at a time: named if it fails
                where = f"{name}: {section}"
                merged = OmegaConf.merge(merged, OmegaConf.create({section: body}))
        source = "override"
        for item in dotlist:
            where = f"override {item.partition('=')[0]}"
            merged = OmegaConf.merge(merged, OmegaConf.from_dotlist([item]))
        where = source = path
        OmegaConf.resolve(merged)
        missing = sorted(OmegaConf.missing_keys(merged))
        if missing:
            raise ConfigError(
                f"{path}: {missing[0]}: a value is required (set it in the file or as "
                f"{missing[0]}=...)"
            )
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{source}: {_describe_omegaconf_error(exc)}") from exc
    except yaml.YAMLError as exc:  # a malformed override value
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"override: invalid value ({first})") from exc
    except RecursionError:
        raise ConfigError(f"{where}: nested too deeply") from None
    except (TypeError, ValueError) as exc:  # OmegaConf's own, e.g. a list merged into a mapping
        raise ConfigError(f"{where}: {str(exc).splitlines()[0] if str(exc) else exc!r}") from None
    if not isinstance(cfg, ExperimentConfig):  # to_object of this schema always is
        raise ConfigError(f"{path}: not an experiment (expected study, server, ... sections)")
    # Types first: normalising reads the values as their declared types (a list inside
    # search.speculative.modes was a TypeError traceback there).
    _check_types(cfg)
    _normalise(cfg)
    validate(cfg)
    return cfg


def _describe_omegaconf_error(exc: OmegaConfBaseException) -> str:
    key = getattr(exc, "full_key", None) or ""
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    first = re.sub(r"^Key '([^']+)' not in '\w+'", r"unknown key '\1'", first)
    first = first.replace(". Did you mean one of:", "; did you mean one of")
    first = first.replace(". Did you mean:", "; did you mean").rstrip()
    return f"{key}: {first}" if key else first


# YAML 1.1 reads unquoted on/off/yes/no as booleans; OmegaConf then stores "True"/"False".
_YAML_BOOL = {"True": "on", "False": "off", "true": "on", "false": "off"}


def _normalise(cfg: ExperimentConfig) -> None:
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
        return f"{key}: expected {hint.__name__}, got {type(value).__name__} {_short(str(value))}"
    return None


def _short(value: str) -> str:
    text = ascii(value)
    return text if len(text) <= 60 else f"{text[:57]}...'"


def _check_types(cfg: ExperimentConfig) -> None:
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
    _check_types(cfg)
    for key, value in _leaves(cfg, ""):
        if isinstance(value, str):
            bad = unsafe_char(value)
            if bad is not None:
                raise _fail(
                    key.replace(" key", ""),
                    f"{_short(value)} holds the control character {ascii(bad)[1:-1]}; values "
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
        raise _fail("study.name", f"{_short(s.name)} must be letters, digits, '.', '_' or '-'")
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
    if s.n_startup_trials < 0:
        raise _fail("study.n_startup_trials", "must be 0 or more")
    if not 1 <= srv.tp_size <= 64:
        raise _fail("server.tp_size", f"{srv.tp_size} must be between 1 and 64")
    if not 1 <= srv.port <= 65535:
        raise _fail("server.port", f"{srv.port} must be a TCP port (1-65535)")
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
    if s.objective not in OBJECTIVES:
        raise _fail("study.objective", f"{s.objective!r} is not one of {', '.join(OBJECTIVES)}")
    if s.objective_scenario and s.objective_scenario not in [sc.name for sc in cfg.scenarios()]:
        raise _fail(
            "study.objective_scenario",
            f"{s.objective_scenario!r} is not a scenario of bench.scenarios",
        )
    if not 0 < s.alpha < 1:
        raise _fail("study.alpha", f"{s.alpha} must be in (0, 1)")
    if not 0 <= s.pick_margin < 1:
        raise _fail("study.pick_margin", f"{s.pick_margin} must be in [0, 1)")
    if s.prune_min_runs < 1:
        raise _fail("study.prune_min_runs", "must be at least 1")
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


def _validate_storage(storage: str) -> None:
    """The form of ``study.storage`` (what the file system says is preflight's job)."""
    if storage != storage.strip():
        raise _fail(
            "study.storage",
            f"{_short(storage)} begins or ends with blanks; leave it empty for "
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
            f"{_short(storage)} is not a database URL rayspec can open ({exc}); use a journal "
            "file path or sqlite:///path/to/study.db",
        ) from None
    if url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:"):
        raise _fail(
            "study.storage",
            f"{_short(storage)} is an in-memory database (nothing kept); use "
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
        raise _fail(key, f"{_short(text)} is not host:port (a TCP port 1-65535)")
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
            f"{_short(address)}: expected auto, host:port (the head's GCS) or ray://host:port",
        )
    return _host_port(address, "cluster.address")


def _validate_cluster(cfg: ExperimentConfig) -> None:
    cl = cfg.cluster
    for count_key, count in (("cluster.num_gpus", cl.num_gpus), ("cluster.num_cpus", cl.num_cpus)):
        if count is not None and count < 0:
            raise _fail(count_key, f"{count} must be 0 or more (or empty: detected)")
    if not 1 <= cl.dashboard_port <= 65535:
        raise _fail("cluster.dashboard_port", f"{cl.dashboard_port} must be a TCP port (1-65535)")
    cluster_endpoint(cl.address)


def _validate_env(cfg: ExperimentConfig) -> None:
    names = [("server.env", n) for n in cfg.server.env]
    names += [("search.nccl", n) for n in cfg.search.nccl]
    for where, name in names:
        if not _ENV_NAME.match(name) or keyword.iskeyword(name):
            raise _fail(
                where,
                f"{_short(name)} is not a valid environment variable name (letters, digits "
                "and _, not starting with a digit)",
            )
    for name in cfg.server.extra_nccl_vars:
        if not (name.startswith("NCCL_") and _ENV_NAME.match(name)):
            raise _fail("server.extra_nccl_vars", f"{_short(name)} is not an NCCL_* name")
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
                raise _fail(where, f"{_short(flag)} must be a long flag starting with --")
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
                    f"{_spelled(flag, managed, label)} is set by rayspec from server.* and "
                    "search.speculative; set it there instead",
                )
            from_file = engine.reads_as(flag, tables.from_file)
            if from_file:
                raise _fail(
                    where,
                    f"{_spelled(flag, from_file, label)} makes {label} read more flags from a "
                    "file, "
                    "past rayspec's checks; give the flags themselves in server.extra_flags",
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
                    f"choice {_short(choice)} would be read as a flag of its own",
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
