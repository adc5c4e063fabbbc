"""Exceptions raised by rayspec.

Every error rayspec raises on purpose derives from :class:`RayspecError`, so a caller can catch
exactly the level it cares about. The whole tree, with where each class lives when it is not
here (a package's own errors stay beside the code that raises them)::

    RayspecError
    ├── ConfigError (also ValueError)  bad experiment file, override or search space (exit code 2)
    │   └── StudyLockedError           tune/_lock.py: another driver holds the study folder
    ├── LaunchError                    a server could not be brought up or kept up
    │   ├── ServerExited               the server process died (return code and log tail attached)
    │   │   └── TwinExitedError        testing/_twin.py: a test's twin process exited before ready
    │   ├── ServerStartTimeout         the server never became ready within the startup timeout
    │   └── SimulatedStartupError      twin/_simulate.py: a simulated start fails as the twin would
    ├── ClusterError                   the Ray cluster failed a trial, not its configuration
    │   ├── NodeLost                   the trial's node died (``node_lost``)
    │   ├── ActorLost                  an actor's worker died or cannot be reached (``actor_lost``)
    │   ├── CallTimeout                a Ray call gave no answer within its timeout
    │   └── PlacementTimeout           tune/_placement.py: no node had the GPUs in time
    ├── BenchError                     the benchmark client failed against a live server
    │   └── StreamStalled              a stream made no progress within the read timeout
    ├── StoreError                     the Parquet store cannot be read or written
    ├── MetricsUnavailable             metrics/_read.py: the study's metrics cannot be read now
    ├── ProfileError (also ValueError) twin/_errors.py: a twin profile is missing or malformed
    ├── NcclError                      twin/_errors.py: a simulated NCCL failure
    │   ├── NcclInitError              at communicator init
    │   │   └── NcclForbiddenError     NVLink multicast asked for where it must stay off
    │   └── NcclNoAlgorithmError       at the first collective
    ├── DraftTreeError (also RuntimeError)  _drafttree.py: draft budget larger than the tree
    └── EngineDead (also RuntimeError) twin/_engine.py: the twin's simulated scheduler crashed

Outside it on purpose: ``screen/_allreduce.py``'s ``Unusable`` (that worker runs by file path
under the servers' interpreter, which need not have rayspec: it imports only the standard
library and torch, and the error leaves it only as an exit status) and ``bench/_client.py``'s
private ``_Partial`` (control flow inside the client: it carries a stream's timeline to
``measure`` next to the typed :class:`BenchError`, which is what leaves the client).

Ray's own errors are translated at one boundary, ``tune/_rayerrors.py``'s ``map_ray_errors``,
into :class:`ClusterError` (or the rayspec error a remote call raised, unwrapped).

A failure's class is the :class:`FailureReason` attribute ``reason``, never something read back
out of the message text.
"""

from __future__ import annotations

import enum


class FailureReason(enum.StrEnum):
    """Why a trial failed; stored verbatim in Parquet and in the Optuna trial's attributes.

    A ``StrEnum``: it is its value as text too (``str()``, f-strings, JSON, ``== "node_lost"``),
    so a line or a stored attribute reads ``node_lost``, never ``FailureReason.NODE_LOST``.
    """

    STARTUP_CRASH = "startup_crash"
    ARGUMENT_ERROR = "argument_error"
    OUT_OF_MEMORY = "out_of_memory"
    CUDA_GRAPH_CAPTURE = "cuda_graph_capture"
    NCCL_INIT = "nccl_init"
    NCCL_FIRST_COLLECTIVE = "nccl_first_collective"
    NEVER_READY = "never_ready"
    CRASH_MID_BENCHMARK = "crash_mid_benchmark"
    STALLED_STREAM = "stalled_stream"
    INVALID_DRAFT_TREE = "invalid_draft_tree"
    WRONG_OUTPUT = "wrong_output"  # fast but not the baseline's greedy output (the gate)
    INFEASIBLE = "infeasible"  # rejected before launch: never cost a server start
    INTERRUPTED = "interrupted"  # the driver died while the trial ran
    NODE_LOST = "node_lost"  # the trial's Ray node died mid-trial; retried once elsewhere
    # The Ray worker process of the trial's server actor died while its node lives (killed, or
    # the host's OOM killer): not the configuration's doing; retried once
    ACTOR_LOST = "actor_lost"
    # No node had the trial's GPUs free within cluster.placement_timeout_s: no server started
    NO_PLACEMENT = "no_placement"
    # The trial's port was held by a process outside the study when its server was to start
    # (past the wait for a previous server to let go): no server started
    PORT_IN_USE = "port_in_use"
    UNKNOWN = "unknown"


# Failures of the cluster or the driver, not of the configuration: they teach the search
# nothing, and the configuration is tried again.
NOT_THE_CONFIG = frozenset(
    {
        FailureReason.INTERRUPTED.value,
        FailureReason.NODE_LOST.value,
        FailureReason.ACTOR_LOST.value,
        FailureReason.NO_PLACEMENT.value,
        FailureReason.PORT_IN_USE.value,
    }
)


class RayspecError(Exception):
    """Root of every error rayspec raises on purpose."""


class ConfigError(RayspecError, ValueError):
    """An experiment file, override or search space is invalid.

    The message is one line that names the key or value and says what is expected.
    """


class LaunchError(RayspecError):
    """A server could not be started or kept running.

    Attributes:
        reason: the classified failure.
        log_tail: the last lines of the server log, if any.
        returncode: the server's exit status, if it exited.
    """

    def __init__(
        self,
        message: str,
        *,
        reason: FailureReason = FailureReason.UNKNOWN,
        log_tail: str = "",
        returncode: int | None = None,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.log_tail = log_tail
        self.returncode = returncode


class ServerExited(LaunchError):
    """The server process exited (before ready, or while serving)."""


class ServerStartTimeout(LaunchError):
    """The server did not become ready within the startup timeout."""


class BenchError(RayspecError):
    """The benchmark client failed against a live server."""

    def __init__(self, message: str, *, reason: FailureReason = FailureReason.UNKNOWN) -> None:
        super().__init__(message)
        self.reason = reason


class StreamStalled(BenchError):
    """A streamed response made no progress within the read timeout."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason=FailureReason.STALLED_STREAM)


class StoreError(RayspecError):
    """The trial store cannot be read or written."""


class ClusterError(RayspecError):
    """The Ray cluster failed a trial (a node, an actor or a call), not its configuration.

    Attributes:
        reason: the classified failure (``node_lost``, ``actor_lost``, ``no_placement``, or
            ``unknown`` for a Ray error that is none of those).
        node: the node that died, as a trial row names it (``"<ip> <node id>"``), if known.
    """

    def __init__(
        self, message: str, *, reason: FailureReason = FailureReason.UNKNOWN, node: str = ""
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.node = node


class NodeLost(ClusterError):
    """The trial's Ray node died while the trial ran."""

    def __init__(self, message: str, *, node: str = "") -> None:
        super().__init__(message, reason=FailureReason.NODE_LOST, node=node)


class ActorLost(ClusterError):
    """An actor's Ray worker died (killed, or the host's OOM killer) or cannot be reached.

    Attributes:
        unreachable: Ray could not reach the actor (its node may be dying) rather than saw
            it die.
    """

    def __init__(self, message: str, *, unreachable: bool = False) -> None:
        super().__init__(message, reason=FailureReason.ACTOR_LOST)
        self.unreachable = unreachable


class CallTimeout(ClusterError):
    """A Ray call gave no answer within its timeout."""
