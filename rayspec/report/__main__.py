"""``python -m rayspec.report STUDY_FOLDER``: write the study's report.md and plots.

The only module of the package that prints or calls ``sys.exit``. Exit codes: 0 written, 2 bad
input (not a study folder), 1 the report could not be written.
"""

from __future__ import annotations

import argparse
import sys

from rayspec._exceptions import StoreError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m rayspec.report",
        description="Write <study>/report.md (the field-style table, the best launch command) "
        "and PNG plots under <study>/plots/ from a study folder.",
        epilog="Example: python -m rayspec.report runs/eagle3-twin",
    )
    p.add_argument("study", help="the study folder: <output.dir>/<study.name>, holding trials/")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from rayspec.report._write import write_report

    try:
        files = write_report(args.study)
    except StoreError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    except OSError as exc:
        print(f"error: cannot write the report: {exc}", file=sys.stderr, flush=True)
        return 1
    print(files.describe())
    for plot in files.plots:
        if plot.skipped:
            print(f"  {plot.name}: not drawn: {plot.skipped}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
