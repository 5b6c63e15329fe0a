"""Whether the memory-mapped files of a cache state were written or cut short since they were
mapped, asked before each search of a process that keeps the state open (not before the first
search after opening it: the opening compared every file with what was written, so a one-search
`query` checks nothing more).

Reading a mapping past the end of a file cut short kills the process with SIGBUS, which Python
cannot catch; and files the index publishes are never written in place, so a write is damage.
The exact check is one ``fstat`` of each mapped file (``mmap.size()``): 31 files at 123,000
documents, 10-80 us a search on a shared 2-core machine. So the first check sets an inotify
watch on each file (Linux) and then compares each file's stat with the one it was mapped in
(any write moves ``ctime``); every later check is one poll of one descriptor (about 1 us):
any write or truncation since, by any process, through any path, shows there. Elsewhere, or
when no inotify instance is left, every check compares the sizes (a write that keeps the size
is then noticed by the next process that opens the state). inotify does not report a change
made by another machine to a file on a network file system.
"""

from __future__ import annotations

import functools
import os
import select
import sys
import weakref
from pathlib import Path

IN_MODIFY = 0x2  # <sys/inotify.h>: a write or a truncation, by any process, through any path


class MappedFiles:
    """``files``: (path or None, its mmap, the size mapped, its stat when mapped or None)."""

    def __init__(self, files: list[tuple[Path | None, object, int, os.stat_result | None]]) -> None:
        self._files = [
            (path, weakref.ref(mapping), size, _state(st)) for path, mapping, size, st in files
        ]
        self._watched = False
        self._poll: select.poll | None = None

    def intact(self) -> bool:
        if self._poll is not None:
            return not self._poll.poll(0)  # any event: a file was written (the state is read anew)
        if not self._watched:
            self._watched = True
            if not self._watch():
                return False
        try:
            for _, ref, size, _ in self._files:
                mapping = ref()  # None: no longer mapped (a graph copied to huge pages)
                if mapping is not None and mapping.size() != size:
                    return False
        except (OSError, ValueError):  # ValueError: a closed mapping
            return False
        return True

    def _watch(self) -> bool:
        """Watch the files, then compare their stat with the one they were mapped in (False: one
        changed); where inotify cannot be had, leave the sizes to every check."""
        fd = _inotify()
        if fd is None:
            return True
        weakref.finalize(self, os.close, fd)
        add = _libc().inotify_add_watch
        for path, _, _, mapped_in in self._files:
            if path is None or mapped_in is None or add(fd, os.fsencode(path), IN_MODIFY) < 0:
                return True  # this one cannot be watched: sizes at every check
        for path, _, _, mapped_in in self._files:
            try:
                if _state(os.stat(path, follow_symlinks=False)) != mapped_in:
                    return False
            except OSError:
                return False
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)
        return True


def _state(st: os.stat_result | None) -> tuple | None:
    return (
        None if st is None else (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
    )


@functools.cache
def _libc():
    import ctypes  # loaded already where the compiled kernel is

    return ctypes.CDLL(None, use_errno=True)


def _inotify() -> int | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fd = _libc().inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, AttributeError):
        return None
    return fd if fd >= 0 else None
