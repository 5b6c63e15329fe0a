"""The ``elasticsearch`` backend: documents in an Elasticsearch index, on the official client.

Layout, scores and guarantees follow the ``opensearch`` backend: ``index_name`` (default ``d2s``)
is an alias over ``d2s-000001`` so ``reindex`` can swap it atomically; a sparse hit's score is
the ``rank_feature`` (or ``sparse_vector`` query) sum, i.e. the dot product over stored weights
truncated to 9 significant bits; matched terms come from the stored features (exact weights);
a dense hit's score is the inner product recovered from Elasticsearch's kNN score.

Servers: 8.x and 9.x. The 9.x client announces ``compatible-with=9`` by default, which an 8.x
server refuses, so every request carries ``compatible-with=<server major>`` (8 for 8.x, 9 for
9.x), learnt from ``GET /`` (asked with ``compatible-with=8``, which both accept).

Hybrid: the ``rrf`` retriever when the server has it (8.14+ and an Enterprise or trial license)
and RRF fusion was asked for; otherwise both runs are fetched and fused here
(``d2s_search.search``). ``last_fusion`` says which one ran, and the CLI prints it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from d2s_search import redact
from d2s_search.backends.base import Document, Hit, IndexIdentity, SparseVector, WordFilter
from d2s_search.backends.elasticsearch import queries as q
from d2s_search.backends.elasticsearch.features import decode_features
from d2s_search.backends.engine.bulk import ChunkLimits, item_reason, send_bulk
from d2s_search.backends.engine.index import EngineIndex
from d2s_search.errors import BackendUnavailableError, IndexStoreError, QueryError
from d2s_search.filters import SearchFilter

log = logging.getLogger("d2s_search.elasticsearch")

ENV_URL = "D2S_ELASTICSEARCH_URL"
ENV_USER = "D2S_ELASTICSEARCH_USER"
ENV_PASSWORD = "D2S_ELASTICSEARCH_PASSWORD"
ENV_API_KEY = "D2S_ELASTICSEARCH_API_KEY"
ENV_CA_FILE = "D2S_ELASTICSEARCH_CA_FILE"
ENV_CLOUD_ID = "D2S_ELASTICSEARCH_CLOUD_ID"
ENV_INDEX = "D2S_ELASTICSEARCH_INDEX"
ENV_INSECURE = "D2S_ELASTICSEARCH_INSECURE"  # "1": skip TLS verification (local demo certificates only)

# Whole requests the client resends itself (busy bulk items are resent by engine.bulk.send_bulk).
RETRY_STATUSES = (429, 502, 503, 504)
RRF_LICENSES = frozenset({"enterprise", "trial"})
_VERSION = re.compile(r"^(\d+)\.(\d+)")


class ElasticsearchBackend(EngineIndex):
    """Backend protocol over Elasticsearch (see :mod:`d2s_search.backends.base`); what it
    shares with OpenSearch lives in :class:`~d2s_search.backends.engine.index.EngineIndex`."""

    name = "elasticsearch"
    label = "Elasticsearch"
    index_option = "--index-name"
    # _reindex waits for completion: the client's 30 s default would time out on a large index
    # and its retry would start a second copy (as for OpenSearch)
    reindex_timeout = 3600.0

    def __init__(
        self,
        url: str | None = None,
        index_name: str = "d2s",
        *,
        user: str | None = None,
        password: str | None = None,
        api_key: str | None = None,
        ca_file: str | None = None,
        cloud_id: str | None = None,
        verify: bool = True,
        timeout: float = 30.0,
        retries: int = 5,
        chunk_docs: int = 500,
        chunk_bytes: int = 8 * 1024 * 1024,
        refresh: bool = True,
        backoff: float = 0.5,
        max_clauses: int = q.DEFAULT_MAX_CLAUSES,
        mapping: q.VectorMapping | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        from elasticsearch import Elasticsearch

        self._init_index(index_name, chunk_docs=chunk_docs, chunk_bytes=chunk_bytes, refresh=refresh)
        if not url and not cloud_id:
            raise BackendUnavailableError(f"no Elasticsearch URL: pass --url or set {ENV_URL} (or {ENV_CLOUD_ID})")
        if url:
            url, url_user, url_password = _split_userinfo(url)
            user, password = user or url_user, password or url_password
        self._secrets = [s for s in (password, api_key) if s]
        redact.remember(password, user=user)  # masked in every message, also as Basic auth
        redact.remember(api_key)
        options: dict[str, Any] = {
            "request_timeout": timeout,
            "max_retries": max(0, retries),
            "retry_on_status": RETRY_STATUSES,
            "retry_on_timeout": True,
        }
        if url:  # an explicit URL wins over a cloud id from the environment
            options["hosts"] = [url]
        else:
            options["cloud_id"] = cloud_id
        if api_key:
            options["api_key"] = api_key
        elif user:
            options["basic_auth"] = (user, password or "")
        if ca_file:
            if not os.path.isfile(ca_file):
                raise BackendUnavailableError(f"CA file {ca_file} is not a readable file (check {ENV_CA_FILE})")
            options["ca_certs"] = ca_file
        if not verify:
            options["verify_certs"] = False
            options["ssl_show_warn"] = False
        try:
            self.es = Elasticsearch(**options)
        except ValueError as exc:
            raise BackendUnavailableError(f"bad Elasticsearch settings: {self._scrub(str(exc))}") from None
        self.url = (url or f"cloud:{cloud_id.split(':', 1)[0]}").rstrip("/")
        self.retries = max(0, retries)
        self.backoff = backoff
        self.max_clauses = max(1, int(max_clauses))
        self.create_mapping = mapping or q.DEFAULT_MAPPING
        self.mapping = self.create_mapping
        self.last_fusion: str | None = None
        self._sleep = sleep or time.sleep
        self._version: tuple[int, int] | None = None
        self._headers: dict[str, str] = {}
        self._license: str | None = None
        self.serverless = False

    @classmethod
    def from_env(cls, url: str | None = None, env: Mapping[str, str] | None = None, **options: Any) -> ElasticsearchBackend:
        """Settings: explicit arguments > ``D2S_ELASTICSEARCH_*`` environment (secrets only there)."""
        env = os.environ if env is None else env
        url = url or env.get(ENV_URL)
        for key, var in (("user", ENV_USER), ("password", ENV_PASSWORD), ("api_key", ENV_API_KEY),
                         ("ca_file", ENV_CA_FILE), ("cloud_id", ENV_CLOUD_ID), ("index_name", ENV_INDEX)):
            if options.get(key) is None and env.get(var):
                options[key] = env[var]
        if options.get("verify") is None and env.get(ENV_INSECURE, "").lower() in ("1", "true", "yes"):
            options["verify"] = False
        options = {k: v for k, v in options.items() if v is not None}
        if not url and not options.get("cloud_id"):
            raise BackendUnavailableError(f"no Elasticsearch URL: pass --url or set {ENV_URL} (or {ENV_CLOUD_ID})")
        return cls(url, **options)

    def __repr__(self) -> str:
        return f"ElasticsearchBackend({self.url!r}, index={self.index_name!r})"

    __str__ = __repr__

    # -- transport ------------------------------------------------------------------------

    def server_version(self) -> tuple[int, int]:
        """(major, minor) from ``GET /``; a server that is not Elasticsearch counts as 8.0."""
        if self._version is None:
            self._headers = _compat_headers(8)
            status, body = self._call("GET", "/")
            if status != 200 or not isinstance(body, dict):
                raise BackendUnavailableError(f"Elasticsearch at {self.url} answered {status} to GET /")
            version = body.get("version") or {}
            m = _VERSION.match(str(version.get("number", "")))
            if version.get("build_flavor") == "serverless":
                # Serverless reports a frozen version number but runs the current code: it has
                # every feature used here, and refuses shard settings.
                self.serverless = True
                self._version = (9, 0)
            elif m and version.get("distribution", "elasticsearch") == "elasticsearch" and int(m.group(1)) >= 8:
                self._version = (int(m.group(1)), int(m.group(2)))
            elif m and version.get("distribution", "elasticsearch") == "elasticsearch":
                raise BackendUnavailableError(
                    f"Elasticsearch {version.get('number')} at {self.url} is too old: d2s-search needs 8.0 or later"
                )
            else:
                log.warning("%s is not Elasticsearch (%s %s): using only what every 8.x offers", self.url,
                            version.get("distribution"), version.get("number"))
                self._version = (8, 0)
            self._headers = _compat_headers(min(self._version[0], 9))
        return self._version

    def supports(self, feature: str) -> bool:
        return self.server_version() >= q.SINCE[feature]

    def _call(self, method: str, path: str, body: Any = None, params: Mapping[str, Any] | None = None,
              ndjson: bool = False, *, timeout: float | None = None) -> tuple[int, Any]:
        """One request through the client (which retries busy/unreachable nodes): (status, body).
        ``timeout`` replaces the client's request timeout for this request."""
        from elastic_transport import TransportError
        from elasticsearch import ApiError, UnsupportedProductError

        if self._version is None and path != "/":
            self.server_version()
        headers = dict(self._headers)
        if ndjson:
            headers["content-type"] = headers["content-type"].replace("+json", "+x-ndjson")
        if body is None:
            headers.pop("content-type", None)
        try:
            client = self.es if timeout is None else self.es.options(request_timeout=timeout)
            resp = client.perform_request(method, path, params=dict(params) if params else None,
                                          headers=headers, body=body)
        except UnsupportedProductError as exc:
            if isinstance(exc.body, str):
                raise self._not_json(method, path, exc.meta.status, exc.meta.headers, exc.body) from None
            raise BackendUnavailableError(
                f"the server at {self.url} is not Elasticsearch (no X-Elastic-Product header)"
            ) from None
        except ApiError as exc:
            return exc.meta.status, exc.body
        except TransportError as exc:
            text = self._scrub(str(exc).splitlines()[0] if str(exc) else "")
            chain = f"{exc!r} {exc.__cause__!r} {getattr(exc, 'errors', '')!r}"
            if "CERTIFICATE_VERIFY_FAILED" in chain or "certificate verify failed" in chain:
                raise BackendUnavailableError(
                    f"TLS certificate of {self.url} is not trusted: set {ENV_CA_FILE} to its CA file"
                ) from None
            raise BackendUnavailableError(
                f"cannot reach Elasticsearch at {self.url}: {type(exc).__name__}{': ' + text[:200] if text else ''}"
            ) from None
        if isinstance(resp.body, str) and 200 <= resp.meta.status < 300:
            # The client checks the product header once per connection pool only: a login wall
            # or a proxy's page answering later would pass for the cluster's answer.
            raise self._not_json(method, path, resp.meta.status, resp.meta.headers, resp.body)
        return resp.meta.status, resp.body

    def _not_json(self, method: str, path: str, status: int, headers: Mapping[str, str],
                  body: str) -> BackendUnavailableError:
        """The one-line error for a 2xx answer that is not JSON (a login page or a proxy's HTML,
        its text scrubbed: such pages may reflect credentials)."""
        kind = (headers.get("content-type") or "").split(";")[0].strip() or "no content type"
        return BackendUnavailableError(
            f"{self.url} answered {method} {path} with {status} {kind}, not JSON: is this the Elasticsearch URL "
            f"(and not a proxy or login page)? ({redact.one_line(self._scrub(body))[:80]})"
        )

    def _scrub(self, text: str) -> str:
        """``text`` without this backend's secrets or anything that looks like a credential (a
        server may reflect the request's Authorization header into its error text)."""
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return redact.scrub(text)

    def _one_line(self, text: str) -> str:
        return self._scrub(text)[:300]

    def _reason(self, body: Any, status: int = 0) -> str:
        err = body.get("error") if isinstance(body, dict) else body
        if isinstance(err, dict):
            root = (err.get("root_cause") or [{}])[0]
            text = f"{err.get('type', 'error')}: {err.get('reason') or root.get('reason', '')}"
            cause = err.get("caused_by")
            if isinstance(cause, dict) and cause.get("reason"):
                text += f" ({cause['reason']})"
        else:
            text = redact.one_line(str(err), limit=400)  # e.g. a proxy's HTML page: its text, not its tags
        return self._scrub(text)[:400]

    def _check(self, status: int, body: Any, what: str) -> Any:
        if status == 401:  # the client does not raise for it (OpenSearchHTTP does)
            raise BackendUnavailableError(
                f"Elasticsearch at {self.url} refused the credentials (401): set {ENV_API_KEY} or {ENV_USER}/{ENV_PASSWORD}"
            )
        return super()._check(status, body, what)

    def _wait(self, attempt: int, why: str) -> None:
        delay = min(30.0, self.backoff * (2**attempt)) * (0.5 + random.random() / 2)
        log.info("retrying in %.2fs after %s", delay, why)
        self._sleep(delay)

    # -- index lifecycle ------------------------------------------------------------------

    def _put_meta(self, identity: IndexIdentity) -> None:
        stored = self._stats()[1]  # _meta is replaced whole: keep what else the index records
        status, body = self._call("PUT", f"/{self.index_name}/_mapping",
                                  body={"_meta": {**stored, **q.put_meta_body(identity, self.mapping)["_meta"]}})
        self._check(status, body, "record the bundle in _meta")

    def _remember_mapping(self, mapping: Mapping[str, Any]) -> None:
        self.mapping = q.meta_mapping(mapping.get("_meta"), mapping.get("properties"))

    def create(self, identity: IndexIdentity, *, mapping: q.VectorMapping | None = None,
               shards: int | None = 1, replicas: int | None = 0) -> str:
        """Create ``<name>-000001`` behind the alias ``<name>``; returns the concrete name."""
        mapping = mapping or self.create_mapping
        self._require(mapping)
        concrete = f"{self.index_name}-000001"
        status, reply = self._create_index(concrete, identity, mapping, shards, replicas, alias=True)
        if not 200 <= status < 300:
            reason = self._reason(reply)
            if "resource_already_exists" in reason:
                # A retried PUT whose first answer was lost, or a race: accept it if it is ours.
                self._check_identity(identity, self._stored_identity())
                return concrete
            raise IndexStoreError(f"cannot create index {concrete} at {self.url}: {reason}")
        self.identity, self.mapping = identity, mapping
        return concrete

    def _create_index(self, name: str, identity: IndexIdentity, mapping: q.VectorMapping, shards: int | None,
                      replicas: int | None, alias: bool = False) -> tuple[int, Any]:
        """``PUT /<name>``; on 9.x with vectors kept in ``_source`` (retried without the setting
        on a 9.x release that does not know it yet)."""
        keep = self.server_version() >= (9, 0)
        # Serverless runs the current code (it reports 9.0): it takes index_options
        options = self.serverless or q.takes_sparse_index_options(self.server_version())
        if self.serverless:
            shards = replicas = None
        while True:
            body = q.index_body(identity, mapping, shards=shards, replicas=replicas, keep_vectors_in_source=keep,
                                sparse_index_options=options)
            if alias:
                body["aliases"] = {self.index_name: {}}
            status, reply = self._call("PUT", f"/{name}", body=body)
            if keep and status == 400 and "exclude_source_vectors" in self._reason(reply):
                keep = False
                continue
            return status, reply

    def _require(self, mapping: q.VectorMapping) -> None:
        for feature in mapping.needs():
            if not self.supports(feature):
                major, minor = q.SINCE[feature]
                have = ".".join(map(str, self.server_version()))
                raise IndexStoreError(f"{feature} needs Elasticsearch {major}.{minor} or later; {self.url} runs {have}")

    def drop(self) -> None:
        for concrete in self._concrete_indices():
            status, body = self._call("DELETE", f"/{concrete}")
            if not 200 <= status < 300 and status != 404:
                raise IndexStoreError(f"cannot delete index {concrete}: {self._reason(body)}")
        self.identity = None

    def close(self) -> None:
        try:
            self._final_refresh()
        finally:
            self.es.close()

    @contextlib.contextmanager
    def _one_attempt(self) -> Iterator[None]:
        client, self.es = self.es, self.es.options(max_retries=0)
        try:
            yield
        finally:
            self.es = client

    def stats(self) -> dict:
        self.settle()
        concrete, meta = self._stats()
        out: dict[str, Any] = {
            "backend": self.name,
            "location": f"{self.url}/{self.index_name}",
            "server_version": ".".join(map(str, self.server_version())),
            "indices": concrete,
            "bundle_fingerprint": meta.get("fingerprint", ""),
            "bundle_model": meta.get("model", ""),
            "dense_dim": meta.get("dense_dim"),
            "mapping_version": meta.get("d2s_mapping_version"),
            "sparse_type": self.mapping.sparse_type,
            "similarity": self.mapping.similarity,
            "dense_index": self.mapping.index_type,
            **self._size_stats(),
        }
        out["max_clauses"] = self.max_clauses
        return out

    # -- writes (upsert and delete: EngineIndex) -------------------------------------------
    # A bulk item is its NDJSON lines: action and source to index, the action alone to delete.

    def _doc_source(self, doc: Document) -> dict[str, Any]:
        return q.doc_source(doc, self.mapping, types=self._user_types)

    def _bulk_index_items(self, sources: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, ...]]:
        lines = q.bulk_index_lines(self.index_name, sources)
        return [tuple(lines[i : i + 2]) for i in range(0, len(lines), 2)]

    def _bulk_delete_items(self, ids: list[str]) -> list[tuple[str, ...]]:
        return [(line,) for line in q.bulk_delete_lines(self.index_name, ids)]

    def _bulk_update_items(self, updates: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, ...]]:
        lines = q.bulk_update_lines(self.index_name, updates)
        return [tuple(lines[i : i + 2]) for i in range(0, len(lines), 2)]

    def _bulk(self, items: list[tuple[str, ...]]) -> tuple[dict[str, str], list[str]]:
        """Send ``items`` in ``_bulk`` chunks; rounds, resends and the report:
        :func:`~d2s_search.backends.engine.bulk.send_bulk`."""
        return send_bulk(
            items, self._send_chunks, ChunkLimits(self.chunk_docs, self.chunk_bytes), retries=self.retries,
            wait=self._wait, reason=lambda result: self._scrub(item_reason(result, _clip)),
        )

    def _send_chunks(self, items: list[tuple[str, ...]], limits: ChunkLimits) -> Iterator[tuple[Any, bool, dict]]:
        """One round: each chunk in one request; a chunk of several documents refused as too
        large (413) answers 413 for each of them, so the next round sends them in halves."""
        for chunk in _chunks(items, limits):
            payload = "".join(line + "\n" for item in chunk for line in item).encode("utf-8")
            status, body = self._call("POST", "/_bulk", body=payload, ndjson=True)
            if status == 413 and len(chunk) > 1:
                limits.docs = min(limits.docs, len(chunk))  # halved next: this chunk in halves
                for item in chunk:
                    yield item, False, {"status": 413}
                continue
            if not 200 <= status < 300:
                raise IndexStoreError(f"bulk write to {self.index_name!r} failed: {self._reason(body)}")
            answers = body.get("items", []) if isinstance(body, dict) else []
            if len(answers) != len(chunk):
                raise IndexStoreError(f"bulk answer has {len(answers)} items for {len(chunk)} documents")
            for item, answer in zip(chunk, answers, strict=True):
                (result,) = answer.values()
                yield item, 200 <= int(result.get("status", 0)) < 300, result

    def _refresh(self, index: str | None = None) -> None:
        status, body = self._call("POST", f"/{index or self.index_name}/_refresh")
        if not 200 <= status < 300:
            log.warning("refresh of %s failed: %s", index or self.index_name, self._reason(body))

    # -- searches -------------------------------------------------------------------------

    def sparse_search(self, query: SparseVector, k: int, explain: int = 5, *, offset: int = 0,
                      path_prefix: str | None = None, words: WordFilter | None = None,
                      filters: SearchFilter | None = None) -> list[Hit]:
        body = q.sparse_search_body(query, k, offset=offset, sparse_type=self._sparse_type(),
                                    max_clauses=self.max_clauses, filters=self._narrowed(path_prefix, words, filters))
        return self._hits(self._search(body), query, explain)

    def two_phase_search(self, first: SparseVector, full: SparseVector, k: int, window: int, explain: int = 5,
                         *, offset: int = 0, path_prefix: str | None = None,
                         words: WordFilter | None = None, filters: SearchFilter | None = None) -> list[Hit]:
        body = q.two_phase_body(first, full, k, window, offset=offset, sparse_type=self._sparse_type(),
                                max_clauses=self.max_clauses, filters=self._narrowed(path_prefix, words, filters))
        return self._hits(self._search(body), full, explain)

    def _narrowed(self, path_prefix: str | None, words: WordFilter | None,
                  filters: SearchFilter | None) -> q.Filters:
        """The restrictions of a search; a word filter queries the sparse field as it is mapped."""
        return replace(super()._narrowed(path_prefix, words, filters),
                       sparse_vector=bool(words) and self._sparse_type() == "sparse_vector")

    def _source_fields(self, fields: list[str]) -> Any:
        return q.source_filter(fields)

    def dense_search(self, vector: np.ndarray, k: int, explain_with: SparseVector | None = None, explain: int = 5,
                     *, offset: int = 0, path_prefix: str | None = None,
                     words: WordFilter | None = None, filters: SearchFilter | None = None) -> list[Hit]:
        body = q.knn_search_body(vector, k, offset=offset, filters=self._narrowed(path_prefix, words, filters))
        hits = self._hits(self._search(body), explain_with or {}, explain if explain_with else 0)
        for hit in hits:
            hit.score = knn_score_to_inner_product(hit.score, self.mapping.similarity)
        return hits

    def rrf_available(self) -> bool:
        """The ``rrf`` retriever: Elasticsearch 8.14+ with an Enterprise or trial license."""
        if not self.supports("rrf_retriever"):
            return False
        if self.serverless:
            return True
        if self._license is None:
            status, body = self._call("GET", "/_license")
            self._license = str((body.get("license") or {}).get("type", "")) if status == 200 and isinstance(body, dict) else ""
        return self._license in RRF_LICENSES

    def hybrid_search(self, sparse: SparseVector, vector: np.ndarray, options: Any, *,
                      words: WordFilter | None = None, filters: SearchFilter | None = None) -> list[Hit]:
        """Sparse + dense: the server's ``rrf`` retriever when it has one and RRF was asked for,
        else this project's fusion of the two runs (min-max or RRF). ``last_fusion`` tells which.

        ``Hit.parts`` holds the exact sparse dot product and dense inner product either way.
        """
        from d2s_search import search as plans

        if options.fusion == "rrf" and self.rrf_available():
            body = q.rrf_search_body(sparse, vector, int(options.k), window=int(options.candidates),
                                     rank_constant=int(options.rrf_k), sparse_type=self._sparse_type(),
                                     max_clauses=self.max_clauses, filters=self._narrowed(None, words, filters))
            body["_source"] = q.source_filter([*q.HIT_SOURCE, q.DENSE_FIELD])
            raw = self._search(body)
            hits = self._hits(raw, sparse, int(options.explain))
            vec = np.asarray(vector, dtype=np.float32).reshape(-1)
            for hit, h in zip(hits, raw, strict=True):
                src = h.get("_source", {})
                doc_sparse = decode_features(src.get(q.SPARSE_FIELD))
                hit.parts = {"sparse": float(sum(w * doc_sparse.get(t, 0.0) for t, w in sparse.items()))}
                if src.get(q.DENSE_FIELD):
                    hit.parts["dense"] = float(np.dot(np.asarray(src[q.DENSE_FIELD], dtype=np.float32), vec))
            self.last_fusion = "elasticsearch-rrf-retriever"
            return hits
        n = int(options.candidates)
        runs = {
            "sparse": self.sparse_search(sparse, n, explain=int(options.explain), words=words, filters=filters),
            "dense": self.dense_search(vector, n, explain_with=sparse, explain=int(options.explain), words=words,
                                       filters=filters),
        }
        if options.fusion == "rrf":
            hits = plans.fuse_rrf(runs, int(options.k), int(options.rrf_k))
        else:
            hits = plans.fuse_minmax(runs, {"sparse": 1 - float(options.alpha), "dense": float(options.alpha)}, int(options.k))
        self.last_fusion = f"client-{options.fusion}"
        return hits

    def _sparse_type(self) -> str:
        if self.mapping.sparse_type == "sparse_vector" and not self.supports("sparse_vector_query"):
            raise QueryError(
                "this index stores sparse_vector fields, whose sparse_vector query needs Elasticsearch 8.15 or later"
            )
        return self.mapping.sparse_type

    def _search(self, body: dict, index: str | None = None) -> list[dict]:
        self.settle()
        if self.path_field != "path" and isinstance(body.get("_source"), dict):  # an enriched index's image field
            body = {**body, "_source": {**body["_source"], "includes": [*body["_source"].get("includes", []),
                                                                        self.path_field]}}
        status, reply = self._call("POST", f"/{index or self.index_name}/_search", body=body)
        return self._check(status, reply, "search").get("hits", {}).get("hits", [])

    def _decode(self, stored: Mapping[str, float] | None) -> dict[str, float]:
        return decode_features(stored)

    # -- reindex --------------------------------------------------------------------------

    def reindex(self, identity: IndexIdentity | None = None,
                reencode: Callable[[Document], Document | None] | None = None, *,
                mapping: q.VectorMapping | None = None, shards: int | None = 1, replicas: int | None = 0,
                keep_old: bool = False, page: int = 200) -> dict:
        """Copy every document into a fresh index (new mapping and/or bundle) and swap the alias.

        Without ``reencode`` the copy runs server-side (``_reindex``; same bundle, new mapping).
        With it, each stored document (read through a point in time) is passed through
        ``reencode`` and written by this client. The alias moves only when the new index holds as
        many documents as the old one; otherwise the new index is deleted and nothing changes.
        """
        return self._reindex(identity, reencode, (mapping, shards, replicas), keep_old=keep_old, page=page)

    def _reindex_target(self, target: tuple) -> tuple:
        """(mapping, shards, replicas) with the stored mapping when none was given, checked
        against the server's version."""
        mapping, shards, replicas = target
        mapping = mapping or self.mapping
        self._require(mapping)
        return mapping, shards, replicas

    def _create_generation(self, name: str, identity: IndexIdentity, target: tuple) -> tuple[int, Any]:
        mapping, shards, replicas = target
        return self._create_index(name, identity, mapping, shards, replicas)

    def _writer(self, index: str, identity: IndexIdentity, target: tuple) -> ElasticsearchBackend:
        writer = super()._writer(index, identity, target)
        writer.mapping = target[0]
        return writer

    def _reindexed(self, identity: IndexIdentity, target: tuple) -> None:
        self.identity, self.mapping = identity, target[0]

    def _pages(self, index: str, page: int, fields: Sequence[str] | None = None) -> Iterator[list[dict]]:
        """Raw hits of every document of ``index`` through a point in time (``search_after`` on
        ``_shard_doc``); ``fields``: only these of ``_source``."""
        status, body = self._call("POST", f"/{index}/_pit", params={"keep_alive": "5m"})
        pit = self._check(status, body, "open a point in time")["id"]
        try:
            after = None
            while True:
                status, body = self._call("POST", "/_search", body=q.pit_page_body(pit, page, after, fields=fields))
                body = self._check(status, body, "scan")
                pit = body.get("pit_id", pit)
                hits = body.get("hits", {}).get("hits", [])
                if not hits:
                    return
                yield hits
                after = hits[-1]["sort"]
        finally:
            self._call("DELETE", "/_pit", body=q.close_pit_body(pit))


def _split_userinfo(url: str) -> tuple[str, str | None, str | None]:
    """``http://user:pw@host`` -> (``http://host``, user, pw): credentials never stay in the shown URL."""
    from urllib.parse import unquote, urlsplit, urlunsplit

    parts = urlsplit(url.strip())
    if not parts.username and not parts.password:
        return url.strip(), None, None
    host = parts.hostname or ""
    netloc = (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
    clean = urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return clean, unquote(parts.username or "") or None, unquote(parts.password or "") or None


def _compat_headers(major: int) -> dict[str, str]:
    mime = f"application/vnd.elasticsearch+json; compatible-with={major}"
    return {"accept": mime, "content-type": mime}


def knn_score_to_inner_product(score: float, similarity: str) -> float:
    """Invert Elasticsearch's kNN score: ``dot_product`` gives ``(1 + ip) / 2``;
    ``max_inner_product`` gives ``1 + ip`` if ip >= 0, else ``1 / (1 - ip)``."""
    if similarity == "dot_product":
        return 2.0 * score - 1.0
    return score - 1.0 if score >= 1.0 else 1.0 - 1.0 / score if score > 0 else float("-inf")


def _clip(text: str) -> str:
    return text[:300]


def _chunks(items: list[tuple[str, ...]], limits: ChunkLimits) -> Iterator[list[tuple[str, ...]]]:
    """Consecutive items, at most ``limits.docs`` of them and ``limits.bytes`` of NDJSON a chunk
    (a single larger item goes alone)."""
    chunk: list[tuple[str, ...]] = []
    size = 0
    for item in items:
        item_size = sum(len(line.encode("utf-8")) + 1 for line in item)
        if chunk and (len(chunk) >= limits.docs or size + item_size > limits.bytes):
            yield chunk
            chunk, size = [], 0
        chunk.append(item)
        size += item_size
    if chunk:
        yield chunk
