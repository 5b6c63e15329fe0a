"""The text encoder inside the cluster: register it with ml-commons as a SPARSE_ENCODING model.

Flow of :meth:`MLCommons.register` (every body is built by a pure function below, so tests
check them against the OpenSearch API specification):

    POST /_plugins/_ml/model_groups/_register          group "d2s-search" (or reuse it)
    POST /_plugins/_ml/models/_register_meta           name, hash, ONNX, SPARSE_ENCODING, chunks
    POST /_plugins/_ml/models/<id>/upload_chunk/<n>    raw zip bytes, <= 10 MB each
      or POST /_plugins/_ml/models/_register {url}     the zip from a URL the cluster can reach
         + GET /_plugins/_ml/tasks/<task>              until COMPLETED -> model id
    POST /_plugins/_ml/models/<id>/_deploy             + poll the task, then the model state

A model is named after its bundle (:func:`d2s_search.backends.opensearch.ml_package.model_name`) and carries
the zip's SHA-256, so running ``register-model`` again reuses a model with the same content
instead of uploading it twice. Searching with the model lives in :mod:`d2s_search.backends.opensearch.server_side`.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from d2s_search.backends.opensearch.client import (
    OpenSearchHTTP,
    Reply,
    auth_message,
)
from d2s_search.backends.opensearch.ml_package import ModelPackage
from d2s_search.backends.opensearch.search_template import TEMPLATE_ID, put_template_body
from d2s_search.errors import BackendUnavailableError, D2SError

log = logging.getLogger("d2s_search.ml_commons")

ML = "/_plugins/_ml"
MODEL_GROUP = "d2s-search"
CHUNK_BYTES = 10_000_000  # ml-commons refuses chunks over 10 MB
DEPLOYED = frozenset({"DEPLOYED", "PARTIALLY_DEPLOYED"})
DEPLOYABLE = frozenset({"REGISTERED", "UNDEPLOYED", "DEPLOY_FAILED"})
TASK_DONE = frozenset({"COMPLETED"})
TASK_FAILED = frozenset({"FAILED", "CANCELLED", "COMPLETED_WITH_ERROR"})
SETTING_LOCAL_FILE = "plugins.ml_commons.allow_registering_model_via_local_file"
SETTING_URL = "plugins.ml_commons.allow_registering_model_via_url"
SETTING_ML_NODE = "plugins.ml_commons.only_run_on_ml_node"
SETTING_MEMORY = "plugins.ml_commons.native_memory_threshold"
SETTING_HEAP = "plugins.ml_commons.jvm_heap_memory_threshold"
SETTING_DISK = "plugins.ml_commons.disk_free_space_threshold"
# (text in an ml-commons error, what the user can do about it). ml-commons 2.19.1.0/3.1.0.0,
# plugin/.../breaker/: MemoryCircuitBreaker ("Memory Circuit Breaker") opens when JVM heap use
# passes jvm_heap_memory_threshold (85%); NativeMemoryCircuitBreaker ("Native Memory Circuit
# Breaker") checks native_memory_threshold (90%). The native one must be matched first.
# DiskCircuitBreaker ("Disk Circuit Breaker", the same 2.19.1.0 and 3.1.0.0 folder) opens when the
# node's data path has less free space than disk_free_space_threshold (5 GB,
# MLCommonsSettings.ML_COMMONS_DISK_FREE_SPACE_THRESHOLD); MLNodeUtils.checkOpenCircuitBreaker
# then refuses register, deploy and predict with "<name> is open, please check your resources!".
_HINTS = (
    ("allow_registering_model_via_local_file",
     f"allow uploads with --configure-cluster (sets {SETTING_LOCAL_FILE}=true)"),
    ("allow_registering_model_via_url", f"allow URL registration with --configure-cluster (sets {SETTING_URL}=true)"),
    ("No eligible node", f"no ML node: --configure-cluster sets {SETTING_ML_NODE}=false to use data nodes"),
    ("Native Memory Circuit Breaker",
     f"the node is short of native memory: --configure-cluster raises {SETTING_MEMORY} to 99"),
    ("Memory Circuit Breaker",
     f"JVM heap use is over {SETTING_HEAP} (85%): give the node a larger heap (OPENSEARCH_HEAP=2g "
     f"or more in .env, then `docker compose up -d`), or raise {SETTING_HEAP}"),
    ("Disk Circuit Breaker",
     f"less than {SETTING_DISK} (5 GB) is free on the node's data disk: free space (a Docker host: "
     f"`docker system df`, `docker system prune`), or lower {SETTING_DISK}"),
    ("model content changed", "the uploaded zip does not match its hash: run register-model again"),
)


class MLCommonsError(D2SError):
    """ml-commons refused a step (settings, memory, a failed task); the message says which."""


class MLCommonsUnavailable(MLCommonsError):
    """The cluster has no ml-commons plugin (or no neural-search for the query)."""


class MLCommonsForbidden(MLCommonsUnavailable):
    """This user may not use ml-commons (403): callers fall back as if it were absent."""


# -- request bodies -------------------------------------------------------------------------


def model_group_body(name: str = MODEL_GROUP) -> dict[str, Any]:
    return {"name": name, "description": "d2s-search sparse text encoders (one version per bundle)"}


def find_by_name_body(name: str) -> dict[str, Any]:
    """Search models or model groups by exact name (model chunks are separate documents)."""
    return {
        "query": {"bool": {"filter": [{"term": {"name.keyword": name}}],
                           "must_not": [{"exists": {"field": "chunk_number"}}]}},
        "size": 50,
    }


def _model_fields(pkg: ModelPackage, group_id: str) -> dict[str, Any]:
    return {
        "name": pkg.name,
        "version": "1",  # ml-commons numbers versions inside a group itself
        "description": f"d2s-search sparse text encoder, bundle {pkg.bundle_fingerprint}",
        "model_group_id": group_id,
        "function_name": "SPARSE_ENCODING",
        "model_format": "ONNX",
        "model_content_hash_value": pkg.sha256,
        "model_config": pkg.model_config(),
    }


def register_meta_body(pkg: ModelPackage, group_id: str, chunk_bytes: int = CHUNK_BYTES) -> dict[str, Any]:
    # model_content_size_in_bytes is optional in ml-commons and absent from the API spec.
    return {**_model_fields(pkg, group_id), "total_chunks": chunk_count(pkg.size, chunk_bytes)}


def register_url_body(pkg: ModelPackage, group_id: str, url: str) -> dict[str, Any]:
    return {**_model_fields(pkg, group_id), "url": url}


def predict_body(texts: Sequence[str]) -> dict[str, Any]:
    return {"text_docs": list(texts)}


def cluster_settings_body(local_file: bool = True, url: bool = False) -> dict[str, Any]:
    """Persistent settings a single-node (demo) cluster needs to run our model."""
    persistent: dict[str, Any] = {SETTING_ML_NODE: False, SETTING_MEMORY: 99}
    if local_file:
        persistent[SETTING_LOCAL_FILE] = True
    if url:
        persistent[SETTING_URL] = True
    return {"persistent": persistent}


def chunk_count(size: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    return max(1, -(-size // chunk_bytes))


def iter_chunks(path: Path, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
    with open(path, "rb") as fh:
        while block := fh.read(chunk_bytes):
            yield block


# -- the REST flow --------------------------------------------------------------------------


@dataclass
class Registration:
    model_id: str
    model_group_id: str
    name: str
    state: str
    reused: bool = False  # an existing model with the same content was used
    chunks: int = 0  # chunks uploaded by this run
    steps: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"model_id": self.model_id, "model_group_id": self.model_group_id, "name": self.name,
                "state": self.state, "reused": self.reused, "chunks_uploaded": self.chunks, "steps": self.steps}


class MLCommons:
    """ml-commons over an :class:`OpenSearchHTTP` connection."""

    def __init__(
        self,
        http: OpenSearchHTTP,
        *,
        poll_interval: float = 2.0,
        timeout: float = 900.0,
        chunk_bytes: int = CHUNK_BYTES,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.http = http
        self.poll_interval = poll_interval
        self.timeout = timeout
        self.chunk_bytes = chunk_bytes
        self._sleep = sleep
        self._clock = clock
        self._progress = progress or (lambda message: None)

    # -- plumbing -------------------------------------------------------------------------

    def _call(self, method: str, path: str, body: Any = None, what: str = "") -> dict[str, Any]:
        try:
            reply = self.http.request(method, path, json_body=body, raise_auth=False)
        except BackendUnavailableError as exc:
            # A breaker answers 429 (CircuitBreakingException): still busy after the retries.
            hint = _hint(str(exc))
            if hint:
                raise BackendUnavailableError(f"{exc}{hint}") from None
            raise
        return self._check(reply, what or f"{method} {path}")

    def _check(self, reply: Reply, what: str) -> dict[str, Any]:
        if reply.ok and isinstance(reply.body, dict):
            return reply.body
        reason = reply.error_reason()
        if reply.status == 401:
            raise BackendUnavailableError(auth_message(self.http.url, 401, reply))
        if reply.status == 403:
            raise MLCommonsForbidden(f"OpenSearch at {self.http.url} denied {what} (403): {reason}")
        if "no handler found" in reason:
            raise MLCommonsUnavailable(
                f"{self.http.url} has no ml-commons plugin ({what} is unknown); "
                f"use the stored search template `{TEMPLATE_ID}` instead (register-model --template-only)"
            )
        raise MLCommonsError(f"ml-commons could not {what}: {reason}{_hint(reason)}")

    def _post_bytes(self, path: str, data: bytes, what: str) -> dict[str, Any]:
        """POST raw bytes (a model chunk) over the same connection, auth, TLS and retries.

        ml-commons reads the chunk as the raw body, whatever its Content-Type (opensearch-py-ml
        sends it as application/json).
        """
        reply = self.http.request("POST", path, content=data, content_type="application/json",
                                  timeout=300.0, raise_auth=False)
        return self._check(reply, what)

    def _wait_until(self, what: str, check: Callable[[], tuple[bool, str]]) -> str:
        deadline = self._clock() + self.timeout
        while True:
            done, state = check()
            if done:
                return state
            if self._clock() >= deadline:
                raise MLCommonsError(f"timed out after {self.timeout:.0f}s waiting to {what} (last state {state})")
            self._progress(f"{what}: {state.lower()}")
            self._sleep(self.poll_interval)

    # -- steps ----------------------------------------------------------------------------

    def configure_cluster(self, local_file: bool = True, url: bool = False) -> None:
        self._call("PUT", "/_cluster/settings", cluster_settings_body(local_file, url), "update the cluster settings")

    def ensure_model_group(self, name: str = MODEL_GROUP) -> str:
        reply = self.http.request("POST", f"{ML}/model_groups/_register", json_body=model_group_body(name))
        if reply.ok and isinstance(reply.body, dict) and reply.body.get("model_group_id"):
            return str(reply.body["model_group_id"])
        # "The name you provided is already being used by a model group with ID: <id>."
        taken = re.search(r"model group with ID: ?([\w-]+)", reply.error_reason())
        if taken:
            return taken.group(1)
        found = self._find(f"{ML}/model_groups/_search", name)
        if found:
            return found[0][0]
        self._check(reply, f"create the model group {name!r}")
        raise MLCommonsError(f"ml-commons created no model group {name!r}")

    def _find(self, path: str, name: str) -> list[tuple[str, dict[str, Any]]]:
        body = self._call("POST", path, find_by_name_body(name), f"search {path.rsplit('/', 2)[-2]}")
        hits = body.get("hits", {}).get("hits", [])
        return [(h["_id"], h.get("_source", {})) for h in hits if h.get("_source", {}).get("name") == name]

    def find_model(self, name: str, sha256: str | None = None) -> tuple[str, str] | None:
        """(model id, state) of the best model called ``name`` (with that content hash)."""
        rank = {**dict.fromkeys(DEPLOYED, 0), **dict.fromkeys(DEPLOYABLE, 1)}
        candidates = []
        for model_id, src in self._find(f"{ML}/models/_search", name):
            state = str(src.get("model_state", ""))
            if state not in rank or (sha256 and src.get("model_content_hash_value") != sha256):
                continue
            candidates.append((rank[state], -_epoch_millis(src.get("last_updated_time")), model_id, state))
        if not candidates:
            return None
        _, _, model_id, state = min(candidates)
        return model_id, state

    def upload(self, pkg: ModelPackage, group_id: str) -> str:
        """Register the model's metadata and upload the zip in chunks; returns the model id."""
        meta = self._call("POST", f"{ML}/models/_register_meta", register_meta_body(pkg, group_id, self.chunk_bytes),
                          "register the model")
        model_id = meta.get("model_id")
        if not model_id:
            raise MLCommonsError(f"ml-commons returned no model id: {str(meta)[:200]}")
        total = chunk_count(pkg.size, self.chunk_bytes)
        for n, chunk in enumerate(iter_chunks(pkg.path, self.chunk_bytes)):
            self._progress(f"uploading chunk {n + 1}/{total}")
            self._post_bytes(f"{ML}/models/{model_id}/upload_chunk/{n}", chunk, f"upload chunk {n + 1}/{total}")
        return str(model_id)

    def register_from_url(self, pkg: ModelPackage, group_id: str, url: str) -> str:
        started = self._call("POST", f"{ML}/models/_register", register_url_body(pkg, group_id, url),
                             "register the model from a URL")
        task = self.wait_task(str(started.get("task_id", "")), "register the model")
        model_id = task.get("model_id")
        if not model_id:
            raise MLCommonsError(f"the register task finished without a model id: {str(task)[:200]}")
        return str(model_id)

    def wait_task(self, task_id: str, what: str) -> dict[str, Any]:
        if not task_id:
            raise MLCommonsError(f"ml-commons started no task to {what}")
        last: dict[str, Any] = {}

        def check() -> tuple[bool, str]:
            nonlocal last
            last = self._call("GET", f"{ML}/tasks/{task_id}", None, f"read task {task_id}")
            state = str(last.get("state", "UNKNOWN"))
            if state in TASK_FAILED:
                error = str(last.get("error") or state)
                raise MLCommonsError(f"could not {what}: {error[:300]}{_hint(error)}")
            return state in TASK_DONE, state

        self._wait_until(what, check)
        return last

    def model(self, model_id: str) -> dict[str, Any]:
        return self._call("GET", f"{ML}/models/{model_id}", None, f"read model {model_id}")

    def deploy(self, model_id: str) -> str:
        started = self._call("POST", f"{ML}/models/{model_id}/_deploy", None, "deploy the model")
        if started.get("task_id"):
            self.wait_task(str(started["task_id"]), "deploy the model")

        def check() -> tuple[bool, str]:
            state = str(self.model(model_id).get("model_state", "UNKNOWN"))
            if state == "DEPLOY_FAILED":
                raise MLCommonsError(f"model {model_id} failed to deploy; see the OpenSearch log")
            return state in DEPLOYED, state

        return self._wait_until("deploy the model", check)

    def predict(self, model_id: str, texts: Sequence[str]) -> list[dict[str, float]]:
        """The model's ``{token: weight}`` per text, as neural_sparse sees them."""
        body = self._call("POST", f"{ML}/_predict/sparse_encoding/{model_id}", predict_body(texts), "encode the query")
        out = []
        for result in body.get("inference_results", []):
            tensors = result.get("output") or [{}]
            response = (tensors[0].get("dataAsMap") or {}).get("response") or [{}]
            out.append({str(t): float(w) for t, w in response[0].items()})
        return out

    def register(self, pkg: ModelPackage, *, model_url: str | None = None, group: str = MODEL_GROUP,
                 force: bool = False, deploy: bool = True) -> Registration:
        existing = None if force else self.find_model(pkg.name, pkg.sha256)
        group_id = self.ensure_model_group(group)
        steps: list[str] = [f"model group {group_id}"]
        chunks = 0
        if existing and (existing[1] in DEPLOYED or not deploy):
            return Registration(existing[0], group_id, pkg.name, existing[1], reused=True,
                                steps=[*steps, f"reused model {existing[0]} ({existing[1]})"])
        if existing:
            model_id = existing[0]
            steps.append(f"reused registered model {model_id}")
        elif model_url:
            model_id = self.register_from_url(pkg, group_id, model_url)
            steps.append(f"registered model {model_id} from {model_url}")
        else:
            model_id = self.upload(pkg, group_id)
            chunks = chunk_count(pkg.size, self.chunk_bytes)
            steps.append(f"uploaded model {model_id} in {chunks} chunk(s)")
        state = "REGISTERED"
        if deploy:
            state = self.deploy(model_id)
            steps.append(f"deployed ({state})")
        return Registration(model_id, group_id, pkg.name, state, reused=bool(existing), chunks=chunks, steps=steps)

    def store_search_template(self) -> str:
        self._call("PUT", f"/_scripts/{TEMPLATE_ID}", put_template_body(), f"store the search template {TEMPLATE_ID}")
        return TEMPLATE_ID


def _epoch_millis(value: Any) -> float:
    try:
        return float(value or 0)
    except (TypeError, ValueError):  # a formatted date: ordering among equals is then arbitrary
        return 0.0


def _hint(reason: str) -> str:
    for needle, hint in _HINTS:
        if needle.lower() in reason.lower():
            return f" ({hint})"
    return ""
