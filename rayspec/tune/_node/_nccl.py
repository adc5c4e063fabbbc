"""NCCL values, with the twin's own parser (so the two never disagree)."""

from __future__ import annotations

from rayspec._config import UNSET
from rayspec._config import ExperimentConfig
from rayspec._config import TwinConfig
from rayspec.tune._node._findings import Findings

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


# The variables NCCL reads (NCCL's environment-variable documentation, 2.18-2.28, and the
# names PyTorch still honours). NCCL ignores any other NCCL_* name without a word, so a
# misspelt one (NCCL_PROTOCOL for NCCL_PROTO) would measure NCCL's defaults under its name.
NCCL_VARIABLES = frozenset(
    """
    ALGO PROTO BUFFSIZE NTHREADS MAX_NCHANNELS MIN_NCHANNELS MAX_NRINGS MIN_NRINGS MAX_CTAS
    MIN_CTAS CGA_CLUSTER_SIZE NVLS_ENABLE NVLS_CHUNKSIZE NVLSTREE_MAX_CHUNKSIZE NVLS_NCHANNELS
    P2P_DISABLE P2P_LEVEL P2P_DIRECT_DISABLE P2P_READ_ENABLE P2P_USE_CUDA_MEMCPY
    P2P_NET_CHUNKSIZE P2P_PCI_CHUNKSIZE P2P_NVL_CHUNKSIZE P2P_LL_THRESHOLD P2P_PXN_LEVEL
    SHM_DISABLE SHM_USE_CUDA_MEMCPY SHM_MEMCPY_MODE SHM_LOCALITY PXN_DISABLE NVB_DISABLE
    NVB_PRECONNECT IGNORE_DISABLED_P2P LL_BUFFSIZE LL128_BUFFSIZE LL128_NTHREADS
    LL_THRESHOLD TREE_THRESHOLD SINGLE_RING_THRESHOLD CUMEM_ENABLE CUMEM_HOST_ENABLE
    MNNVL_ENABLE MNNVL_UUID MNNVL_CLIQUE_ID RUNTIME_CONNECT GRAPH_REGISTER LOCAL_REGISTER
    LEGACY_CUDA_REGISTER GRAPH_MIXING_SUPPORT DMABUF_ENABLE WORK_FIFO_BYTES WORK_FIFO_DEPTH
    LAUNCH_MODE CHECKS_DISABLE CHECK_POINTERS COMM_BLOCKING ASYNC_ERROR_HANDLING BLOCKING_WAIT
    NCHANNELS_PER_NET_PEER NCHANNELS_PER_PEER CTA_POLICY NETDEVS_POLICY SET_STACK_SIZE
    SET_THREAD_NAME CREATE_THREAD_CONTEXT PROXY_APPEND_BATCH_SIZE PROGRESS_APPENDOP_FREQ
    L1_SHARED_MEMORY_CARVEOUT ALLOC_P2P_NET_LL_BUFFERS NVLINK_UTIL_CENTRIC_SCHED_ENABLE
    WIN_ENABLE SYMMETRIC_ENABLE DEBUG DEBUG_FILE DEBUG_SUBSYS DEBUG_TIMESTAMP_FORMAT
    DEBUG_TIMESTAMP_LEVELS WARN_ENABLE_DEBUG_INFO
    CONF_FILE TOPO_FILE TOPO_DUMP_FILE GRAPH_FILE GRAPH_DUMP_FILE HOSTID IGNORE_CPU_AFFINITY
    COLLNET_ENABLE COLLNET_NODE_THRESHOLD NET NET_PLUGIN TUNER_PLUGIN PROFILER_PLUGIN
    ENV_PLUGIN NET_GDR_LEVEL NET_GDR_READ NET_GDR_C2C NET_SHARED_BUFFERS NET_SHARED_COMMS
    NET_DISABLE_INTRA NET_FORCE_FLUSH NET_MERGE_LEVEL NET_OVERHEAD GDRCOPY_ENABLE
    GDRCOPY_FLUSH_ENABLE GDRCOPY_SYNC_ENABLE SOCKET_IFNAME SOCKET_FAMILY SOCKET_NTHREADS
    NSOCKS_PERTHREAD SOCKET_RETRY_CNT SOCKET_RETRY_SLEEP_MSEC CROSS_NIC OOB_NET_ENABLE
    OOB_NET_IFNAME UID_STAGGER_THRESHOLD UID_STAGGER_RATE RAS_ENABLE RAS_ADDR
    RAS_TIMEOUT_FACTOR IB_DISABLE IB_HCA IB_TIMEOUT IB_RETRY_CNT IB_GID_INDEX IB_ADDR_FAMILY
    IB_ADDR_RANGE IB_ROCE_VERSION_NUM IB_SL IB_TC IB_FIFO_TC IB_RETURN_ASYNC_EVENTS
    IB_PCI_RELAXED_ORDERING IB_ADAPTIVE_ROUTING IB_AR_THRESHOLD IB_ECE_ENABLE
    IB_QPS_PER_CONNECTION IB_SPLIT_DATA_ON_QPS IB_CUDA_SUPPORT IB_MERGE_VFS IB_MERGE_NICS
    IB_USE_INLINE IB_MQP_RETRY_ALL IB_MQP_RETRY_CNT IB_MQP_RETRY_SLEEP_MSEC IB_GDR_LEVEL
    IB_DATA_DIRECT IB_OOO_RQ
    """.split()
)


def unknown_nccl_variables(cfg: ExperimentConfig) -> Findings:
    """Every ``NCCL_*`` name of ``search.nccl`` and ``server.env`` is one NCCL reads, or one
    the experiment declares in ``server.extra_nccl_vars``."""
    import difflib

    known = {f"NCCL_{n}" for n in NCCL_VARIABLES} | set(cfg.server.extra_nccl_vars)
    out = Findings()
    named = [(f"search.nccl.{n}", n) for n in cfg.search.nccl]
    named += [(f"server.env.{n}", n) for n in cfg.server.env if n.startswith("NCCL_")]
    for key, name in named:
        if name in known:
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
        hint = f"did you mean {close[0]}? " if close else ""
        out.problems.append(
            f"{key}: {name} is not a variable NCCL reads (NCCL ignores unknown names silently: "
            f"trials would measure its default); {hint}if your NCCL reads it, declare it: "
            f"server.extra_nccl_vars=[{name}]"
        )
    return out


def check_nccl_values(cfg: ExperimentConfig) -> Findings:
    """Every value of ``search.nccl`` and ``server.env`` is one NCCL accepts and uses.

    Refused: an unknown ``NCCL_PROTO``/``NCCL_ALGO`` token (communicator init fails), an
    ``NCCL_P2P_LEVEL`` NCCL does not know (ignored silently: the names are case-sensitive), a
    non-integer integer parameter (ignored: NCCL keeps its default).
    """
    from rayspec.twin import NCCL_ALGORITHMS as ALGORITHMS
    from rayspec.twin import NCCL_PROTOCOLS as PROTOCOLS
    from rayspec.twin import NcclInitError
    from rayspec.twin import load_profile
    from rayspec.twin import nccl_int_var
    from rayspec.twin import nccl_p2p_level
    from rayspec.twin import parse_nccl_list

    # NCCL's level names; every shipped profile lists the same (nccl_choice.path_order).
    profile = load_profile(TwinConfig().profile)
    levels = profile.nccl_choice.path_order
    values = [(f"search.nccl.{n}", n, v) for n, vs in cfg.search.nccl.items() for v in vs]
    values += [(f"server.env.{n}", n, v) for n, v in cfg.server.env.items()]
    out = unknown_nccl_variables(cfg)
    for key, name, value in values:
        if value == UNSET and key.startswith("search."):
            continue
        notes: list[str] = []
        if name in ("NCCL_PROTO", "NCCL_ALGO"):
            names = PROTOCOLS if name == "NCCL_PROTO" else ALGORITHMS
            try:
                parse_nccl_list(value, name, names)
            except NcclInitError as exc:
                detail = str(exc).splitlines()[0].removeprefix("NCCL WARN ")
                out.problems.append(
                    f"{key}: {value!r}: NCCL refuses it at communicator init ({detail}): "
                    f"every trial with it would fail; use {', '.join(names)}"
                )
        elif name == "NCCL_P2P_LEVEL":
            nccl_p2p_level({name: value}, profile, notes)
            if notes:
                fix = value.upper() if value.upper() in levels else f"one of {', '.join(levels)}"
                out.problems.append(
                    f"{key}: {value!r}: NCCL ignores it silently (case-sensitive): use {fix}"
                )
        elif name in _NCCL_INTEGERS:
            nccl_int_var({name: value}, (name,), notes)
            if notes:
                out.problems.append(
                    f"{key}: {value!r} is not an integer: NCCL ignores it and keeps its "
                    "default, so trials with it measure the default"
                )
    return out
