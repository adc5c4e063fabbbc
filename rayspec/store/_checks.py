"""Can a study write its folder? Checked before anything is written or launched.

Each of these used to surface as a traceback, or only when the first trial's row was written (a
server restart already spent):

- an entry of the folder that is a symbolic link out of it (a write would land outside), or a
  subfolder that is a link at all (the writers do not enter one: :mod:`rayspec._atomic`);
- a subfolder the study keeps rows in that is a file (``trials`` a file);
- a folder or the journal that cannot be written (read-only, ``chattr +i``): probed, not
  guessed from the mode bits (root writes a read-only folder);
- a stored file whose column holds another type than the study's (``value`` as text): no
  reader could read the folder as one table.

:func:`folder_problems` says each in one line; :func:`check_folder` raises them.
"""

from __future__ import annotations

import os
import tempfile

import pyarrow as pa
import pyarrow.parquet as pq

from rayspec._exceptions import ConfigError
from rayspec.store._categories import CATEGORY_SCHEMA
from rayspec.store._folder import StudyFolder
from rayspec.store._parquet import REQUEST_SCHEMA
from rayspec.store._parquet import TRIAL_SCHEMA

__all__ = ["check_folder", "folder_problems"]

_MOVE = "move it away (or the study folder, to start a new study)"


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def _links(folder: StudyFolder) -> list[str]:
    """Entries (top level, and in the study's subfolders) that are links out of the folder,
    and subfolders that are links at all."""
    real = os.path.realpath(folder.root)
    own = set(folder.folders())
    out = []
    places = [folder.root] + [f for f in folder.folders() if os.path.isdir(f)]
    for place in places:
        if os.path.islink(place):
            continue  # said below, as an entry of the root
        try:
            entries = list(os.scandir(place))
        except OSError:
            continue  # said by the write probe
        for entry in sorted(entries, key=lambda e: e.name):
            if not entry.is_symlink():
                continue
            target = os.path.realpath(entry.path)
            if not _inside(target, real):
                out.append(
                    f"{entry.path} is a symbolic link to {target}, outside the study folder: "
                    f"the study never writes through a link; {_MOVE}"
                )
            elif entry.path in own:
                out.append(
                    f"{entry.path} is a symbolic link: the study writes only into its own "
                    f"folders; {_MOVE}"
                )
    return out


def _probe(folder: str) -> str:
    """Why no file can be created in ``folder`` ("" when one can)."""
    try:
        fd, path = tempfile.mkstemp(prefix=".rayspec-probe-", dir=folder)
    except OSError as exc:
        return exc.strerror or str(exc)
    os.close(fd)
    os.unlink(path)
    return ""


def _writable(folder: StudyFolder, journal: str) -> list[str]:
    out = []
    for path in folder.folders():
        if os.path.lexists(path) and not os.path.isdir(path):
            out.append(f"{path} is a file, where the study keeps a folder; {_MOVE}")
    for path in (folder.root, *folder.folders()):
        if os.path.isdir(path) and not os.path.islink(path):
            why = _probe(path)
            if why:
                out.append(f"{path} cannot be written ({why}): the study writes its files there")
    if journal and os.path.isfile(journal):
        try:
            os.close(os.open(journal, os.O_WRONLY | os.O_APPEND))  # nothing written
        except OSError as exc:
            out.append(
                f"{journal} cannot be written ({exc.strerror or exc}): the study appends every "
                "trial to its journal (chattr -i / chmod u+w it, or move the study away)"
            )
    return out


def _column_types(folder: str, declared: pa.Schema, other: pa.DataType | None) -> list[str]:
    """Files under ``folder`` with a column whose type cannot be read as the study's.

    ``other``: the type of every column ``declared`` does not name (trial metrics: float64),
    or None to leave those alone."""
    if not os.path.isdir(folder):
        return []
    out = []
    for name in sorted(os.listdir(folder)):
        if StudyFolder.trial_number(name) is None:
            continue
        path = os.path.join(folder, name)
        try:
            schema = pq.read_schema(path)
        except (OSError, pa.ArrowException):
            continue  # unreadable: the study sets it aside, with a line of its own
        for field in schema:
            if field.name in declared.names:
                want = declared.field(field.name).type
            elif other is not None:
                want = other
            else:
                continue
            try:
                pa.unify_schemas(
                    [pa.schema([(field.name, want)]), pa.schema([field])],
                    promote_options="permissive",
                )
            except (pa.ArrowTypeError, pa.ArrowInvalid):
                out.append(
                    f"{path}: column {field.name!r} holds {field.type}, the study's is {want}: "
                    f"the file is not this study's row; move it out of {folder}"
                )
                break  # one line per file
    return out


def folder_problems(root: str, journal: str = "") -> list[str]:
    """Why a study cannot write the folder ``root``, one line each (none for a folder that
    does not exist yet).

    Args:
        root: the study folder.
        journal: the Optuna journal file (default: the folder's own, when it exists).
    """
    if not os.path.lexists(root):
        return []
    folder = StudyFolder(root)
    if not os.path.isdir(root):
        return [f"{root} is a file, where the study keeps its folder; {_MOVE}"]
    problems = _links(folder)
    problems += _writable(folder, journal or folder.journal)
    problems += _column_types(folder.trials, TRIAL_SCHEMA, pa.float64())
    problems += _column_types(folder.requests, REQUEST_SCHEMA, None)
    problems += _column_types(folder.categories, CATEGORY_SCHEMA, None)
    return problems


def check_folder(root: str, journal: str = "", key: str = "output.dir") -> None:
    """Raise :func:`folder_problems`, each line after ``key`` (the CLI prints ``error:``
    before each).

    Raises:
        ConfigError: one line per problem.
    """
    problems = folder_problems(root, journal)
    if problems:
        raise ConfigError("\nerror: ".join(f"{key}: {p}" if key else p for p in problems))
