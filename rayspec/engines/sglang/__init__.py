"""SGLang: the engine rayspec tunes (:data:`SGLANG`), and the tables and rules behind it.

Public names:

- :data:`SGLANG` (an :class:`SGLangEngine`): the engine object the packages above use.
- The version table: :data:`SGLANG_VERSIONS`, :class:`SGLangFeatures`, :func:`sglang_features`,
  :func:`parse_sglang_version`, :data:`CONTRACT_PINNED_VERSIONS`, :data:`SERVER_INFO_PATHS`.
- The flag tables of the config checks: :data:`MANAGED_FLAGS`, :data:`MULTICAST_FLAGS`,
  :data:`FILE_FLAGS`, :data:`DEAD_FLAGS`, :data:`SECRET_FLAGS`, and :func:`sglang_reads_as`
  (argparse's prefixes).
- The launch: :func:`cuda_graph_flag`, :data:`SPEC_V2_ENV`.
- The log: :func:`classify_failure`, :func:`parse_decode_line`, :func:`parse_decode_lines`,
  :func:`parse_startup_summary`, :class:`StartupSummary`.
- The node: :func:`probe_sglang` (:data:`InstalledSGLang`), the context length
  (:func:`context_length`, :func:`longer_context_allowed`, :data:`CONTEXT_LENGTH_FLAG`,
  :data:`LONGER_CONTEXT_ENV`), and the EAGLE-3 layer rules
  :func:`captured_layers`, :func:`default_captured_layers`, :func:`default_capture_ids`,
  :func:`keeps_last_layer`.
"""

from __future__ import annotations

from rayspec.engines.sglang._argv import SPEC_V2_ENV
from rayspec.engines.sglang._argv import cuda_graph_flag
from rayspec.engines.sglang._classify import classify_failure
from rayspec.engines.sglang._context import CONTEXT_LENGTH_FLAG
from rayspec.engines.sglang._context import LONGER_CONTEXT_ENV
from rayspec.engines.sglang._context import context_length
from rayspec.engines.sglang._context import longer_context_allowed
from rayspec.engines.sglang._eagle import captured_layers
from rayspec.engines.sglang._eagle import default_capture_ids
from rayspec.engines.sglang._eagle import default_captured_layers
from rayspec.engines.sglang._eagle import keeps_last_layer
from rayspec.engines.sglang._engine import SGLANG
from rayspec.engines.sglang._engine import SGLangEngine
from rayspec.engines.sglang._flags import DEAD_FLAGS
from rayspec.engines.sglang._flags import FILE_FLAGS
from rayspec.engines.sglang._flags import MANAGED_FLAGS
from rayspec.engines.sglang._flags import MULTICAST_FLAGS
from rayspec.engines.sglang._flags import SECRET_FLAGS
from rayspec.engines.sglang._flags import sglang_reads_as
from rayspec.engines.sglang._logparse import StartupSummary
from rayspec.engines.sglang._logparse import parse_decode_line
from rayspec.engines.sglang._logparse import parse_decode_lines
from rayspec.engines.sglang._logparse import parse_startup_summary
from rayspec.engines.sglang._probe import SGLANG_IMPORT_TIMEOUT_S
from rayspec.engines.sglang._probe import InstalledSGLang
from rayspec.engines.sglang._probe import probe_sglang
from rayspec.engines.sglang._versions import CONTRACT_PINNED_VERSIONS
from rayspec.engines.sglang._versions import SERVER_INFO_PATHS
from rayspec.engines.sglang._versions import SGLANG_VERSIONS
from rayspec.engines.sglang._versions import SGLangFeatures
from rayspec.engines.sglang._versions import parse_sglang_version
from rayspec.engines.sglang._versions import sglang_features

__all__ = [
    "CONTEXT_LENGTH_FLAG",
    "CONTRACT_PINNED_VERSIONS",
    "DEAD_FLAGS",
    "FILE_FLAGS",
    "LONGER_CONTEXT_ENV",
    "MANAGED_FLAGS",
    "MULTICAST_FLAGS",
    "SECRET_FLAGS",
    "SERVER_INFO_PATHS",
    "SGLANG",
    "SGLANG_IMPORT_TIMEOUT_S",
    "SGLANG_VERSIONS",
    "SPEC_V2_ENV",
    "InstalledSGLang",
    "SGLangEngine",
    "SGLangFeatures",
    "StartupSummary",
    "captured_layers",
    "classify_failure",
    "context_length",
    "cuda_graph_flag",
    "default_capture_ids",
    "default_captured_layers",
    "keeps_last_layer",
    "longer_context_allowed",
    "parse_decode_line",
    "parse_decode_lines",
    "parse_sglang_version",
    "parse_startup_summary",
    "probe_sglang",
    "sglang_features",
    "sglang_reads_as",
]
