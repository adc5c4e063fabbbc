"""The SGLang a real study would run: installed, known to rayspec's version table, configured."""

from __future__ import annotations

from rayspec.engines.sglang import SGLANG_VERSIONS
from rayspec.engines.sglang import InstalledSGLang
from rayspec.engines.sglang import parse_sglang_version
from rayspec.engines.sglang import sglang_features
from rayspec.tune._node._findings import Findings


def check_sglang(
    found: InstalledSGLang, *, python: str, configured: str, key: str = "server.engine"
) -> Findings:
    """The installed SGLang imports, is in rayspec's version table and is ``configured``.

    Args:
        found: the probe's answer.
        python: the interpreter that was asked (for the messages).
        configured: ``server.sglang_version``.
        key: the key to name for an interpreter problem (``server.python`` when it is set).
    """
    out = Findings()
    if found.version is None:
        if found.missing:
            out.problems.append(
                f"{key}: sglang is not installed for {python}; install it on the GPU node "
                "(pip install 'rayspec[sglang]') or set server.python to the interpreter "
                "that has it"
            )
        else:
            out.problems.append(f"{key}: {python} cannot import sglang: {found.error}")
        return out
    try:
        release = parse_sglang_version(found.version)
    except ValueError:
        out.problems.append(
            f"{key}: {python} reports sglang.__version__ {found.version!r}, which is no version"
        )
        return out
    oldest, newest = SGLANG_VERSIONS[0].since, SGLANG_VERSIONS[-1].since
    if release < oldest:
        out.problems.append(
            f"{key}: SGLang {found.version} ({python}) is older than any version rayspec "
            f"knows ({oldest} and later); install a newer SGLang"
        )
        return out
    if release > newest:
        out.warnings.append(
            f"SGLang {found.version} ({python}) is newer than any version rayspec has "
            f"examined: it is launched as {newest} would be"
        )
    if parse_sglang_version(configured) != release:
        have, want = sglang_features(release), sglang_features(configured)
        why = ""
        if have.cuda_graph_flag != want.cuda_graph_flag:
            why = (
                f" (that SGLang's CUDA-graph cap is {have.cuda_graph_flag}, not "
                f"{want.cuda_graph_flag})"
            )
        out.problems.append(
            f"server.sglang_version: {configured} but {python} has SGLang {found.version}"
            f"{why}; set server.sglang_version={release}"
        )
    return out
