"""The contract diff: the same requests to the twin and to real SGLang 0.5.23 (on this CPU, the
tiny models), without speculation, with an EAGLE-3 chain and with the always-agreeing pair
(whose every token is a special token without text; the twin with ``--twin-text pad``),
compared by shape.

Every endpoint, JSON field (and its type), metric name and log line rayspec reads must be in
both with the same shape, the twin's stream and response shapes must be real SGLang's, and so
must its error and edge answers (each layer's refusal, budgets past the context length, ``n``,
logprobs, 404/405, ``/v1/loads``, ``/model_info``; ``tests/sglang_dialect.py`` has the probes
and the rules). No real start of its own: the probe runs on the shared plain, EAGLE-3 chain and
agreeing runs (``plain_run``, ``chain_run``, ``agree_run``), after their own requests.

``RAYSPEC_RECORD_DIALECT=1`` writes real SGLang's shapes to ``tests/data/`` for the twin test
that runs without real SGLang (``tests/twin_tests/test_twin_dialect.py``); otherwise this
checks that the recording still describes real SGLang.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from rayspec.testing._twin import TwinProcess
from tests.real_sglang._runs import ServerRun
from tests.real_sglang._server import launch_argv
from tests.sglang_dialect import TEXTLESS_FLAGS
from tests.sglang_dialect import TWIN_FLAGS
from tests.sglang_dialect import Shape
from tests.sglang_dialect import answers
from tests.sglang_dialect import diff_counts
from tests.sglang_dialect import load_recorded
from tests.sglang_dialect import problems
from tests.sglang_dialect import record
from tests.sglang_dialect import recordable
from tests.sglang_dialect import shapes

RECORD = os.environ.get("RAYSPEC_RECORD_DIALECT") == "1"


@dataclasses.dataclass(frozen=True)
class Compared:
    mode: str  # "plain" or "spec"
    real: dict[str, Shape]
    twin: dict[str, Shape]


def _as_launched(flags: tuple[str, ...]) -> list[str]:
    """The flags the real server was given (launch_argv's, less the interpreter, host, port)."""
    return launch_argv(Path("python"), flags, 0)[3:-4]


RUN_OF = {"plain": "plain_run", "spec": "chain_run", "agree": "agree_run"}


@pytest.fixture(scope="module", params=list(RUN_OF))
def compared(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Compared:
    """The probe's answers from the shared real run (its requests follow the run's own) and
    from a twin started with the same flags (and, for the agreeing pair, answers without
    text)."""
    mode = str(request.param)
    run: ServerRun = request.getfixturevalue(RUN_OF[mode])
    twin_log = tmp_path_factory.mktemp(f"twin-{mode}") / "server.log"
    flags = [*_as_launched(run.flags), *TWIN_FLAGS]
    if mode == "agree":
        flags += TEXTLESS_FLAGS
    with TwinProcess(flags, log_path=str(twin_log)) as twin:
        twin.wait_ready(60)
        twin_answers = answers(twin.base_url, twin_log)
    return Compared(mode, shapes(run.probed), shapes(twin_answers))


def test_the_twin_speaks_real_sglangs_dialect(compared: Compared, record_property: Any) -> None:
    counts = diff_counts(compared.real, compared.twin)
    # The remaining differences (real-only, twin-only, mistyped paths per probe), for the
    # report: SGLang's server arguments and metrics the twin does not model.
    record_property(f"dialect_diff_{compared.mode}", json.dumps(counts))
    print(f"\n{compared.mode}: twin-vs-real shape differences {counts}")
    assert problems(compared.real, compared.twin, spec=compared.mode != "plain") == []


def test_the_recorded_shapes_are_still_real_sglangs(compared: Compared) -> None:
    fresh = recordable(compared.real, compared.twin)
    if RECORD:
        record(compared.mode, fresh)
        return
    recorded = load_recorded()[compared.mode]
    # The recording, checked as the twin is: what it says real SGLang sends, it still sends.
    assert problems(fresh, recorded, spec=compared.mode != "plain") == [], (
        "real SGLang's shapes changed: RAYSPEC_RECORD_DIALECT=1 records them again"
    )
