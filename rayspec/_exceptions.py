"""Exceptions raised by rayspec.

Every error rayspec raises on purpose derives from :class:`RayspecError`, so a caller can catch
exactly the level it cares about::

    RayspecError
    ├── ConfigError              bad experiment file, override or search space (exit code 2)
    ├── LaunchError              a server could not be brought up or kept up
    │   ├── ServerExited         the server process died (return code and log tail attached)
    │   └── ServerStartTimeout   the server never became ready within the startup timeout
    ├── BenchError               the benchmark client failed against a live server
    │   └── StreamStalled        a stream made no progress within the read timeout
    └── StoreError               the Parquet store cannot be read or written

A failure's class is the :class:`FailureReason` attribute ``reason``, never something read back
out of the message text.
"""

from __future__ import annotations

import enum


class FailureReason(str, enum.Enum):
    """Why a trial failed; stored verbatim in Parquet and in the Optuna trial's attributes."""

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
