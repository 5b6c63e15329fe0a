"""Whether another process still runs (for files a process leaves behind while it works)."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """True when ``pid`` exists, also when it belongs to another user (signal 0 is refused)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True
