"""The Optuna journal file as Optuna reads it: torn tails, damaged lines.

Optuna's ``JournalFileBackend`` appends each batch of records under its own lock file and reads
the log line by line: a last line without its newline is a write in progress, skipped; an
undecodable last line is skipped too; an undecodable line with anything after it fails every
read (``JSONDecodeError``, or ``UnicodeDecodeError`` for bytes that are not UTF-8). A crash in
the middle of an append (a full disk, kill -9) leaves such a last line, and the next append
lands after it, which turns a skipped tail into damage in the middle of the file.

So, before a driver writes: :func:`repair_journal` cuts a torn last line off (after saving the
whole file beside it), under Optuna's own journal lock so that no append is in flight, which
keeps every record Optuna's reader can replay (damaged lines with no record after them, which
no crash-free reader gets past either, go with the torn line). Damage followed by a record is
not guessed at: :func:`check_journal` refuses it with one line.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass

from optuna.storages.journal import JournalFileSymlinkLock

from rayspec._exceptions import ConfigError

__all__ = ["JournalScan", "check_journal", "repair_journal"]

_LOCK_SUFFIX = ".lock"  # Optuna's JournalFileSymlinkLock: <journal>.lock


@dataclass(frozen=True)
class JournalScan:
    """What a read of the journal found.

    Attributes:
        good_bytes: the length of the leading records Optuna replays.
        size: the file's length.
        records: how many records those are.
    """

    good_bytes: int
    size: int
    records: int

    @property
    def torn(self) -> bool:
        return self.good_bytes < self.size


def _is_record(line: bytes) -> bool:
    try:
        doc = json.loads(line)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError alike
        return False
    return isinstance(doc, dict) and "op_code" in doc


def check_journal(path: str) -> JournalScan:
    """Read ``path`` as Optuna would; refuse what Optuna could not read.

    Raises:
        ConfigError: a damaged line with more lines after it (one line: where, and what to do).
    """
    good = records = offset = 0
    bad_line = 0  # 1-based number of the first damaged line
    with open(path, "rb") as fh:
        for number, line in enumerate(fh, start=1):
            offset += len(line)
            if not (line.endswith(b"\n") and _is_record(line)):
                bad_line = bad_line or number
                continue
            if bad_line:  # a record after damage: Optuna cannot read past it, nor may we cut
                raise ConfigError(
                    f"study.storage: {path} line {bad_line} is not an Optuna journal record "
                    f"and records follow it (line {number}), which Optuna cannot read past; "
                    "restore the journal from a backup (or delete that line by hand if it is "
                    "the only damage), then run the same command again"
                )
            good, records = offset, records + 1
    return JournalScan(good_bytes=good, size=offset, records=records)


def repair_journal(path: str, *, sole_writer: bool) -> list[str]:
    """Make the journal safe to append to; the lines to print (none when it already was).

    Args:
        path: the journal file (nothing happens when it does not exist).
        sole_writer: the caller holds the study lock and the journal is the study's own, so
            an Optuna lock file left on it is a killed driver's (removed now rather than after
            Optuna's 30 s grace period).

    Raises:
        ConfigError: damage in the middle of the file (:func:`check_journal`).
    """
    if not os.path.isfile(path):
        return []
    said: list[str] = []
    lock_file = path + _LOCK_SUFFIX
    if sole_writer and os.path.lexists(lock_file):
        os.unlink(lock_file)
        said.append(f"journal: removed {lock_file}, left by a driver killed while it wrote")
    lock = JournalFileSymlinkLock(path)
    lock.acquire()  # no append is in flight while it is held
    try:
        scan = check_journal(path)
        if not scan.torn:
            return said
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        backup = f"{path}.torn-{stamp}"
        shutil.copyfile(path, backup)
        with open(path, "r+b") as fh:
            fh.truncate(scan.good_bytes)
            fh.flush()
            os.fsync(fh.fileno())
        said.append(
            f"journal: {path} ended in a torn record ({scan.size - scan.good_bytes} bytes a "
            f"crash left mid-write, which Optuna skips); saved the file as {backup} and cut "
            "that tail off so that new records do not land after it"
        )
    finally:
        lock.release()
    return said
