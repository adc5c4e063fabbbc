"""The files a launch carries (``LaunchSpec.files``), written on the node before the server starts.

A plan's verification trial runs SGLang with ``--speculative-adaptive-config FILE``: the tiers
travel in the launch spec as text and the node writes them beside the server log, then passes
``flag PATH`` after argv. No shell and no script line is involved: the text is only ever a file's
content, and the path is one argv element.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os

from rayspec._types import LaunchSpec

__all__ = ["with_files"]


def with_files(launch: LaunchSpec, folder: str, stem: str = "server") -> LaunchSpec:
    """Write each of ``launch.files`` into ``folder``; the launch with ``flag PATH`` appended.

    A file is named ``<stem>.<flag>.<digest>.json`` (the digest of its text: two trials never
    share one by accident). Returns ``launch`` unchanged when it carries no file.

    Raises:
        OSError: the folder cannot be written.
    """
    if not launch.files:
        return launch
    os.makedirs(folder, exist_ok=True)
    argv = list(launch.argv)
    for flag, text in launch.files:
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        name = f"{stem}.{flag.strip('-')}.{digest}.json"
        path = os.path.join(folder, name)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        argv += [flag, path]
    return dataclasses.replace(launch, argv=tuple(argv), files=())
