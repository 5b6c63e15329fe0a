"""The optional compiled parts (CPython extensions ``pip install`` builds when a C compiler is
present): each loaded by name, or None where it was not built or ``D2S_C_KERNEL=0`` turns them
off (the tests run both paths and compare them)."""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path
from types import ModuleType


def turned_off() -> bool:
    """Whether ``D2S_C_KERNEL=0`` asks for the Python and numpy paths everywhere."""
    return os.environ.get("D2S_C_KERNEL", "1") == "0"


def load_extension(name: str, beside: str) -> ModuleType | None:
    """The extension ``name`` (a full module name) if it was built in the folder of ``beside``
    (the importing module's ``__file__``), else None. Only the build beside it: for a top-level
    package's own modules an editable install's finder also looks in its checkout, which may be
    another copy of the package than the one running."""
    if turned_off():
        return None
    try:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None or Path(spec.origin).resolve().parent != Path(beside).resolve().parent:
            return None
        return importlib.import_module(name)
    except ImportError:
        return None
