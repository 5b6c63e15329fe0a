"""What the OpenSearch and Elasticsearch backends do the same way with an index behind an alias:
opening it against a bundle, copying it into the next generation (reindex), bulk writes and
their report, reads by id, hits. Both APIs agree on these requests and answers.

:class:`EngineIndex` is a base class; each engine supplies its transport and its differences:
``_call`` (one request: status and parsed body), ``_reason`` (one scrubbed line from an error
body) and ``_one_line``, ``_decode`` (stored sparse field -> terms), ``_put_meta``, ``create``, ``_pages`` (a
scroll on OpenSearch, a point in time on Elasticsearch), ``_doc_source`` and the bulk items,
``_bulk``, and the reindex hooks. Request bodies come from :mod:`.bodies`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from d2s_search.backends.base import Document, Hit, IndexIdentity, WordFilter, relinked
from d2s_search.backends.engine import narrowing
from d2s_search.backends.engine.bodies import (
    HOLDERS_PER_REQUEST,
    Filters,
    alias_swap_body,
    check_page,
    holders_body,
    mget_body,
    reindex_body,
)
from d2s_search.backends.engine.bulk import next_generation
from d2s_search.backends.engine.documents import (
    PATH_FIELD,
    SPARSE_FIELD,
    document_from_source,
    paths_from_source,
    shown_path,
    stored_paths,
)
from d2s_search.backends.engine.identity import (
    IMAGE_FIELD_META,
    check_dims,
    check_identity,
    meta_identity,
)
from d2s_search.backends.opensearch.features import matched_terms
from d2s_search.errors import (
    BackendUnavailableError,
    BundleMismatchError,
    DocumentsRejectedError,
    IndexStoreError,
    MetadataError,
    QueryError,
)
from d2s_search.filters import BUILT_IN_FIELDS, SearchFilter
from d2s_search.metadata import Metadata

log = logging.getLogger("d2s_search.engine")


class EngineIndex:
    """Shared index logic of the OpenSearch and Elasticsearch backends (see the module doc)."""

    label: str  # the engine's name in messages ("OpenSearch")
    index_option: str  # the CLI option that names another index
    reindex_timeout: float | None = None  # per-request timeout of a server-side ``_reindex``
    index_name: str
    url: str
    identity: IndexIdentity | None
    refresh: bool
    chunk_docs: int  # documents per _bulk request
    chunk_bytes: int  # bytes per _bulk request
    # upsert takes the documents' paths from any other document that holds them (one path,
    # one document); off for the copy a reindex writes, which already keeps that rule.
    claims_paths: bool = True
    # The field a hit shows as its path: ``path``, or the image field of a user's index given
    # picture search (``_meta.image_field``, d2s_search.enrich).
    path_field: str = PATH_FIELD

    def _init_index(self, index_name: str, *, chunk_docs: int, chunk_bytes: int, refresh: bool) -> None:
        """The settings both engines take the same way (first in ``__init__``: a bad name fails
        before any connection is made)."""
        if not index_name or index_name != index_name.lower() or index_name.startswith(("_", "-", "+")):
            raise IndexStoreError(f"invalid {self.label} index name {index_name!r} (lowercase, no leading _ - +)")
        self.index_name = index_name
        self.chunk_docs = max(1, chunk_docs)
        self.chunk_bytes = max(1024, chunk_bytes)
        self.refresh = refresh
        self.identity = None
        self._unsearchable_paths: set[str] = set()  # written by this process since its last refresh
        self._user_types: dict[str, str] = {}  # the user's fields, as the mapping says
        self._missing_fields: dict[str, Any] = {}  # built-in metadata fields the mapping lacks

    # -- what each engine provides ----------------------------------------------------------

    def _call(self, method: str, path: str, body: Any = None, params: Mapping[str, Any] | None = None,
              *, timeout: float | None = None) -> tuple[int, Any]:
        """One request; non-2xx answers come back as (status, body), not as exceptions."""
        raise NotImplementedError

    def _reason(self, body: Any, status: int = 0) -> str:
        """One line (credentials scrubbed) from an error body."""
        raise NotImplementedError

    def _one_line(self, text: str) -> str:
        """A server's text shortened for a message, credentials scrubbed."""
        raise NotImplementedError

    def _decode(self, stored: Mapping[str, float] | None) -> dict[str, float]:
        """A document's stored sparse field -> ``{term: weight}``."""
        raise NotImplementedError

    def create(self, identity: IndexIdentity, **options: Any) -> str:
        raise NotImplementedError

    def _put_meta(self, identity: IndexIdentity) -> None:
        """Record ``identity`` (fingerprint, model, bundle path) in the index's ``_meta``."""
        raise NotImplementedError

    def _pages(self, index: str, page: int, fields: Sequence[str] | None = None) -> Iterator[list[dict]]:
        """Raw hits of every document of ``index``, a page at a time (``fields``: only these)."""
        raise NotImplementedError

    def _doc_source(self, doc: Document) -> dict[str, Any]:
        """The ``_source`` stored for ``doc`` (ValueError/TypeError: refused before sending)."""
        raise NotImplementedError

    def _bulk_index_items(self, sources: list[tuple[str, dict[str, Any]]]) -> list[Any]:
        raise NotImplementedError

    def _bulk_delete_items(self, ids: list[str]) -> list[Any]:
        raise NotImplementedError

    def _bulk_update_items(self, updates: list[tuple[str, dict[str, Any]]]) -> list[Any]:
        """Partial updates: (id, the fields that change)."""
        raise NotImplementedError

    def _bulk(self, items: list[Any]) -> tuple[dict[str, str], list[str]]:
        """Send bulk ``items``: ({id: reason} of the refused, results of the accepted)."""
        raise NotImplementedError

    def _refresh(self, index: str | None = None) -> None:
        raise NotImplementedError

    def _one_attempt(self) -> contextlib.AbstractContextManager[None]:
        """Requests inside this block are tried once, without the retry policy (close)."""
        return contextlib.nullcontext()

    # -- refresh: once before the next read, not per batch -----------------------------------

    _dirty: bool = False  # written since the last refresh

    def _writing(self) -> None:
        """Called before a bulk write: the next read refreshes first."""
        self._dirty = True

    def _written(self) -> None:
        """Called after a bulk write that raised nothing."""

    def settle(self) -> None:
        """Refresh once before the first read after writes (``refresh=True``), not per batch.

        A refresh after every ingest batch of 32 images writes a tiny Lucene segment each
        time (merge pressure, slower searches) on either engine; searches through this backend
        still see every write, and :meth:`_final_refresh` refreshes once at the end of an ingest.
        """
        if self._dirty and self.refresh:
            self._refresh()
            self._unsearchable_paths.clear()
        self._dirty = False

    def _final_refresh(self) -> None:
        """The refresh an ingest still owes, at close: one attempt (closing after the cluster
        went away must not wait through back-offs; the periodic refresh makes the writes
        visible within a second anyway)."""
        try:
            with self._one_attempt():
                self.settle()
        except BackendUnavailableError as exc:
            log.warning("final refresh of %s failed: %s", self.index_name, exc)

    def _opened(self) -> None:
        """Called at the end of :meth:`open`, with ``identity`` set."""

    def _remember_mapping(self, mapping: Mapping[str, Any]) -> None:
        """Called with the stored ``mappings`` whenever the identity is read."""

    def _hit_id(self, hit: Mapping[str, Any]) -> str:
        """The document id (content hash) of a search hit."""
        return hit["_id"]

    def _id_source(self) -> bool | list[str]:
        """The ``_source`` a hit needs for :meth:`_hit_id` (none where ``_id`` is the hash)."""
        return False

    def _reindex_target(self, target: Any) -> Any:
        """The engine's settings of the next generation, completed (the stored identity has been
        read) and checked; refuse here what this engine cannot reindex."""
        return target

    def _create_generation(self, name: str, identity: IndexIdentity, target: Any) -> tuple[int, Any]:
        """``PUT /<name>`` for the next generation, as ``target`` (engine settings) says."""
        raise NotImplementedError

    def _writer(self, index: str, identity: IndexIdentity, target: Any) -> EngineIndex:
        """A copy of this backend that writes into ``index`` (no refresh per batch)."""
        writer = type(self).__new__(type(self))
        writer.__dict__.update(self.__dict__)
        writer.index_name, writer.identity, writer.refresh = index, identity, False
        writer.claims_paths = False
        return writer

    def _reindexed(self, identity: IndexIdentity, target: Any) -> None:
        self.identity = identity

    # -- responses --------------------------------------------------------------------------

    def _check(self, status: int, body: Any, what: str) -> Any:
        """``body`` of a 2xx answer; otherwise the matching one-line error."""
        if 200 <= status < 300:
            return body
        reason = self._reason(body, status)
        if status == 404 and "index_not_found" in reason:
            raise IndexStoreError(self._missing())
        if "too_many_clauses" in reason or "too_many_nested_clauses" in reason:
            raise QueryError(f"the query has too many terms for this cluster: {reason}")
        raise IndexStoreError(f"{self.label} could not {what}: {reason}")

    def _missing(self) -> str:
        return f"no index {self.index_name!r} at {self.url}: run `d2s-search index create` or ingest first"

    # -- index lifecycle --------------------------------------------------------------------

    def exists(self) -> bool:
        status, _ = self._call("HEAD", f"/{self.index_name}")
        return status == 200

    def open(self, identity: IndexIdentity | None, create: bool = True, **create_options: Any) -> None:
        """Open the index; with ``identity`` check (or, when new, create and record) the bundle.

        ``identity=None`` opens an existing index as it is (stats, delete). The same bundle
        found at a new place (``bundle_path``) is recorded there, so the index keeps pointing
        at a copy that exists.
        """
        stored = self._stored_identity()
        if create and self.path_field != PATH_FIELD:  # the user's own index, given picture search
            raise IndexStoreError(f"index {self.index_name!r} is your own, with picture search from the field "
                                  f"{self.path_field!r}: `d2s-search ingest --update-existing` keeps it up to date; "
                                  "ingest folders into another index")
        if stored is None:
            if not create or identity is None:
                raise IndexStoreError(self._missing())
            self.create(identity, **create_options)
            stored = identity
        elif identity is None:
            pass
        elif not stored.fingerprint:
            # Created from the mapping file by hand: claim it if the dimension agrees.
            self._check_dims(identity, stored)
            self._put_meta(identity)
            stored = identity
        else:
            self._check_identity(identity, stored)
            if create and identity.bundle_path and identity.bundle_path != stored.bundle_path:
                self._put_meta(identity)  # the same bundle at a new place: record where it is now
                stored = identity
        self.identity = stored
        self._opened()
        if create and self._missing_fields:
            self._add_metadata_fields()

    def _mapping(self) -> dict:
        status, body = self._call("GET", f"/{self.index_name}/_mapping")
        if status == 404:
            return {}
        body = self._check(status, body, "read the mapping")
        return body if isinstance(body, dict) else {}

    def _concrete_indices(self) -> list[str]:
        return sorted(self._mapping())

    def _stored_identity(self) -> IndexIdentity | None:
        mapping = self._mapping()
        if not mapping:
            return None
        first = next(iter(mapping.values())).get("mappings", {})
        ident = meta_identity(first.get("_meta"))
        if ident is None:
            raise IndexStoreError(
                f"index {self.index_name!r} at {self.url} was not made by d2s-search (no _meta.fingerprint)"
            )
        self.path_field = str((first.get("_meta") or {}).get(IMAGE_FIELD_META) or PATH_FIELD)
        self._remember_mapping(first)
        self._remember_fields(first)
        return ident

    def _check_identity(self, wanted: IndexIdentity, stored: IndexIdentity | None) -> None:
        check_identity(self.index_name, self.url, wanted, stored, self.index_option)

    def _check_dims(self, wanted: IndexIdentity, stored: IndexIdentity) -> None:
        check_dims(self.index_name, wanted, stored)

    def _count(self, index: str) -> int:
        self.settle()
        status, body = self._call("GET", f"/{index}/_count")
        return int(self._check(status, body, "count documents").get("count", 0))

    def _stats(self) -> tuple[list[str], dict[str, Any]]:
        """The concrete indices and the ``_meta`` of the first."""
        mapping = self._mapping()
        concrete = sorted(mapping)
        meta = mapping[concrete[0]].get("mappings", {}).get("_meta", {}) if concrete else {}
        return concrete, meta

    def _size_stats(self) -> dict[str, Any]:
        """Documents (None when the count is refused), bytes on disk and deleted documents."""
        out: dict[str, Any] = {}
        status, body = self._call("GET", f"/{self.index_name}/_count")
        out["documents"] = int(body.get("count", 0)) if status == 200 else None
        status, body = self._call("GET", f"/{self.index_name}/_stats/docs,store")
        if status == 200:
            prim = body.get("_all", {}).get("primaries", {})
            out["disk_bytes"] = prim.get("store", {}).get("size_in_bytes")
            out["deleted_documents"] = prim.get("docs", {}).get("deleted")
        return out

    # -- writes -----------------------------------------------------------------------------

    def upsert(self, docs: Sequence[Document]) -> None:
        """Index documents by id through ``_bulk`` chunks; raises DocumentsRejectedError for refused ones.

        Each document is stored whole or not at all; a batch is not atomic, but ids are content
        hashes, so running the same ingest again fills any gap without duplicates. Other
        documents give up the paths of these first (so an interruption in between leaves a
        path without a document, which the next ingest stores, never a path with two).
        """
        failures: dict[str, str] = {}
        sources: list[tuple[str, dict[str, Any]]] = []
        dim = self.identity.dense_dim if self.identity else None
        for doc in docs:
            try:
                if dim and np.asarray(doc.dense).size != dim:
                    raise ValueError(f"dense vector has {np.asarray(doc.dense).size} values, the index wants {dim}")
                sources.append((doc.id, self._doc_source(doc)))
            except (ValueError, TypeError) as exc:
                failures[doc.id] = str(exc)
        if sources and self.claims_paths:
            sent = {doc_id for doc_id, _ in sources}
            claimed = {p: doc.id for doc in docs if doc.id in sent for p in doc.paths}
            others = self.paths_of(self._holders(list(claimed)) - sent)
            self._apply_paths(others, relinked(others, claimed))
            self._unsearchable_paths.update(claimed)
        if sources:
            self._writing()
            failures.update(self._bulk(self._bulk_index_items(sources))[0])
            self._written()
        if failures:
            stored = len(sources) - sum(1 for i, _ in sources if i in failures)
            first_id, first = next(iter(failures.items()))
            raise DocumentsRejectedError(
                f"{len(failures)} document(s) refused by {self.label}, {stored} stored "
                f"(first: {first_id[:12]}: {first})",
                failures,
            )

    def delete(self, ids: Iterable[str]) -> int:
        ids = list(dict.fromkeys(ids))
        if not ids:
            return 0
        self._writing()
        failures, results = self._bulk(self._bulk_delete_items(ids))
        if failures:
            raise IndexStoreError(f"cannot delete {len(failures)} document(s): {next(iter(failures.values()))}")
        self._written()
        return sum(1 for r in results if r == "deleted")

    # -- reads ------------------------------------------------------------------------------

    def ids_present(self, ids: Iterable[str]) -> set[str]:
        ids = list(dict.fromkeys(ids))
        found: set[str] = set()
        for start in range(0, len(ids), 1000):
            found.update(d["_id"] for d in self._mget(ids[start : start + 1000], source=False) if d.get("found"))
        return found

    def get(self, ids: Sequence[str]) -> list[Document]:
        out: list[Document] = []
        for start in range(0, len(ids), 500):
            for d in self._mget(list(ids[start : start + 500]), source=True):
                if d.get("found"):
                    out.append(document_from_source(d["_id"], d.get("_source", {}), self._decode, self._user_types))
        return out

    # PathListing (index prune, the missing-file count of index stats, copies, moved and
    # overwritten files in ingest): only the ``path`` field of ``_source`` travels, never the
    # vectors. A document with copies stores its paths as a list, the shown one first.

    def document_paths(self, page: int = 1000) -> Iterator[tuple[str, str]]:
        """(id, path) of every stored path, through pages that fetch only ``path``."""
        self.settle()
        for hits in self._pages(self.index_name, page, fields=[PATH_FIELD]):
            for h in hits:
                for path in paths_from_source(h.get("_source", {}).get(PATH_FIELD)):
                    yield self._hit_id(h), path

    def paths_of(self, ids: Iterable[str]) -> dict[str, list[str]]:
        ids = list(dict.fromkeys(ids))
        out: dict[str, list[str]] = {}
        for start in range(0, len(ids), 1000):
            for d in self._mget(ids[start : start + 1000], source=PATH_FIELD):
                if d.get("found"):
                    out[d["_id"]] = paths_from_source(d.get("_source", {}).get(PATH_FIELD))
        return out

    def relink(self, found: Mapping[str, str] | None = None, gone: Iterable[str] = ()) -> int:
        """Move paths between documents (see ``Backend.relink``): partial updates of ``path``,
        deletes of the documents left without one."""
        found, gone = dict(found or {}), list(gone)
        if not found and not gone:
            return 0
        current = self.paths_of(self._holders([*found, *gone]) | set(found.values()))
        return self._apply_paths(current, relinked(current, found, gone))

    def _holders(self, paths: list[str]) -> set[str]:
        """Ids of the documents that hold any of ``paths`` (a search on ``path``).

        Without a refresh per ingest batch (the small segments ``settle`` avoids): an ingest
        meets each path once, so only a path this process wrote since its last refresh needs
        one first.
        """
        if not paths:
            return set()
        if self._unsearchable_paths.intersection(paths):
            self._refresh()
            self._unsearchable_paths.clear()
        ids: set[str] = set()
        for start in range(0, len(paths), HOLDERS_PER_REQUEST):
            chunk = paths[start : start + HOLDERS_PER_REQUEST]
            status, body = self._call("POST", f"/{self.index_name}/_search", body=holders_body(chunk, self._id_source()))
            hits = self._check(status, body, "find the documents of these paths").get("hits", {}).get("hits", [])
            ids.update(self._hit_id(h) for h in hits)
        return ids

    def _apply_paths(self, current: Mapping[str, list[str]], changed: Mapping[str, list[str]]) -> int:
        """Write ``changed`` (id -> new paths, [] to remove the document); how many were removed."""
        if not changed:
            return 0
        updates = [(doc_id, {PATH_FIELD: stored_paths(new)}) for doc_id, new in changed.items() if new]
        removed = [doc_id for doc_id, new in changed.items() if not new]
        self._unsearchable_paths.update(p for _, new in changed.items() for p in new)
        self._writing()
        failures, results = self._bulk(self._bulk_update_items(updates) + self._bulk_delete_items(removed))
        if failures:
            raise IndexStoreError(f"cannot change the paths of {len(failures)} document(s): "
                                  f"{next(iter(failures.values()))}")
        self._written()
        return sum(1 for r in results if r == "deleted")

    def _mget(self, ids: list[str], source: bool | str, index: str | None = None) -> list[dict]:
        """``source``: whole documents (True), none (False), or these comma-separated fields;
        ``index``: another index than this one's."""
        if not ids:
            return []
        status, body = self._call("POST", f"/{index or self.index_name}/_mget", body=mget_body(ids),
                                  params={"_source": source if isinstance(source, str) else "true" if source else "false"})
        return self._check(status, body, "read documents").get("docs", [])

    def _hits(self, raw: list[dict], query: Mapping[str, float], explain: int) -> list[Hit]:
        hits = []
        for h in raw:
            src = h.get("_source", {})
            hits.append(Hit(
                id=self._hit_id(h),
                # _score is a float32 printed in shortest form: recover the exact value.
                score=float(np.float32(h.get("_score") or 0.0)),
                path=shown_path(src.get(self.path_field)),
                url=src.get("url") if self.path_field == PATH_FIELD else None,  # a user's url is not the picture's
                matched=matched_terms(query, self._decode(src.get(SPARSE_FIELD)), explain),
            ))
        return hits

    # -- reindex ----------------------------------------------------------------------------

    def _reindex(self, identity: IndexIdentity | None, reencode: Callable[[Document], Document | None] | None,
                 target: Any, *, keep_old: bool, page: int) -> dict:
        """Copy every document into ``<name>-00000N+1`` and move the alias there.

        ``target`` holds the engine's settings of the new index (see :meth:`_reindex_target`).
        Without ``reencode`` the copy runs
        server-side (``_reindex``); with it each stored document goes through ``reencode`` and
        is written by this client. The alias moves only when the new index holds as many
        documents as the old one; otherwise the new index is deleted and nothing changes.
        """
        old = self._stored_identity()
        if old is None:
            raise IndexStoreError(f"no index {self.index_name!r} at {self.url} to reindex")
        new_identity = identity or old
        if reencode is None and new_identity.fingerprint != old.fingerprint:
            raise BundleMismatchError("a new bundle needs its documents re-encoded: reindex with the bundle's encoder")
        target = self._reindex_target(target)
        concrete = self._concrete_indices()
        if len(concrete) != 1:
            raise IndexStoreError(f"{self.index_name!r} points at {len(concrete)} indices; expected one")
        (old_index,) = concrete
        is_alias = old_index != self.index_name
        new_index = next_generation(self.index_name, old_index)
        status, body = self._create_generation(new_index, new_identity, target)
        if not 200 <= status < 300:
            raise IndexStoreError(f"cannot create index {new_index}: {self._reason(body, status)}")
        if self._user_types:  # the copy carries the user's fields: map them first
            status, body = self._call("PUT", f"/{new_index}/_mapping",
                                      body=narrowing.declared_properties(self._user_types, {}))
            if not 200 <= status < 300:
                self._call("DELETE", f"/{new_index}")
                raise IndexStoreError(f"cannot map the user's fields in {new_index}: {self._reason(body, status)}")
        before = self._count(old_index)
        lost: dict[str, str] = {}
        try:
            if reencode is None:
                status, body = self._call("POST", "/_reindex", body=reindex_body(old_index, new_index),
                                          params={"refresh": "true", "wait_for_completion": "true"},
                                          timeout=self.reindex_timeout)
                self._check(status, body, "reindex")
                if body.get("failures"):
                    raise IndexStoreError(f"reindex failed: {self._one_line(str(body['failures'][0]))}")
            else:
                lost = self._copy_reencoded(old_index, self._writer(new_index, new_identity, target), reencode, page)
            after = self._count(new_index)
            if lost or after < before:
                raise IndexStoreError(
                    f"reindex stopped: {after} of {before} documents copied"
                    + (f", {len(lost)} could not be re-encoded" if lost else "")
                    + f"; {self.index_name!r} still points at {old_index}"
                )
        except BaseException:
            self._call("DELETE", f"/{new_index}")
            raise
        status, body = self._call("POST", "/_aliases", body=alias_swap_body(self.index_name, new_index, old_index, is_alias))
        self._check(status, body, "swap the alias")
        if is_alias and not keep_old:
            self._call("DELETE", f"/{old_index}")
        self._reindexed(new_identity, target)
        return {"from": old_index, "to": new_index, "documents": after, "kept_old": bool(is_alias and keep_old)}

    def _copy_reencoded(self, source: str, writer: EngineIndex,
                        reencode: Callable[[Document], Document | None], page: int) -> dict[str, str]:
        """Every document of ``source`` through ``reencode`` into ``writer``; {id: path} of those lost."""
        lost: dict[str, str] = {}
        for batch in self._scan(source, page):
            out = []
            for doc in batch:
                new = reencode(doc)
                if new is None:
                    lost[doc.id] = doc.path
                else:
                    out.append(new)
            writer.upsert(out)
        self._refresh(writer.index_name)
        return lost

    def _scan(self, index: str, page: int) -> Iterator[list[Document]]:
        for hits in self._pages(index, page):
            yield [document_from_source(self._hit_id(h), h.get("_source", {}), self._decode, self._user_types)
                   for h in hits]

    # -- metadata (the Narrowing protocol of d2s_search.backends.base) -----------------------

    def _remember_fields(self, mapping: Mapping[str, Any]) -> None:
        """The user's fields and the built-in metadata fields missing from a stored mapping."""
        properties = mapping.get("properties") or {}
        self._user_types = narrowing.user_field_types(properties)
        self._missing_fields = narrowing.missing_properties(properties)

    def _mapping_targets(self) -> list[str]:
        """The indices whose mapping carries the metadata fields (a SEISMIC index's sibling too)."""
        return [self.index_name]

    def _put_mapping(self, body: Mapping[str, Any]) -> tuple[int, Any]:
        return self._call("PUT", f"/{','.join(self._mapping_targets())}/_mapping", body=body)

    def _add_metadata_fields(self) -> None:
        """Map the built-in metadata fields in an index made before them (adding fields is
        allowed on both engines; existing documents simply lack them)."""
        status, body = self._put_mapping({"properties": self._missing_fields})
        if not 200 <= status < 300:
            raise IndexStoreError(
                f"{self.label} refused to add the metadata fields ({', '.join(self._missing_fields)}) to "
                f"{self.index_name!r}: {self._reason(body, status)}; reindex it into a new index to filter by them"
            )
        log.info("added the metadata fields %s to %s", ", ".join(self._missing_fields), self.index_name)
        self._missing_fields = {}

    def _read_fields(self) -> dict[str, str]:
        """The user's fields as the index's mapping says now (another process may declare some)."""
        mapping = self._mapping()
        if not mapping:
            raise IndexStoreError(self._missing())
        self._remember_fields(next(iter(mapping.values())).get("mappings", {}))
        return self._user_types

    def field_types(self) -> dict[str, str]:
        return {**BUILT_IN_FIELDS, **self._read_fields()}

    def declare_fields(self, types: Mapping[str, str]) -> None:
        if not types:
            return
        body = narrowing.declared_properties(types, self._read_fields())
        if not body:
            return
        status, answer = self._put_mapping(body)
        if not 200 <= status < 300:
            reason = self._reason(answer, status)
            if "cannot be changed" in reason or "mapper_parsing" in reason:  # declared meanwhile with another type
                raise MetadataError(f"cannot declare the fields {', '.join(sorted(types))}: {reason}")
            raise IndexStoreError(f"{self.label} could not declare the fields {', '.join(sorted(types))}: {reason}")
        self._user_types.update({name: kind for name, kind in types.items()})

    def set_metadata(self, metadata: Mapping[str, Metadata], keep_fields: Collection[str] = ()) -> int:
        """Partial updates of the metadata fields of the stored documents whose metadata
        changes (vectors are not sent); returns how many changed."""
        if not metadata:
            return 0
        types = self._read_fields()
        for doc_id, meta in metadata.items():
            try:
                narrowing.check_fields(meta, types)
            except ValueError as exc:
                raise MetadataError(f"document {doc_id[:12]}: {exc}") from None
        stored: dict[str, tuple[list[str], Metadata]] = {}
        ids = list(metadata)
        wanted = ",".join([PATH_FIELD, "taken_at", "camera", "location", narrowing.USER_FIELDS])
        for start in range(0, len(ids), 1000):
            for d in self._mget(ids[start : start + 1000], source=wanted):
                if d.get("found"):
                    src = d.get("_source") or {}
                    stored[d["_id"]] = (paths_from_source(src.get(PATH_FIELD)),
                                        narrowing.document_metadata(src, types))
        keep = set(keep_fields)  # their stored user fields stay: only what the pictures say is replaced
        metadata = {i: m.with_fields(stored[i][1].fields) if i in keep and i in stored else m
                    for i, m in metadata.items()}
        updates = [(doc_id, narrowing.metadata_source(doc_id, stored[doc_id][0], meta, types, update=True))
                   for doc_id, meta in metadata.items() if doc_id in stored and stored[doc_id][1] != meta]
        if not updates:
            return 0
        self._writing()
        failures, _ = self._bulk(self._bulk_update_items(updates))
        if failures:
            raise IndexStoreError(f"cannot change the metadata of {len(failures)} document(s): "
                                  f"{next(iter(failures.values()))}")
        self._written()
        return len(updates)

    def _narrowed(self, path_prefix: str | None, words: WordFilter | None,
                  filters: SearchFilter | None) -> Filters:
        """The restrictions of a search as this index stores its fields."""
        return Filters(path_prefix, words, search=filters or None, types=dict(self._user_types))

    def _source_fields(self, fields: list[str]) -> Any:
        """``_source`` naming these fields, in the form the engine's specification takes."""
        return fields

    def _search_answer(self, body: dict[str, Any], what: str) -> dict[str, Any]:
        self.settle()
        status, answer = self._call("POST", f"/{self.index_name}/_search", body=body)
        answer = self._check(status, answer, what)
        return answer if isinstance(answer, dict) else {}

    def browse(self, k: int, filters: SearchFilter | None = None, offset: int = 0, *,
               words: WordFilter | None = None) -> list[Hit]:
        check_page(k, offset)
        query = self._narrowed(None, words, filters).as_query()
        fields = [PATH_FIELD, "url", *([narrowing.CONTENT_ID] if self._id_source() else [])]
        body = narrowing.browse_body(k, offset, query, [])
        body["_source"] = self._source_fields(fields)
        hits = self._hits(self._search_answer(body, "list the library").get("hits", {}).get("hits", []), {}, 0)
        for hit in hits:
            hit.score = 0.0
        return hits

    def facets(self, filters: SearchFilter | None = None, size: int = 20, *,
               words: WordFilter | None = None) -> dict[str, list[tuple[str, int]]]:
        if size < 1:
            raise QueryError("the facet size must be at least 1")
        types = dict(self._user_types)
        query = self._narrowed(None, words, filters).as_query()
        answer = self._search_answer(narrowing.facets_body(query, types, size), "count the facets")
        return narrowing.facets_from_answer(answer, types, size)
