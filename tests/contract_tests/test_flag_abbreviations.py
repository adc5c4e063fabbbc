"""rayspec's flag checks read a flag as SGLang's own parser does: unique prefixes included.

SGLang's ``argparse`` parser keeps ``allow_abbrev`` on, so ``--hos 0.0.0.0`` after rayspec's
``--host 127.0.0.1`` binds the server to every interface, and ``--tp-s 4`` overrides
``--tp-size``. Each abbreviation below goes to SGLang's ``prepare_server_args`` after a line
rayspec built; the field SGLang set must be the one :func:`rayspec.engines.sglang.sglang_reads_as`
names, and rayspec must refuse the flag. SGLang's full option list then shows that no option
of its own is a prefix of a protected flag (argparse would take it exactly, and rayspec would
refuse a flag SGLang accepts).
"""

from __future__ import annotations

import pytest

from rayspec import Candidate
from rayspec._config import load_config
from rayspec._exceptions import ConfigError
from rayspec.engines.sglang import DEAD_FLAGS
from rayspec.engines.sglang import FILE_FLAGS
from rayspec.engines.sglang import MANAGED_FLAGS
from rayspec.engines.sglang import MULTICAST_FLAGS
from rayspec.engines.sglang import SECRET_FLAGS
from rayspec.engines.sglang import sglang_reads_as
from rayspec.server import build_launch
from tests.contract_tests._sglang import FakeModels
from tests.contract_tests._sglang import ProbeCase
from tests.contract_tests._sglang import ProbeRunner
from tests.helpers import FIELD_EXPERIMENT

PROTECTED = (*MANAGED_FLAGS, *MULTICAST_FLAGS, *DEAD_FLAGS, *FILE_FLAGS, *SECRET_FLAGS)
# (the flag as a user might write it, its value or None, the field SGLang sets, the value)
ABBREVIATIONS = [
    (["--hos", "0.0.0.0"], "host", "0.0.0.0"),
    (["--hos=0.0.0.0"], "host", "0.0.0.0"),
    (["--tp-s", "4"], "tp_size", 4),
    (["--tp-si=2"], "tp_size", 2),
    (["--enable-nccl-nv"], "enable_nccl_nvls", True),
    (["--enable-symm"], "enable_symm_mem", True),
    (["--num-continuous-d", "4"], "num_continuous_decode_steps", 4),
    (["--max-running-req", "7"], "max_running_requests", 7),
]


def _baseline(models: FakeModels) -> tuple[str, ...]:
    cfg = load_config(
        str(FIELD_EXPERIMENT),
        [f"server.model_path={models.target}", f"server.draft_model_path={models.draft}"],
    )
    return build_launch(cfg, Candidate(), port=31001, log_path="-").argv[3:]


def test_sglang_reads_each_abbreviation_as_rayspec_says(
    run_probe: ProbeRunner, fake_models: FakeModels, tmp_path
) -> None:
    base = _baseline(fake_models)
    cases = [
        ProbeCase(id=str(i), argv=(*base, *flag, "--device", "cuda"), entry="parse")
        for i, (flag, _, _) in enumerate(ABBREVIATIONS)
    ]
    results = run_probe(cases)
    for i, (flag, field, value) in enumerate(ABBREVIATIONS):
        got = results[str(i)]
        assert got["ok"], (flag, got)
        assert got["values"][field] == value, (flag, field, got["values"][field])
        meant = sglang_reads_as(flag[0], PROTECTED)
        assert meant is not None and meant.removeprefix("--").replace("-", "_") in (
            field,
            "tensor_parallel_size",
        ), (flag, meant)
        # And rayspec refuses it, naming what SGLang would read.
        with pytest.raises(ConfigError, match=f"SGLang reads it as {meant}"):
            load_config(
                str(FIELD_EXPERIMENT),
                [
                    f"server.model_path={fake_models.target}",
                    f"server.draft_model_path={fake_models.draft}",
                    f"server.extra_flags=[{','.join(flag)}]",
                ],
            )
    options = set(results["0"]["options"])
    # No option of SGLang's own is a strict prefix of a protected flag (it would be taken
    # exactly, and rayspec's prefix rule would refuse a flag SGLang accepts).
    shadowing = sorted(
        o for o in options if o not in PROTECTED and sglang_reads_as(o, PROTECTED) is not None
    )
    assert shadowing == [], shadowing
    # Every alias of a protected setting is protected too.
    assert {"--host", "--tp-size", "--tensor-parallel-size", "--enable-nccl-nvls"} <= options
    assert "--config" in options  # SGLang merges that file's flags before parsing
