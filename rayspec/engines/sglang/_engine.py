"""SGLang as an :class:`~rayspec.engines.Engine`: its tables and its modules behind one object."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rayspec._exceptions import FailureReason
from rayspec.engines._base import DecodeBatch
from rayspec.engines._base import Endpoints
from rayspec.engines._base import Engine
from rayspec.engines._base import FlagTable
from rayspec.engines._base import Installed
from rayspec.engines._base import LaunchArgs
from rayspec.engines._base import MetricKeys
from rayspec.engines._base import Phase
from rayspec.engines.sglang import _eagle
from rayspec.engines.sglang._argv import sglang_argv
from rayspec.engines.sglang._argv import sglang_env
from rayspec.engines.sglang._classify import classify_failure
from rayspec.engines.sglang._context import context_length
from rayspec.engines.sglang._context import longer_context_allowed
from rayspec.engines.sglang._flags import DEAD_FLAGS
from rayspec.engines.sglang._flags import FILE_FLAGS
from rayspec.engines.sglang._flags import MANAGED_FLAGS
from rayspec.engines.sglang._flags import MULTICAST_FLAGS
from rayspec.engines.sglang._flags import SECRET_FLAGS
from rayspec.engines.sglang._flags import sglang_reads_as
from rayspec.engines.sglang._logparse import parse_decode_lines
from rayspec.engines.sglang._probe import probe_sglang
from rayspec.engines.sglang._versions import SERVER_INFO_PATHS
from rayspec.engines.sglang._versions import SGLANG_VERSIONS
from rayspec.engines.sglang._versions import SGLangFeatures
from rayspec.engines.sglang._versions import sglang_features

__all__ = ["SGLANG", "SGLangEngine"]


def _first_since(has: Callable[[SGLangFeatures], bool]) -> str:
    """The first version of the table that has a feature."""
    return next(str(row.since) for row in SGLANG_VERSIONS if has(row))


@dataclass(frozen=True)
class SGLangEngine(Engine):
    """SGLang's dialect: ``sglang.launch_server``'s flags, HTTP API, logs and versions."""

    def launch_argv(self, args: LaunchArgs) -> tuple[str, ...]:
        return sglang_argv(self.module, args)

    def launch_env(self, args: LaunchArgs) -> dict[str, str]:
        return sglang_env(args)

    def reads_as(self, flag: str, protected: tuple[str, ...]) -> str | None:
        return sglang_reads_as(flag, protected)

    def unsupported_overlap_off(self, version: str) -> str:
        if sglang_features(version).spec_v2_switch:
            return ""
        since = _first_since(lambda row: bool(row.spec_v2_switch))
        return (
            f"needs {self.label} {since} or later (EAGLE already runs without the overlap "
            f"scheduler in {version})"
        )

    def unsupported_adaptive_steps(self, version: str) -> str:
        if sglang_features(version).adaptive_spec:
            return ""
        since = _first_since(lambda row: row.adaptive_spec)
        return (
            f"needs {self.label} {since} or later (--speculative-adaptive); "
            f"this experiment runs {version}"
        )

    def classify_failure(
        self, log_text: str, returncode: int | None, phase: str | Phase
    ) -> FailureReason:
        return classify_failure(log_text, returncode, phase)

    def parse_decode_lines(self, text: str) -> list[DecodeBatch]:
        return parse_decode_lines(text)

    def probe(self, python: str, env: Mapping[str, str] | None = None) -> Installed:
        return probe_sglang(python, env)

    def context_length(self, text_config: Mapping[str, Any]) -> int | None:
        return context_length(text_config)

    def longer_context_allowed(self, env: Mapping[str, str]) -> bool:
        return longer_context_allowed(env)

    def default_capture_ids(self, architecture: str | None, num_layers: int) -> list[int]:
        return _eagle.default_capture_ids(architecture, num_layers)

    def default_captured_layers(self, architecture: str | None, num_layers: int) -> list[int]:
        return _eagle.default_captured_layers(architecture, num_layers)

    def captured_layers(
        self, architecture: str | None, ids: Sequence[int], num_layers: int
    ) -> list[int]:
        return _eagle.captured_layers(architecture, ids, num_layers)

    def highest_layer_id(self, architecture: str | None, num_layers: int) -> int:
        return num_layers if _eagle.keeps_last_layer(architecture) else num_layers - 1


SGLANG = SGLangEngine(
    name="sglang",
    label="SGLang",
    module="sglang.launch_server",
    deploys_as="sglang",
    flags=FlagTable(
        managed=MANAGED_FLAGS,
        multicast=MULTICAST_FLAGS,
        from_file=FILE_FLAGS,
        dead=DEAD_FLAGS,
        secret=SECRET_FLAGS,
    ),
    endpoints=Endpoints(
        ready="/health_generate",
        flush="/flush_cache",
        info=SERVER_INFO_PATHS,
        metrics="/metrics",
        probed=("/health_generate", "/health", *SERVER_INFO_PATHS),
    ),
    # The gauges of the last decode-log window (docs/sglang.md, *Measuring acceptance*).
    metrics=MetricKeys(
        accept_length="sglang:spec_accept_length",
        gen_throughput="sglang:gen_throughput",
    ),
)
