"""Property: any experiment file and overrides either pass validation and preflight, or are
refused with one ``error:`` line per problem, the first naming a key, exit code 2, no
traceback, no Ray started and nothing written.

Generated over every key of the schema (:mod:`tests.fuzz_tests._schema`): wrong types, NaN and
infinities, huge and negative numbers, NUL and control characters, Unicode, paths, URLs,
ports, nested garbage; in the file, as overrides, or both. The CLI runs in-process
(``rayspec.tune.__main__.main``); where a configuration is valid the run stops at the
validation/preflight boundary (``_run``, what would start Ray, is replaced by a marker), or
at ``--dry-run``'s printed lines. A few cases run ``python -m rayspec.tune --dry-run`` as a
real subprocess.

Seeded and bounded: ``derandomize`` (the same examples every run) unless ``RAYSPEC_FUZZ_SEED``
picks a seed; ``RAYSPEC_FUZZ_EXAMPLES`` sets the examples per test (default below). A failure
prints the falsifying example and ``@reproduce_failure`` to replay it.
"""

from __future__ import annotations

import contextlib
import io
import ipaddress
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import seed
from hypothesis import settings
from hypothesis import strategies as st

from rayspec.tune._node import InstalledSGLang
from rayspec.tune._node import NodeProbes
from tests.fuzz_tests._schema import KEYS
from tests.fuzz_tests._schema import SECTIONS
from tests.fuzz_tests._schema import garbage
from tests.fuzz_tests._schema import override_text
from tests.fuzz_tests._schema import plausible
from tests.fuzz_tests._schema import value_for
from tests.helpers import REPO

EXAMPLES = int(os.environ.get("RAYSPEC_FUZZ_EXAMPLES", "150"))
SEED = os.environ.get("RAYSPEC_FUZZ_SEED")
FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=SEED is None,
    database=None,  # reproducible from the printed example, not from a local cache
    deadline=None,  # no timed assertions (shared machines)
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
seeded = seed(int(SEED)) if SEED is not None else (lambda f: f)

# Outcomes, for the closing counts (printed in the terminal summary by conftest.py).
COUNTS: Counter[str] = Counter()

_KEY_SUBJECT = re.compile(
    rf"^error: (?:(?:{'|'.join(SECTIONS)})[.\[\w]|override\b|\S*\.ya?ml\b|'.*\.ya?ml)"
)


@pytest.fixture(scope="module", autouse=True)
def boundary() -> Iterator[dict[str, int]]:
    """Replace what would start Ray (``_run``) with a marker; fake the SGLang probes (no
    subprocess per example); refuse ``ray.init`` outright."""
    import ray

    import rayspec.tune.__main__ as cli
    import rayspec.tune._preflight as pre

    reached = {"run": 0}

    def marker(cfg: Any, *_rest: Any) -> int:
        reached["run"] += 1
        return 0

    def no_ray(*_a: object, **_k: object) -> None:
        raise AssertionError("ray.init was called at the validation/preflight boundary")

    probes = NodeProbes(sglang=lambda py, env: InstalledSGLang("0.5.23"), nvml=lambda: None)
    real_getaddrinfo = socket.getaddrinfo

    def offline(host: Any, *args: Any, **kwargs: Any) -> Any:
        """This machine's resolver without DNS: a generated host name answers at once
        (a lookup that waits for a DNS server would bound nothing)."""
        try:
            ipaddress.ip_address(str(host).strip("[]"))
        except ValueError:
            if host != "localhost":
                raise socket.gaierror(socket.EAI_NONAME, "Name or service not known") from None
        return real_getaddrinfo(host, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket, "getaddrinfo", offline)
        mp.setattr(cli, "_run", marker)
        mp.setattr(ray, "init", no_ray)
        mp.setattr(pre, "default_probes", lambda: probes)
        yield reached


def _doc(out_dir: str, engine: str) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "study": {"name": "fz", "n_trials": 2},
        "server": {"engine": engine},
        "output": {"dir": out_dir},
    }
    if engine == "sglang":
        doc["server"].update(model_path="org/target", draft_model_path="org/draft")
    return doc


def _put(doc: dict[str, Any], key: str, value: Any) -> None:
    node = doc
    *parents, last = key.split(".")
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[last] = value


def _write(path: str, doc: Any) -> None:
    try:
        text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
    except (yaml.YAMLError, UnicodeError):
        text = json.dumps(doc)  # JSON is YAML too
    with open(path, "w", encoding="utf-8", errors="surrogatepass") as fh:
        fh.write(text)


def _snapshot(folder: str) -> set[str]:
    out = set()
    for root, dirs, files in os.walk(folder):
        out.update(os.path.join(root, n) for n in (*dirs, *files))
    return out


@contextlib.contextmanager
def _inside(folder: str) -> Iterator[None]:
    before = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def check_contract(argv_tail: list[str], doc: Any, *, mode: str, boundary: dict[str, int]) -> str:
    """Write ``doc``, run the CLI on it with ``argv_tail``, assert the contract."""
    import ray

    from rayspec.tune.__main__ import main

    # A cluster an earlier test of this process left up is not this run's (ray.init is refused
    # outright at the boundary): the run must leave Ray as it found it.
    ray_before = ray.is_initialized()
    with tempfile.TemporaryDirectory(prefix="rayspec-fuzz-") as tmp, _inside(tmp):
        path = os.path.join(tmp, "exp.yaml")
        _write(path, doc)
        before = _snapshot(tmp)
        err, out = io.StringIO(), io.StringIO()
        runs_before = boundary["run"]
        argv = [*([mode] if mode else []), path, *argv_tail]
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                rc = main(argv)
            except SystemExit as exc:  # argparse
                rc = exc.code if isinstance(exc.code, int) else 1
        after = _snapshot(tmp)
    message = err.getvalue()
    assert "Traceback" not in message, message
    assert ray.is_initialized() == ray_before
    assert after == before, f"files written: {sorted(after - before)}"
    if rc == 2:
        lines = [line for line in message.splitlines() if line.strip()]
        assert lines and all(line.startswith("error: ") for line in lines), message
        assert _KEY_SUBJECT.match(lines[0]), f"the first line names no key: {lines[0]!r}"
        assert boundary["run"] == runs_before
        COUNTS["refused"] += 1
        return "refused"
    assert rc == 0, (rc, message, out.getvalue())
    if mode:  # --dry-run or --print-config: printed, nothing run
        printed = out.getvalue().splitlines()
        first = "study " if mode == "--dry-run" else "study:"
        assert printed and printed[0].startswith(first), out.getvalue()
        assert boundary["run"] == runs_before
        COUNTS[f"valid ({mode})"] += 1
    else:
        assert boundary["run"] == runs_before + 1  # stopped at the boundary, nothing ran
        COUNTS["valid (preflight passed)"] += 1
    return "valid"


_ENGINES = st.sampled_from(["twin", "twin", "sglang"])
_MODES = st.sampled_from(["", "", "--dry-run", "--print-config"])
_KEYED = st.sampled_from(KEYS).flatmap(lambda kv: st.tuples(st.just(kv[0]), value_for(kv[1])))


def _keyed_case(
    boundary: dict[str, int], engine: str, in_file: list[Any], overrides: list[Any], mode: str
) -> None:
    """One case: the generated keys set in the file and as overrides, then the contract."""
    COUNTS["cases"] += 1
    doc = _doc("runs", engine)  # relative: inside the folder whose files are compared
    for key, value in in_file:
        _put(doc, key, value)
    tail = [override_text(k, v) for k, v in overrides]
    check_contract(tail, doc, mode=mode, boundary=boundary)


@seeded
@FUZZ
@given(
    engine=_ENGINES,
    in_file=st.lists(_KEYED, max_size=3),
    overrides=st.lists(_KEYED, max_size=3),
    mode=_MODES,
)
def test_generated_experiments_keep_the_contract(
    boundary, engine, in_file, overrides, mode
) -> None:
    _keyed_case(boundary, engine, in_file, overrides, mode)


_PLAUSIBLE = st.sampled_from(KEYS).flatmap(lambda kv: st.tuples(st.just(kv[0]), plausible(kv[1])))


@seeded
@FUZZ
@given(
    engine=_ENGINES,
    in_file=st.lists(_PLAUSIBLE, max_size=4),
    overrides=st.lists(_PLAUSIBLE, max_size=2),
    mode=_MODES,
)
def test_plausible_experiments_keep_the_contract(
    boundary, engine, in_file, overrides, mode
) -> None:
    """Values a user might mean: many configurations are valid, and pass preflight."""
    _keyed_case(boundary, engine, in_file, overrides, mode)


@seeded
@FUZZ
@given(
    top=st.one_of(garbage(), st.dictionaries(st.sampled_from([*SECTIONS, "x"]), garbage())),
    mode=_MODES,
)
def test_garbage_documents_keep_the_contract(boundary, top, mode) -> None:
    """Whole documents of garbage: a list, a scalar, sections that are not mappings."""
    COUNTS["cases"] += 1
    check_contract([], top, mode=mode, boundary=boundary)


@seeded
@FUZZ
@given(raw=st.binary(max_size=200), mode=_MODES)
def test_raw_bytes_keep_the_contract(boundary, raw, mode) -> None:
    """Files that are not YAML, or not text at all."""
    COUNTS["cases"] += 1
    import ray

    from rayspec.tune.__main__ import main

    ray_before = ray.is_initialized()
    with tempfile.TemporaryDirectory(prefix="rayspec-fuzz-") as tmp, _inside(tmp):
        path = os.path.join(tmp, "exp.yaml")
        with open(path, "wb") as fh:
            fh.write(raw)
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = main([*([mode] if mode else []), path])
        assert _snapshot(tmp) == {path}
    assert rc == 2 and "Traceback" not in err.getvalue()
    assert len(err.getvalue().strip().splitlines()) == 1, err.getvalue()
    assert ray.is_initialized() == ray_before
    COUNTS["refused"] += 1


# A few generated cases as real subprocesses: the exit code, stderr and that nothing is left
# behind, as a user's shell sees them (--dry-run: a valid one prints its launch lines).
SUBPROCESS_CASES = [
    ["server.startup_timeout_s=nan"],
    ["server.extra_flags=[--hos,0.0.0.0]"],
    ["search.flags={--tokenizer-path: ['x\ntouch PWNED\n#']}"],
    [],
]


@pytest.mark.parametrize(
    "tail", SUBPROCESS_CASES, ids=[str(i) for i in range(len(SUBPROCESS_CASES))]
)
def test_as_a_subprocess(tail, tmp_path) -> None:
    COUNTS["cases"] += 1
    path = tmp_path / "exp.yaml"
    _write(str(path), _doc(str(tmp_path / "runs"), "twin"))
    proc = subprocess.run(
        [sys.executable, "-m", "rayspec.tune", "--dry-run", str(path), *tail],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env={**os.environ, "PYTHONPATH": REPO},
    )
    assert "Traceback" not in proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["exp.yaml"]
    if tail:
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and _KEY_SUBJECT.match(lines[0]), proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr
