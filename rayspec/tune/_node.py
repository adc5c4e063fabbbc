"""Preflight of a real node: what can be checked before the first restart, without the model.

Every check is a pure function over plain data (a version string, a parsed ``config.json``, a
list of :class:`GpuState`) returning :class:`Findings`: problems (each one line that names the
key, then what to do) and warnings (printed; the study goes on). The probes that gather that
data are thin and injected through :class:`NodeProbes`, so tests use a fake version probe and a
fake NVML, never SGLang or a GPU.

:func:`check_node` runs only for ``server.engine: sglang`` on a local cluster (an empty
``cluster.address``): it inspects *this* machine. On a remote cluster (``cluster.address`` set)
the servers run on other nodes, so nothing here is checked there: not SGLang's import or
version on the workers, not the model and draft folders, not the drafter's layer ids, not
the workers' GPUs. :func:`check_nccl_values` is a property of NCCL, not of a node, and runs
for every real-engine study.

Hub ids (``org/name``) are not checked: only paths that look local (``/``, ``./``, ``../``,
``~``, or an existing path) are opened. Nothing is downloaded.

Example::

    findings = check_node(cfg, default_probes())
    for line in findings.warnings:
        print(f"warning: {line}")
    if findings.problems:
        raise ConfigError(...)
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from importlib.util import find_spec
from typing import Any
from typing import Protocol
from typing import cast

from rayspec._config import SPEC_OFF
from rayspec._config import UNSET
from rayspec._config import ExperimentConfig
from rayspec._config import TwinConfig
from rayspec.server._versions import SGLANG_VERSIONS
from rayspec.server._versions import parse_sglang_version
from rayspec.server._versions import sglang_features

__all__ = [
    "Findings",
    "GpuProcess",
    "GpuState",
    "InstalledSGLang",
    "ModelInfo",
    "NodeProbes",
    "Nvml",
    "check_aux_layers",
    "check_context_length",
    "check_gpus",
    "check_nccl_values",
    "check_node",
    "check_sglang",
    "default_capture_ids",
    "default_probes",
    "load_nvml",
    "probe_sglang",
    "read_gpus",
    "read_model",
    "visible_gpus",
]

GiB = 1024**3
#: A GPU counts as busy above min(2 GiB, 10 % of its memory): an idle one holds well under
#: 1 GiB, and SGLang sizes its pool from total memory, so a stranger's share means OOM.
BUSY_GPU_BYTES = 2 * GiB
BUSY_GPU_FRACTION = 0.10
#: ``import sglang`` imports torch and CUDA libraries: seconds, more on a cold disk.
SGLANG_IMPORT_TIMEOUT_S = 180.0

_MISSING_EXIT = 3
_VERSION_MARK = "rayspec-sglang-version="
_ASK_VERSION = (
    "import importlib.util, sys\n"
    f"if importlib.util.find_spec('sglang') is None: sys.exit({_MISSING_EXIT})\n"
    "import sglang\n"
    f"print('{_VERSION_MARK}' + sglang.__version__)\n"
)


@dataclass
class Findings:
    """Problems (refuse the study) and warnings (print them, go on), one line each."""

    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def extend(self, other: Findings) -> None:
        self.problems.extend(other.problems)
        self.warnings.extend(other.warnings)


# --------------------------------------------------------------------------------------------
# SGLang's version, asked of the interpreter that runs the server


@dataclass(frozen=True)
class InstalledSGLang:
    """What the server's interpreter said about SGLang.

    Attributes:
        version: ``sglang.__version__``, or None when it could not be imported.
        missing: SGLang is not installed for that interpreter at all.
        error: why the import failed (one line), when it failed for another reason.
    """

    version: str | None
    missing: bool = False
    error: str = ""


def probe_sglang(python: str, env: Mapping[str, str] | None = None) -> InstalledSGLang:
    """Ask ``python`` for ``sglang.__version__`` (a subprocess: argv, no shell, a timeout).

    The interpreter running rayspec needs no subprocess when SGLang is not even installed.
    """
    if python == sys.executable and find_spec("sglang") is None:
        return InstalledSGLang(None, missing=True)
    try:
        proc = subprocess.run(
            [python, "-c", _ASK_VERSION],
            capture_output=True,
            text=True,
            timeout=SGLANG_IMPORT_TIMEOUT_S,
            env=dict(os.environ if env is None else env),
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return InstalledSGLang(
            None, error=f"import sglang did not finish within {SGLANG_IMPORT_TIMEOUT_S:.0f} s"
        )
    except OSError as exc:
        return InstalledSGLang(None, error=f"cannot run it ({exc.strerror})")
    if proc.returncode == _MISSING_EXIT:
        return InstalledSGLang(None, missing=True)
    for line in proc.stdout.splitlines():
        if line.startswith(_VERSION_MARK):
            return InstalledSGLang(line[len(_VERSION_MARK) :].strip())
    lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
    last = lines[-1] if lines else f"exit status {proc.returncode}, no output"
    return InstalledSGLang(None, error=f"import sglang fails: {last}")


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


# --------------------------------------------------------------------------------------------
# Model and draft folders


@dataclass(frozen=True)
class ModelInfo:
    """What preflight reads from a local model's ``config.json``.

    Attributes:
        path: the folder.
        config: the whole file.
        architecture: ``architectures[0]``, or None.
        num_layers: ``num_hidden_layers`` (under ``text_config`` for multimodal configs).
        context_len: SGLang's derived context length, or None when no key gives it.
    """

    path: str
    config: Mapping[str, Any]
    architecture: str | None
    num_layers: int | None
    context_len: int | None


def looks_local(path: str) -> bool:
    """Whether SGLang would read ``path`` from disk rather than resolve it as a hub id."""
    return path.startswith(("/", "./", "../", "~")) or os.path.exists(path)


def read_model(key: str, path: str) -> tuple[ModelInfo | None, Findings]:
    """Read ``path/config.json`` when ``path`` looks local; hub ids are not checked.

    Returns:
        The model's info (None for a hub id, a single-file checkpoint or a problem), and the
        problems found.
    """
    out = Findings()
    if not path or not looks_local(path):
        return None, out
    folder = os.path.expanduser(path)
    if not os.path.exists(folder):
        out.problems.append(f"{key}: {path} does not exist on this node")
        return None, out
    if not os.path.isdir(folder):
        return None, out  # a single-file checkpoint (GGUF) carries no config.json
    config_path = os.path.join(folder, "config.json")
    try:
        with open(config_path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        out.problems.append(
            f"{key}: {path} has no config.json; point it at the model's folder (the one "
            "that holds config.json)"
        )
        return None, out
    except OSError as exc:
        out.problems.append(f"{key}: cannot read {config_path} ({exc.strerror})")
        return None, out
    except ValueError as exc:
        out.problems.append(f"{key}: {config_path} is not valid JSON ({exc})")
        return None, out
    if not isinstance(data, dict):
        out.problems.append(f"{key}: {config_path} is not a JSON object")
        return None, out
    # SGLang reads a multimodal model's language part (hf_text_config), e.g. Kimi-K2.5's.
    text = data.get("text_config")
    text = text if isinstance(text, dict) else data
    layers = text.get("num_hidden_layers", data.get("num_hidden_layers"))
    archs = data.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    info = ModelInfo(
        path=path,
        config=data,
        architecture=arch,
        num_layers=layers if isinstance(layers, int) and layers > 0 else None,
        context_len=_context_len(text),
    )
    return info, out


# The keys SGLang's get_context_length tries, in order (srt/utils/hf_transformers/common.py).
_CONTEXT_KEYS = (
    "max_sequence_length",
    "seq_length",
    "max_seq_len",
    "model_max_length",
    "max_position_embeddings",
)


def _context_len(text: Mapping[str, Any]) -> int | None:
    """SGLang's ``get_context_length`` on a raw config; None when no key is there (then the
    config class's own default applies, which a raw read cannot know)."""
    factor: float = 1
    rope = text.get("rope_scaling")
    if isinstance(rope, dict) and rope:
        factor = rope.get("factor", 1) or 1
        if "original_max_position_embeddings" in rope or rope.get("rope_type") == "llama3":
            factor = 1
    for name in _CONTEXT_KEYS:
        value = text.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return int(factor * value)
    return None


# --------------------------------------------------------------------------------------------
# EAGLE-3: which target layers feed the drafter
#
# SGLang 0.5.23 reads the ids from the draft's config.json, eagle_config.
# eagle_aux_hidden_state_layer_ids (model_runner_components/spec_aux_hidden_state.py:185-196),
# and hands them, or None, to the target's set_eagle3_layers_to_capture
# (attention_backend_setup.py:54-61, called from model_runner.py:1112). The target captures
# the residual stream *entering* layer k for each k in layers_to_capture
# (deepseek_v2.py:3175-3195, llama.py:486-493), so an id i (the output of layer i) becomes
# k = i + 1. With no ids the default is k = [2, L // 2, L - 3] (llama.py:929-941 and most
# models). Exceptions below.

# DeepSeek-V2 and its subclasses shift the ids only when the first is 1, else use them as
# given (deepseek_v2.py:3458-3473, glm4_moe_lite.py:805-820); Kimi-K2.5 delegates to its
# DeepseekV3 language model (kimi_k25.py:693, :928-939).
_SHIFT_IF_FIRST_IS_ONE = frozenset(
    {
        "DeepseekV2ForCausalLM",
        "DeepseekV3ForCausalLM",
        "DeepseekV32ForCausalLM",
        "GlmMoeDsaForCausalLM",
        "Glm4MoeLiteForCausalLM",
        "MistralLarge3ForCausalLM",
        "KimiK25ForConditionalGeneration",
    }
)
# gpt-oss keeps ids whose largest is L (its final state), else shifts (gpt_oss.py:1337-1351).
_KEEP_IF_MAX_IS_L = frozenset({"GptOssForCausalLM"})
# MiniMax-M3-VL shifts its default too (minimax_m3_vl.py:246-261).
_SHIFT_DEFAULT = frozenset({"MiniMaxM3SparseForConditionalGeneration"})


def _captured(arch: str | None, ids: Sequence[int], n_layers: int) -> list[int]:
    """The ``layers_to_capture`` the target builds from the draft's ids."""
    if arch in _SHIFT_IF_FIRST_IS_ONE and ids[0] != 1:
        return list(ids)
    if arch in _KEEP_IF_MAX_IS_L and max(ids) == n_layers:
        return list(ids)
    return [i + 1 for i in ids]


def _default_captured(arch: str | None, n_layers: int) -> list[int]:
    ks = [2, n_layers // 2, n_layers - 3]
    return [k + 1 for k in ks] if arch in _SHIFT_DEFAULT else ks


def default_capture_ids(arch: str | None, n_layers: int) -> list[int]:
    """The draft ids that make SGLang capture what it captures by default for ``arch``."""
    return [k - 1 for k in _default_captured(arch, n_layers)]


def check_aux_layers(target: ModelInfo, draft: ModelInfo) -> Findings:
    """The EAGLE-3 drafter's ``eagle_aux_hidden_state_layer_ids`` against the target.

    Refuses ids outside the target's layers; warns when they differ from SGLang's default for
    the target's architecture, and when ids sit where SGLang does not read them.
    """
    out = Findings()
    key = "server.draft_model_path"
    n_layers, arch = target.num_layers, target.architecture
    if n_layers is None:
        return out  # nothing to compare with
    eagle = draft.config.get("eagle_config")
    if isinstance(eagle, dict) and eagle.get("use_aux_hidden_state", True) is False:
        return out  # no aux capture at all
    default = default_capture_ids(arch, n_layers)
    where = f"{arch or 'the target'} ({n_layers} layers)"
    ids = eagle.get("eagle_aux_hidden_state_layer_ids") if isinstance(eagle, dict) else None
    if ids is None:
        # kimi_k25_eagle3.py:50-57 sizes the drafter from top-level ids, but the target
        # captures only what eagle_config says (spec_aux_hidden_state.py:188-196).
        loose = draft.config.get("eagle_aux_hidden_state_layer_ids")
        if isinstance(loose, list) and loose != default:
            out.warnings.append(
                f"{key}: config.json has eagle_aux_hidden_state_layer_ids {loose} outside "
                f"eagle_config, where SGLang does not read them: the target feeds the "
                f"drafter its default layers {default} for {where}; move them into "
                "eagle_config if the drafter was trained on them"
            )
        return out
    if (
        not isinstance(ids, list)
        or not ids
        or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
    ):
        out.problems.append(
            f"{key}: eagle_config.eagle_aux_hidden_state_layer_ids is {ids!r}; SGLang needs a "
            "non-empty list of layer numbers"
        )
        return out
    top = n_layers if arch in _KEEP_IF_MAX_IS_L else n_layers - 1
    outside = [i for i in ids if not 0 <= i <= top]
    if outside:
        out.problems.append(
            f"{key}: eagle_aux_hidden_state_layer_ids {ids} name layers {outside} but the "
            f"target {target.path} has {n_layers} layers (0-{top}): this drafter was made for "
            "another model"
        )
        return out
    if _captured(arch, ids, n_layers) != _default_captured(arch, n_layers):
        out.warnings.append(
            f"{key}: the drafter's eagle_aux_hidden_state_layer_ids are {ids}, SGLang's "
            f"default for {where} is {default}; a drafter fed other layers than it was "
            "trained on accepts far fewer tokens (speculation then looks like it does not "
            "pay): check which layers it was trained on"
        )
    return out


def _context_flag(extra_flags: Sequence[str]) -> int | None:
    for i, arg in enumerate(extra_flags):
        name, sep, value = arg.partition("=")
        if name != "--context-length":
            continue
        text = value if sep else (extra_flags[i + 1] if i + 1 < len(extra_flags) else "")
        return int(text) if text.isdigit() else None
    return None


def check_context_length(
    target: ModelInfo | None,
    draft: ModelInfo | None,
    *,
    extra_flags: Sequence[str],
    env: Mapping[str, str],
) -> Findings:
    """SGLang refuses a context longer than a model's config allows (model_config.py:1248-1272).

    The draft is built with the target's context length (eagle_worker_v2.py:229), so a
    drafter with a shorter ``max_position_embeddings`` stops every speculative start, unless
    ``SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN`` is true.
    """
    out = Findings()
    allow = env.get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "").lower()
    if allow in ("true", "1", "yes", "y"):
        return out
    given = _context_flag(extra_flags)
    fix = "or set server.env.SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1"
    if target is not None and given is not None and target.context_len is not None:
        if given > target.context_len:
            out.problems.append(
                f"server.extra_flags: --context-length {given} is longer than the target's "
                f"{target.context_len} (its config.json); SGLang refuses to start: lower it "
                f"{fix}"
            )
            return out
    length = given if given is not None else (target.context_len if target else None)
    if draft is None or draft.context_len is None or length is None:
        return out
    if length > draft.context_len:
        out.problems.append(
            f"server.draft_model_path: the drafter's context length ({draft.context_len}, its "
            f"config.json) is shorter than the target's ({length}); SGLang refuses every "
            f"speculative start: add --context-length {draft.context_len} to "
            f"server.extra_flags {fix}"
        )
    return out


# --------------------------------------------------------------------------------------------
# GPUs, through NVML


class Nvml(Protocol):
    """The few NVML calls preflight makes (the ``pynvml`` module has them all).

    Tests pass a small fake with the same names; nothing else is ever called.
    """

    NVMLError: type[Exception]

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> Sequence[Any]: ...
    def nvmlSystemGetProcessName(self, pid: int) -> str | bytes: ...


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    name: str
    used_bytes: int | None  # None: NVML cannot tell (e.g. another container's process)


@dataclass(frozen=True)
class GpuState:
    """One GPU as NVML sees it (``index`` is NVML's, in PCI bus order)."""

    index: int
    uuid: str
    used_bytes: int
    total_bytes: int
    processes: tuple[GpuProcess, ...] = ()


def load_nvml() -> Nvml | None:
    """The ``pynvml`` module (package ``nvidia-ml-py``), or None when it is not installed."""
    try:
        return cast(Nvml, importlib.import_module("pynvml"))
    except ImportError:
        return None


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def read_gpus(nvml: Nvml) -> list[GpuState]:
    """Every GPU's memory and compute processes.

    Raises:
        nvml.NVMLError: NVML cannot start (no driver) or a GPU cannot be read.
    """
    nvml.nvmlInit()
    try:
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            procs = []
            for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                try:
                    name = _text(nvml.nvmlSystemGetProcessName(proc.pid))
                except nvml.NVMLError:
                    name = "?"  # a process NVML cannot name (gone, or not ours to see)
                used = getattr(proc, "usedGpuMemory", None)
                procs.append(GpuProcess(int(proc.pid), os.path.basename(name), used))
            gpus.append(
                GpuState(
                    index=index,
                    uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                    used_bytes=int(mem.used),
                    total_bytes=int(mem.total),
                    processes=tuple(procs),
                )
            )
        return gpus
    finally:
        nvml.nvmlShutdown()


def visible_gpus(gpus: Sequence[GpuState], cuda_visible: str | None) -> tuple[list[GpuState], str]:
    """The GPUs CUDA (and so Ray) sees under ``CUDA_VISIBLE_DEVICES``, in its order.

    Entries are CUDA ordinals or ``GPU-`` UUID prefixes; like CUDA, the list stops at the
    first entry that names no GPU. Ordinals are taken as NVML indices: CUDA's default order
    equals PCI bus order on a node of identical GPUs (exactly so with
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``).

    Returns:
        The visible GPUs, and a warning when the GPU checks cannot follow the variable (MIG).
    """
    if cuda_visible is None:
        return list(gpus), ""
    shown: list[GpuState] = []
    for entry in (e.strip() for e in cuda_visible.split(",")):
        if entry.startswith("MIG-"):
            return [], "GPU checks skipped: CUDA_VISIBLE_DEVICES names MIG devices"
        if entry.isdigit():
            match = [g for g in gpus if g.index == int(entry)]
        else:
            match = [g for g in gpus if entry and g.uuid.startswith(entry)]
        if len(match) != 1 or match[0] in shown:
            break
        shown.append(match[0])
    return shown, ""


def _gib(n: int) -> str:
    return f"{n / GiB:.1f} GiB"


def check_gpus(
    gpus: Sequence[GpuState],
    *,
    tp_size: int,
    num_gpus: int | None,
    cuda_visible: str | None,
) -> Findings:
    """Enough visible GPUs for one server, and none of those Ray may hand out already in use.

    Args:
        gpus: the visible GPUs (:func:`visible_gpus`).
        tp_size: ``server.tp_size``, the GPUs one server needs.
        num_gpus: ``cluster.num_gpus``: Ray then hands out the first that many.
        cuda_visible: ``CUDA_VISIBLE_DEVICES`` (for the messages).
    """
    out = Findings()
    seen = "unset" if cuda_visible is None else repr(cuda_visible)
    if num_gpus is not None and num_gpus > len(gpus):
        out.problems.append(
            f"cluster.num_gpus: {num_gpus} but this node shows {len(gpus)} GPUs "
            f"(CUDA_VISIBLE_DEVICES {seen}); servers would be given GPUs that do not exist"
        )
    usable = list(gpus if num_gpus is None else gpus[:num_gpus])
    if len(usable) < tp_size:
        out.problems.append(
            f"server.tp_size: a server needs {tp_size} GPUs and this node shows {len(usable)} "
            f"(CUDA_VISIBLE_DEVICES {seen}); lower server.tp_size or run on a larger node"
        )
    # Ray assigns GPU ids without looking at memory: any busy one may land in a trial.
    for gpu in usable:
        if gpu.used_bytes <= min(BUSY_GPU_BYTES, BUSY_GPU_FRACTION * gpu.total_bytes):
            continue
        holders = ", ".join(
            f"pid {p.pid} {p.name}" + (f" {_gib(p.used_bytes)}" if p.used_bytes else "")
            for p in gpu.processes
        )
        out.problems.append(
            f"CUDA_VISIBLE_DEVICES: GPU {gpu.index} already has {_gib(gpu.used_bytes)} of "
            f"{_gib(gpu.total_bytes)} in use by "
            f"{holders or 'no process visible from here (another container?)'}; stop it, "
            f"or leave GPU {gpu.index} out of CUDA_VISIBLE_DEVICES (now {seen})"
        )
    return out


# --------------------------------------------------------------------------------------------
# NCCL values, with the twin's own parser (so the two never disagree)

# NCCL integer parameters the tuner sets (NCCL reads them with strtoll, base 0).
_NCCL_INTEGERS = (
    "NCCL_NTHREADS",
    "NCCL_MAX_NCHANNELS",
    "NCCL_MIN_NCHANNELS",
    "NCCL_MAX_NRINGS",
    "NCCL_MIN_NRINGS",
    "NCCL_BUFFSIZE",
    "NCCL_SHM_DISABLE",
)


def check_nccl_values(cfg: ExperimentConfig) -> Findings:
    """Every value of ``search.nccl`` and ``server.env`` is one NCCL accepts and uses.

    Refused: an unknown ``NCCL_PROTO``/``NCCL_ALGO`` token (communicator init fails), an
    ``NCCL_P2P_LEVEL`` NCCL does not know (ignored silently: the names are case-sensitive), a
    non-integer integer parameter (ignored: NCCL keeps its default).
    """
    from rayspec.twin import NcclInitError
    from rayspec.twin import load_profile
    from rayspec.twin._nccl import ALGORITHMS
    from rayspec.twin._nccl import PROTOCOLS
    from rayspec.twin._nccl import _int_var
    from rayspec.twin._nccl import _p2p_level
    from rayspec.twin._nccl import _parse_list

    # NCCL's level names; every shipped profile lists the same (nccl_choice.path_order).
    profile = load_profile(TwinConfig().profile)
    levels = profile.nccl_choice.path_order
    values = [(f"search.nccl.{n}", n, v) for n, vs in cfg.search.nccl.items() for v in vs]
    values += [(f"server.env.{n}", n, v) for n, v in cfg.server.env.items()]
    out = Findings()
    for key, name, value in values:
        if value == UNSET and key.startswith("search."):
            continue
        notes: list[str] = []
        if name in ("NCCL_PROTO", "NCCL_ALGO"):
            names = PROTOCOLS if name == "NCCL_PROTO" else ALGORITHMS
            try:
                _parse_list(value, name, names)
            except NcclInitError as exc:
                detail = str(exc).splitlines()[0].removeprefix("NCCL WARN ")
                out.problems.append(
                    f"{key}: {value!r}: NCCL refuses it at communicator init ({detail}): "
                    f"every trial with it would fail; use {', '.join(names)}"
                )
        elif name == "NCCL_P2P_LEVEL":
            _p2p_level({name: value}, profile, notes)
            if notes:
                fix = value.upper() if value.upper() in levels else f"one of {', '.join(levels)}"
                out.problems.append(
                    f"{key}: {value!r}: NCCL ignores it silently (case-sensitive): use {fix}"
                )
        elif name in _NCCL_INTEGERS:
            _int_var({name: value}, (name,), notes)
            if notes:
                out.problems.append(
                    f"{key}: {value!r} is not an integer: NCCL ignores it and keeps its "
                    "default, so trials with it measure the default"
                )
    return out


# --------------------------------------------------------------------------------------------
# All of it, for one local node


@dataclass(frozen=True)
class NodeProbes:
    """How preflight looks at the node; tests pass fakes.

    Attributes:
        sglang: asks an interpreter for SGLang's version (:func:`probe_sglang`).
        nvml: returns NVML, or None when ``pynvml`` is not installed (:func:`load_nvml`).
    """

    sglang: Callable[[str, Mapping[str, str]], InstalledSGLang]
    nvml: Callable[[], Nvml | None]


def default_probes() -> NodeProbes:
    """The real probes: a subprocess of the server's interpreter, and ``pynvml``."""
    return NodeProbes(sglang=probe_sglang, nvml=load_nvml)


def check_node(
    cfg: ExperimentConfig, probes: NodeProbes, environ: Mapping[str, str] | None = None
) -> Findings:
    """Everything about this node a real-engine study needs, short of loading the model.

    Args:
        cfg: the experiment (``server.engine: sglang``, a local cluster).
        probes: how to ask SGLang and NVML.
        environ: the node's environment (default ``os.environ``).
    """
    env = dict(os.environ if environ is None else environ)
    srv = cfg.server
    out = Findings()
    python = srv.python or sys.executable
    found = probes.sglang(python, {**env, **srv.env})
    key = "server.python" if srv.python else "server.engine"
    out.extend(check_sglang(found, python=python, configured=srv.sglang_version, key=key))

    target, found_target = read_model("server.model_path", srv.model_path)
    draft, found_draft = read_model("server.draft_model_path", srv.draft_model_path)
    out.extend(found_target)
    out.extend(found_draft)
    modes = cfg.search.speculative.modes
    if any(m != SPEC_OFF for m in modes):
        out.extend(
            check_context_length(
                target, draft, extra_flags=srv.extra_flags, env={**env, **srv.env}
            )
        )
    if "EAGLE3" in modes and target is not None and draft is not None:
        out.extend(check_aux_layers(target, draft))

    nvml = probes.nvml()
    if nvml is None:
        out.warnings.append(
            "GPU checks skipped: pynvml is not installed (pip install 'rayspec[gpu]')"
        )
        return out
    try:
        gpus = read_gpus(nvml)
    except nvml.NVMLError as exc:
        out.warnings.append(f"GPU checks skipped: NVML is not usable here ({exc})")
        return out
    cuda_visible = env.get("CUDA_VISIBLE_DEVICES")
    shown, note = visible_gpus(gpus, cuda_visible)
    if note:
        out.warnings.append(note)
        return out
    out.extend(
        check_gpus(
            shown, tp_size=srv.tp_size, num_gpus=cfg.cluster.num_gpus, cuda_visible=cuda_visible
        )
    )
    return out
