"""Checks that need more than the schema, run before anything starts (each a ConfigError)."""

from __future__ import annotations

import errno
import os
import shutil
import socket
import tempfile
from collections.abc import Callable
from typing import Any

from rayspec._config import Engine
from rayspec._config import ExperimentConfig
from rayspec._config import cluster_endpoint
from rayspec._exceptions import ConfigError
from rayspec._plural import plural
from rayspec.search import SearchSpace
from rayspec.search import validate_enqueue
from rayspec.search._resume import check_grid
from rayspec.search._resume import check_resumable
from rayspec.store import StudyFolder
from rayspec.store import check_folder
from rayspec.tune._fit import check_arrivals
from rayspec.tune._fit import check_prompt_lengths
from rayspec.tune._node import NodeProbes
from rayspec.tune._node import check_nccl_values
from rayspec.tune._node import check_node
from rayspec.tune._node import default_probes

__all__ = [
    "check_output_dir",
    "check_path_limits",
    "check_port_free",
    "planned_local_slots",
    "preflight",
]

# How long preflight waits for an answer at cluster.address.
ADDRESS_PROBE_S = 3.0
# Restarts the search needs before a plan exists to verify: the baseline and a chain.
PLAN_SEARCH_MIN = 2
# No model served today takes a longer context: a budget past it is a typo whatever the
# model (a hub id's config is not read here).
MAX_KNOWN_CONTEXT = 10 * 2**20


def planned_local_slots(cfg: ExperimentConfig) -> int:
    """Concurrent trials on a local cluster (each needs its own port)."""
    return max(1, cfg.cluster.max_concurrent_trials)


def check_port_free(host: str, port: int, key: str = "server.port") -> None:
    """Nothing listens on ``host:port``, probed as the server will bind it.

    The probe binds with ``SO_REUSEADDR`` (as uvicorn, SGLang's server, and the twin do), so a
    port left in TIME_WAIT by a crashed study counts as free: "run the same command again"
    works at once.

    Raises:
        ConfigError: one line naming ``key`` (or ``server.host`` when the host is the
            problem).
    """
    from rayspec._exceptions import LaunchError
    from rayspec.server._process import check_port_free as bind_probe

    try:
        bind_probe(host, port)
    except LaunchError as exc:
        cause = exc.__cause__
        if isinstance(cause, OSError) and cause.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"{key}: {port} on {host} is already in use; free it or choose another with "
                f"{key}=..."
            ) from None
        host_key = "server.host" if key == "server.port" else "cluster.dashboard_host"
        why = cause.strerror if isinstance(cause, OSError) and cause.strerror else str(exc)
        raise ConfigError(f"{host_key}: cannot listen on {host}:{port} ({why})") from None


def _probe_address(address: str, timeout_s: float = ADDRESS_PROBE_S) -> None:
    """Something answers at ``cluster.address`` (a bounded TCP connect, not Ray's own wait).

    ``ray.init`` retries an address with nothing behind it for minutes (and ``ray://`` ends in
    a traceback): this probe says so in seconds.
    """
    if address == "auto":
        from ray._private.services import get_ray_address_from_environment

        try:
            found = get_ray_address_from_environment("auto", None)
        except ConnectionError:
            found = None
        if not found:
            raise ConfigError(
                "cluster.address: auto found no running Ray cluster on this machine (no "
                "RAY_ADDRESS, no ray start); give the head's host:port, or leave it empty "
                "for a private local cluster"
            )
        address = found
    endpoint = cluster_endpoint(address)
    if endpoint is None:
        return
    host, port = endpoint
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return
    except OSError as exc:
        why = "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        raise ConfigError(
            f"cluster.address: nothing answers at {host}:{port} ({why} within "
            f"{timeout_s:g} s); start the cluster (ray start --head) or fix the address"
        ) from None


def _check_dashboard(cfg: ExperimentConfig) -> None:
    cl = cfg.cluster
    try:
        socket.getaddrinfo(cl.dashboard_host, cl.dashboard_port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise ConfigError(
            f"cluster.dashboard_host: cannot resolve {cl.dashboard_host!r} ({exc}); use an "
            "address of this machine, e.g. 127.0.0.1"
        ) from None
    try:
        check_port_free(cl.dashboard_host, cl.dashboard_port, key="cluster.dashboard_port")
    except ConfigError as exc:
        raise ConfigError(
            f"{exc} (another study's Ray dashboard?), or cluster.include_dashboard=false"
        ) from None


def _check_storage(cfg: ExperimentConfig) -> None:
    """``study.storage`` names something a study can be kept in, before anything reads it.

    Raises:
        ConfigError: one line naming ``study.storage``.
    """
    url = cfg.storage_url
    if "://" in url:
        from sqlalchemy.engine import make_url

        parsed = make_url(url)
        if parsed.get_backend_name() != "sqlite" or not parsed.database:
            return  # a database server: checked when the study opens it
        path = os.path.abspath(os.path.expanduser(parsed.database))
        what, name = "the sqlite file", "study.db"
        if not os.path.isdir(os.path.dirname(path)):
            raise ConfigError(
                f"study.storage: {url}: the folder {os.path.dirname(path)} does not exist "
                "(sqlite does not create it); create it or choose another path"
            )
    else:
        path, what = os.path.abspath(url), "the journal"
        name = os.path.basename(StudyFolder(path).journal)
    if os.path.isdir(path):
        raise ConfigError(
            f"study.storage: {url} is a folder; {what} must be a file (e.g. {url}/{name})"
        )


def _check_launch_inputs(cfg: ExperimentConfig) -> list[str]:
    """What every trial's server and client read on this machine: the interpreter, the
    prompts. Problems, one line each."""
    problems = []
    python = cfg.server.python
    if python and not shutil.which(python):
        problems.append(
            f"server.python: {python} is not an executable file; give the interpreter of the "
            "server's environment (e.g. /opt/sglang/bin/python)"
        )
    from rayspec.bench import load_prompts

    try:
        load_prompts(cfg.bench.prompts)
    except ConfigError as exc:
        problems.append(f"bench.prompts: {exc}")
    except (OSError, UnicodeDecodeError) as exc:
        problems.append(f"bench.prompts: cannot read {cfg.bench.prompts} ({exc})")
    return problems


def _prompt_lengths(cfg: ExperimentConfig) -> list[str]:
    """The prompts too long for the served model (``_fit``); a file that does not load is
    :func:`_check_launch_inputs`' line, not a second one."""
    try:
        return check_prompt_lengths(cfg)
    except (ConfigError, OSError, UnicodeDecodeError):
        return []


def _writable_folder(path: str) -> str:
    """Why ``path`` cannot hold a study's files ("" when it can): its nearest existing folder
    must take a new entry. A probe folder is made there and removed again, so nothing stays
    behind and a refusal by the file system itself (``/proc``, a read-only mount, root on
    a folder ``os.access`` calls writable) is caught, not guessed."""
    folder = os.path.abspath(path)
    while not os.path.exists(folder):
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    if not os.path.isdir(folder):
        return f"{folder} is not a folder"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".rayspec-probe-", dir=folder))
    except OSError as exc:
        return f"cannot create folders in {folder} ({exc.strerror or exc})"
    return ""


# The longest name the study writes under its folder (a request file's temporary copy), with
# room to spare: the folder's path must leave this much of the system's path limit.
_LONGEST_ENTRY = "requests/.trial-000000.parquet.tmp-0123456789abcdef"
# AF_UNIX socket paths (Linux): Ray puts its private cluster's sockets under its temp folder.
_SOCKET_PATH_MAX = 107
_RAY_SOCKET = "session_2026-01-01_00-00-00_000000_{pid}/sockets/plasma_store"


def _nearest_folder(path: str) -> str:
    folder = os.path.abspath(path)
    while not os.path.isdir(folder):
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    return folder


def _limit(folder: str, name: str, default: int) -> int:
    try:
        return int(os.pathconf(folder, name))
    except (OSError, ValueError):
        return default


def _clip(text: str, n: int = 40) -> str:
    return text if len(text) <= n else f"{text[:n]}…"


def _path_problem(key: str, path: str) -> str:
    """Why ``path`` (a folder to create and write in) is past the system's path limits ("":
    it is not). The file system refuses such a path with ENAMETOOLONG, at whatever write
    comes first."""
    full = os.path.abspath(path)
    existing = _nearest_folder(full)
    name_max = _limit(existing, "PC_NAME_MAX", 255)
    for part in full.split(os.sep):
        if len(part.encode("utf-8", "surrogateescape")) > name_max:
            return (
                f"{key}: the folder name {_clip(part)!r} is {len(part):,} characters, past this "
                f"file system's limit of {name_max} for one name; choose a shorter {key}"
            )
    path_max = _limit(existing, "PC_PATH_MAX", 4096)
    need = len(os.path.join(full, _LONGEST_ENTRY).encode("utf-8", "surrogateescape"))
    if need >= path_max:
        return (
            f"{key}: the study's files would have paths of {need:,} bytes "
            f"({_clip(full)}), past this system's limit of {path_max} for a path; choose a "
            f"shorter {key}"
        )
    return ""


def check_path_limits(cfg: ExperimentConfig) -> None:
    """The study folder (``output.dir`` and ``study.name``) and a journal kept elsewhere fit
    the system's limits on a name and a path (before anything reads them).

    Raises:
        ConfigError: one line naming ``output.dir`` (or ``study.storage``).
    """
    why = _path_problem("output.dir", cfg.out_dir)
    url = cfg.storage_url
    if not why and "://" not in url:
        why = _path_problem("study.storage", os.path.dirname(os.path.abspath(url)))
    if why:
        raise ConfigError(why)


def _check_ray_temp(cfg: ExperimentConfig) -> list[str]:
    """The folder a private Ray cluster keeps its sockets and logs in (``RAY_TMPDIR``, else
    ``TMPDIR``, else /tmp: Ray's rule) can hold them: a file there, or a path too long for a
    Unix socket, failed inside ``ray.init`` with a line that named neither variable."""
    if cfg.cluster.address:
        return []  # a joined cluster keeps its own
    key = next((k for k in ("RAY_TMPDIR", "TMPDIR") if k in os.environ), "")
    base = os.environ[key] if key else os.path.join(os.sep, "tmp")
    name = key or "TMPDIR (unset: /tmp)"
    ray_dir = os.path.join(base, "ray")
    fix = f"set {key or 'TMPDIR'} to a short writable folder, e.g. {key or 'TMPDIR'}=/tmp"
    why = _writable_folder(ray_dir)
    if why:
        return [f"{name}: Ray's private cluster keeps its files in {ray_dir}: {why}; {fix}"]
    socket = os.path.join(os.path.abspath(ray_dir), _RAY_SOCKET.format(pid=os.getpid()))
    if len(socket.encode("utf-8", "surrogateescape")) > _SOCKET_PATH_MAX:
        return [
            f"{name}: {_clip(base)} is too long for Ray's sockets under it ("
            f"{len(socket.encode('utf-8', 'surrogateescape'))} bytes, at most "
            f"{_SOCKET_PATH_MAX} for a Unix socket path); {fix}"
        ]
    return []


def check_output_dir(cfg: ExperimentConfig) -> None:
    """The study folder (and a journal storage elsewhere) can be created and written.

    Raises:
        ConfigError: one line naming ``output.dir`` (or ``study.storage``).
    """
    why = _writable_folder(cfg.out_dir)
    if why:
        raise ConfigError(
            f"output.dir: {cfg.out_dir} cannot be created: {why}; choose a writable folder "
            "with output.dir=..."
        )
    url = cfg.storage_url
    if "://" not in url:
        why = _writable_folder(os.path.dirname(os.path.abspath(url)))
        if why:
            raise ConfigError(f"study.storage: {url} cannot be created: {why}")
    # An existing study folder: links out of it, unwritable folders or journal, foreign rows.
    check_folder(cfg.out_dir, "" if "://" in url else url)


def preflight(
    cfg: ExperimentConfig,
    *,
    launching: bool = True,
    probes: NodeProbes | None = None,
    space: SearchSpace | None = None,
) -> list[str]:
    """Raise :class:`ConfigError` for any problem found before starting Ray or a server.

    ``launching=False`` (``--dry-run``, ``--print-config``) skips what only matters when
    servers really start on this machine: free ports, SGLang, the model folders and the GPUs.
    The real engine on a local cluster gets every node check of :func:`check_node` (through
    ``probes``, default the real ones); a remote cluster's nodes are not inspected. ``space``:
    the experiment's space when the caller has built it (the CLI builds it once for all).

    Returns:
        Warnings to print; they do not stop the study.

    Raises:
        ConfigError: one line per problem (the CLI prefixes the first with ``error: ``).
    """
    check_path_limits(cfg)
    _check_storage(cfg)
    space = space or SearchSpace.from_config(cfg.search)
    check_grid(cfg, space)
    validate_enqueue(cfg, space)
    _check_plan_budget(cfg)
    warnings = check_resumable(cfg, space)
    if cfg.server.engine is Engine.twin:
        _check_twin(cfg)
    if launching:
        check_output_dir(cfg)
    local = not cfg.cluster.address
    problems: list[str] = check_arrivals(cfg)
    if launching and not local:
        _probe_address(cfg.cluster.address)
    # A finished study starts no Ray and no server: this machine's ports, inputs and GPUs do
    # not matter to it.
    on_this_machine = local and launching and _servers_start(cfg, space)
    problems += _check_output_budget(cfg, with_prompts=on_this_machine)
    if on_this_machine:
        problems += _check_launch_inputs(cfg)
        problems += _prompt_lengths(cfg)
        problems += _check_ray_temp(cfg)
        if cfg.cluster.include_dashboard:
            problems += _problem(_check_dashboard, cfg)
        for slot in range(planned_local_slots(cfg)):
            problems += _problem(check_port_free, cfg.server.host, cfg.server.port + slot)
    if cfg.server.engine is Engine.sglang:
        # NCCL values are checked for the real engine only, and on every run (a dry run too:
        # they are NCCL's rules, not this node's). The twin accepts them on purpose: it exists
        # to exercise failures, and its studies search bad values (NCCL_PROTO=LL256 in
        # tests/tune_tests/test_search.py and tests/reliability_tests/test_faults.py) to check
        # that a failing NCCL set is recorded, screened out and never launched again.
        findings = check_nccl_values(cfg)
        if on_this_machine:
            findings.extend(check_node(cfg, probes or default_probes()))
        problems += findings.problems
        warnings += findings.warnings
    else:
        warnings += _twin_served_warnings(cfg)
    if problems:
        # One line per problem: the CLI prints "error: " before the message's first line.
        raise ConfigError("\nerror: ".join(problems))
    return warnings


def _check_plan_budget(cfg: ExperimentConfig) -> None:
    """``study.verify_plan`` leaves the search the restarts a plan needs first: the baseline
    and a chain (with fewer, the study ran no trial at all and said only "budget spent")."""
    from rayspec.tune._tiers import plan_may_apply

    kept, budget = cfg.study.verify_plan, cfg.study.max_restarts
    if not kept or not plan_may_apply(cfg) or budget - kept >= PLAN_SEARCH_MIN:
        return
    raise ConfigError(
        f"study.verify_plan: {plural(kept, 'server start')} kept for the plan's verification "
        f"leave the search {plural(max(0, budget - kept), 'restart')} of "
        f"study.max_restarts={budget}, and a plan needs {PLAN_SEARCH_MIN} measured first (the "
        f"baseline and a chain); raise study.max_restarts to {kept + PLAN_SEARCH_MIN} or more, "
        "or lower study.verify_plan"
    )


def _problem(check: Callable[..., None], *args: Any) -> list[str]:
    try:
        check(*args)
    except ConfigError as exc:
        return [str(exc)]
    return []


def _servers_start(cfg: ExperimentConfig, space: SearchSpace) -> bool:
    """Whether this run would launch a server (a finished study would not)."""
    from rayspec.tune._driver import idle_reason

    return not idle_reason(cfg, space=space)


def _check_twin(cfg: ExperimentConfig) -> None:
    from rayspec.twin import load_profile
    from rayspec.twin.server import Faults

    twin = cfg.server.twin
    try:
        profile = load_profile(twin.profile)
    except (ValueError, OSError) as exc:
        raise ConfigError(f"server.twin.profile: {exc}") from None
    gpus = profile.hardware.n_ranks
    if cfg.server.tp_size > gpus:  # the twin, like SGLang, would fail to start every trial
        raise ConfigError(
            f"server.tp_size: {cfg.server.tp_size} is more than the {plural(gpus, 'GPU')} of "
            f"the twin's node (profile {twin.profile}); use server.tp_size={gpus} or a profile "
            "with more ranks"
        )
    if twin.fault:
        try:
            Faults.parse([twin.fault])
        except ValueError as exc:
            raise ConfigError(f"server.twin.fault: {exc}") from None


def _served_context(cfg: ExperimentConfig) -> tuple[int, str]:
    """The context length the trials' servers will have, and where it comes from (SGLang's
    rule: ``--context-length``, else the model folder's config.json)."""
    from rayspec.tune._node._models import _context_flag
    from rayspec.tune._node._models import read_model
    from rayspec.twin import DEFAULT_CONTEXT_LEN

    srv = cfg.server
    flag = _context_flag(srv.extra_flags)
    if flag:
        return flag, "--context-length in server.extra_flags"
    info, _ = read_model("server.model_path", srv.model_path)
    if info is not None and info.context_len:
        return info.context_len, f"the context length of {srv.model_path}/config.json"
    if srv.engine is Engine.twin:
        return DEFAULT_CONTEXT_LEN, "the twin's context length"
    return MAX_KNOWN_CONTEXT, "longer than any served model's context"


def _check_output_budget(cfg: ExperimentConfig, *, with_prompts: bool) -> list[str]:
    """Every request's output budget fits the served context (SGLang refuses a request whose
    prompt and budget do not, HTTP 400, on every trial). A prompt has at least one token, so a
    budget is at most the context length less one. Problems, one line each."""
    context, source = _served_context(cfg)
    limit = context - 1
    declared = bool(cfg.bench.scenarios)
    problems = []
    records_checked = False
    for i, sc in enumerate(cfg.scenarios()):
        key = f"bench.scenarios[{i}]" if declared else "bench"
        budgets = [(f"{key}.max_tokens", sc.max_tokens)]
        if sc.output_len:
            budgets = [(f"{key}.output_len", max(sc.output_len))]
        elif with_prompts and not records_checked:  # a record's own output_tokens
            records_checked = True
            budgets += _record_budgets(cfg.bench.prompts)
        for where, value in budgets:
            if value > limit:
                problems.append(
                    f"{where}: {value:,} output tokens cannot fit a context of {context:,} "
                    f"tokens ({source}); SGLang refuses such a request (HTTP 400): give at "
                    f"most {limit:,}"
                )
                return problems  # one line: the first budget past the context
    return problems


def _record_budgets(prompts: str) -> list[tuple[str, int]]:
    """The largest ``output_tokens`` a record of the prompt set gives (a file's problems are
    reported by the launch-input check)."""
    from rayspec.bench import load_dataset

    try:
        records = load_dataset(prompts)
    except (ConfigError, OSError, UnicodeDecodeError):
        return []
    budgets = [r.output_tokens for r in records if r.output_tokens is not None]
    if not budgets:
        return []
    return [(f"bench.prompts ({prompts}): a record's output_tokens", max(budgets))]


def _twin_served_warnings(cfg: ExperimentConfig) -> list[str]:
    """One line per way the twin's trials are not the experiment's model or TP size: the twin
    times every trial as its profile's model at the profile's TP, whatever server.model_path
    and server.tp_size say."""
    from rayspec.twin import load_profile
    from rayspec.twin import mismatches

    srv = cfg.server
    try:
        profile = load_profile(srv.twin.profile)
    except (ValueError, OSError):
        return []  # refused by _check_twin already
    names = ("server.tp_size", "server.model_path", "=")
    return mismatches(profile, srv.model_path or "rayspec-twin/", srv.tp_size, names=names)
