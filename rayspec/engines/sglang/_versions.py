"""What differs between the SGLang versions rayspec knows, as one table of data.

Each row of :data:`SGLANG_VERSIONS` holds from its ``since`` version up to the next row's
(docs/sglang.md, *Versions*). Versions 0.5.13-0.5.17 were never examined: the rows say
what the nearest examined versions do. A version is looked up by its release number, so a
pre-release, dev or local build (``0.5.20rc1``, ``0.5.23+cu130``) counts as that release; a
version older than the first row takes the first row, a newer one the last.

Example:
    >>> sglang_features("0.5.19").cuda_graph_flag
    '--cuda-graph-max-bs-decode'
    >>> sglang_features("0.5.19").deprecated_graph_flags
    ('--cuda-graph-max-bs',)
    >>> sglang_features("0.5.23").has_ready_endpoint
    True
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.version import InvalidVersion
from packaging.version import Version

__all__ = [
    "CONTRACT_PINNED_VERSIONS",
    "SERVER_INFO_PATHS",
    "SGLANG_VERSIONS",
    "SGLangFeatures",
    "parse_sglang_version",
    "sglang_features",
]

# Where a server says what it resolved: /server_info since 0.5.12 (0.5.23 logs "Endpoint
# '/get_server_info' is deprecated" for every call of the old name), /get_server_info before.
SERVER_INFO_PATHS = ("/server_info", "/get_server_info")

_OLD_GRAPH_FLAG = "--cuda-graph-max-bs"
_NEW_GRAPH_FLAG = "--cuda-graph-max-bs-decode"

# The speculative fields a final chunk's meta_info carries with speculation on (read from each
# wheel's tokenizer_manager.py; 0.5.18+ may add spec_cap_length, spec_block_accept_length and
# spec_cap_lens_histogram for features rayspec does not use).
_META_0_4 = ("spec_verify_ct",)
_META_0_5_5 = (*_META_0_4, "spec_accept_length", "spec_accept_rate")
_META_0_5_21 = (
    *_META_0_5_5,
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
    "spec_correct_drafts_histogram",
)
_META_0_5_12 = (
    *_META_0_5_21,
    # Aliases of the three above, present 0.5.12-0.5.20 and gone in 0.5.21.
    "spec_accepted_drafts",
    "spec_proposed_drafts",
    "spec_accept_histogram",
)


@dataclass(frozen=True)
class SGLangFeatures:
    """What one range of SGLang versions does, as far as rayspec's launch depends on it.

    Attributes:
        since: the first version of the range (the range ends where the next row starts).
        cuda_graph_flag: the decode CUDA-graph cap flag rayspec passes.
        deprecated_graph_flags: older names still accepted as deprecated aliases.
        rejected_graph_flags: older names argparse rejects (exit code 2, "ambiguous option").
        has_ready_endpoint: whether ``GET /ready`` exists.
        spec_meta_fields: the speculative fields of a final chunk's ``meta_info``.
        spec_v2_switch: how the speculative overlap scheduler is turned off ("env": set
            ``SGLANG_ENABLE_SPEC_V2=False``; "flag": ``--disable-overlap-schedule``; "": not).
        adaptive_spec: whether adaptive speculative decoding (``--speculative-adaptive``) exists.
        contract_pinned: whether tests/contract_tests check rayspec's launch lines against
            the argument parser of exactly ``since`` (built by ``.ci/sglang-env``); a later
            version that falls in the row is not checked.
    """

    since: Version
    cuda_graph_flag: str
    deprecated_graph_flags: tuple[str, ...]
    rejected_graph_flags: tuple[str, ...]
    has_ready_endpoint: bool
    spec_meta_fields: tuple[str, ...]
    contract_pinned: bool = False
    # How the speculative overlap scheduler (spec v2) is turned off: "env" (the environment
    # variable SGLANG_ENABLE_SPEC_V2=False, 0.5.5-0.5.12), "flag" (--disable-overlap-schedule:
    # the variable is gone by 0.5.18; 0.5.23 always runs spec v2), or "" (EAGLE forces it off).
    spec_v2_switch: str = ""
    # Whether --speculative-adaptive / --speculative-adaptive-config exist (adaptive steps).
    adaptive_spec: bool = False


#: The table, oldest first: a row at each version where a difference was first seen, among
#: the wheels read for docs/sglang.md (0.4.10, 0.5.5, 0.5.12, 0.5.18-0.5.23).
SGLANG_VERSIONS: tuple[SGLangFeatures, ...] = (
    # All arguments in server_args.py; the cap is --cuda-graph-max-bs.
    SGLangFeatures(
        since=Version("0.4.10"),
        cuda_graph_flag=_OLD_GRAPH_FLAG,
        deprecated_graph_flags=(),
        rejected_graph_flags=(),
        has_ready_endpoint=False,
        spec_meta_fields=_META_0_4,
    ),
    # spec_accept_length and spec_accept_rate (= accepted / (verify_ct * steps)) appear.
    SGLangFeatures(
        since=Version("0.5.5"),
        cuda_graph_flag=_OLD_GRAPH_FLAG,
        deprecated_graph_flags=(),
        rejected_graph_flags=(),
        has_ready_endpoint=False,
        spec_meta_fields=_META_0_5_5,
        spec_v2_switch="env",
    ),
    # The draft counters appear, each also under an alias name.
    SGLangFeatures(
        since=Version("0.5.12"),
        cuda_graph_flag=_OLD_GRAPH_FLAG,
        deprecated_graph_flags=(),
        rejected_graph_flags=(),
        has_ready_endpoint=False,
        spec_meta_fields=_META_0_5_12,
        spec_v2_switch="env",
    ),
    # The cap is renamed; the old name survives as a deprecated alias (first seen in 0.5.18).
    SGLangFeatures(
        since=Version("0.5.18"),
        cuda_graph_flag=_NEW_GRAPH_FLAG,
        deprecated_graph_flags=(_OLD_GRAPH_FLAG,),
        rejected_graph_flags=(),
        has_ready_endpoint=False,
        spec_meta_fields=_META_0_5_12,
        spec_v2_switch="flag",
    ),
    # The old name is gone: argparse rejects it as ambiguous (exit 2). GET /ready appears.
    SGLangFeatures(
        since=Version("0.5.20"),
        cuda_graph_flag=_NEW_GRAPH_FLAG,
        deprecated_graph_flags=(),
        rejected_graph_flags=(_OLD_GRAPH_FLAG,),
        has_ready_endpoint=True,
        spec_meta_fields=_META_0_5_12,
        spec_v2_switch="flag",
    ),
    # The draft-counter aliases are gone from meta_info.
    SGLangFeatures(
        since=Version("0.5.21"),
        cuda_graph_flag=_NEW_GRAPH_FLAG,
        deprecated_graph_flags=(),
        rejected_graph_flags=(_OLD_GRAPH_FLAG,),
        has_ready_endpoint=True,
        spec_meta_fields=_META_0_5_21,
        spec_v2_switch="flag",
    ),
    # Arguments become a sealed msgspec Struct. The version the contract tests pin.
    SGLangFeatures(
        since=Version("0.5.23"),
        cuda_graph_flag=_NEW_GRAPH_FLAG,
        deprecated_graph_flags=(),
        rejected_graph_flags=(_OLD_GRAPH_FLAG,),
        has_ready_endpoint=True,
        spec_meta_fields=_META_0_5_21,
        contract_pinned=True,
        spec_v2_switch="flag",
        adaptive_spec=True,
    ),
)

#: The versions whose own argument parser checks rayspec's launch lines in CI.
CONTRACT_PINNED_VERSIONS: tuple[str, ...] = tuple(
    str(row.since) for row in SGLANG_VERSIONS if row.contract_pinned
)

_LEADING_RELEASE = re.compile(r"^\s*v?(\d+(?:\.\d+)*)")


def parse_sglang_version(text: str) -> Version:
    """The release number of an SGLang version string, as a :class:`~packaging.version.Version`.

    Args:
        text: a version such as ``"0.5.23"``, ``"0.4.10.post2"`` or ``"0.5.20rc1"``. Text
            that is no PEP 440 version counts by its leading numbers (``"0.5.23.x"``).

    Returns:
        The release alone (``Version("0.5.20")`` for ``"0.5.20rc1"``).

    Raises:
        ValueError: the text does not start with a number.
    """
    try:
        return Version(Version(text).base_version)
    except InvalidVersion:
        match = _LEADING_RELEASE.match(text)
        if match is None:
            raise ValueError(f"{text!r} is not an SGLang version like 0.5.23") from None
        return Version(match.group(1))


def sglang_features(version: str | Version) -> SGLangFeatures:
    """The row of :data:`SGLANG_VERSIONS` that covers ``version``.

    Args:
        version: an SGLang version (string or parsed).

    Returns:
        The last row whose ``since`` is at most ``version``; the first row for older versions.

    Raises:
        ValueError: ``version`` is a string that is no version.
    """
    if isinstance(version, Version):
        release = Version(version.base_version)
    else:
        release = parse_sglang_version(version)
    found = SGLANG_VERSIONS[0]
    for row in SGLANG_VERSIONS:
        if row.since <= release:
            found = row
    return found
