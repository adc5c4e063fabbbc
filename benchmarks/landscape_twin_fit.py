"""The twin against a real engine's landscape: fit a twin profile to at most 5 recorded settings
of a CPU landscape (``benchmarks/landscapes/cpu-<drafter>.parquet``) and predict the rest.

The model form is the twin's (docs/twin-model.md): at batch 1 with no collectives (tp 1),
``T_fwd(T) = C0 + p_tok·(T - 1)``, a cycle ``V + D = T_fwd(N) + F_spec + D0 + k·d_step``, chain
acceptance ``a_j`` per depth, a tree keeping the N - 1 likeliest of its nodes with rank r >= 2
children accepted ``(1 - a_j)·θ·(1 - θ)^(r-2)``, and ``tok/s = 1000·L / (V + D)``. The fitted
constants go into a real profile (``rayspec.twin.load_profile`` of a YAML written here) and every
prediction is ``rayspec.twin.PerfModel(...).expected_tok_s()``: the twin's own code.

The fit, from the fitted settings only:
- ``C0`` = 1000 / (no speculation's tok/s);
- ``a_j``: pooled from the chains' accept histograms (the share of verify steps that accepted
  at least j drafts among those that accepted at least j - 1), depths past the deepest fitted
  chain repeating its last value;
- ``θ``: the value whose tree accept lengths best match the fitted trees' (a grid; 0.4, the
  shipped profiles' value, without a fitted tree);
- ``p_tok``, ``F_spec + D0`` (one constant: they are not separable here) and ``d_step``:
  non-negative least squares of each fitted setting's cycle time ``1000·L / tok/s`` (L its
  measured accept length) over ``N - 1``, 1 and ``k``.
The objective measured is a run's tok/s with its TTFT included (the study's), so the fitted
constants carry the prefill too.

Usage::

    python benchmarks/landscape_twin_fit.py [--drafters strong,mid,weak]
        [--fit "off;1,1,2;3,1,4;5,1,6;3,4,8"] [--out benchmarks/results/landscape_twin_fit.txt]
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import sys
import tempfile
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from benchmarks.landscape.store import landscape_path  # noqa: E402
from benchmarks.landscape.store import read_landscape  # noqa: E402
from benchmarks.landscape.summary import SettingStats  # noqa: E402
from benchmarks.landscape.summary import setting_stats  # noqa: E402
from rayspec._types import SpecSettings  # noqa: E402
from rayspec.twin import PerfModel  # noqa: E402
from rayspec.twin import load_profile  # noqa: E402
from rayspec.twin import resolve_nccl  # noqa: E402

BASE_PROFILE = "h200-nvlink-tp8-dense"  # its node and NCCL tables are unused: no collectives
DEFAULT_FIT = "off;1,1,2;3,1,4;5,1,6;3,4,8"
OUT = ROOT / "benchmarks" / "results" / "landscape_twin_fit.txt"
THETAS = [i / 100 for i in range(1, 100)]


def key_of(s: SettingStats) -> tuple[int, int, int] | None:
    if s.mode == "off":
        return None
    assert s.num_steps and s.eagle_topk and s.num_draft_tokens
    return (s.num_steps, s.eagle_topk, s.num_draft_tokens)


def parse_fit(text: str) -> list[tuple[int, int, int] | None]:
    out: list[tuple[int, int, int] | None] = []
    for part in text.split(";"):
        part = part.strip()
        if part == "off":
            out.append(None)
        else:
            k, m, n = (int(v) for v in part.split(","))
            out.append((k, m, n))
    if len(out) > 5:
        raise SystemExit("error: --fit: at most 5 settings")
    return out


def spec_of(key: tuple[int, int, int]) -> SpecSettings:
    return SpecSettings("EAGLE3", key[0], key[1], key[2], overlap=False)


def depth_acceptance(
    rows: Sequence[Mapping[str, Any]], chains: set[tuple[int, int, int]]
) -> list[float]:
    """a_j pooled over the chain settings' accept histograms (measured runs)."""
    reach: dict[int, float] = {}  # verify steps that accepted >= j drafts
    seen: dict[int, float] = {}  # verify steps that could have (accepted >= j - 1)
    for r in rows:
        if r["run"] < 0 or r["mode"] == "off" or not r["accept_histogram"]:
            continue
        key = (r["num_steps"], r["eagle_topk"], r["num_draft_tokens"])
        if key not in chains:
            continue
        hist = list(r["accept_histogram"])
        for j in range(1, key[0] + 1):
            seen[j] = seen.get(j, 0.0) + sum(hist[j - 1 :])
            reach[j] = reach.get(j, 0.0) + sum(hist[j:])
    return [reach[j] / seen[j] if seen.get(j) else 0.0 for j in sorted(seen)]


def nnls_small(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Non-negative least squares by trying every support (3 unknowns at most)."""
    n = a.shape[1]
    best, best_res = np.zeros(n), float(np.sum(b**2))
    for size in range(1, n + 1):
        for cols in itertools.combinations(range(n), size):
            x_sub, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
            if np.any(x_sub < 0):
                continue
            x = np.zeros(n)
            x[list(cols)] = x_sub
            res = float(np.sum((a @ x - b) ** 2))
            if res < best_res - 1e-12:
                best, best_res = x, res
    return best


def profile_doc(
    name: str,
    c0: float,
    p_tok: float,
    f_spec: float,
    d_step: float,
    acc: list[float],
    theta: float,
) -> dict[str, Any]:
    base_path = Path(__file__).resolve().parents[1] / "rayspec" / "twin" / "profiles"
    doc = yaml.safe_load((base_path / f"{BASE_PROFILE}.yaml").read_text())
    doc["profile"] = name
    doc["model"].update(
        architecture="LlamaForCausalLM",
        hidden=128,
        layers=32,
        vocab=1024,
        collectives_per_forward=0,
        kv_bytes_per_token_layer=0,
        calib_context=1000,
    )
    doc["forward"].update(C0_ms=c0, W0_ms=c0, c_e_ms=0.0, p_tok_ms=p_tok, flop_tok_ms=0.0)
    doc["speculative"].update(
        F_spec_ms=f_spec,
        F_spec_no_overlap_ms=f_spec,
        D0_ms=0.0,
        d_step_ms=d_step,
        draft_collectives_per_step=0,
    )
    doc["drafter"].update(
        acceptance={"kind": "per_depth", "a": [round(a, 4) for a in acc]},
        a_cap=0.999,
        tree_theta=theta,
    )
    doc["drafter"].pop("category_mult", None)
    return doc


def fit_one(name: str, rows: list[dict[str, Any]], fit: list[tuple[int, int, int] | None]) -> str:
    stats = {key_of(s): s for s in setting_stats(rows)}
    missing = [k for k in fit if k not in stats]
    if missing or None not in stats:
        return f"## {name}\n\n(not recorded: {missing or 'no speculation'})\n"
    c0 = 1000.0 / stats[None].mean
    spec_fit = [k for k in fit if k is not None]
    chains = {k for k in spec_fit if k[1] == 1}
    acc = depth_acceptance(rows, chains) or [0.5]
    trees = [k for k in spec_fit if k[1] > 1]

    def model_for(p_tok: float, f: float, d: float, theta: float) -> Any:
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as fh:
            yaml.safe_dump(profile_doc(f"fit-{name}", c0, p_tok, f, d, acc, theta), fh)
        profile = load_profile(fh.name)
        Path(fh.name).unlink()
        nccl = resolve_nccl({}, profile)
        return lambda key: PerfModel(profile, nccl, None if key is None else spec_of(key))

    theta = 0.4
    if trees:
        probe = model_for(0.0, 0.0, 0.0, 0.4)
        del probe
        errs = []
        for th in THETAS:
            m = model_for(0.0, 0.0, 0.0, th)
            errs.append(
                (
                    sum(
                        (m(k).expected_accept_length() - stats[k].accept_length) ** 2
                        for k in trees
                    ),
                    th,
                )
            )
        theta = min(errs)[1]
    a = np.array([[k[2] - 1, 1.0, k[0]] for k in spec_fit], dtype=float)
    b = np.array([1000.0 * (stats[k].accept_length or 1.0) / stats[k].mean - c0 for k in spec_fit])
    p_tok, f_spec, d_step = (float(v) for v in nnls_small(a, b))
    model = model_for(p_tok, f_spec, d_step, theta)
    lines = [
        f"## {name}",
        "",
        f"fitted on: {', '.join(stats[k].short for k in fit)}",
        f"C0 {c0:.2f} ms, p_tok {p_tok:.3f} ms, F_spec+D0 {f_spec:.2f} ms, "
        f"d_step {d_step:.2f} ms, "
        f"a_j {', '.join(f'{x:.3f}' for x in acc)}, theta {theta:.2f}",
        "",
        f"{'setting':<34} {'measured':>8} {'95 % over starts':>17} {'twin':>7} {'error':>7} "
        f"{'in CI':>5} {'L meas':>6} {'L twin':>6}",
    ]
    errors = []
    for key, s in sorted(stats.items(), key=lambda kv: -kv[1].mean):
        pm = model(key)
        pred = pm.expected_tok_s()
        err = pred / s.mean - 1
        fitted = key in fit
        if not fitted:
            errors.append(err)
        inside = s.low <= pred <= s.high if math.isfinite(s.low) else False
        lines.append(
            f"{s.short + (' (fit)' if fitted else ''):<34} {s.mean:>8.2f} "
            f"{s.low:>8.2f}-{s.high:<8.2f} {pred:>7.2f} {100 * err:>+6.1f}% "
            f"{'yes' if inside else 'no':>5} {_f(s.accept_length):>6} "
            f"{pm.expected_accept_length():>6.2f}"
        )
    spec = [(k, s) for k, s in stats.items() if k is not None]
    best_meas = max(spec, key=lambda kv: kv[1].mean)
    best_twin = max(spec, key=lambda kv: model(kv[0]).expected_tok_s())
    order = sorted(spec, key=lambda kv: -kv[1].mean)
    rank = [k for k, _ in order].index(best_twin[0]) + 1
    abs_err = [abs(e) for e in errors]
    lines += [
        "",
        f"predicted settings: {len(errors)}; "
        f"|error| median {100 * statistics.median(abs_err):.1f} %, "
        f"max {100 * max(abs_err):.1f} %; mean error {100 * statistics.fmean(errors):+.1f} %",
        f"measured best: {best_meas[1].short}; the twin's best: {best_twin[1].short} "
        f"(measured rank {rank} of {len(spec)}, {best_twin[1].mean / best_meas[1].mean - 1:+.1%} "
        "against the measured best)",
        "",
    ]
    return "\n".join(lines)


def _f(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafters", default="strong,mid,weak")
    ap.add_argument("--fit", default=DEFAULT_FIT)
    ap.add_argument("--landscapes", type=Path, default=ROOT / "benchmarks" / "landscapes")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    fit = parse_fit(args.fit)
    parts = [
        "# The twin's model form against the recorded CPU landscapes "
        "(benchmarks/landscape_twin_fit.py)",
        "",
        "Fitted on at most 5 settings, every other setting predicted by rayspec.twin.PerfModel;",
        "error = twin / measured - 1; 'in CI': the prediction inside the measured 95 % interval",
        "over starts.",
        "",
    ]
    for drafter in args.drafters.split(","):
        rows, _ = read_landscape(landscape_path(args.landscapes, drafter))
        parts.append(
            fit_one(f"cpu-{drafter}", rows, fit) if rows else f"## cpu-{drafter}\n\n(no file)\n"
        )
    text = "\n".join(parts)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
