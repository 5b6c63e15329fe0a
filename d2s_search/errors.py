"""One error type per failure a user can act on.

The CLI prints ``error: <message>`` on one line (no traceback unless ``--debug``) and exits
with ``exit_code``. Messages say what went wrong and what to do about it.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_PARTIAL = 3


class D2SError(Exception):
    """Base class: a failure with a one-line explanation for the user."""

    exit_code = EXIT_FAILED


class BundleError(D2SError):
    """The model bundle is missing, incomplete, corrupt or of an unknown format."""


class BundleMismatchError(D2SError):
    """An index was filled with another bundle than the one given."""


class HubUnreachableError(D2SError):
    """A model must come from the Hugging Face hub and the hub cannot be reached."""


class ModelError(D2SError):
    """A dense model name or checkpoint cannot be built."""


class ParityError(D2SError):
    """The exported ONNX graph does not reproduce the torch model."""


class IndexStoreError(D2SError):
    """The index is missing, corrupt or cannot be written."""


class SettingsError(D2SError):
    """The settings given cannot name an index: a backend without its URL, an unknown name."""

    exit_code = EXIT_USAGE


class BackendUnavailableError(D2SError):
    """The search backend (e.g. an OpenSearch cluster) cannot be reached."""


class NoInputError(D2SError):
    """Nothing to do: no images under the given paths."""


class MetadataError(D2SError):
    """A metadata file (``ingest --metadata``) or a field that cannot be used as given."""

    exit_code = EXIT_USAGE


class WorkersError(D2SError):
    """Distributed ingest: the workers could not be started or kept running."""


class MissingDependencyError(D2SError):
    """A command needs an optional package that is not installed; the message names the extra
    that installs it (``d2s_search.extras``)."""

    def __init__(self, message: str, extras: tuple[str, ...] = (), modules: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.extras, self.modules = extras, modules


class CommandLoadError(D2SError):
    """A command's module cannot be imported (a broken or partial installation)."""


class QueryError(D2SError):
    """The query cannot be run as asked (empty text, unknown mode, ...)."""

    exit_code = EXIT_USAGE


class ImageInputError(D2SError):
    """A picture given to the Python API cannot be used: missing, unreadable, or not a picture."""


class QueryImageError(ImageInputError):
    """The query picture cannot be used: missing, unreadable, or not a picture."""


class ImageRejected(Exception):
    """One input file cannot be used as an image; carries the reason shown to the user."""


class DocumentsRejectedError(D2SError):
    """Some documents of a write were refused by the backend; the others were stored."""

    exit_code = EXIT_PARTIAL

    def __init__(self, message: str, failures: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.failures: dict[str, str] = dict(failures or {})


class DiskFullError(IndexStoreError):
    """A write found its file system full. The write that failed was undone; everything stored
    before it is kept."""

    def __init__(self, where: str, free: int | None, stored: int | None = None) -> None:
        self.where, self.free, self.stored = where, free, stored
        room = f"{free:,} bytes free on its file system" if free is not None else "its file system is full"
        kept = (f"the {stored} image(s) this run stored before are kept" if stored is not None
                else "everything stored before is kept")
        again = ("free some space and run the same ingest again: it skips what is stored" if stored is not None
                 else "free some space and run the command again")
        super().__init__(f"disk full: {where} could not be written ({room}); the write that failed was undone "
                         f"and {kept}: {again}")
