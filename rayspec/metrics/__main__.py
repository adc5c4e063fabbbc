"""``python -m rayspec.metrics STUDY_FOLDER``: print a running study's Ray metrics.

Exit codes: 0 printed, 1 none to print now (one line says why).
"""

from __future__ import annotations

import argparse
import sys

from rayspec.metrics._read import MetricsUnavailable
from rayspec.metrics._read import read_study_metrics


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m rayspec.metrics",
        description="Print a running study's ray_rayspec_* metrics from its own Ray node.",
        epilog="Example: python -m rayspec.metrics runs/eagle3-twin",
    )
    p.add_argument("study", help="the study folder: <output.dir>/<study.name>")
    args = p.parse_args(argv)
    try:
        lines = read_study_metrics(args.study)
    except MetricsUnavailable as exc:
        print(f"rayspec.metrics: {exc}", file=sys.stderr, flush=True)
        return 1
    print("\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
