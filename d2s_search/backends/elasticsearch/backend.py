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

import logging
import os
import random
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from d2s_search.backends.base import Document, Hit, IndexIdentity, SparseVector
from d2s_search.backends.elasticsearch import queries as q
from d2s_search.backends.elasticsearch.features import decode_features, matched_terms
from d2s_search.backends.engine.bulk import item_reason, next_generation
from d2s_search.backends.engine.documents import document_from_source
from d2s_search.backends.engine.identity import check_dims, check_identity
from d2s_search.errors import (
    BackendUnavailableError,
    BundleMismatchError,
    DocumentsRejectedError,
    IndexStoreError,
    QueryError,
)

log = logging.getLogger("d2s_search.elasticsearch")

ENV_URL = "D2S_ELASTICSEARCH_URL"
ENV_USER = "D2S_ELASTICSEARCH_USER"
ENV_PASSWORD = "D2S_ELASTICSEARCH_PASSWORD"
ENV_API_KEY = "D2S_ELASTICSEARCH_API_KEY"
ENV_CA_FILE = "D2S_ELASTICSEARCH_CA_FILE"
ENV_CLOUD_ID = "D2S_ELASTICSEARCH_CLOUD_ID"
ENV_INDEX = "D2S_ELASTICSEARCH_INDEX"
ENV_INSECURE = "D2S_ELASTICSEARCH_INSECURE"  # "1": skip TLS verification (local demo certificates only)

# Whole requests the client resends itself; bulk items with these statuses are resent here.
RETRY_STATUSES = (429, 502, 503, 504)
RETRY_ITEM_STATUSES = frozenset({429, 500, 502, 503, 504})
RRF_LICENSES = frozenset({"enterprise", "trial"})
_VERSION = re.compile(r"^(\d+)\.(\d+)")


class ElasticsearchBackend:
    """Backend protocol over Elasticsearch (see :mod:`d2s_search.backends.base`)."""

    name = "elasticsearch"

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

        if not index_name or index_name != index_name.lower() or index_name.startswith(("_", "-", "+")):
            raise IndexStoreError(f"invalid Elasticsearch index name {index_name!r} (lowercase, no leading _ - +)")
        if not url and not cloud_id:
            raise BackendUnavailableError(f"no Elasticsearch URL: pass --url or set {ENV_URL} (or {ENV_CLOUD_ID})")
        if url:
            url, url_user, url_password = _split_userinfo(url)
            user, password = user or url_user, password or url_password
        self._secrets = [s for s in (password, api_key) if s]
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
        self.index_name = index_name
        self.retries = max(0, retries)
        self.backoff = backoff
        self.chunk_docs = max(1, chunk_docs)
        self.chunk_bytes = max(1024, chunk_bytes)
        self.refresh = refresh
        self.max_clauses = max(1, int(max_clauses))
        self.create_mapping = mapping or q.DEFAULT_MAPPING
        self.mapping = self.create_mapping
        self.identity: IndexIdentity | None = None
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
              ndjson: bool = False) -> tuple[int, Any]:
        """One request through the client (which retries busy/unreachable nodes): (status, body)."""
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
            resp = self.es.perform_request(method, path, params=dict(params) if params else None,
                                           headers=headers, body=body)
            return resp.meta.status, resp.body
        except UnsupportedProductError:
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

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _reason(self, body: Any) -> str:
        err = body.get("error") if isinstance(body, dict) else body
        if isinstance(err, dict):
            root = (err.get("root_cause") or [{}])[0]
            text = f"{err.get('type', 'error')}: {err.get('reason') or root.get('reason', '')}"
            cause = err.get("caused_by")
            if isinstance(cause, dict) and cause.get("reason"):
                text += f" ({cause['reason']})"
        else:
            text = str(err)
        return self._scrub(text)[:400]

    def _check(self, status: int, body: Any, what: str) -> Any:
        if 200 <= status < 300:
            return body
        reason = self._reason(body)
        if status == 404 and "index_not_found" in reason:
            raise IndexStoreError(
                f"no index {self.index_name!r} at {self.url}: run `d2s-search index create` or ingest first"
            )
        if "too_many_clauses" in reason or "too_many_nested_clauses" in reason:
            raise QueryError(f"the query has too many terms for this cluster: {reason}")
        if status == 401:
            raise BackendUnavailableError(
                f"Elasticsearch at {self.url} refused the credentials (401): set {ENV_API_KEY} or {ENV_USER}/{ENV_PASSWORD}"
            )
        raise IndexStoreError(f"Elasticsearch could not {what}: {reason}")

    def _wait(self, attempt: int, why: str) -> None:
        delay = min(30.0, self.backoff * (2**attempt)) * (0.5 + random.random() / 2)
        log.info("retrying in %.2fs after %s", delay, why)
        self._sleep(delay)

    # -- index lifecycle ------------------------------------------------------------------

    def exists(self) -> bool:
        status, _ = self._call("HEAD", f"/{self.index_name}")
        return status == 200

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
            # Created from mappings/elasticsearch/index.json by hand: claim it if the dimension agrees.
            self._check_dims(identity, stored)
            status, body = self._call("PUT", f"/{self.index_name}/_mapping", body=q.put_meta_body(identity, self.mapping))
            self._check(status, body, "record the bundle in _meta")
            stored = identity
        else:
            self._check_identity(identity, stored)
        self.identity = stored

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
        if self.serverless:
            shards = replicas = None
        while True:
            body = q.index_body(identity, mapping, shards=shards, replicas=replicas, keep_vectors_in_source=keep)
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
        self.es.close()

    def stats(self) -> dict:
        mapping = self._mapping()
        concrete = sorted(mapping)
        meta = mapping[concrete[0]].get("mappings", {}).get("_meta", {}) if concrete else {}
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
        }
        status, body = self._call("GET", f"/{self.index_name}/_count")
        out["documents"] = int(body.get("count", 0)) if status == 200 else None
        status, body = self._call("GET", f"/{self.index_name}/_stats/docs,store")
        if status == 200:
            prim = body.get("_all", {}).get("primaries", {})
            out["disk_bytes"] = prim.get("store", {}).get("size_in_bytes")
            out["deleted_documents"] = prim.get("docs", {}).get("deleted")
        out["max_clauses"] = self.max_clauses
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
                sources.append((doc.id, q.doc_source(doc, self.mapping)))
            except (ValueError, TypeError) as exc:
                failures[doc.id] = str(exc)
        for chunk in self._chunks(q.bulk_index_lines(self.index_name, sources)):
            failures.update(self._bulk(chunk)[0])
        if sources and self.refresh:
            self._refresh()
        if failures:
            stored = len(sources) - sum(1 for i, _ in sources if i in failures)
            first_id, first = next(iter(failures.items()))
            raise DocumentsRejectedError(
                f"{len(failures)} document(s) refused by Elasticsearch, {stored} stored "
                f"(first: {first_id[:12]}: {first})",
                failures,
            )

    def delete(self, ids: Iterable[str]) -> int:
        ids = list(dict.fromkeys(ids))
        deleted = 0
        for chunk in self._chunks(q.bulk_delete_lines(self.index_name, ids), lines_per_doc=1):
            failures, results = self._bulk(chunk, lines_per_doc=1)
            if failures:
                raise IndexStoreError(f"cannot delete {len(failures)} document(s): {next(iter(failures.values()))}")
            deleted += sum(1 for r in results if r == "deleted")
        if ids and self.refresh:
            self._refresh()
        return deleted

    def _chunks(self, lines: list[str], lines_per_doc: int = 2) -> Iterator[list[str]]:
        chunk: list[str] = []
        size = 0
        for i in range(0, len(lines), lines_per_doc):
            item = lines[i : i + lines_per_doc]
            item_size = sum(len(s.encode("utf-8")) + 1 for s in item)
            if chunk and (len(chunk) // lines_per_doc >= self.chunk_docs or size + item_size > self.chunk_bytes):
                yield chunk
                chunk, size = [], 0
            chunk.extend(item)
            size += item_size
        if chunk:
            yield chunk

    def _bulk(self, lines: list[str], lines_per_doc: int = 2) -> tuple[dict[str, str], list[str]]:
        """Send one chunk; resend only the items refused as busy. Returns ({id: reason}, results)."""
        pending = lines
        failures: dict[str, str] = {}
        results: list[str] = []
        attempt = 0
        while pending:
            payload = ("\n".join(pending) + "\n").encode("utf-8")
            status, body = self._call("POST", "/_bulk", body=payload, ndjson=True)
            if status == 413 and len(pending) > lines_per_doc:
                half = (len(pending) // lines_per_doc // 2) * lines_per_doc
                for part in (pending[:half], pending[half:]):
                    f, r = self._bulk(part, lines_per_doc)
                    failures.update(f)
                    results.extend(r)
                break
            if not 200 <= status < 300:
                raise IndexStoreError(f"bulk write to {self.index_name!r} failed: {self._reason(body)}")
            items = body.get("items", []) if isinstance(body, dict) else []
            if len(items) * lines_per_doc != len(pending):
                raise IndexStoreError(f"bulk answer has {len(items)} items for {len(pending) // lines_per_doc} documents")
            retry: list[str] = []
            for n, item in enumerate(items):
                (result,) = item.values()
                item_status = int(result.get("status", 0))
                doc_id = str(result.get("_id"))
                if 200 <= item_status < 300 or (item_status == 404 and result.get("result") == "not_found"):
                    results.append(result.get("result", ""))
                elif item_status in RETRY_ITEM_STATUSES and attempt < self.retries:
                    retry.extend(pending[n * lines_per_doc : (n + 1) * lines_per_doc])
                else:
                    failures[doc_id] = self._scrub(item_reason(result, _clip))
            if retry:
                self._wait(attempt, f"{len(retry) // lines_per_doc} bulk item(s) refused as busy")
                attempt += 1
            pending = retry
        return failures, results

    def _refresh(self, index: str | None = None) -> None:
        status, body = self._call("POST", f"/{index or self.index_name}/_refresh")
        if not 200 <= status < 300:
            log.warning("refresh of %s failed: %s", index or self.index_name, self._reason(body))

    # -- reads ----------------------------------------------------------------------------

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
                    out.append(_document(d["_id"], d.get("_source", {})))
        return out

    # PathListing (index prune, the missing-file count of index stats, moved files in ingest):
    # only the ``path`` field of ``_source`` travels, never the vectors.

    def document_paths(self, page: int = 1000) -> Iterator[tuple[str, str]]:
        """(id, path) of every document, through a point in time that fetches only ``path``."""
        for hits in self._pit_pages(self.index_name, page, fields=["path"]):
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
        status, body = self._call("POST", f"/{self.index_name}/_mget", body=q.mget_body(ids),
                                  params={"_source": source if isinstance(source, str) else "true" if source else "false"})
        return self._check(status, body, "read documents").get("docs", [])

    # -- searches -------------------------------------------------------------------------

    def sparse_search(self, query: SparseVector, k: int, explain: int = 5, *, offset: int = 0,
                      path_prefix: str | None = None) -> list[Hit]:
        body = q.sparse_search_body(query, k, offset=offset, sparse_type=self._sparse_type(),
                                    max_clauses=self.max_clauses, filters=q.Filters(path_prefix))
        return self._hits(self._search(body), query, explain)

    def two_phase_search(self, first: SparseVector, full: SparseVector, k: int, window: int, explain: int = 5,
                         *, offset: int = 0, path_prefix: str | None = None) -> list[Hit]:
        body = q.two_phase_body(first, full, k, window, offset=offset, sparse_type=self._sparse_type(),
                                max_clauses=self.max_clauses, filters=q.Filters(path_prefix))
        return self._hits(self._search(body), full, explain)

    def dense_search(self, vector: np.ndarray, k: int, explain_with: SparseVector | None = None, explain: int = 5,
                     *, offset: int = 0, path_prefix: str | None = None) -> list[Hit]:
        body = q.knn_search_body(vector, k, offset=offset, filters=q.Filters(path_prefix))
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

    def hybrid_search(self, sparse: SparseVector, vector: np.ndarray, options: Any) -> list[Hit]:
        """Sparse + dense: the server's ``rrf`` retriever when it has one and RRF was asked for,
        else this project's fusion of the two runs (min-max or RRF). ``last_fusion`` tells which.

        ``Hit.parts`` holds the exact sparse dot product and dense inner product either way.
        """
        from d2s_search import search as plans

        if options.fusion == "rrf" and self.rrf_available():
            body = q.rrf_search_body(sparse, vector, int(options.k), window=int(options.candidates),
                                     rank_constant=int(options.rrf_k), sparse_type=self._sparse_type(),
                                     max_clauses=self.max_clauses)
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
            "sparse": self.sparse_search(sparse, n, explain=int(options.explain)),
            "dense": self.dense_search(vector, n, explain_with=sparse, explain=int(options.explain)),
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
        status, reply = self._call("POST", f"/{index or self.index_name}/_search", body=body)
        return self._check(status, reply, "search").get("hits", {}).get("hits", [])

    def _hits(self, raw: list[dict], query: Mapping[str, float], explain: int) -> list[Hit]:
        hits = []
        for h in raw:
            src = h.get("_source", {})
            hits.append(Hit(
                id=h["_id"],
                # _score is a float32 printed in shortest form: recover the exact value.
                score=float(np.float32(h.get("_score") or 0.0)),
                path=src.get("path", ""),
                url=src.get("url"),
                matched=matched_terms(query, decode_features(src.get(q.SPARSE_FIELD)), explain),
            ))
        return hits

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
        old = self._stored_identity()
        if old is None:
            raise IndexStoreError(f"no index {self.index_name!r} at {self.url} to reindex")
        new_identity = identity or old
        if reencode is None and new_identity.fingerprint != old.fingerprint:
            raise BundleMismatchError("a new bundle needs its documents re-encoded: reindex with the bundle's encoder")
        mapping = mapping or self.mapping
        self._require(mapping)
        concrete = self._concrete_indices()
        if len(concrete) != 1:
            raise IndexStoreError(f"{self.index_name!r} points at {len(concrete)} indices; expected one")
        (old_index,) = concrete
        is_alias = old_index != self.index_name
        target = next_generation(self.index_name, old_index)
        status, body = self._create_index(target, new_identity, mapping, shards, replicas)
        if not 200 <= status < 300:
            raise IndexStoreError(f"cannot create index {target}: {self._reason(body)}")
        before = self._count(old_index)
        lost: dict[str, str] = {}
        try:
            if reencode is None:
                status, body = self._call("POST", "/_reindex", body=q.reindex_body(old_index, target),
                                          params={"refresh": "true", "wait_for_completion": "true"})
                self._check(status, body, "reindex")
                if body.get("failures"):
                    raise IndexStoreError(f"reindex failed: {self._scrub(str(body['failures'][0]))[:300]}")
            else:
                lost = self._copy_reencoded(old_index, target, new_identity, mapping, reencode, page)
            after = self._count(target)
            if lost or after < before:
                raise IndexStoreError(
                    f"reindex stopped: {after} of {before} documents copied"
                    + (f", {len(lost)} could not be re-encoded" if lost else "")
                    + f"; {self.index_name!r} still points at {old_index}"
                )
        except BaseException:
            self._call("DELETE", f"/{target}")
            raise
        status, body = self._call("POST", "/_aliases", body=q.alias_swap_body(self.index_name, target, old_index, is_alias))
        self._check(status, body, "swap the alias")
        if is_alias and not keep_old:
            self._call("DELETE", f"/{old_index}")
        self.identity, self.mapping = new_identity, mapping
        return {"from": old_index, "to": target, "documents": after, "kept_old": bool(is_alias and keep_old)}

    def _copy_reencoded(self, source: str, target: str, identity: IndexIdentity, mapping: q.VectorMapping,
                        reencode: Callable[[Document], Document | None], page: int) -> dict[str, str]:
        writer = ElasticsearchBackend.__new__(ElasticsearchBackend)
        writer.__dict__.update(self.__dict__)
        writer.index_name, writer.identity, writer.mapping, writer.refresh = target, identity, mapping, False
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
        self._refresh(target)
        return lost

    def _scan(self, index: str, page: int) -> Iterator[list[Document]]:
        for hits in self._pit_pages(index, page):
            yield [_document(h["_id"], h.get("_source", {})) for h in hits]

    def _pit_pages(self, index: str, page: int, fields: Sequence[str] | None = None) -> Iterator[list[dict]]:
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

    # -- helpers --------------------------------------------------------------------------

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
        ident = q.meta_identity(first.get("_meta"))
        if ident is None:
            raise IndexStoreError(
                f"index {self.index_name!r} at {self.url} was not made by d2s-search (no _meta.fingerprint)"
            )
        self.mapping = q.meta_mapping(first.get("_meta"), first.get("properties"))
        return ident

    def _check_identity(self, wanted: IndexIdentity, stored: IndexIdentity | None) -> None:
        check_identity(self.index_name, self.url, wanted, stored, "--index-name")

    def _check_dims(self, wanted: IndexIdentity, stored: IndexIdentity) -> None:
        check_dims(self.index_name, wanted, stored)

    def _count(self, index: str) -> int:
        status, body = self._call("GET", f"/{index}/_count")
        return int(self._check(status, body, "count documents").get("count", 0))


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


def _document(doc_id: str, src: Mapping[str, Any]) -> Document:
    return document_from_source(doc_id, src, decode_features)


def _clip(text: str) -> str:
    return text[:300]
