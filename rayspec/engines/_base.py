"""The engine seam: what rayspec needs to know of a serving engine, as one object.

An :class:`Engine` holds everything that differs between engines: how the server's argv is
spelled, which flags the launch owns and which it refuses, the HTTP endpoints of readiness,
cache flush, server info and metrics, how the engine's log reads (failure classes, decode
lines), which versions behave how, which metric keys carry what, how to ask an interpreter
for the engine's version, and which engine a study's pick deploys to. The packages above it
(``server/``, ``bench/``, ``tune/``) adapt the experiment to these calls and never spell an
engine's flag or endpoint themselves.

The engine knows primitives and the leaf types (:class:`~rayspec.LaunchSpec`,
:class:`~rayspec.SpecSettings`), never the experiment config: it sits below ``_config``, which
reads its flag tables. Read like httpx's transports or Optuna's samplers: one base class, one
subclass per engine, instances that differ only in data are one class
(:meth:`Engine.with_process`: the twin is SGLang's dialect run by another module).

docs/engines.md lists what a second engine (vLLM) would implement.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
from collections.abc import Mapping
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any

from rayspec._text import shell_quote

if TYPE_CHECKING:
    from rayspec._exceptions import FailureReason
    from rayspec._types import LaunchSpec
    from rayspec._types import SpecSettings

__all__ = [
    "DecodeBatch",
    "Endpoints",
    "Engine",
    "FlagTable",
    "Installed",
    "LaunchArgs",
    "MetricKeys",
    "Phase",
    "deploy_lines",
    "flag_name",
    "shell_line",
]


class Phase(str, enum.Enum):
    """When a server failure was observed."""

    STARTUP = "startup"  # the server exited before it became ready
    TIMEOUT = "timeout"  # it neither exited nor became ready within the startup timeout
    SERVING = "serving"  # it exited after it had become ready


@dataclasses.dataclass(frozen=True)
class Endpoints:
    """The HTTP paths rayspec calls on a running server.

    Attributes:
        ready: answers 200 once the server can generate (the readiness probe).
        flush: POST empties the prefix cache between runs.
        info: where the server says what it resolved, newest name first (the first that
            answers 200 with a JSON object wins).
        metrics: the Prometheus text exposition.
        probed: every path rayspec polls, whose access-log lines are left out of a failure's
            log tail (they would push the server's own last lines out).
    """

    ready: str
    flush: str
    info: tuple[str, ...]
    metrics: str
    probed: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class FlagTable:
    """The engine's flags that rayspec's checks of ``server.extra_flags``/``search.flags`` name.

    Attributes:
        managed: set by the launch builder from the config; setting them elsewhere would
            contradict the candidate.
        multicast: turn NVLink multicast on (refused unless the experiment allows it).
        from_file: make the engine read more flags from a file, past every check.
        dead: parsed by the engine and never read: searching one measures noise.
        secret: take a secret (an API key): the benchmark client does not send it, and a flag's
            value is written wherever the launch is (best.sh, the trial rows, the logs).
    """

    managed: tuple[str, ...]
    multicast: tuple[str, ...]
    from_file: tuple[str, ...]
    dead: tuple[str, ...]
    secret: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class MetricKeys:
    """The names of the engine's Prometheus series rayspec reads after a run.

    Attributes:
        accept_length: the gauge of the last window's accepted tokens per verify.
        gen_throughput: the gauge of the last window's generation throughput (tok/s).
    """

    accept_length: str
    gen_throughput: str


@dataclasses.dataclass(frozen=True)
class LaunchArgs:
    """One server launch in primitives: what ``server/`` reads from the experiment.

    Attributes:
        python: the interpreter that runs the server.
        model_path: the target model's directory or hub id.
        draft_model_path: the drafter (read only when ``spec`` is set).
        tp_size: tensor-parallel size.
        host: the address the server listens on.
        port: its port.
        spec: the speculative settings, or None for the baseline.
        attention_backend: the attention backend ("" leaves the engine's default).
        max_running_requests: the running-request cap (explicit in both arms).
        cuda_graph_max_bs: the decode CUDA-graph cap.
        mem_fraction_static: the static memory fraction (None: the engine's default).
        chunked_prefill_size: the prefill chunk in tokens, -1 chunking off (None: the engine's
            default; set when ``search.scheduler`` searches it).
        trust_remote_code: pass the engine's trust-remote-code switch.
        enable_metrics: serve the metrics endpoint.
        version: the engine version whose rules the server follows (how overlap is off).
        spelling_version: the version whose flag names the argv uses (the deploy target's:
            a twin launch is spelled as the real one it stands for).
        extra: flags appended as given (the candidate's, the experiment's, the process's own).
    """

    python: str
    model_path: str
    draft_model_path: str
    tp_size: int
    host: str
    port: int
    spec: SpecSettings | None
    attention_backend: str
    max_running_requests: int
    cuda_graph_max_bs: int
    mem_fraction_static: float | None
    trust_remote_code: bool
    enable_metrics: bool
    version: str
    spelling_version: str
    extra: tuple[str, ...] = ()
    chunked_prefill_size: int | None = None


@dataclasses.dataclass(frozen=True)
class DecodeBatch:
    """One decode-window line of a server log; a field the line lacks is None.

    Attributes:
        timestamp: the line's stamp, as printed.
        ranks: the rank prefix, e.g. ``"TP0"`` or ``"DP0 TP0"`` ("" when there is none).
        running_req: requests running in the window.
        num_tokens: tokens held in the KV cache.
        token_usage: the KV cache's share in use.
        accept_len: window mean of accepted drafts + bonus per verify (speculation only).
        accept_rate: the engine's acceptance rate (its definition is the engine's version's).
        graph: whether the window ran in a captured graph.
        gen_throughput_tok_s: tokens generated in the window / window wall time, all requests.
        queue_req: requests waiting.
    """

    timestamp: str | None
    ranks: str
    running_req: int | None
    num_tokens: int | None
    token_usage: float | None
    accept_len: float | None
    accept_rate: float | None
    graph: bool | None
    gen_throughput_tok_s: float | None
    queue_req: int | None


@dataclasses.dataclass(frozen=True)
class Installed:
    """What an interpreter said about the engine it should run.

    Attributes:
        version: the engine's ``__version__``, or None when it could not be imported.
        missing: the engine is not installed for that interpreter at all.
        error: why the import failed (one line), when it failed for another reason.
    """

    version: str | None
    missing: bool = False
    error: str = ""


@dataclasses.dataclass(frozen=True)
class Engine(abc.ABC):
    """One serving engine, as rayspec launches, probes and reads it.

    Attributes:
        name: the value of ``server.engine`` and ``LaunchSpec.engine``.
        label: the engine's name in messages ("SGLang").
        module: the module the server process runs (``python -m <module>``).
        deploys_as: the engine a study's pick is deployed to (its own name for a real
            engine; a simulation deploys to the engine it imitates).
        flags: the flag tables of the config checks.
        endpoints: the HTTP paths of a running server.
        metrics: the metric keys read after a run.
    """

    name: str
    label: str
    module: str
    deploys_as: str
    flags: FlagTable
    endpoints: Endpoints
    metrics: MetricKeys

    def with_process(self, name: str, module: str, *, deploys_as: str | None = None) -> Engine:
        """The same dialect (flags, endpoints, logs, versions) run by another module."""
        return dataclasses.replace(
            self, name=name, module=module, deploys_as=deploys_as or self.deploys_as
        )

    def runs_module(self, argv: Sequence[str]) -> bool:
        """Whether ``argv`` runs this engine's module (``-m <module>`` or its file)."""
        path = self.module.replace(".", "/") + ".py"
        return any(a == self.module or a.replace("\\", "/").endswith(path) for a in argv)

    # -- the launch --------------------------------------------------------------------------

    @abc.abstractmethod
    def launch_argv(self, args: LaunchArgs) -> tuple[str, ...]:
        """The exact argv of one launch (no shell), ``args.extra`` last."""

    @abc.abstractmethod
    def launch_env(self, args: LaunchArgs) -> dict[str, str]:
        """The variables the launch sets for the engine itself (beyond the experiment's)."""

    @abc.abstractmethod
    def reads_as(self, flag: str, protected: tuple[str, ...]) -> str | None:
        """The flag of ``protected`` the engine's argument parser reads ``flag`` as, or None."""

    # -- versions ----------------------------------------------------------------------------

    @abc.abstractmethod
    def unsupported_overlap_off(self, version: str) -> str:
        """Why ``version`` cannot run speculation without its overlap scheduler ("" if it can).

        The text follows the searched value in a config error: ``off <text>``.
        """

    @abc.abstractmethod
    def unsupported_adaptive_steps(self, version: str) -> str:
        """Why ``version`` has no adaptive speculative steps ("" if it has them)."""

    # -- reading the server ------------------------------------------------------------------

    @abc.abstractmethod
    def classify_failure(
        self, log_text: str, returncode: int | None, phase: str | Phase
    ) -> FailureReason:
        """A failure's reason from the server log, its exit status and when it happened."""

    @abc.abstractmethod
    def parse_decode_lines(self, text: str) -> list[DecodeBatch]:
        """Every decode-window line of a server log, in order."""

    # -- the node ----------------------------------------------------------------------------

    @abc.abstractmethod
    def probe(self, python: str, env: Mapping[str, str] | None = None) -> Installed:
        """Ask ``python`` for the engine's version (a subprocess: argv, no shell, a timeout)."""

    @abc.abstractmethod
    def context_length(self, text_config: Mapping[str, Any]) -> int | None:
        """The context length the engine derives from a model's (language) config, or None."""

    @abc.abstractmethod
    def longer_context_allowed(self, env: Mapping[str, str]) -> bool:
        """Whether the server's environment lets the engine take a longer context."""

    @abc.abstractmethod
    def default_capture_ids(self, architecture: str | None, num_layers: int) -> list[int]:
        """The EAGLE-3 drafter's layer ids that match what the engine captures by default."""

    @abc.abstractmethod
    def default_captured_layers(self, architecture: str | None, num_layers: int) -> list[int]:
        """The target layers the engine feeds an EAGLE-3 drafter whose config names no ids."""

    @abc.abstractmethod
    def captured_layers(
        self, architecture: str | None, ids: Sequence[int], num_layers: int
    ) -> list[int]:
        """The target layers the engine feeds an EAGLE-3 drafter whose config names ``ids``."""

    @abc.abstractmethod
    def highest_layer_id(self, architecture: str | None, num_layers: int) -> int:
        """The largest layer id an EAGLE-3 drafter's config may name for the target."""


def flag_name(arg: str) -> str:
    """The flag of ``--flag=value`` (the argument itself otherwise)."""
    return arg.split("=", 1)[0]


def shell_line(launch: LaunchSpec) -> str:
    """The launch as one copy-pastable shell line (for reports; never executed by rayspec)."""
    env = " ".join(f"{k}={shell_quote(v)}" for k, v in launch.env)
    unset = " ".join(f"-u {k}" for k in launch.unset_env)
    prefix = f"env {unset} " if unset else ""
    cmd = " ".join(shell_quote(a) for a in launch.argv)
    return f"{prefix}{env} {cmd}".strip()


def deploy_lines(launch: LaunchSpec, placeholders: Mapping[str, str] | None = None) -> list[str]:
    """The lines of a bash script that run ``launch``: unset, export, then ``exec`` the argv.

    Args:
        launch: the launch to deploy.
        placeholders: argv values written as given instead of quoted (a ``${VAR:?...}``
            expansion for a path the user supplies).
    """
    given = placeholders or {}
    lines = []
    if launch.unset_env:
        lines.append("unset " + " ".join(launch.unset_env))
    lines += [f"export {k}={shell_quote(v)}" for k, v in launch.env]
    argv = [given.get(arg) or shell_quote(arg) for arg in launch.argv]
    lines.append("exec " + " ".join(argv) + ' "$@"')
    return lines
