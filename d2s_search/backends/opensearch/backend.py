"""The ``opensearch`` backend: documents in an OpenSearch index, searched server-side.

Layout: ``index_name`` (default ``d2s``) is an alias over a concrete index ``d2s-000001``,
so ``reindex`` can build ``d2s-000002`` and swap the alias atomically. An index created by
hand under the plain name works too (it is replaced by an alias on the first reindex).

Scores: a sparse hit's score is OpenSearch's ``rank_feature`` sum, i.e. the dot product with
every stored weight truncated to 9 significant bits (see ``lucene_feature_value``); matched
terms are computed here from the stored features, so they use the exact weights. A dense
hit's score is the inner product recovered from OpenSearch's k-NN score, as in ``local``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from opensearchpy import helpers

from d2s_search import redact
from d2s_search.backends.base import Document, Hit, IndexIdentity, SparseVector
from d2s_search.backends.engine.bulk import item_reason, next_generation
from d2s_search.backends.engine.documents import document_from_source
from d2s_search.backends.engine.identity import check_dims, check_identity
from d2s_search.backends.opensearch import queries as q
from d2s_search.backends.opensearch.client import (
    ENV_AWS_REGION,
    ENV_AWS_SERVICE,
    OpenSearchHTTP,
    Reply,
    split_hosts,
)
from d2s_search.backends.opensearch.cluster import ClusterInfo, Dialect, cluster_info
from d2s_search.backends.opensearch.features import decode_features, matched_terms
from d2s_search.backends.opensearch.seismic import (
    VOCABULARY_DOC,
    Vocabulary,
    vocabulary_index,
    vocabulary_index_body,
)
from d2s_search.errors import (
    BackendUnavailableError,
    BundleMismatchError,
    DocumentsRejectedError,
    IndexStoreError,
    QueryError,
)

log = logging.getLogger("d2s_search.opensearch")

ENV_URL = "D2S_OPENSEARCH_URL"
ENV_USER = "D2S_OPENSEARCH_USER"
ENV_PASSWORD = "D2S_OPENSEARCH_PASSWORD"
ENV_API_KEY = "D2S_OPENSEARCH_API_KEY"
ENV_CA_FILE = "D2S_OPENSEARCH_CA_FILE"
ENV_INDEX = "D2S_OPENSEARCH_INDEX"
ENV_INSECURE = "D2S_OPENSEARCH_INSECURE"  # "1": skip TLS verification (local demo certificates only)
ENV_SNIFF = "D2S_OPENSEARCH_SNIFF"  # "1": discover the cluster's other nodes (not behind Docker/LB)

# Per-item bulk statuses worth sending again (queue full, node busy).
RETRY_ITEM_STATUSES = frozenset({429, 500, 502, 503, 504})


class OpenSearchBackend:
    """Backend protocol over OpenSearch's REST API (see :mod:`d2s_search.backends.base`)."""

    name = "opensearch"

    def __init__(
        self,
        url: str | Sequence[str],
        index_name: str = "d2s",
        user: str | None = None,
        password: str | None = None,
        api_key: str | None = None,
        ca_file: str | None = None,
        verify: bool = True,
        timeout: float = 30.0,
        retries: int = 5,
        *,
        chunk_docs: int = 500,
        chunk_bytes: int = 8 * 1024 * 1024,
        refresh: bool = True,
        backoff: float = 0.5,
        sleep: Callable[[float], None] | None = None,
        aws_region: str | None = None,
        aws_service: str | None = None,
        sniff: bool = False,
    ) -> None:
        if not index_name or index_name != index_name.lower() or index_name.startswith(("_", "-", "+")):
            raise IndexStoreError(f"invalid OpenSearch index name {index_name!r} (lowercase, no leading _ - +)")
        extra: dict[str, Any] = {"sleep": sleep} if sleep else {}
        self.http = OpenSearchHTTP(
            url, user=user, password=password, api_key=api_key, ca_file=ca_file, verify=verify,
            timeout=timeout, retries=retries, backoff=backoff, aws_region=aws_region,
            aws_service=aws_service, sniff=sniff, **extra,
        )
        self.index_name = index_name
        self.chunk_docs = max(1, chunk_docs)
        self.chunk_bytes = max(1024, chunk_bytes)
        self.refresh = refresh
        self.identity: IndexIdentity | None = None
        self._max_clauses: int | None = None
        self._pipelines: set[str] = set()
        self._cluster: ClusterInfo | None = None
        self._dirty = False  # written since the last refresh
        self.vocabulary: Vocabulary | None = None  # set on a SEISMIC index: keys are vocabulary ids
        self.seismic_top_n = 10  # query tokens SEISMIC keeps (SparseAnnQueryBuilder default)
        self.seismic_heap_factor = 1.0

    @classmethod
    def from_env(cls, url: str | Sequence[str] | None = None, env: Mapping[str, str] | None = None,
                 **options: Any) -> OpenSearchBackend:
        """Settings: explicit arguments > ``D2S_OPENSEARCH_*`` environment (see connection_options)."""
        options = connection_options(url, env, **options)
        return cls(options.pop("url"), **options)

    def __repr__(self) -> str:
        return f"OpenSearchBackend({self.http!r}, index={self.index_name!r})"

    __str__ = __repr__

    @property
    def url(self) -> str:
        return self.http.url

    # -- index lifecycle ------------------------------------------------------------------

    def exists(self) -> bool:
        reply = self.http.request("HEAD", f"/{self.index_name}")
        return reply.status == 200

    def open(self, identity: IndexIdentity | None, create: bool = True, **create_options: Any) -> None:
        """Open the index; with ``identity`` check (or, when new, create and record) the bundle.

        ``identity=None`` opens an existing index as it is (stats, delete).
        """
        stored = self._stored_identity()
        if stored is None:
            if not create or identity is None:
                raise IndexStoreError(
                    f"no index {self.index_name!r} at {self.url}: run `d2s-search index create` or ingest first"
                )
            self.create(identity, **create_options)
            stored = identity
        elif identity is None:
            pass
        elif not stored.fingerprint:
            # Created from mappings/index.json by hand: claim it if the dimension agrees.
            self._check_dims(identity, stored)
            self._put_meta(identity)
            stored = identity
        else:
            self._check_identity(identity, stored)
            if create and identity.bundle_path and identity.bundle_path != stored.bundle_path:
                self._put_meta(identity)  # the same bundle at a new place: record where it is now
                stored = identity
        self.identity = stored
        self._load_vocabulary()

    def create(self, identity: IndexIdentity, *, engine: str = "faiss", shards: int = 1, replicas: int = 0,
               sparse_index: str = q.SPARSE_RANK_FEATURES, vocabulary: Sequence[str] | None = None,
               seismic: Mapping[str, Any] | None = None) -> str:
        """Create ``<name>-000001`` behind the alias ``<name>``; returns the concrete name.

        ``sparse_index="seismic"`` needs the bundle's ``vocabulary`` (stored beside the index,
        see :mod:`d2s_search.backends.opensearch.seismic`).
        """
        concrete = f"{self.index_name}-000001"
        body = q.index_body(identity, engine=engine, shards=shards, replicas=replicas,
                            sparse_index=sparse_index, seismic=seismic)
        if sparse_index == q.SPARSE_SEISMIC:
            if not self.dialect().sparse_vector:
                raise IndexStoreError(
                    f"the SEISMIC sparse index needs OpenSearch 3.3 or later (this cluster: "
                    f"{self.cluster().to_json()['version']})"
                )
            if not vocabulary:
                raise IndexStoreError("a SEISMIC index needs the bundle's vocabulary")
            self._store_vocabulary(Vocabulary(vocabulary, identity.fingerprint), replicas)
        body["aliases"] = {self.index_name: {}}
        reply = self.http.request("PUT", f"/{concrete}", json_body=body)
        if not reply.ok:
            kind = reply.error_reason()
            if "resource_already_exists" in kind:
                # A retried PUT whose first answer was lost, or a race: accept it if it is ours.
                self._check_identity(identity, self._stored_identity())
                return concrete
            if self.vocabulary is not None:  # created just above for this index: take it back
                self.http.request("DELETE", f"/{vocabulary_index(self.index_name)}")
                self.vocabulary = None
            raise IndexStoreError(f"cannot create index {concrete} at {self.url}: {kind}")
        self.identity = identity
        return concrete

    def drop(self) -> list[str]:
        """Delete the index (every concrete index behind the alias, and a SEISMIC index's
        vocabulary); returns the concrete indices deleted."""
        deleted = []
        if self.vocabulary is not None or self._is_seismic():
            self.http.request("DELETE", f"/{vocabulary_index(self.index_name)}")
        for concrete in self._concrete_indices():
            reply = self.http.request("DELETE", f"/{concrete}")
            if not reply.ok and reply.status != 404:
                raise IndexStoreError(f"cannot delete index {concrete}: {reply.error_reason()}")
            if reply.ok:
                deleted.append(concrete)
        self.identity = None
        return deleted

    def close(self) -> None:
        # One attempt only: closing after the cluster went away must not wait through back-offs
        # (the periodic refresh makes the writes visible within a second anyway).
        retries, self.http.policy.retries = self.http.policy.retries, 0
        try:
            self.settle()
        except BackendUnavailableError as exc:
            log.warning("final refresh of %s failed: %s", self.index_name, exc)
        finally:
            self.http.policy.retries = retries
            self.http.close()

    def stats(self) -> dict:
        self.settle()
        mapping = self._mapping()
        concrete = sorted(mapping)
        meta = mapping[concrete[0]].get("mappings", {}).get("_meta", {}) if concrete else {}
        out: dict[str, Any] = {
            "backend": self.name,
            "location": f"{self.url}/{self.index_name}",
            "indices": concrete,
            "bundle_fingerprint": meta.get("fingerprint", ""),
            "bundle_model": meta.get("model", ""),
            "dense_dim": meta.get("dense_dim"),
            "mapping_version": meta.get("d2s_mapping_version"),
        }
        count = self.http.request("GET", f"/{self.index_name}/_count")
        out["documents"] = int(count.body.get("count", 0)) if count.ok else None
        st = self.http.request("GET", f"/{self.index_name}/_stats/docs,store")
        if st.ok:
            prim = st.body.get("_all", {}).get("primaries", {})
            out["disk_bytes"] = prim.get("store", {}).get("size_in_bytes")
            out["deleted_documents"] = prim.get("docs", {}).get("deleted")
        out["max_clause_count"] = self.max_clauses()
        return out

    # -- writes ---------------------------------------------------------------------------

    def upsert(self, docs: Sequence[Document]) -> None:
        """Index documents by id through ``_bulk`` chunks; raises DocumentsRejectedError for refused ones.

        Each document is stored whole or not at all; a batch is not atomic, but ids are content
        hashes, so running the same ingest again fills any gap without duplicates.
        """
        failures: dict[str, str] = {}
        sources: list[tuple[str, dict[str, Any]]] = []
        dim = self.identity.dense_dim if self.identity else None
        for doc in docs:
            try:
                if dim and np.asarray(doc.dense).size != dim:
                    raise ValueError(f"dense vector has {np.asarray(doc.dense).size} values, the index wants {dim}")
                source = q.doc_source(doc)
                if self.vocabulary is not None:
                    source[q.SPARSE_FIELD] = self.vocabulary.to_ids(doc.sparse)
                sources.append((doc.id, source))
            except (ValueError, TypeError) as exc:
                failures[doc.id] = str(exc)
        if sources:
            self._dirty = True
            failures.update(self._bulk(q.bulk_index_actions(self.index_name, sources)))
        if failures:
            stored = len(sources) - sum(1 for i, _ in sources if i in failures)
            first_id, first = next(iter(failures.items()))
            raise DocumentsRejectedError(
                f"{len(failures)} document(s) refused by OpenSearch, {stored} stored "
                f"(first: {first_id[:12]}: {first})",
                failures,
            )

    def delete(self, ids: Iterable[str]) -> int:
        ids = list(dict.fromkeys(ids))
        if not ids:
            return 0
        self._dirty = True
        failures, results = self._bulk(q.bulk_delete_actions(self.index_name, ids), collect=True)
        if failures:
            raise IndexStoreError(f"cannot delete {len(failures)} document(s): {next(iter(failures.values()))}")
        return sum(1 for r in results if r == "deleted")

    def _bulk(self, actions: list[dict[str, Any]], collect: bool = False):
        """Send ``actions`` with ``opensearchpy.helpers.streaming_bulk``; per-item results.

        Items refused as busy (429/5xx) are sent again after a back-off, the rest are reported:
        returns ``{id: reason}`` (and the results of the items that succeeded with ``collect``).
        A chunk refused as too large (413) is sent again in halves.
        """
        failures: dict[str, str] = {}
        results: list[str] = []
        pending, chunk_docs, chunk_bytes, attempt = actions, self.chunk_docs, self.chunk_bytes, 0
        while pending:
            retry: list[dict[str, Any]] = []
            too_large: list[dict[str, Any]] = []
            by_id = {a["_id"]: a for a in pending}
            for ok, item in helpers.streaming_bulk(
                self.http.client, pending, chunk_size=chunk_docs, max_chunk_bytes=chunk_bytes,
                raise_on_error=False, raise_on_exception=False, max_retries=0, yield_ok=True,
                headers={"content-type": "application/x-ndjson"},
            ):
                ((_, result),) = item.items()
                status = int(result.get("status", 0) or 0)
                doc_id = str(result.get("_id"))
                if ok or (status == 404 and result.get("result") == "not_found"):
                    results.append(result.get("result", ""))
                elif status == 413 and chunk_docs > 1:
                    too_large.append(by_id[doc_id])
                elif status in RETRY_ITEM_STATUSES and attempt < self.http.retries:
                    retry.append(by_id[doc_id])
                else:
                    failures[doc_id] = item_reason(result, redact.one_line)
            if too_large:
                # A smaller chunk may fit; this is not a retry of a busy server.
                chunk_docs, chunk_bytes = max(1, chunk_docs // 2), max(1024, chunk_bytes // 2)
                retry += too_large
            elif retry:
                self.http.policy.wait(attempt, None, f"{len(retry)} bulk item(s) refused as busy")
                attempt += 1
            pending = retry
        return (failures, results) if collect else failures

    def settle(self) -> None:
        """Refresh once before the first read after writes (``refresh=True``), not per batch.

        A refresh after every ingest batch of 32 images writes a tiny Lucene segment each
        time (merge pressure, slower searches); searches through this backend still see
        every write, and ``close`` refreshes once at the end of an ingest.
        """
        if self._dirty and self.refresh:
            self._refresh()
        self._dirty = False

    def _refresh(self) -> None:
        reply = self.http.request("POST", f"/{self.index_name}/_refresh")
        if not reply.ok:
            log.warning("refresh of %s failed: %s", self.index_name, reply.error_reason())

    # -- reads ----------------------------------------------------------------------------

    def ids_present(self, ids: Iterable[str]) -> set[str]:
        ids = list(dict.fromkeys(ids))
        found: set[str] = set()
        for start in range(0, len(ids), 1000):
            reply = self._mget(ids[start : start + 1000], source=False)
            found.update(d["_id"] for d in reply if d.get("found"))
        return found

    def get(self, ids: Sequence[str]) -> list[Document]:
        out: list[Document] = []
        for start in range(0, len(ids), 500):
            for d in self._mget(list(ids[start : start + 500]), source=True):
                if d.get("found"):
                    out.append(_document(d["_id"], d.get("_source", {}), self._decode))
        return out

    # PathListing (index prune, the missing-file count of index stats, moved files in ingest):
    # only the ``path`` field of ``_source`` travels, never the vectors.

    def document_paths(self, page: int = 1000) -> Iterator[tuple[str, str]]:
        """(id, path) of every document, through a scroll that fetches only ``path``."""
        self.settle()
        for hits in self._scroll(self.index_name, page, fields=["path"]):
            for h in hits:
                yield h["_id"], h.get("_source", {}).get("path", "")

    def paths_of(self, ids: Iterable[str]) -> dict[str, str]:
        ids = list(dict.fromkeys(ids))
        out: dict[str, str] = {}
        for start in range(0, len(ids), 1000):
            for d in self._mget(ids[start : start + 1000], source="path"):
                if d.get("found"):
                    out[d["_id"]] = d.get("_source", {}).get("path", "")
        return out

    def _mget(self, ids: list[str], source: bool | str) -> list[dict]:
        """``source``: whole documents (True), none (False), or these comma-separated fields."""
        if not ids:
            return []
        reply = self.http.request(
            "POST", f"/{self.index_name}/_mget", json_body=q.mget_body(ids),
            params={"_source": source if isinstance(source, str) else "true" if source else "false"},
        )
        self._raise_for(reply, "read documents")
        return reply.body.get("docs", [])

    # -- searches -------------------------------------------------------------------------

    def sparse_search(
        self,
        query: SparseVector,
        k: int,
        explain: int = 5,
        *,
        offset: int = 0,
        path_prefix: str | None = None,
        neural_sparse: bool = False,
    ) -> list[Hit]:
        if self.vocabulary is not None:
            body = q.seismic_search_body(self.vocabulary.to_ids(query), k, offset=offset, top_n=self.seismic_top_n,
                                         heap_factor=self.seismic_heap_factor, filters=q.Filters(path_prefix))
            return self._hits(self._search(body), query, explain)
        body = q.sparse_search_body(
            query, k, offset=offset, max_clauses=self.max_clauses(),
            filters=q.Filters(path_prefix), neural_sparse=neural_sparse,
        )
        return self._hits(self._search(body), query, explain)

    def two_phase_search(
        self,
        first: SparseVector,
        full: SparseVector,
        k: int,
        window: int,
        explain: int = 5,
        *,
        offset: int = 0,
        path_prefix: str | None = None,
    ) -> list[Hit]:
        if self.vocabulary is not None:
            raise QueryError("a SEISMIC index has no two-phase plan; use sparse (approximate) or hybrid")
        body = q.two_phase_body(
            first, full, k, window, offset=offset, max_clauses=self.max_clauses(),
            filters=q.Filters(path_prefix),
        )
        return self._hits(self._search(body), full, explain)

    def dense_search(
        self,
        vector: np.ndarray,
        k: int,
        explain_with: SparseVector | None = None,
        explain: int = 5,
        *,
        offset: int = 0,
        path_prefix: str | None = None,
    ) -> list[Hit]:
        body = q.knn_search_body(vector, k, offset=offset, filters=q.Filters(path_prefix))
        hits = self._hits(self._search(body), explain_with or {}, explain if explain_with else 0)
        for hit in hits:
            hit.score = knn_score_to_inner_product(hit.score)
        return hits

    def hybrid_search(
        self,
        sparse: SparseVector,
        vector: np.ndarray,
        k: int | Any,
        *,
        method: str = "min_max",
        weights: tuple[float, float] = (0.5, 0.5),
        rank_constant: int = 60,
        window: int | None = None,
        explain: int = 5,
        offset: int = 0,
        path_prefix: str | None = None,
        neural_sparse: bool = False,
    ) -> list[Hit]:
        """Sparse + dense fused by OpenSearch (``hybrid`` query through a search pipeline).

        ``k`` may be a :class:`d2s_search.search.SearchOptions` (how ``search.hybrid`` calls
        native fusion): its k, fusion, alpha (dense weight), rrf_k, window and explain apply.
        ``weights`` are (sparse, dense). ``Hit.score`` is the fused score; ``Hit.parts`` holds
        the exact sparse dot product and dense inner product, computed from the stored vectors.
        """
        if not isinstance(k, int):
            opts = k
            k = int(opts.k)
            method = "rrf" if opts.fusion == "rrf" else "min_max"
            weights = (1.0 - float(opts.alpha), float(opts.alpha))
            rank_constant = int(opts.rrf_k)
            window = int(opts.candidates)
            explain = int(opts.explain)
        pipeline = self.ensure_pipeline(method, weights, rank_constant)
        dialect = self.dialect()
        seismic_clause = None
        if self.vocabulary is not None:
            depth = min(max(int(window or 0), offset + k), q.MAX_RESULT_WINDOW)
            seismic_clause = q.seismic_query(self.vocabulary.to_ids(sparse), depth, top_n=self.seismic_top_n,
                                             heap_factor=self.seismic_heap_factor, filters=q.Filters(path_prefix))
        body = q.hybrid_search_body(
            sparse, vector, k, offset=offset, window=window, max_clauses=self.max_clauses(),
            filters=q.Filters(path_prefix), neural_sparse=neural_sparse, dialect=dialect,
            sparse_clause=seismic_clause,
        )
        body["_source"] = [*q.HIT_SOURCE, q.DENSE_FIELD]
        raw = q.hybrid_page(self._search(body, params={"search_pipeline": pipeline}), k, offset, dialect)
        hits = self._hits(raw, sparse, explain)
        vec = np.asarray(vector, dtype=np.float32).reshape(-1)
        for hit, h in zip(hits, raw, strict=True):
            src = h.get("_source", {})
            doc_sparse = self._decode(src.get(q.SPARSE_FIELD))
            hit.parts = {
                "sparse": float(sum(w * doc_sparse.get(t, 0.0) for t, w in sparse.items())),
                "dense": float(np.dot(np.asarray(src.get(q.DENSE_FIELD, []), dtype=np.float32), vec))
                if src.get(q.DENSE_FIELD) else 0.0,
            }
        return hits

    def ensure_pipeline(self, method: str = "min_max", weights: tuple[float, float] = (0.5, 0.5),
                        rank_constant: int = 60) -> str:
        """Create (idempotently) the search pipeline for a fusion setting; returns its name."""
        name = q.pipeline_name(method, weights, rank_constant)
        if name not in self._pipelines:
            reply = self.http.request(
                "PUT", f"/_search/pipeline/{name}",
                json_body=q.pipeline_body(method, weights, rank_constant, self.dialect()),
            )
            if not reply.ok:
                raise IndexStoreError(
                    f"cannot create search pipeline {name} (needs the neural-search plugin): {reply.error_reason()}"
                )
            self._pipelines.add(name)
        return name

    def cluster(self) -> ClusterInfo:
        """Version and distribution from ``GET /`` (read once; unknown when it is refused)."""
        if self._cluster is None:
            reply = self.http.request("GET", "/", raise_auth=False)
            self._cluster = cluster_info(reply.body if reply.ok else None, self.url, self.http.aws_service)
        return self._cluster

    def dialect(self) -> Dialect:
        return self.cluster().dialect

    def max_clauses(self) -> int:
        """``indices.query.bool.max_clause_count`` of the cluster (1024 when it cannot be read).

        Reading it needs ``cluster:monitor/settings``; a user without it (403) still searches,
        with the default.
        """
        if self._max_clauses is None:
            self._max_clauses = q.DEFAULT_MAX_CLAUSES
            reply = self.http.request(
                "GET", "/_cluster/settings", params={"include_defaults": "true", "flat_settings": "true"},
                raise_auth=False,
            )
            if reply.status in (401, 403):
                log.info("cannot read max_clause_count (%s); assuming %d", reply.status, q.DEFAULT_MAX_CLAUSES)
            elif reply.ok and isinstance(reply.body, dict):
                for scope in ("transient", "persistent", "defaults"):
                    value = reply.body.get(scope, {}).get("indices.query.bool.max_clause_count")
                    if value is not None:
                        self._max_clauses = max(1, int(value))
                        break
        return self._max_clauses

    def _search(self, body: dict, params: Mapping[str, str] | None = None) -> list[dict]:
        self.settle()
        reply = self.http.request("POST", f"/{self.index_name}/_search", json_body=body, params=params)
        self._raise_for(reply, "search")
        return reply.body.get("hits", {}).get("hits", [])

    def _hits(self, raw: list[dict], query: Mapping[str, float], explain: int) -> list[Hit]:
        hits = []
        for h in raw:
            src = h.get("_source", {})
            hits.append(
                Hit(
                    id=h["_id"],
                    # _score is a float32 printed in shortest form: recover the exact value.
                    score=float(np.float32(h.get("_score") or 0.0)),
                    path=src.get("path", ""),
                    url=src.get("url"),
                    matched=matched_terms(query, self._decode(src.get(q.SPARSE_FIELD)), explain),
                )
            )
        return hits

    # -- reindex --------------------------------------------------------------------------

    def reindex(
        self,
        identity: IndexIdentity | None = None,
        reencode: Callable[[Document], Document | None] | None = None,
        *,
        engine: str = "faiss",
        shards: int = 1,
        replicas: int = 0,
        keep_old: bool = False,
        page: int = 200,
    ) -> dict:
        """Copy every document into a fresh index (new mapping and/or bundle) and swap the alias.

        Without ``reencode`` the copy runs server-side (``_reindex``; same bundle, new mapping).
        With it, each stored document is passed through ``reencode`` (e.g. re-encode its image
        with a new bundle) and written by this client. The alias moves only when the new index
        holds as many documents as the old one; otherwise the new index is deleted and nothing
        changes. Stop ingest while reindexing: writes in between go to the old index.
        """
        old = self._stored_identity()
        if old is None:
            raise IndexStoreError(f"no index {self.index_name!r} at {self.url} to reindex")
        if self._is_seismic():
            raise IndexStoreError("reindexing a SEISMIC index is not supported yet: create a new index and ingest")
        new_identity = identity or old
        if reencode is None and new_identity.fingerprint != old.fingerprint:
            raise BundleMismatchError(
                "a new bundle needs its documents re-encoded: reindex with the bundle's encoder"
            )
        concrete = self._concrete_indices()
        if len(concrete) != 1:
            raise IndexStoreError(f"{self.index_name!r} points at {len(concrete)} indices; expected one")
        (old_index,) = concrete
        is_alias = old_index != self.index_name
        target = next_generation(self.index_name, old_index)
        body = q.index_body(new_identity, engine=engine, shards=shards, replicas=replicas)
        reply = self.http.request("PUT", f"/{target}", json_body=body)
        if not reply.ok:
            raise IndexStoreError(f"cannot create index {target}: {reply.error_reason()}")
        before = self._count(old_index)
        lost: dict[str, str] = {}
        try:
            if reencode is None:
                reply = self.http.request(
                    "POST", "/_reindex", json_body=q.reindex_body(old_index, target),
                    params={"refresh": "true", "wait_for_completion": "true"}, timeout=3600.0,
                )
                self._raise_for(reply, "reindex")
                if reply.body.get("failures"):
                    raise IndexStoreError(f"reindex failed: {redact.one_line(str(reply.body['failures'][0]))}")
            else:
                lost = self._copy_reencoded(old_index, target, new_identity, reencode, page)
            after = self._count(target)
            if lost or after < before:
                raise IndexStoreError(
                    f"reindex stopped: {after} of {before} documents copied"
                    + (f", {len(lost)} could not be re-encoded" if lost else "")
                    + f"; {self.index_name!r} still points at {old_index}"
                )
        except BaseException:
            self.http.request("DELETE", f"/{target}")
            raise
        swap = q.alias_swap_body(self.index_name, target, old_index, is_alias)
        reply = self.http.request("POST", "/_aliases", json_body=swap)
        self._raise_for(reply, "swap the alias")
        if is_alias and not keep_old:
            self.http.request("DELETE", f"/{old_index}")
        self.identity = new_identity
        return {"from": old_index, "to": target, "documents": after, "kept_old": bool(is_alias and keep_old)}

    def _copy_reencoded(self, source: str, target: str, identity: IndexIdentity,
                        reencode: Callable[[Document], Document | None], page: int) -> dict[str, str]:
        writer = OpenSearchBackend.__new__(OpenSearchBackend)
        writer.__dict__.update(self.__dict__)
        writer.index_name, writer.identity, writer.refresh = target, identity, False
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
        self.http.request("POST", f"/{target}/_refresh")
        return lost

    def _scan(self, index: str, page: int) -> Iterator[list[Document]]:
        for hits in self._scroll(index, page):
            yield [_document(h["_id"], h.get("_source", {})) for h in hits]

    def _scroll(self, index: str, page: int, fields: Sequence[str] | None = None) -> Iterator[list[dict]]:
        """Raw hits of every document of ``index``, a page at a time, through a scroll."""
        reply = self.http.request("POST", f"/{index}/_search", params={"scroll": "5m"},
                                  json_body=q.scan_body(page, fields))
        self._raise_for(reply, "scan")
        scroll_id = reply.body.get("_scroll_id")
        try:
            while True:
                hits = reply.body.get("hits", {}).get("hits", [])
                if not hits:
                    return
                yield hits
                reply = self.http.request(
                    "POST", "/_search/scroll", json_body={"scroll": "5m", "scroll_id": scroll_id}
                )
                self._raise_for(reply, "scan")
                scroll_id = reply.body.get("_scroll_id", scroll_id)
        finally:
            if scroll_id:
                self.http.request("DELETE", "/_search/scroll", json_body={"scroll_id": [scroll_id]})

    # -- helpers --------------------------------------------------------------------------

    def _decode(self, stored: Mapping[str, float] | None) -> dict[str, float]:
        """A document's stored sparse field -> ``{term: weight}``."""
        return self.vocabulary.from_ids(stored) if self.vocabulary is not None else decode_features(stored)

    def _is_seismic(self) -> bool:
        metas = [m.get("mappings", {}).get("_meta") or {} for m in self._mapping().values()]
        return any(meta.get("sparse_index") == q.SPARSE_SEISMIC for meta in metas)

    def _store_vocabulary(self, vocabulary: Vocabulary, replicas: int) -> None:
        name = vocabulary_index(self.index_name)
        reply = self.http.request("PUT", f"/{name}", json_body=vocabulary_index_body(replicas))
        if not reply.ok and "resource_already_exists" not in reply.error_reason():
            raise IndexStoreError(f"cannot create {name}: {reply.error_reason()}")
        reply = self.http.request("PUT", f"/{name}/_doc/{VOCABULARY_DOC}", json_body=vocabulary.to_json(),
                                  params={"refresh": "true"})
        self._raise_for(reply, f"store the vocabulary in {name}")
        self.vocabulary = vocabulary

    def _load_vocabulary(self) -> None:
        self.vocabulary = None
        if not self._is_seismic():
            return
        name = vocabulary_index(self.index_name)
        reply = self.http.request("GET", f"/{name}/_doc/{VOCABULARY_DOC}")
        if not reply.ok or not isinstance(reply.body, dict) or not reply.body.get("found"):
            raise IndexStoreError(f"{self.index_name!r} is a SEISMIC index but its vocabulary ({name}) is missing")
        vocabulary = Vocabulary.from_json(reply.body.get("_source", {}))
        if self.identity and self.identity.fingerprint and vocabulary.fingerprint not in ("", self.identity.fingerprint):
            raise BundleMismatchError(f"the vocabulary in {name} belongs to another bundle")
        self.vocabulary = vocabulary

    def _mapping(self) -> dict:
        reply = self.http.request("GET", f"/{self.index_name}/_mapping")
        if reply.status == 404:
            return {}
        self._raise_for(reply, "read the mapping")
        return reply.body if isinstance(reply.body, dict) else {}

    def _concrete_indices(self) -> list[str]:
        return sorted(self._mapping())

    def _stored_identity(self) -> IndexIdentity | None:
        mapping = self._mapping()
        if not mapping:
            return None
        metas = [m.get("mappings", {}).get("_meta") for m in mapping.values()]
        ident = q.meta_identity(metas[0])
        if ident is None:
            raise IndexStoreError(
                f"index {self.index_name!r} at {self.url} was not made by d2s-search (no _meta.fingerprint)"
            )
        return ident

    def _check_identity(self, wanted: IndexIdentity, stored: IndexIdentity | None) -> None:
        check_identity(self.index_name, self.url, wanted, stored, "--index")

    def _check_dims(self, wanted: IndexIdentity, stored: IndexIdentity) -> None:
        check_dims(self.index_name, wanted, stored)

    def _put_meta(self, identity: IndexIdentity) -> None:
        meta = q.index_body(identity)["mappings"]["_meta"]
        reply = self.http.request("PUT", f"/{self.index_name}/_mapping", json_body={"_meta": meta})
        self._raise_for(reply, "record the bundle in _meta")

    def _count(self, index: str) -> int:
        self.settle()
        reply = self.http.request("GET", f"/{index}/_count")
        self._raise_for(reply, "count documents")
        return int(reply.body.get("count", 0))

    def _raise_for(self, reply: Reply, what: str) -> None:
        if reply.ok:
            return
        reason = reply.error_reason()
        if reply.status == 404 and "index_not_found" in reason:
            raise IndexStoreError(
                f"no index {self.index_name!r} at {self.url}: run `d2s-search index create` or ingest first"
            )
        if "too_many_clauses" in reason or "too_many_nested_clauses" in reason:
            raise QueryError(f"the query has too many terms for this cluster: {reason}")
        raise IndexStoreError(f"OpenSearch could not {what}: {reason}")


def connection_options(url: str | Sequence[str] | None = None, env: Mapping[str, str] | None = None,
                       **options: Any) -> dict[str, Any]:
    """Connection settings shared by the backend, ml-commons and ``doctor``: explicit
    arguments > ``D2S_OPENSEARCH_*`` environment. ``url`` may list several hosts."""
    env = os.environ if env is None else env
    url = url or env.get(ENV_URL)
    if not url:
        raise BackendUnavailableError(f"no OpenSearch URL: pass --url or set {ENV_URL}")
    for key, var in (("user", ENV_USER), ("password", ENV_PASSWORD), ("api_key", ENV_API_KEY),
                     ("ca_file", ENV_CA_FILE), ("index_name", ENV_INDEX),
                     ("aws_region", ENV_AWS_REGION), ("aws_service", ENV_AWS_SERVICE)):
        if options.get(key) is None and env.get(var):
            options[key] = env[var]
    if options.get("verify") is None and env.get(ENV_INSECURE, "").lower() in ("1", "true", "yes"):
        options["verify"] = False
    if options.get("sniff") is None and env.get(ENV_SNIFF, "").lower() in ("1", "true", "yes"):
        options["sniff"] = True
    options = {k: v for k, v in options.items() if v is not None}
    options["url"] = split_hosts(url)
    return options


def http_from_env(url: str | Sequence[str] | None = None, env: Mapping[str, str] | None = None,
                  **options: Any) -> OpenSearchHTTP:
    """An :class:`OpenSearchHTTP` with the backend's connection settings (no index)."""
    options = connection_options(url, env, **options)
    options.pop("index_name", None)
    return OpenSearchHTTP(options.pop("url"), **options)


def knn_score_to_inner_product(score: float) -> float:
    """Invert OpenSearch's inner-product k-NN score (``1 + ip`` if ip >= 0, else ``1 / (1 - ip)``)."""
    return score - 1.0 if score >= 1.0 else 1.0 - 1.0 / score if score > 0 else float("-inf")


def _document(doc_id: str, src: Mapping[str, Any],
              decode: Callable[[Mapping[str, float] | None], dict[str, float]] = decode_features) -> Document:
    return document_from_source(doc_id, src, decode)
