"""The ``opensearch`` backend: documents in an OpenSearch index, searched server-side.

Layout: ``index_name`` (default ``d2s``) is an alias over a concrete index ``d2s-000001``,
so ``reindex`` can build ``d2s-000002`` and swap the alias atomically. An index created by
hand under the plain name works too (it is replaced by an alias on the first reindex).

Scores: a sparse hit's score is OpenSearch's ``rank_feature`` sum, i.e. the dot product with
every stored weight truncated to 9 significant bits (see ``lucene_feature_value``); matched
terms are computed here from the stored features, so they use the exact weights. A dense
hit's score is the inner product recovered from OpenSearch's k-NN score, as in ``local``.

Two layouts differ: a SEISMIC index keeps its dense vectors in the sibling ``<name>-dense``
(:mod:`.seismic`), and on Amazon OpenSearch Serverless documents are found by a
``content_id`` field instead of their ids (:mod:`.serverless`).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from opensearchpy import helpers

from d2s_search import redact
from d2s_search.backends.base import Document, Hit, IndexIdentity, SparseVector, WordFilter
from d2s_search.backends.engine.bulk import ChunkLimits, item_reason, send_bulk
from d2s_search.backends.engine.index import EngineIndex
from d2s_search.backends.opensearch import queries as q
from d2s_search.backends.opensearch import serverless as aoss
from d2s_search.backends.opensearch.client import (
    ENV_AWS_REGION,
    ENV_AWS_SERVICE,
    OpenSearchHTTP,
    Reply,
    split_hosts,
)
from d2s_search.backends.opensearch.cluster import ClusterInfo, Dialect, cluster_info
from d2s_search.backends.opensearch.features import decode_features
from d2s_search.backends.opensearch.seismic import (
    VOCABULARY_DOC,
    Vocabulary,
    dense_index,
    split_source,
    vocabulary_index,
    vocabulary_index_body,
)
from d2s_search.errors import (
    BackendUnavailableError,
    BundleMismatchError,
    IndexStoreError,
    QueryError,
)
from d2s_search.filters import SearchFilter

log = logging.getLogger("d2s_search.opensearch")

ENV_URL = "D2S_OPENSEARCH_URL"
ENV_USER = "D2S_OPENSEARCH_USER"
ENV_PASSWORD = "D2S_OPENSEARCH_PASSWORD"
ENV_API_KEY = "D2S_OPENSEARCH_API_KEY"
ENV_CA_FILE = "D2S_OPENSEARCH_CA_FILE"
ENV_INDEX = "D2S_OPENSEARCH_INDEX"
ENV_INSECURE = "D2S_OPENSEARCH_INSECURE"  # "1": skip TLS verification (local demo certificates only)
ENV_SNIFF = "D2S_OPENSEARCH_SNIFF"  # "1": discover the cluster's other nodes (not behind Docker/LB)


class OpenSearchBackend(EngineIndex):
    """Backend protocol over OpenSearch's REST API (see :mod:`d2s_search.backends.base`); what
    it shares with Elasticsearch lives in :class:`~d2s_search.backends.engine.index.EngineIndex`."""

    name = "opensearch"
    label = "OpenSearch"
    index_option = "--index"
    reindex_timeout = 3600.0

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
        self._init_index(index_name, chunk_docs=chunk_docs, chunk_bytes=chunk_bytes, refresh=refresh)
        extra: dict[str, Any] = {"sleep": sleep} if sleep else {}
        self.http = OpenSearchHTTP(
            url, user=user, password=password, api_key=api_key, ca_file=ca_file, verify=verify,
            timeout=timeout, retries=retries, backoff=backoff, aws_region=aws_region,
            aws_service=aws_service, sniff=sniff, **extra,
        )
        self._max_clauses: int | None = None
        self._pipelines: set[str] = set()
        self._cluster: ClusterInfo | None = None
        self.vocabulary: Vocabulary | None = None  # set on a SEISMIC index: keys are vocabulary ids
        self.dense_index: str | None = None  # a SEISMIC index's sibling holding the dense vectors
        # Serverless: the collection names documents; the content hash is the content_id field
        self.content_ids = self.serverless
        self.last_fusion: str | None = None  # set when hybrid is fused here (SEISMIC)
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

    @property
    def serverless(self) -> bool:
        """Amazon OpenSearch Serverless (SigV4 service ``aoss``): see :mod:`.serverless`."""
        return self.http.aws_service == "aoss"

    # -- transport ------------------------------------------------------------------------

    def _call(self, method: str, path: str, body: Any = None, params: Mapping[str, Any] | None = None,
              *, timeout: float | None = None) -> tuple[int, Any]:
        reply = self.http.request(method, path, json_body=body, params=params, timeout=timeout)
        return reply.status, reply.body

    def _reason(self, body: Any, status: int = 0) -> str:
        return Reply(status, body).error_reason()

    def _one_line(self, text: str) -> str:
        return redact.one_line(text)

    # -- index lifecycle ------------------------------------------------------------------

    def _opened(self) -> None:
        self._load_vocabulary()
        if self.vocabulary is not None:
            sibling = dense_index(self.index_name)
            if not self.http.request("HEAD", f"/{sibling}").ok:
                raise IndexStoreError(f"{self.index_name!r} is a SEISMIC index but its dense vectors ({sibling}) are missing")
            self.dense_index = sibling

    def _remember_mapping(self, mapping: Mapping[str, Any]) -> None:
        meta = mapping.get("_meta") or {}
        self.content_ids = self.serverless or meta.get("document_ids") == q.CONTENT_ID

    def _check_engine(self, engine: str) -> None:
        if engine == "lucene" and not self.dialect().lucene_inner_product:
            raise IndexStoreError(
                f"--engine lucene needs OpenSearch 2.13 or later (inner product on Lucene HNSW arrives "
                f"with k-NN 2.13); {self.url} runs {self.cluster().to_json()['version']}: use --engine faiss"
            )

    def create(self, identity: IndexIdentity, *, engine: str = "faiss", shards: int = 1, replicas: int = 0,
               sparse_index: str = q.SPARSE_RANK_FEATURES, vocabulary: Sequence[str] | None = None,
               seismic: Mapping[str, Any] | None = None) -> str:
        """Create ``<name>-000001`` behind the alias ``<name>``; returns the concrete name.

        ``sparse_index="seismic"`` needs the bundle's ``vocabulary`` (stored beside the index,
        see :mod:`d2s_search.backends.opensearch.seismic`) and puts the dense vectors in the
        sibling ``<name>-dense``. On Serverless the index is ``<name>`` itself (no reindex there,
        so no generations behind an alias).
        """
        seismic_index = sparse_index == q.SPARSE_SEISMIC
        if seismic_index:
            if self.serverless:
                raise IndexStoreError(aoss.SEISMIC_REFUSED)
            if not self.dialect().sparse_vector:
                raise IndexStoreError(
                    f"the SEISMIC sparse index needs OpenSearch 3.3 or later (this cluster: "
                    f"{self.cluster().to_json()['version']})"
                )
            if not vocabulary:
                raise IndexStoreError("a SEISMIC index needs the bundle's vocabulary")
        self._check_engine(engine)
        concrete = self.index_name if self.serverless else f"{self.index_name}-000001"
        body = q.index_body(identity, engine=engine, shards=shards, replicas=replicas,
                            sparse_index=sparse_index, seismic=seismic, serverless=self.serverless)
        made: list[str] = []  # created here for this index: taken back if the index is not made
        if seismic_index:
            self._store_vocabulary(Vocabulary(vocabulary or [], identity.fingerprint), replicas)
            made.append(vocabulary_index(self.index_name))
            sibling = dense_index(self.index_name)
            reply = self.http.request("PUT", f"/{sibling}", json_body=q.dense_index_body(
                identity, engine=engine, shards=shards, replicas=replicas))
            if not reply.ok and "resource_already_exists" not in reply.error_reason():
                self._take_back(made)
                raise IndexStoreError(f"cannot create {sibling} (the dense vectors) at {self.url}: {reply.error_reason()}")
            made.append(sibling)
            self.dense_index = sibling
        if not self.serverless:
            body["aliases"] = {self.index_name: {}}
        reply = self.http.request("PUT", f"/{concrete}", json_body=body)
        if not reply.ok:
            kind = reply.error_reason()
            if "resource_already_exists" in kind:
                # A retried PUT whose first answer was lost, or a race: accept it if it is ours.
                self._check_identity(identity, self._stored_identity())
                return concrete
            self._take_back(made)
            raise IndexStoreError(f"cannot create index {concrete} at {self.url}: {kind}")
        self.identity = identity
        return concrete

    def _take_back(self, indices: Sequence[str]) -> None:
        for name in indices:
            self.http.request("DELETE", f"/{name}")
        self.vocabulary, self.dense_index = None, None

    def drop(self) -> list[str]:
        """Delete the index (every concrete index behind the alias, and a SEISMIC index's
        vocabulary); returns the concrete indices deleted."""
        deleted = []
        if self.vocabulary is not None or self._is_seismic():
            self.http.request("DELETE", f"/{vocabulary_index(self.index_name)}")
            self.http.request("DELETE", f"/{dense_index(self.index_name)}")
        for concrete in self._concrete_indices():
            reply = self.http.request("DELETE", f"/{concrete}")
            if not reply.ok and reply.status != 404:
                raise IndexStoreError(f"cannot delete index {concrete}: {reply.error_reason()}")
            if reply.ok:
                deleted.append(concrete)
        self.identity = None
        return deleted

    def close(self) -> None:
        try:
            self._final_refresh()
        finally:
            self.http.close()

    @contextlib.contextmanager
    def _one_attempt(self) -> Iterator[None]:
        retries, self.http.policy.retries = self.http.policy.retries, 0
        try:
            yield
        finally:
            self.http.policy.retries = retries

    def stats(self) -> dict:
        self.settle()
        concrete, meta = self._stats()
        out: dict[str, Any] = {
            "backend": self.name,
            "location": f"{self.url}/{self.index_name}",
            "indices": concrete,
            "bundle_fingerprint": meta.get("fingerprint", ""),
            "bundle_model": meta.get("model", ""),
            "dense_dim": meta.get("dense_dim"),
            "mapping_version": meta.get("d2s_mapping_version"),
            **self._size_stats(),
        }
        if self.dense_index:
            out["dense_index"] = self.dense_index
        if self.content_ids:
            out["document_ids"] = f"{q.CONTENT_ID} field (the collection assigns _id)"
        out["max_clause_count"] = self.max_clauses()
        return out

    # -- writes (upsert and delete: EngineIndex) -------------------------------------------

    def _doc_source(self, doc: Document) -> dict[str, Any]:
        source = q.doc_source(doc, types=self._user_types)
        if self.vocabulary is not None:
            source[q.SPARSE_FIELD] = self.vocabulary.to_ids(doc.sparse)
        return source

    def _bulk_index_items(self, sources: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
        if self.content_ids:
            # The stored copies of these documents go, the new ones come: no _id on Serverless.
            # A document given twice is written once (the last), as an id would overwrite.
            sources = list({doc_id: (doc_id, source) for doc_id, source in sources}.values())
            stored = aoss.stored_documents(self._search, [i for i, _ in sources], False)
            return (q.bulk_delete_stored(self.index_name, aoss.server_ids(stored))
                    + q.bulk_create_actions(self.index_name, sources))
        if self.dense_index:
            halves = [(doc_id, split_source(source)) for doc_id, source in sources]
            return (q.bulk_index_actions(self.index_name, [(i, main) for i, (main, _) in halves])
                    + q.bulk_index_actions(self.dense_index, [(i, dense) for i, (_, dense) in halves]))
        return q.bulk_index_actions(self.index_name, sources)

    def _bulk_delete_items(self, ids: list[str]) -> list[dict[str, Any]]:
        if self.content_ids:
            stored = aoss.stored_documents(self._search, ids, False)
            return q.bulk_delete_stored(self.index_name, aoss.server_ids(stored))
        actions = q.bulk_delete_actions(self.index_name, ids)
        if self.dense_index:
            actions += q.bulk_delete_actions(self.dense_index, ids)
        return actions

    def _bulk_update_items(self, updates: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
        if self.content_ids:
            fields = dict(updates)
            stored = aoss.server_ids(aoss.stored_documents(self._search, list(fields), False))
            return q.bulk_update_stored(self.index_name, [(doc_id, server_id, fields[doc_id])
                                                          for doc_id, server_id in stored])
        actions = q.bulk_update_actions(self.index_name, updates)
        if self.dense_index:  # the sibling keeps the paths its hits show
            actions += q.bulk_update_actions(self.dense_index, updates)
        return actions

    def _id_source(self) -> bool | list[str]:
        return [q.CONTENT_ID] if self.content_ids else False

    def _mapping_targets(self) -> list[str]:
        # a SEISMIC index's sibling is searched by dense queries: it carries the metadata too
        return [self.index_name, *([self.dense_index] if self.dense_index else [])]

    def _bulk(self, actions: list[dict[str, Any]]) -> tuple[dict[str, str], list[str]]:
        """Send ``actions`` with ``opensearchpy.helpers.streaming_bulk`` (which chunks them and
        turns a chunk refused as too large into 413 items); rounds, resends and the report:
        :func:`~d2s_search.backends.engine.bulk.send_bulk`. Actions for a SEISMIC index's dense
        sibling go in their own rounds; the results are this index's."""
        failures: dict[str, str] = {}
        results: list[str] = []
        for index in dict.fromkeys(a["_index"] for a in actions):
            failed, done = self._bulk_rounds([a for a in actions if a["_index"] == index])
            failures.update(failed)
            if index == self.index_name:
                results = done
        return failures, results

    def _bulk_rounds(self, actions: list[dict[str, Any]]) -> tuple[dict[str, str], list[str]]:
        def send(pending: list[dict[str, Any]], limits: ChunkLimits):
            answers = helpers.streaming_bulk(
                self.http.client, pending, chunk_size=limits.docs, max_chunk_bytes=limits.bytes,
                raise_on_error=False, raise_on_exception=False, max_retries=0, yield_ok=True,
                headers={"content-type": "application/x-ndjson"},
            )
            # streaming_bulk answers in the order of the actions (a chunk's failure too)
            for action, (ok, item) in zip(pending, answers, strict=True):
                ((_, result),) = item.items()
                yield action, ok, {**result, "_id": action.get(q.CONTENT_ID) or action.get("_id")}

        policy = self.http.policy
        # Serverless names each new document: a write whose answer was lost may be stored
        # already, and sending it again would store it twice.
        resend, policy.resend_unanswered = policy.resend_unanswered, not self.content_ids
        try:
            return send_bulk(
                actions, send, ChunkLimits(self.chunk_docs, self.chunk_bytes), retries=self.http.retries,
                wait=lambda attempt, why: policy.wait(attempt, None, why),
                reason=lambda result: item_reason(result, redact.one_line),
            )
        finally:
            policy.resend_unanswered = resend

    def _refresh(self, index: str | None = None) -> None:
        if self.serverless:
            return  # not offered there; documents become searchable on their own (serverless.py)
        target = index or ",".join(filter(None, (self.index_name, self.dense_index)))
        reply = self.http.request("POST", f"/{target}/_refresh")
        if not reply.ok:
            log.warning("refresh of %s failed: %s", target, reply.error_reason())

    # -- searches -------------------------------------------------------------------------

    def sparse_search(
        self,
        query: SparseVector,
        k: int,
        explain: int = 5,
        *,
        offset: int = 0,
        path_prefix: str | None = None,
        words: WordFilter | None = None,
        neural_sparse: bool = False,
        filters: SearchFilter | None = None,
    ) -> list[Hit]:
        narrowed = self._narrowed(path_prefix, words, filters)
        if self.vocabulary is not None:
            body = q.seismic_search_body(self.vocabulary.to_ids(query), k, offset=offset, top_n=self.seismic_top_n,
                                         heap_factor=self.seismic_heap_factor, filters=narrowed)
            return self._hits(self._search(body), query, explain)
        if neural_sparse:
            self._check_query_tokens()
        body = q.sparse_search_body(
            query, k, offset=offset, max_clauses=self.max_clauses(),
            filters=narrowed, neural_sparse=neural_sparse,
        )
        return self._hits(self._search(body), query, explain)

    def _check_query_tokens(self) -> None:
        if not self.dialect().neural_sparse_tokens:
            raise QueryError(
                f"neural_sparse with query_tokens needs OpenSearch 2.14 or later (neural-search 2.14); "
                f"{self.url} runs {self.cluster().to_json()['version']}: use the rank_feature plan (the default)"
            )

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
        words: WordFilter | None = None,
        filters: SearchFilter | None = None,
    ) -> list[Hit]:
        if self.vocabulary is not None:
            raise QueryError("a SEISMIC index has no two-phase plan; use sparse (approximate) or hybrid")
        body = q.two_phase_body(
            first, full, k, window, offset=offset, max_clauses=self.max_clauses(),
            filters=self._narrowed(path_prefix, words, filters),
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
        words: WordFilter | None = None,
        filters: SearchFilter | None = None,
    ) -> list[Hit]:
        explain = explain if explain_with else 0
        if self.dense_index and words:  # the sibling index has no sparse field to filter on
            raise QueryError("a SEISMIC index cannot require or exclude words (+word, -word); search without them")
        narrowed = self._narrowed(path_prefix, words, filters)
        if self.dense_index:
            # A SEISMIC index's vectors are in its sibling; matched terms come from the index.
            body = q.knn_search_body(vector, k, offset=offset, filters=narrowed, source=["path", "url"])
            raw = self._search(body, index=self.dense_index)
            if explain:
                stored = {d["_id"]: d.get("_source", {}) for d in self._mget([h["_id"] for h in raw], q.SPARSE_FIELD)}
                for h in raw:
                    h.setdefault("_source", {})[q.SPARSE_FIELD] = stored.get(h["_id"], {}).get(q.SPARSE_FIELD)
        else:
            raw = self._search(q.knn_search_body(vector, k, offset=offset, filters=narrowed))
        hits = self._hits(raw, explain_with or {}, explain)
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
        words: WordFilter | None = None,
        neural_sparse: bool = False,
        filters: SearchFilter | None = None,
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
        self.last_fusion = None
        if self.dense_index:
            return self._fused_here(sparse, vector, k, method, weights, rank_constant, window, explain, offset,
                                    path_prefix, words, filters)
        if neural_sparse:
            self._check_query_tokens()
        pipeline = self.ensure_pipeline(method, weights, rank_constant)
        dialect = self.dialect()
        seismic_clause = None
        narrowed = self._narrowed(path_prefix, words, filters)
        if self.vocabulary is not None:
            depth = min(max(int(window or 0), offset + k), q.MAX_RESULT_WINDOW)
            seismic_clause = q.seismic_query(self.vocabulary.to_ids(sparse), depth, top_n=self.seismic_top_n,
                                             heap_factor=self.seismic_heap_factor, filters=narrowed)
        body = q.hybrid_search_body(
            sparse, vector, k, offset=offset, window=window, max_clauses=self.max_clauses(),
            filters=narrowed, neural_sparse=neural_sparse, dialect=dialect,
            sparse_clause=seismic_clause,
        )
        body["_source"] = [*q.HIT_SOURCE, q.DENSE_FIELD]
        raw = q.hybrid_page(self._search(body, params={"search_pipeline": pipeline}), k, offset, dialect)
        hits = self._hits(raw, sparse, explain)
        vec = np.asarray(vector, dtype=np.float32).reshape(-1)
        first = {}  # the first hit of each document (Serverless may have stored one twice)
        for h in raw:
            first.setdefault(self._hit_id(h), h)
        for hit in hits:
            src = first[hit.id].get("_source", {})
            doc_sparse = self._decode(src.get(q.SPARSE_FIELD))
            hit.parts = {
                "sparse": float(sum(w * doc_sparse.get(t, 0.0) for t, w in sparse.items())),
                "dense": float(np.dot(np.asarray(src.get(q.DENSE_FIELD, []), dtype=np.float32), vec))
                if src.get(q.DENSE_FIELD) else 0.0,
            }
        return hits

    def _fused_here(self, sparse: SparseVector, vector: np.ndarray, k: int, method: str,
                    weights: tuple[float, float], rank_constant: int, window: int | None, explain: int,
                    offset: int, path_prefix: str | None, words: WordFilter | None = None,
                    filters: SearchFilter | None = None) -> list[Hit]:
        """Hybrid on a SEISMIC index: its sparse search and its sibling's dense search, fused
        here (one index cannot hold both, see seismic.py); ``last_fusion`` says so."""
        from d2s_search import search as plans

        q.check_page(k, offset)
        depth = min(max(int(window or 0), offset + k), q.MAX_RESULT_WINDOW)
        runs = {
            "sparse": self.sparse_search(sparse, depth, explain, path_prefix=path_prefix, words=words,
                                         filters=filters),
            "dense": self.dense_search(vector, depth, explain_with=sparse, explain=explain, path_prefix=path_prefix,
                                       words=words, filters=filters),
        }
        if method == "rrf":
            fused = plans.fuse_rrf(runs, offset + k, rank_constant)
        else:
            plans_weights = dict(zip(("sparse", "dense"), q.fusion_weights(weights), strict=True))
            fused = plans.fuse_minmax(runs, plans_weights, offset + k)
        self.last_fusion = f"client-{'rrf' if method == 'rrf' else 'minmax'}"
        return fused[offset:]

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

    def _search(self, body: dict, params: Mapping[str, str] | None = None, *, index: str | None = None) -> list[dict]:
        self.settle()
        if self.content_ids and isinstance(body.get("_source"), list) and q.CONTENT_ID not in body["_source"]:
            body = {**body, "_source": [*body["_source"], q.CONTENT_ID]}  # the hit's own id
        if self.path_field != "path" and isinstance(body.get("_source"), list):
            body = {**body, "_source": [*body["_source"], self.path_field]}  # an enriched index's image field
        reply = self.http.request("POST", f"/{index or self.index_name}/_search", json_body=body, params=params)
        self._raise_for(reply, "search")
        return reply.body.get("hits", {}).get("hits", [])

    # -- reads (EngineIndex) where the layout differs --------------------------------------

    def _hit_id(self, hit: Mapping[str, Any]) -> str:
        return aoss.content_id_of(hit) if self.content_ids else hit["_id"]

    def _hits(self, raw: list[dict], query: Mapping[str, float], explain: int) -> list[Hit]:
        hits = super()._hits(raw, query, explain)
        if self.content_ids:  # a document stored twice (a write whose answer was lost) shows once
            seen: set[str] = set()
            hits = [h for h in hits if not (h.id in seen or seen.add(h.id))]
        return hits

    def _mget(self, ids: list[str], source: bool | str, index: str | None = None) -> list[dict]:
        if self.content_ids:  # the ids are the server's: find the documents by their hash
            fields = source if isinstance(source, bool) else source.split(",")
            return aoss.as_mget(aoss.stored_documents(self._search, ids, fields))
        return super()._mget(ids, source, index)

    def ids_present(self, ids: Iterable[str]) -> set[str]:
        """Stored ids; for a SEISMIC index, those stored in both it and its dense sibling."""
        found = super().ids_present(ids)
        if self.dense_index and found:
            listed = sorted(found)
            found = {d["_id"] for start in range(0, len(listed), 1000)
                     for d in self._mget(listed[start : start + 1000], False, self.dense_index) if d.get("found")}
        return found

    def get(self, ids: Sequence[str]) -> list[Document]:
        docs = super().get(ids)
        if self.dense_index and docs:
            dense = {d["_id"]: d.get("_source", {}).get(q.DENSE_FIELD) for start in range(0, len(docs), 500)
                     for d in self._mget([x.id for x in docs[start : start + 500]], q.DENSE_FIELD, self.dense_index)
                     if d.get("found")}
            for doc in docs:
                doc.dense = np.asarray(dense.get(doc.id) or [], dtype=np.float32)
        return docs

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
        target = {"engine": engine, "shards": shards, "replicas": replicas}
        return self._reindex(identity, reencode, target, keep_old=keep_old, page=page)

    def _reindex_target(self, target: dict[str, Any]) -> dict[str, Any]:
        if self.serverless:
            raise IndexStoreError(aoss.REINDEX_REFUSED)
        if self._is_seismic():
            raise IndexStoreError("reindexing a SEISMIC index is not supported yet: create a new index and ingest")
        self._check_engine(target.get("engine", "faiss"))
        return target

    def _create_generation(self, name: str, identity: IndexIdentity, target: dict[str, Any]) -> tuple[int, Any]:
        return self._call("PUT", f"/{name}", body=q.index_body(identity, **target))

    def _pages(self, index: str, page: int, fields: Sequence[str] | None = None) -> Iterator[list[dict]]:
        """Raw hits of every document of ``index``, a page at a time, through a scroll (on
        Serverless, which offers no scroll, ``search_after`` in content-hash order)."""
        if self.content_ids:
            yield from self._content_pages(index, page, fields)
            return
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

    def _content_pages(self, index: str, page: int, fields: Sequence[str] | None) -> Iterator[list[dict]]:
        after = None
        while True:
            hits = self._search(q.content_page_body(page, after, fields), index=index)
            if not hits:
                return
            yield hits
            after = hits[-1]["sort"]

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

    def _put_meta(self, identity: IndexIdentity) -> None:
        # _meta is replaced whole: keep what the index records besides the bundle (SEISMIC, ids)
        stored = next(iter(self._mapping().values()), {}).get("mappings", {}).get("_meta") or {}
        meta = {**stored, **q.index_body(identity)["mappings"]["_meta"]}
        reply = self.http.request("PUT", f"/{self.index_name}/_mapping", json_body={"_meta": meta})
        self._raise_for(reply, "record the bundle in _meta")

    def _raise_for(self, reply: Reply, what: str) -> None:
        self._check(reply.status, reply.body, what)


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

