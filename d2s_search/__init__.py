"""d2s-search: text-to-image search on learned sparse (Dense2Sparse) vectors.

The public Python API (docs/python-api.md) is exported here, each name imported when first
used, so ``import d2s_search`` loads neither numpy nor ONNX Runtime:

- ``Encoder``, ``Encoding``: a model bundle's encoders, texts and pictures as sparse
  ``{word: weight}`` bags and dense vectors;
- ``Index``, ``SearchResult``, ``Hit``, ``IngestReport``: open an index, search it, ingest into it;
- ``UpdateReport``: what ``Index.update_existing`` did to an OpenSearch index of the user's own;
- ``SearchFilter``, ``Metadata``: what a search is narrowed to, and what a picture carries
  (date taken, camera, place, the user's fields);
- ``Watching``, ``WatchBatch``: ``Index.watch`` keeping an index in sync with folders;
- ``search_app``: the search page and its JSON API as an ASGI app to mount;
- ``D2SError`` (and the classes in ``d2s_search.errors``): every failure a caller can act on.

Everything else (runtime core, cli/, backends/, serve/, the torch-side train/) is internal.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (2 ms of a 1 ms import)

__version__ = "0.1.0"

# Public name -> the module that defines it (imported on first use).
_EXPORTS = {
    "Encoder": "d2s_search.python_api.encoding",
    "Encoding": "d2s_search.python_api.encoding",
    "Index": "d2s_search.python_api.index",
    "search_app": "d2s_search.python_api.web",
    "SearchResult": "d2s_search.search",
    "Hit": "d2s_search.backends.base",
    "IngestReport": "d2s_search.ingest",
    "UpdateReport": "d2s_search.enrich",
    "D2SError": "d2s_search.errors",
    "SearchFilter": "d2s_search.filters",
    "Metadata": "d2s_search.metadata",
    "Watching": "d2s_search.watch",
    "WatchBatch": "d2s_search.watch",
}

__all__ = ["D2SError", "Encoder", "Encoding", "Hit", "Index", "IngestReport", "Metadata", "SearchFilter",
           "SearchResult", "UpdateReport", "WatchBatch", "Watching", "search_app", "__version__"]

if TYPE_CHECKING:  # what type checkers and editors see
    from d2s_search.backends.base import Hit
    from d2s_search.enrich import UpdateReport
    from d2s_search.errors import D2SError
    from d2s_search.filters import SearchFilter
    from d2s_search.ingest import IngestReport
    from d2s_search.metadata import Metadata
    from d2s_search.python_api.encoding import Encoder, Encoding
    from d2s_search.python_api.index import Index
    from d2s_search.python_api.web import search_app
    from d2s_search.search import SearchResult
    from d2s_search.watch import WatchBatch, Watching


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(module), name)
    globals()[name] = value  # the next lookup does not come here
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
