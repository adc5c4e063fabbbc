"""The twin's command line: SGLang's ``launch_server`` flags, spelled as SGLang spells them.

The parser accepts the flag surface of SGLang (``docs/sglang.md``; with aliases) plus twin-only
options under ``--twin-``. It is a plain :mod:`argparse` parser with SGLang's behaviour kept on
purpose: an unknown flag is an argparse error (exit code 2) and abbreviations are allowed, which
is exactly why ``--cuda-graph-max-bs`` is *ambiguous* (exit 2) when emulating SGLang >= 0.5.20.

Resolution of the parsed values (SGLang's rules, *Speculative rules*) lives in
:mod:`rayspec.twin._resolve`.
"""

from __future__ import annotations

import argparse
import re

DEFAULT_VERSION = "0.5.23"


def parse_version(text: str) -> tuple[int, int, int]:
    """``"0.5.23"`` or ``"0.4.10.post2"`` -> ``(0, 5, 23)``.

    Raises:
        ValueError: the text does not start with three dot-separated integers.
    """
    match = re.match(r"^(\d+)\.(\d+)\.(\d+)", text.strip())
    if match is None:
        raise ValueError(f"--twin-version {text!r}: expected a version like 0.5.23")
    return int(match.group(1)), int(match.group(2)), int(match.group(3))


def _peek_version(argv: list[str]) -> tuple[int, int, int]:
    """The emulated version, read before the real parse (it changes which flags exist)."""
    value = DEFAULT_VERSION
    for i, arg in enumerate(argv):
        if arg == "--twin-version" and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--twin-version="):
            value = arg.split("=", 1)[1]
    try:
        return parse_version(value)
    except ValueError:
        return parse_version(DEFAULT_VERSION)


def _str2bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean, got {text!r}")


def build_parser(version: tuple[int, int, int] = (0, 5, 23)) -> argparse.ArgumentParser:
    """The argument parser for one emulated SGLang version.

    Args:
        version: the emulated SGLang version. It decides the cuda-graph flag names: up to
            0.5.17 ``--cuda-graph-max-bs`` is the flag; 0.5.18-0.5.19 accept it as a deprecated
            alias of ``--cuda-graph-max-bs-decode``; from 0.5.20 it is ambiguous (exit 2).

    Returns:
        The parser. ``--help`` explains every option.
    """
    parser = argparse.ArgumentParser(
        prog="python -m rayspec.twin.server",
        description=(
            "rayspec digital twin: a simulated SGLang node. It takes sglang.launch_server's "
            "flags (spelled as SGLang spells them), serves SGLang's HTTP API and writes "
            "SGLang's log lines, while a calibrated performance model (--twin-profile) decides "
            "how fast tokens stream. Nothing is computed on a GPU."
        ),
    )
    add = parser.add_argument

    g = parser.add_argument_group("model and server (SGLang)")
    g.add_argument(
        "--model-path",
        "--model",
        dest="model_path",
        required=True,
        help="Target model path or Hugging Face id (only reported by the twin).",
    )
    g.add_argument("--tokenizer-path", default=None, help="Tokenizer path (reported only).")
    g.add_argument(
        "--served-model-name",
        default=None,
        help="Model name in the OpenAI API (default: --model-path).",
    )
    g.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="Accepted for compatibility; nothing is loaded.",
    )
    g.add_argument("--host", default="127.0.0.1", help="Address to bind (default 127.0.0.1).")
    g.add_argument("--port", type=int, default=30000, help="Port to bind (default 30000).")
    g.add_argument(
        "--context-length",
        type=int,
        default=None,
        help="Maximum context length (default: the profile's, else 262144).",
    )
    g.add_argument("--dtype", default="auto", help="Accepted and reported only.")
    g.add_argument("--quantization", default=None, help="Accepted and reported only.")
    g.add_argument("--kv-cache-dtype", default="auto", help="Accepted and reported only.")
    g.add_argument("--load-format", default="auto", help="Accepted and reported only.")
    g.add_argument("--device", default=None, help="Accepted and reported only.")
    g.add_argument("--random-seed", type=int, default=None, help="Accepted and reported only.")
    g.add_argument("--api-key", default=None, help="Accepted; the twin does not check keys.")
    g.add_argument(
        "--skip-server-warmup",
        action="store_true",
        help="Skip the 8-token warmup request; the ready line is printed at once.",
    )
    g.add_argument(
        "--watchdog-timeout", type=float, default=300, help="Accepted and reported only."
    )

    g = parser.add_argument_group("parallelism and memory (SGLang)")
    g.add_argument(
        "--tp-size",
        "--tensor-parallel-size",
        dest="tp_size",
        type=int,
        default=1,
        help="Tensor-parallel size (the log prefix shows TP0 when > 1).",
    )
    g.add_argument(
        "--dp-size",
        "--data-parallel-size",
        dest="dp_size",
        type=int,
        default=1,
        help="Data-parallel size (reported only).",
    )
    g.add_argument(
        "--pp-size",
        "--pipeline-parallel-size",
        dest="pp_size",
        type=int,
        default=1,
        help="Pipeline-parallel size (reported only).",
    )
    g.add_argument(
        "--ep-size",
        "--expert-parallel-size",
        dest="ep_size",
        type=int,
        default=1,
        help="Expert-parallel size (reported only).",
    )
    g.add_argument("--nnodes", type=int, default=1, help="Accepted and reported only.")
    g.add_argument("--node-rank", type=int, default=0, help="Accepted and reported only.")
    g.add_argument("--dist-init-addr", default=None, help="Accepted and reported only.")
    g.add_argument("--nccl-port", type=int, default=None, help="Accepted and reported only.")
    g.add_argument(
        "--mem-fraction-static",
        type=float,
        default=None,
        help="Static memory fraction (default: SGLang's formula for the GPU).",
    )
    g.add_argument(
        "--max-running-requests",
        type=int,
        default=None,
        help="Cap on the running batch; extra requests queue (default 48 with "
        "speculative decoding, as in SGLang).",
    )
    g.add_argument(
        "--max-total-tokens",
        type=int,
        default=None,
        help="KV pool size in tokens (default: derived from the profile).",
    )
    g.add_argument(
        "--max-prefill-tokens", type=int, default=16384, help="Accepted and reported only."
    )
    g.add_argument(
        "--chunked-prefill-size",
        type=int,
        default=None,
        help="Chunked prefill size (default from SGLang's GPU-memory table).",
    )
    g.add_argument("--page-size", type=int, default=None, help="KV page size (default 1).")
    g.add_argument("--schedule-policy", default="fcfs", help="Accepted; the twin is FCFS.")
    g.add_argument("--enable-mixed-chunk", action="store_true", help="Accepted and reported.")
    g.add_argument(
        "--disable-overlap-schedule", action="store_true", help="Accepted and reported."
    )
    g.add_argument("--disable-radix-cache", action="store_true", help="Accepted and reported.")
    g.add_argument(
        "--num-continuous-decode-steps",
        type=int,
        default=1,
        help="Dead flag in SGLang (parsed, never read): accepted and ignored.",
    )

    g = parser.add_argument_group("kernels, graphs and collectives (SGLang)")
    g.add_argument(
        "--attention-backend",
        default=None,
        help="Attention backend (default: SGLang's rule, fa3 unless topk > 1).",
    )
    g.add_argument("--prefill-attention-backend", default=None, help="Reported only.")
    g.add_argument("--decode-attention-backend", default=None, help="Reported only.")
    g.add_argument("--sampling-backend", default=None, help="Reported only.")
    if version >= (0, 5, 18):
        decode_names = ["--cuda-graph-max-bs-decode"]
        if version < (0, 5, 20):
            decode_names.append("--cuda-graph-max-bs")
        g.add_argument(
            *decode_names,
            dest="cuda_graph_max_bs_decode",
            type=int,
            default=None,
            help="Largest decode batch captured as a CUDA graph (default from the "
            "GPU-memory table). --cuda-graph-max-bs is a deprecated alias on "
            "0.5.18-0.5.19 and ambiguous (exit 2) from 0.5.20.",
        )
        g.add_argument(
            "--cuda-graph-max-bs-prefill",
            type=int,
            default=None,
            help="Largest prefill batch captured (reported only).",
        )
        g.add_argument(
            "--cuda-graph-bs-decode",
            type=int,
            nargs="+",
            default=None,
            help="Explicit decode batch sizes to capture.",
        )
        g.add_argument(
            "--cuda-graph-backend-decode",
            choices=["full", "breakable", "disabled"],
            default=None,
            help="Decode CUDA-graph backend; 'disabled' runs eager.",
        )
        g.add_argument(
            "--cuda-graph-backend-prefill",
            choices=["full", "breakable", "disabled"],
            default=None,
            help="Prefill CUDA-graph backend (reported only).",
        )
        g.add_argument(
            "--disable-decode-cuda-graph",
            action="store_true",
            help="Run decode without CUDA graphs (cuda graph: False in the log).",
        )
        g.add_argument(
            "--cuda-graph-config", default=None, help="JSON cuda-graph config (reported only)."
        )
    else:
        g.add_argument(
            "--cuda-graph-max-bs",
            dest="cuda_graph_max_bs_decode",
            type=int,
            default=None,
            help="Largest batch captured as a CUDA graph.",
        )
        g.add_argument(
            "--cuda-graph-bs",
            dest="cuda_graph_bs_decode",
            type=int,
            nargs="+",
            default=None,
            help="Explicit batch sizes to capture.",
        )
    g.add_argument(
        "--disable-cuda-graph",
        action="store_true",
        help="Deprecated in 0.5.23 (logs a warning): run without CUDA graphs.",
    )
    g.add_argument(
        "--disable-custom-all-reduce",
        action="store_true",
        help="Fall back to NCCL; no effect on a PCIe profile (custom all-reduce is "
        "off there anyway).",
    )
    g.add_argument(
        "--enable-nccl-nvls",
        action="store_true",
        help="Forces NCCL_NVLS_ENABLE=1 in the environment (as SGLang does).",
    )
    g.add_argument(
        "--enable-symm-mem",
        action="store_true",
        help="Symmetric-memory collectives; also forces NCCL_NVLS_ENABLE=1.",
    )
    g.add_argument(
        "--enable-torch-symm-mem", action="store_true", help="Accepted and reported only."
    )
    g.add_argument(
        "--enable-deterministic-inference", action="store_true", help="Accepted and reported only."
    )

    g = parser.add_argument_group("speculative decoding (SGLang)")
    g.add_argument(
        "--speculative-algorithm",
        default=None,
        help="EAGLE, EAGLE3, NEXTN (alias of EAGLE) or STANDALONE are simulated; "
        "other SGLang names are recognised but not simulated.",
    )
    g.add_argument(
        "--speculative-draft-model-path",
        "--speculative-draft-model",
        dest="speculative_draft_model_path",
        default=None,
        help="Draft model path (reported only).",
    )
    g.add_argument("--speculative-draft-model-revision", default=None, help="Reported only.")
    g.add_argument("--speculative-draft-load-format", default=None, help="Reported only.")
    g.add_argument(
        "--speculative-num-steps",
        type=int,
        default=None,
        help="Draft depth k. Give steps, topk and draft tokens together or none.",
    )
    g.add_argument(
        "--speculative-eagle-topk",
        type=int,
        default=None,
        help="Branching factor m per draft step (1 forces draft tokens to steps+1).",
    )
    g.add_argument(
        "--speculative-num-draft-tokens",
        type=int,
        default=None,
        help="Tokens verified per cycle N, root included. N-1 above the tree's "
        "capacity starts but fails at the first decode, as in SGLang.",
    )
    g.add_argument(
        "--speculative-accept-threshold-single",
        type=float,
        default=1.0,
        help="Reported only (greedy acceptance is modelled).",
    )
    g.add_argument(
        "--speculative-accept-threshold-acc",
        type=float,
        default=1.0,
        help="Reported only (greedy acceptance is modelled).",
    )
    g.add_argument(
        "--speculative-use-rejection-sampling", action="store_true", help="Reported only."
    )
    g.add_argument("--speculative-token-map", default=None, help="Reported only.")
    g.add_argument(
        "--speculative-attention-mode",
        choices=["prefill", "decode"],
        default="prefill",
        help="Reported only.",
    )
    g.add_argument("--speculative-draft-attention-backend", default=None, help="Reported only.")
    if version >= (0, 5, 23):
        g.add_argument(
            "--speculative-adaptive",
            action="store_true",
            help="Adaptive steps per batch-size tier (EAGLE/EAGLE3, topk 1); the "
            "controller is SGLang's, the cost of each step the twin's [est] model.",
        )
        g.add_argument(
            "--speculative-adaptive-config",
            default=None,
            help='JSON tiers {"<batch size>": {"candidate_steps": [...]}} (default: SGLang\'s).',
        )

    g = parser.add_argument_group("streaming, logging and metrics (SGLang)")
    g.add_argument(
        "--log-level",
        default="info",
        help="Log level of the server (debug, info, warning, error).",
    )
    g.add_argument(
        "--log-level-http",
        default=None,
        help="Log level of the HTTP access log (default: --log-level).",
    )
    g.add_argument("--log-requests", action="store_true", help="Accepted and reported only.")
    g.add_argument(
        "--enable-metrics",
        action="store_true",
        help="Mount GET /metrics with SGLang's Prometheus series.",
    )
    g.add_argument(
        "--decode-log-interval",
        type=int,
        default=40,
        help="Decode iterations between 'Decode batch' log lines (default 40).",
    )
    g.add_argument(
        "--stream-interval",
        type=int,
        default=1,
        help="Decode iterations between streamed chunks (default 1).",
    )
    g.add_argument(
        "--incremental-streaming-output",
        action="store_true",
        help="/generate chunks carry only the new text and ids.",
    )
    g.add_argument(
        "--stream-response-default-include-usage",
        action="store_true",
        help="OpenAI streams always end with a usage chunk.",
    )
    g.add_argument(
        "--enable-cache-report",
        action="store_true",
        help="Add prompt_tokens_details.cached_tokens to OpenAI usage.",
    )
    g.add_argument("--show-time-cost", action="store_true", help="Accepted and reported only.")
    g.add_argument(
        "--sleep-on-idle", action="store_true", help="Accepted and reported only (the twin idles)."
    )

    g = parser.add_argument_group("twin-only options")
    g.add_argument(
        "--twin-profile",
        default="kimi-k2.5-tp8-pcie",
        help="Hardware/model profile: a built-in name or a path to a YAML file of "
        "the same schema (default kimi-k2.5-tp8-pcie).",
    )
    g.add_argument(
        "--twin-seed",
        type=int,
        default=0,
        help="Seed of every random draw (noise, acceptance, text); a fixed seed "
        "gives identical token counts and acceptance (default 0).",
    )
    g.add_argument(
        "--twin-startup-s",
        type=float,
        default=1.0,
        help="Simulated time from launch to the ready line, in seconds (default 1).",
    )
    g.add_argument(
        "--twin-fault",
        action="append",
        default=[],
        metavar="KIND[:ARG]",
        help="Inject a failure (repeatable): crash-startup, crash-after:N (after N "
        "generated tokens server-wide, counted from the ready line, the scheduler "
        "crashes and the process dies), never-ready (503 forever), stall:N (after "
        "N tokens the scheduler hangs; streams stay open), oom (torch OOM during "
        "startup; oom:kv for the KV-pool error), graph-capture (CUDA graph capture "
        "fails).",
    )
    g.add_argument(
        "--twin-version",
        default=DEFAULT_VERSION,
        help="Emulated SGLang version (default 0.5.23). >= 0.5.20 rejects "
        "--cuda-graph-max-bs as ambiguous (exit 2); < 0.5.20 has no /ready; "
        ">= 0.5.22 answers 400 to unknown sampling_params keys.",
    )
    g.add_argument(
        "--twin-realtime",
        type=_str2bool,
        default=True,
        metavar="BOOL",
        help="Stream at the model's rate in real time (default true). false "
        "skips every sleep: same numbers, no waiting (for fast unit tests).",
    )
    g.add_argument(
        "--twin-text",
        choices=("words", "pad"),
        default="words",
        help="The answers' tokens: words (default; one word per token) or pad (every token "
        "the pad token, a special token with no text, as a model whose greedy pick is its pad "
        "token answers: the chat stream then sends no content chunk).",
    )
    del add
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse ``argv`` for the emulated version named by ``--twin-version`` inside it.

    Exits with code 2 (argparse's ``SystemExit``) on an unknown or ambiguous flag, as SGLang.
    """
    version = _peek_version(argv)
    namespace = build_parser(version).parse_args(argv)
    namespace.twin_version_tuple = parse_version(namespace.twin_version)
    return namespace
