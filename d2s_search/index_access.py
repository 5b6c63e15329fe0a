"""Opening an index with the bundle that belongs to it: which backend the settings name, the
bundle that filled the index (refusing another), the index used last. Shared by the commands
and the Python API (``d2s_search.python_api``); nothing here imports click or a command.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple

from d2s_search import extras, settings
from d2s_search.errors import BundleError, BundleMismatchError, IndexStoreError, SettingsError

backend_kind = settings.backend_kind  # which backend the flags and environment name


def make_backend(backend: str | None, index: str, url: str | None, index_name: str, threads: int = 1):
    from d2s_search.backends import open_backend

    kind = backend_kind(backend, url)
    if kind == "elasticsearch":
        return elasticsearch_backend(url, index_name)
    if kind == "opensearch":
        if not url:
            raise SettingsError("--backend opensearch needs --url or D2S_OPENSEARCH_URL")
        extras.require("opensearch", who="--backend opensearch")
        from d2s_search.backends.opensearch.backend import OpenSearchBackend

        # Credentials, CA file and D2S_OPENSEARCH_INSECURE come from the environment only.
        return OpenSearchBackend.from_env(url=url, index_name=index_name)
    return open_backend("local", index=index, threads=threads)


def load_bundle(path: str | None, verify: bool = False):
    from d2s_search.bundle import Bundle

    return Bundle.load(settings.resolve_bundle_path(path), verify_hashes=verify)


# --- the index and the bundle that filled it ---------------------------------------------

def index_location(store) -> str:
    """Where an index lives, absolute: a folder for ``local``, URL/name for OpenSearch; safe to
    print (undecodable bytes escaped, no credentials)."""
    from d2s_search import redact
    from d2s_search.pathtext import path_to_text

    if store.name == "local":
        return path_to_text(os.path.abspath(store.path))
    return redact.strip_url_credentials(f"{store.url}/{store.index_name}")


def require_index(store) -> None:
    """Refuse early when there is no local index here, naming the one used last."""
    if store.name != "local" or store.exists():
        return
    where = Path(os.path.abspath(store.path))
    message = f"no index at {where}: ingest some images first (`d2s-search ingest PATH`)"
    last = settings.last_index()
    if last is not None and last != where.resolve() and (last / "index.sqlite").is_file():
        message += f"; the index used last is {last} (pass --index {last} or set D2S_INDEX)"
    raise IndexStoreError(message)


def missing_files(store) -> list[tuple[str, str]]:
    """(id, path) of every stored path that is no longer a regular file (a document with
    copies has one pair per path)."""
    from d2s_search.sources import exists

    return [(doc_id, path) for doc_id, path in store.document_paths() if not exists(path)]


def describe_index(store) -> dict:
    """What `index stats` shows of an open index: the backend's counts, where it is, the
    bundle that filled it, and how many stored files are gone (backends that list paths)."""
    from d2s_search.backends.base import PathListing

    stats = store.stats()
    stats["location"] = index_location(store)
    stats["bundle_path"] = store.identity.bundle_path if store.identity else None
    if isinstance(store, PathListing):
        stats["missing_files"] = len(missing_files(store))
    return stats


def remember_index(store) -> None:
    if store.name == "local":
        settings.remember_index(Path(store.path))


def recorded_identity(backend, index, url, index_name):
    """What an existing index records about the bundle that filled it (None: no index, or empty)."""
    peek = make_backend(backend, index, url, index_name)
    try:
        if not peek.exists():
            return None
        peek.open(None, create=False)
        return peek.identity
    finally:
        peek.close()


def bundle_for_index(given: str | None, recorded, where: str, verify: bool = False):
    """The bundle to use with an index: ``given`` if it matches the index; without one, the
    bundle that filled the index (its recorded path), else the one exported last."""
    from d2s_search.bundle import Bundle

    if recorded is not None and not recorded.fingerprint:  # an index that lost the record of its bundle
        return _bundle_for_unrecorded(given, recorded, where, verify)
    if given:
        bundle = load_bundle(given, verify)
        if recorded is not None and recorded.fingerprint and recorded.fingerprint != bundle.fingerprint:
            raise BundleMismatchError(
                f"index {where} was filled with bundle {_describe(recorded)}, not with {bundle.path.resolve()} "
                f"({bundle.fingerprint[:12]}, {bundle.model_name}); their vectors differ: leave out --bundle to use "
                "the recorded one, or re-ingest the images with this bundle into another --index"
            )
        return bundle
    damaged = None  # the recorded bundle is there but refused (a file changed): said as --bundle says it
    if recorded is not None and recorded.bundle_path:
        try:
            bundle = Bundle.load(recorded.bundle_path, verify_hashes=verify)
        except BundleError as exc:
            bundle = None
            if (Path(recorded.bundle_path) / "manifest.json").is_file():
                damaged = exc
        if bundle is not None and bundle.fingerprint == recorded.fingerprint:
            return bundle
    try:
        bundle = load_bundle(None, verify)
    except BundleError:
        if damaged is not None:
            raise damaged from None
        raise
    if recorded is not None and recorded.fingerprint and recorded.fingerprint != bundle.fingerprint:
        if damaged is not None:
            raise damaged from None
        gone = ", which is gone or now holds another bundle" if recorded.bundle_path else ""
        raise BundleMismatchError(
            f"index {where} was filled with bundle {_describe(recorded)}{gone}; the bundle exported last "
            f"({bundle.path.resolve()}, {bundle.fingerprint[:12]}) is another one: pass --bundle with the original, "
            "or use another --index"
        )
    return bundle


def _bundle_for_unrecorded(given: str | None, recorded, where: str, verify: bool):
    """An index holds documents but no longer records the bundle that filled them: never the
    bundle exported last behind the user's back, only one named with --bundle whose dense size
    is that of the stored vectors."""
    size = f" (its vectors have {recorded.dense_dim} dimensions)" if recorded.dense_dim else ""
    if not given:
        raise IndexStoreError(
            f"index {where} no longer records the bundle that filled it{size}; nothing was done: run "
            f"`d2s-search index check --index {where} --repair` to restore the record from what survives, or "
            "name that bundle with --bundle"
        )
    bundle = load_bundle(given, verify)
    made = bundle.identity().dense_dim
    if recorded.dense_dim and made != recorded.dense_dim:
        raise BundleMismatchError(
            f"index {where} holds {recorded.dense_dim}-dimensional vectors; {bundle.path.resolve()} "
            f"({bundle.fingerprint[:12]}, {bundle.model_name}) makes {made}-dimensional ones: it did not fill this "
            "index. Name the bundle that did with --bundle"
        )
    return bundle


def _describe(identity) -> str:
    model = f", {identity.model}" if identity.model else ""
    at = f" at {identity.bundle_path}" if identity.bundle_path else ""
    return f"{identity.fingerprint[:12]}{model}{at}"


class OpenedIndex(NamedTuple):
    bundle: Any
    store: Any
    created: bool  # this call created the index (it did not exist before)


def open_index(backend, index, url, index_name, bundle: str | None, *, create: bool, verify: bool = False,
               threads: int = 1, remember: bool = True) -> OpenedIndex:
    """The index at the given place, opened, with the bundle that belongs to it (``threads``:
    shards a local index searches at once; ``remember``: as the local index used last, which
    the commands' "no index here" names)."""
    store = make_backend(backend, index, url, index_name, threads)
    if not create:
        require_index(store)
    recorded = recorded_identity(backend, index, url, index_name)
    chosen = bundle_for_index(bundle, recorded, index_location(store), verify)
    existed = store.exists()
    try:
        store.open(chosen.identity(), create=create)
    except BaseException:
        store.close()
        raise
    if remember:
        remember_index(store)
    return OpenedIndex(chosen, store, not existed)


# --- Elasticsearch connection -------------------------------------------------------------


def elasticsearch_backend(url: str | None, index_name: str, insecure: bool = False, **options):
    """The backend from flags and D2S_ELASTICSEARCH_* variables (URL or cloud id; API key, user and
    password, CA file only from the environment)."""
    extras.require("elasticsearch", who="--backend elasticsearch")
    from d2s_search.backends.elasticsearch.backend import ElasticsearchBackend

    url = url or os.environ.get("D2S_ELASTICSEARCH_URL")
    if not url and not os.environ.get("D2S_ELASTICSEARCH_CLOUD_ID"):
        raise SettingsError("--backend elasticsearch needs --url, D2S_ELASTICSEARCH_URL or D2S_ELASTICSEARCH_CLOUD_ID")
    return ElasticsearchBackend.from_env(url=url, index_name=index_name, verify=False if insecure else None, **options)
