"""SGLang's flags that rayspec's config checks name, and how SGLang's parser reads a flag.

The tables are read by ``_config.py`` (``server.extra_flags`` and ``search.flags``) and checked
against SGLang's own parser by tests/contract_tests/test_flag_abbreviations.py.
"""

from __future__ import annotations

from rayspec.engines._base import flag_name

__all__ = [
    "DEAD_FLAGS",
    "FILE_FLAGS",
    "MANAGED_FLAGS",
    "MULTICAST_FLAGS",
    "SECRET_FLAGS",
    "sglang_reads_as",
]

# Flags that turn NVLink multicast (NVLS) on; refused unless server.allow_nvlink_multicast.
MULTICAST_FLAGS = ("--enable-nccl-nvls", "--enable-symm-mem", "--enable-torch-symm-mem")
# Flags the command builder owns: setting them elsewhere would contradict the candidate.
MANAGED_FLAGS = (
    "--model-path",
    "--model",
    "--tp-size",
    "--tensor-parallel-size",
    "--host",
    "--port",
    "--speculative-algorithm",
    "--speculative-draft-model-path",
    "--speculative-draft-model",
    "--speculative-num-steps",
    "--speculative-adaptive",
    "--speculative-adaptive-config",
    "--speculative-eagle-topk",
    "--speculative-num-draft-tokens",
    "--max-running-requests",
    "--attention-backend",
    "--mem-fraction-static",
    "--cuda-graph-max-bs",
    "--cuda-graph-max-bs-decode",
)
# SGLang merges the flags of this YAML file into its argv before parsing: past every check here.
FILE_FLAGS = ("--config",)
# Parsed by SGLang and never read (docs/sglang.md, *Flags rayspec keeps out*): searching it
# measures noise.
DEAD_FLAGS = ("--num-continuous-decode-steps",)
# Keys that make SGLang refuse requests without them: rayspec's client sends none, and the value
# would be written in every record of the launch.
SECRET_FLAGS = ("--api-key", "--admin-api-key")

# SGLang options that are a prefix of a protected flag yet are options of their own: argparse
# takes an exact match before any abbreviation (checked against SGLang's own parser by
# tests/contract_tests/test_flag_abbreviations.py).
_EXACT_SGLANG_PREFIXES: tuple[str, ...] = ()


def sglang_reads_as(flag: str, protected: tuple[str, ...]) -> str | None:
    """The flag of ``protected`` that SGLang's parser reads ``flag`` as, or None.

    SGLang's ``argparse`` parser takes unique prefixes (``allow_abbrev``): ``--hos`` is
    ``--host``, ``--tp-s`` is ``--tp-size``; ``--flag=value`` is ``--flag``. A prefix of a
    protected flag is reported even when SGLang would find it ambiguous (that launch fails
    anyway), unless it is an option of its own.
    """
    name = flag_name(flag)
    if name in protected:
        return name
    if len(name) <= 2 or name in _EXACT_SGLANG_PREFIXES:
        return None
    hits = sorted(p for p in protected if p.startswith(name))
    return hits[0] if hits else None
