"""Write a study's file atomically, never through a symbolic link planted in the study folder.

A study folder may be shared, copied or prepared by someone else. Writing ``best.sh`` by way of
``open("best.sh.tmp", "w")`` follows a link planted at that name (``best.sh.tmp -> ~/.bashrc``
overwrote the target and ``chmod 755``-ed it). :func:`write_atomic` instead:

- creates its temporary file with ``O_CREAT | O_EXCL | O_NOFOLLOW`` under a fresh random name
  in the target's folder (nothing there can be followed: an existing name is never opened);
- sets the mode on that file descriptor (never ``chmod`` by path);
- renames it over the target: a rename replaces a link at the target's name, it does not write
  through it;
- opens each folder below ``root`` (the study folder) with ``O_NOFOLLOW``: a subfolder that is
  a link (``trials -> /elsewhere``) is refused, not entered. ``root`` itself may be a link (the
  user's own choice of where the study lives).

Standard library only: every package that writes into a study folder imports it.
"""

from __future__ import annotations

import errno
import os
import secrets

__all__ = ["write_atomic"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_below(root: str, parts: list[str]) -> int:
    """A descriptor of ``root/parts...``, creating missing folders, following no link below
    ``root``."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts:
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    where = os.path.join(root, *parts[: parts.index(part) + 1])
                    kind = "a symbolic link" if os.path.islink(where) else "not a folder"
                    raise OSError(
                        exc.errno, f"{where} is {kind}: the study writes only into its own folders"
                    ) from None
                raise
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_atomic(
    path: str, data: bytes | str, *, mode: int = 0o644, root: str | None = None
) -> str:
    """Write ``data`` to ``path`` atomically (a reader sees the old file or the new one, also
    after a crash) without following a link at ``path`` or in the folders below ``root``.

    Args:
        path: the file to write.
        data: its content (text is written as UTF-8).
        mode: the file's permission bits (``0o755`` for a script), set on the new file itself.
        root: the study folder ``path`` lies in (default: ``path``'s own folder); the folders
            between them are created when missing, and refused when one is a link.

    Returns:
        ``path``.

    Raises:
        OSError: the file could not be written, or a folder below ``root`` is a link.
    """
    folder, name = os.path.split(os.path.abspath(path))
    top = os.path.abspath(root) if root is not None else folder
    rel = os.path.relpath(folder, top)
    if rel == os.pardir or rel.startswith(os.pardir + os.sep):
        raise ValueError(f"{path} is not inside {root}")
    os.makedirs(top, exist_ok=True)
    dirfd = _open_below(top, [] if rel == os.curdir else rel.split(os.sep))
    try:
        tmp = ""
        for _ in range(8):
            tmp = f".{name}.{secrets.token_hex(6)}.tmp"  # '.'-prefixed: readers skip it
            try:
                fd = os.open(tmp, _NEW_FILE, 0o600, dir_fd=dirfd)
                break
            except FileExistsError:
                continue
        else:  # pragma: no cover - eight random 48-bit names all taken
            raise FileExistsError(errno.EEXIST, f"no free temporary name beside {path}")
        try:
            try:
                blob = data.encode("utf-8") if isinstance(data, str) else data
                view = memoryview(blob)
                while view:
                    view = view[os.write(fd, view) :]
                os.fchmod(fd, mode)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, name, src_dir_fd=dirfd, dst_dir_fd=dirfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dirfd)
            except OSError:
                pass
            raise
        os.fsync(dirfd)
    finally:
        os.close(dirfd)
    return path
