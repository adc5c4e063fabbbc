"""The contract diff: the same requests to the twin and to real SGLang 0.5.23 (on this CPU, the
tiny models), without speculation and with an EAGLE-3 chain, compared by shape.

Every endpoint, JSON field (and its type), metric name and log line rayspec reads must be in
both with the same shape, and the twin's stream and response shapes must be real SGLang's
(``tests/sglang_dialect.py`` has the probes and the rules). Two real server starts in all.

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
from tests.real_sglang._models import TinyModels
from tests.real_sglang.conftest import RealServer
from tests.sglang_dialect import TWIN_FLAGS
from tests.sglang_dialect import Shape
from tests.sglang_dialect import diff_counts
from tests.sglang_dialect import load_recorded
from tests.sglang_dialect import log_answers
from tests.sglang_dialect import probe
from tests.sglang_dialect import problems
from tests.sglang_dialect import record
from tests.sglang_dialect import recordable
from tests.sglang_dialect import server_flags
from tests.sglang_dialect import shapes

RECORD = os.environ.get("RAYSPEC_RECORD_DIALECT") == "1"


@dataclasses.dataclass(frozen=True)
class Compared:
    mode: str  # "plain" or "spec"
    real: dict[str, Shape]
    twin: dict[str, Shape]


def _answers(url: str, log_path: Path) -> dict[str, Any]:
    answers = probe(url)
    answers |= log_answers(log_path)
    return answers


@pytest.fixture(scope="module", params=["plain", "spec"])
def compared(
    request: pytest.FixtureRequest,
    real_server: RealServer,
    tiny_models: TinyModels,
    tmp_path_factory: pytest.TempPathFactory,
) -> Compared:
    mode = str(request.param)
    draft = str(tiny_models.draft) if mode == "spec" else None
    flags = server_flags(str(tiny_models.target), draft)
    with real_server(flags) as (url, log_path):
        real = _answers(url, log_path)
    twin_log = tmp_path_factory.mktemp(f"twin-{mode}") / "server.log"
    with TwinProcess([*flags, *TWIN_FLAGS], log_path=str(twin_log)) as twin:
        twin.wait_ready(60)
        answers = _answers(twin.base_url, twin_log)
    return Compared(mode, shapes(real), shapes(answers))


def test_the_twin_speaks_real_sglangs_dialect(compared: Compared, record_property: Any) -> None:
    counts = diff_counts(compared.real, compared.twin)
    # The remaining differences (real-only, twin-only, mistyped paths per probe), for the
    # report: SGLang's server arguments and metrics the twin does not model.
    record_property(f"dialect_diff_{compared.mode}", json.dumps(counts))
    print(f"\n{compared.mode}: twin-vs-real shape differences {counts}")
    assert problems(compared.real, compared.twin, spec=compared.mode == "spec") == []


def test_the_recorded_shapes_are_still_real_sglangs(compared: Compared) -> None:
    fresh = recordable(compared.real, compared.twin)
    if RECORD:
        record(compared.mode, fresh)
        return
    recorded = load_recorded()[compared.mode]
    # The recording, checked as the twin is: what it says real SGLang sends, it still sends.
    assert problems(fresh, recorded, spec=compared.mode == "spec") == [], (
        "real SGLang's shapes changed: RAYSPEC_RECORD_DIALECT=1 records them again"
    )
