"""Open only regular files, and never block doing it.

A FIFO, socket or device named ``photo.jpg`` would hang a plain ``open()`` (a FIFO waits for
a writer) or have side effects (a tape device rewinds). So: ``stat`` first and refuse
anything that is not a regular file, then open with ``O_NONBLOCK`` (a FIFO swapped in after
the check opens at once instead of hanging) and check the opened descriptor with ``fstat``.
"""

from __future__ import annotations

import os
import stat
from typing import BinaryIO

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


class NotRegularFile(OSError):
    """The path names something other than a regular file; ``str()`` says what it is."""


def kind_of(mode: int) -> str:
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


def check_regular(st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        kind = kind_of(st.st_mode)
        raise NotRegularFile(f"not a regular file: {kind}" if kind != "not a regular file" else kind)


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """A binary file object for ``path``, which must be a regular file (symlinks followed).

    Raises :class:`NotRegularFile` (an ``OSError``) with a one-line reason, or the ``OSError``
    of ``stat``/``open`` (missing, permission denied, ...).
    """
    check_regular(os.stat(path))
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    flags |= getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags)
    try:
        check_regular(os.fstat(fd))  # replaced between stat and open
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike[str], max_bytes: int) -> bytes:
    """All of ``path`` (a regular file), refusing more than ``max_bytes`` with ``OSError``."""
    with open_regular(path) as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise OSError(f"{os.fsdecode(path)} is over {max_bytes} bytes")
    return data
