"""The experiment's only reader, :func:`load_config` (the schema is :mod:`rayspec._schema`,
the rules :mod:`rayspec._validate`).

An experiment is a YAML file merged over the typed defaults (the schema), then dotted ``key=value``
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
import functools
import os
import re
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import InterpolationResolutionError
from omegaconf.errors import OmegaConfBaseException

from rayspec._exceptions import ConfigError
from rayspec._schema import ADAPTIVE_SUFFIX
from rayspec._schema import SCHEDULER_KNOBS
from rayspec._schema import SPEC_OFF
from rayspec._schema import UNSET
from rayspec._schema import BenchApi
from rayspec._schema import BenchConfig
from rayspec._schema import ClusterConfig
from rayspec._schema import Engine
from rayspec._schema import ExperimentConfig
from rayspec._schema import NcclScreenConfig
from rayspec._schema import OutputConfig
from rayspec._schema import Sampler
from rayspec._schema import ScenarioConfig
from rayspec._schema import SchedulerSpace
from rayspec._schema import SearchConfig
from rayspec._schema import ServerConfig
from rayspec._schema import SpeculativeSpace
from rayspec._schema import StudyConfig
from rayspec._schema import TwinConfig
from rayspec._text import unsafe_char
from rayspec._validate import check_types
from rayspec._validate import cluster_endpoint
from rayspec._validate import normalise
from rayspec._validate import short
from rayspec._validate import validate
from rayspec._yaml import YAML_MAX_NODES
from rayspec._yaml import expanded_nodes

__all__ = [
    "ADAPTIVE_SUFFIX",
    "BenchApi",
    "BenchConfig",
    "ClusterConfig",
    "Engine",
    "ExperimentConfig",
    "NcclScreenConfig",
    "OutputConfig",
    "SCHEDULER_KNOBS",
    "SPEC_OFF",
    "Sampler",
    "ScenarioConfig",
    "SchedulerSpace",
    "SearchConfig",
    "ServerConfig",
    "SpeculativeSpace",
    "StudyConfig",
    "TwinConfig",
    "UNSET",
    "YAML_MAX_NODES",
    "cluster_endpoint",
    "load_config",
    "validate",
]


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
            nodes = expanded_nodes(node)
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
                f"{key}: {short(value)} holds the control character {ascii(bad)[1:-1]}"
            )
        _load_yaml_text(value, f"override {key}")
        dotlist.append(item)
    source = path
    where = path
    try:
        # One copy of the schema, every layer merged into it in place: OmegaConf.merge would
        # deep-copy the whole config again for each section and override (most of a load's
        # time). unsafe_merge copies nothing; each layer is a node made here and used once.
        merged = _schema()
        for name, layer in layers:
            source = name  # named in the error if this layer does not fit the schema
            for section, body in layer.items():  # one section at a time: named if it fails
                where = f"{name}: {section}"
                OmegaConf.unsafe_merge(merged, OmegaConf.create({section: body}))
        source = "override"
        for item in dotlist:
            where = f"override {item.partition('=')[0]}"
            OmegaConf.unsafe_merge(merged, OmegaConf.from_dotlist([item]))
        where = source = path
        OmegaConf.resolve(merged)
        missing = sorted(OmegaConf.missing_keys(merged))
        if missing:
            raise ConfigError(
                f"{path}: {missing[0]}: a value is required (set it in the file or as "
                f"{missing[0]}=...)"
            )
        cfg = OmegaConf.to_object(merged)
    except InterpolationResolutionError as exc:
        # Resolved once all layers are merged: the key, not a file, is what names it.
        raise ConfigError(_describe_interpolation_error(exc)) from None
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
    check_types(cfg)
    normalise(cfg)
    validate(cfg)
    return cfg


_ENV_MISSING = re.compile(r"Environment variable '([^']*)' not found")


def _describe_interpolation_error(exc: InterpolationResolutionError) -> str:
    """A ``${...}`` that could not be resolved: its key, and for ``${oc.env:X}`` the variable."""
    key = getattr(exc, "full_key", None) or "a value"
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    missing = _ENV_MISSING.search(first)
    if missing:
        var = missing.group(1)
        return (
            f"{key}: ${{oc.env:{var}}}: the environment variable {var} is not set (export it "
            f"before running, or give a default: ${{oc.env:{var},default}})"
        )
    return f"{key}: cannot resolve its ${{...}} interpolation: {first}"


def _describe_omegaconf_error(exc: OmegaConfBaseException) -> str:
    key = getattr(exc, "full_key", None) or ""
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    first = re.sub(r"^Key '([^']+)' not in '\w+'", r"unknown key '\1'", first)
    first = first.replace(". Did you mean one of:", "; did you mean one of")
    first = first.replace(". Did you mean:", "; did you mean").rstrip()
    return f"{key}: {first}" if key else first
