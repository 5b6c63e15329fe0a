"""A local stand-in for the parts of OpenSearch that osmem-server does not implement.

It listens on 127.0.0.1 and handles ml-commons (model groups, chunked and URL registration,
tasks, deploy, predict), stored scripts, ``_search/template``, ``neural_sparse`` with
``query_text`` + ``model_id`` and ``PUT _cluster/settings``; what k-NN, neural-search and
core do with an index or query (codec factories, engines, ``query_tokens``, SEISMIC, ``knn``)
and Amazon OpenSearch Serverless (``serverless=True``) follow tests/opensearch/plugins.py,
where each rule cites its source; everything else is forwarded to an osmem-server. Every
request is recorded, so tests can check each body against the OpenSearch API specification.

Where ml-commons behaviour matters it is emulated from its source: a model zip must have
exactly one ``.onnx``/``.pt`` at the top level and a ``tokenizer.json``; deploy re-joins the
chunks and checks the SHA-256; predict tokenizes one text at a time, runs the graph and
turns *every* output into ``{tokenizer.decode([i], skip_special_tokens=True): weight}`` over
its non-zero entries (SparseEncodingTranslator); neural_sparse scores the field with one
linear feature clause per token (what neural-search builds), here as rank_feature clauses.

Inputs are fed BY NAME, as on a real node. Sources, at release tags:

* opensearch-project/ml-commons 2.19.1.0 and 3.1.0.0,
  ``ml-algorithms/src/main/java/org/opensearch/ml/engine/algorithms/SentenceTransformerTranslator.java``
  (extended by ``sparse_encoding/SparseEncodingTranslator.java``): ``processInput`` names the
  tensors ``input1.input_ids`` and ``input1.attention_mask``; ``Batchifier.STACK``.
* deepjavalibrary/djl ``api/src/main/java/ai/djl/translate/StackBatchifier.java``: stacking
  a batch of one gives shape (1, seq) and keeps each tensor's name.
* deepjavalibrary/djl
  ``engines/onnxruntime/onnxruntime-engine/src/main/java/ai/djl/onnxruntime/engine/OrtSymbolBlock.java``
  ``forwardInternal``: a count mismatch is "Input mismatch, looking for: [...]"; named
  tensors go to the session under their names, and a name that is not a graph input throws
  "Invalid input tensor name: <name>" (the deploy warm-up then fails: DEPLOY_FAILED).
* ml-commons 2.19.1.0 ``plugin/.../breaker/MemoryCircuitBreaker.java``: the JVM heap
  breaker's message is "Memory Circuit Breaker is open, please check your resources!"
  (``heap_used_percent`` lets a test open it).
* ml-commons 2.19.1.0 / 3.1.0.0 ``plugin/.../breaker/DiskCircuitBreaker.java`` ("Disk Circuit
  Breaker"): open while the data path has less free space than
  ``plugins.ml_commons.disk_free_space_threshold`` (5 GB by default); ``MLCircuitBreakerService``
  checks the memory breaker first, then the disk one (``disk_free_bytes`` opens it; the node
  reports the space in ``_nodes/stats/fs``).
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import threading
import uuid
import zipfile
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import numpy as np
from d2s_dash_mustache import render  # loaded by conftest.py under this name
from d2s_os_plugins import PluginStandIn  # likewise

LOCAL_FILE = "plugins.ml_commons.allow_registering_model_via_local_file"
VIA_URL = "plugins.ml_commons.allow_registering_model_via_url"
TRANSLATOR_INPUTS = ("input1.input_ids", "input1.attention_mask")
ML_DEFAULTS = {
    "plugins.ml_commons.only_run_on_ml_node": "true",
    "plugins.ml_commons.allow_registering_model_via_local_file": "false",
    "plugins.ml_commons.allow_registering_model_via_url": "false",
    "plugins.ml_commons.native_memory_threshold": "90",
    "plugins.ml_commons.jvm_heap_memory_threshold": "85",
    "plugins.ml_commons.disk_free_space_threshold": "5gb",
}
GB = 1024**3


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes


@dataclass
class FakeModel:
    meta: dict[str, Any]
    state: str = "REGISTERING"
    chunks: dict[int, bytes] = field(default_factory=dict)
    content: bytes | None = None
    runner: Any = None


class _ModelRunner:
    """ml-commons' SparseEncodingTranslator, in Python."""

    def __init__(self, zip_bytes: bytes) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        with zipfile.ZipFile(io.BytesIO(zip_bytes)) as zf:
            names = zf.namelist()
            top = [n for n in names if "/" not in n]
            models = [n for n in top if n.endswith((".onnx", ".pt"))]
            if len(models) != 1:
                raise ValueError("found multiple models" if models else "no model file in the zip")
            if "tokenizer.json" not in top:
                raise ValueError("no tokenizer.json at the top of the zip")
            self.tokenizer = Tokenizer.from_str(zf.read("tokenizer.json").decode("utf-8"))
            self.session = ort.InferenceSession(zf.read(models[0]), providers=["CPUExecutionProvider"])
        self.tokenizer.no_padding()  # optPadding(true) pads a batch of one to itself

    def encode(self, text: str) -> list[dict[str, float]]:
        enc = self.tokenizer.encode(text)
        # SentenceTransformerTranslator.processInput + StackBatchifier: named, shape (1, seq)
        named = [(TRANSLATOR_INPUTS[0], np.asarray([enc.ids], dtype=np.int64)),
                 (TRANSLATOR_INPUTS[1], np.asarray([enc.attention_mask], dtype=np.int64))]
        graph_inputs = [i.name for i in self.session.get_inputs()]
        # OrtSymbolBlock.forwardInternal
        if len(named) != len(graph_inputs):
            raise ValueError(f"Input mismatch, looking for: [{', '.join(graph_inputs)}]")
        feeds = {}
        for name, array in named:
            if name not in graph_inputs:
                raise ValueError(f"Invalid input tensor name: {name}")
            feeds[name] = array
        outputs = []
        for array in self.session.run(None, feeds):
            row = np.asarray(array)[0]
            tokens: dict[str, float] = {}
            for index in np.flatnonzero(row).tolist():
                token = self.tokenizer.decode([index], skip_special_tokens=True)
                if token:
                    tokens[token] = float(row[index])
            outputs.append(tokens)
        return outputs


class FakeCluster:
    def __init__(self, osmem_url: str, *, ml_enabled: bool = True, task_polls: int = 2,
                 settings: dict[str, Any] | None = None, auth: tuple[str, str] | None = None,
                 forbidden: dict[str, str] | None = None, heap_used_percent: int = 40,
                 version: str = "2.19.1", heap_max_bytes: int = 1024**3, serverless: bool = False,
                 disk_free_bytes: int = 50 * GB) -> None:
        self.osmem = httpx.Client(base_url=osmem_url, timeout=30.0)
        self.plugins = PluginStandIn(osmem_url, version, serverless=serverless)
        self.serverless = serverless
        self.ml_enabled = ml_enabled
        self.task_polls = task_polls
        self.settings: dict[str, Any] = dict(settings or {})
        self.auth = auth
        # path regex -> security action: answered 403 like the security plugin does for a
        # user whose roles lack that action
        self.forbidden = dict(forbidden or {})
        self.heap_used_percent = heap_used_percent
        self.version = version
        self.heap_max_bytes = heap_max_bytes
        self.disk_free_bytes = disk_free_bytes
        self.requests: list[Recorded] = []
        self.groups: dict[str, str] = {}
        self.models: dict[str, FakeModel] = {}
        self.tasks: dict[str, dict[str, Any]] = {}
        self.scripts: dict[str, dict[str, Any]] = {}
        self.files: dict[str, bytes] = {}  # served at /files/<name>, for URL registration
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                fake._handle(self)

            do_POST = do_PUT = do_DELETE = do_HEAD = do_GET

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.osmem.close()

    # -- plumbing ---------------------------------------------------------------------

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(h.path)
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        rec = Recorded(h.command, parts.path, parse_qs(parts.query), {k.lower(): v for k, v in h.headers.items()}, body)
        if not parts.path.startswith("/files/"):
            with self.lock:
                self.requests.append(rec)
        if self.auth and not parts.path.startswith("/files/"):
            import base64

            want = "Basic " + base64.b64encode(f"{self.auth[0]}:{self.auth[1]}".encode()).decode()
            if h.headers.get("Authorization") != want:
                return self._send(h, 401, {"error": {"root_cause": [{"type": "security_exception",
                                  "reason": "missing authentication credentials"}]}, "status": 401})
        for pattern, action in self.forbidden.items():
            if re.fullmatch(pattern, parts.path):
                reason = f"no permissions for [{action}] and User [name=reader, backend_roles=[], requestedTenant=null]"
                return self._send(h, 403, _error("security_exception", reason, 403))
        try:
            status, payload = self._route(rec, parts.query)
        except _Refused as exc:
            status, payload = exc.status, _error(exc.kind, exc.reason, exc.status)
        self._send(h, status, payload)

    def _send(self, h: BaseHTTPRequestHandler, status: int, payload: Any) -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/octet-stream" if isinstance(payload, bytes) else "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(data)

    def _json(self, rec: Recorded) -> Any:
        try:
            return json.loads(rec.body or b"{}")
        except ValueError:
            raise _Refused(400, "parse_exception", "request body is not JSON") from None

    def _route(self, rec: Recorded, query: str) -> tuple[int, Any]:
        path, method = rec.path, rec.method
        if self.serverless:
            answered = self.plugins(method, path + (f"?{query}" if query else ""), rec.body)
            if answered is not None:
                return answered
        if path == "/" and method == "GET":
            return 200, {"name": "fake-node", "cluster_name": "fake", "tagline": "The OpenSearch Project: https://opensearch.org/",
                         "version": {"distribution": "opensearch", "number": self.version, "build_type": "tar",
                                     "lucene_version": "9.12.1", "minimum_wire_compatibility_version": "7.10.0"}}
        if path.startswith("/files/") and method == "GET":
            name = path.removeprefix("/files/")
            return (200, self.files[name]) if name in self.files else (404, {"error": "not found"})
        if path.startswith("/_plugins/_ml"):
            if not self.ml_enabled:
                return 400, {"error": f"no handler found for uri [{path}] and method [{method}]"}
            return self._ml(rec)
        if path == "/_cat/plugins" and method == "GET":
            components = ["opensearch-knn", "opensearch-neural-search", "opensearch-security"]
            components += ["opensearch-ml"] if self.ml_enabled else []
            return 200, [{"name": "fake-node", "component": c, "version": self.version + ".0"} for c in components]
        if path == "/_nodes/stats/jvm" and method == "GET":
            mem = {"heap_used_in_bytes": self.heap_max_bytes * self.heap_used_percent // 100,
                   "heap_used_percent": self.heap_used_percent, "heap_max_in_bytes": self.heap_max_bytes}
            return 200, {"_nodes": {"total": 1, "successful": 1, "failed": 0}, "cluster_name": "fake",
                         "nodes": {"n1": {"name": "fake-node", "jvm": {"mem": mem}}}}
        if path == "/_nodes/stats/fs" and method == "GET":
            fs = {"total": {"total_in_bytes": 100 * GB, "free_in_bytes": self.disk_free_bytes,
                            "available_in_bytes": self.disk_free_bytes}}
            return 200, {"_nodes": {"total": 1, "successful": 1, "failed": 0}, "cluster_name": "fake",
                         "nodes": {"n1": {"name": "fake-node", "fs": fs}}}
        if path == "/_cluster/settings" and method == "GET":
            status, body = self._forward(method, path, b"", query)
            if status == 200:
                if self.ml_enabled:  # ml-commons 2.19.1.0 plugin/.../settings/MLCommonsSettings.java defaults
                    body.setdefault("defaults", {}).update(ML_DEFAULTS)
                body.setdefault("persistent", {}).update({k: str(v).lower() if isinstance(v, bool) else str(v)
                                                          for k, v in self.settings.items()})
            return status, body
        if path == "/_cluster/settings" and method == "PUT":
            body = self._json(rec)
            self.settings.update(body.get("persistent", {}))
            return 200, {"acknowledged": True, "persistent": body.get("persistent", {}), "transient": {}}
        m = re.fullmatch(r"/_scripts/([^/]+)", path)
        if m and method == "PUT":
            script = self._json(rec)["script"]
            self.scripts[m.group(1)] = script
            return 200, {"acknowledged": True}
        m = re.fullmatch(r"/([^/_][^/]*)/_search/template", path)
        if m and method in ("GET", "POST"):
            body = self._json(rec)
            script = self.scripts.get(body.get("id", ""))
            if script is None:
                raise _Refused(404, "resource_not_found_exception", f"unable to find script [{body.get('id')}]")
            rendered = json.loads(render(script["source"], body.get("params", {})))
            return self._forward("POST", f"/{m.group(1)}/_search", json.dumps(rendered).encode(), "")
        if b'"query_text"' not in rec.body:
            answered = self.plugins(method, path + (f"?{query}" if query else ""), rec.body)
            if answered is not None:
                return answered
        if path.endswith("/_search") and b'"neural_sparse"' in rec.body:
            rewritten = self._rewrite_neural(self._json(rec))
            return self._forward(method, path, json.dumps(rewritten).encode(), query)
        return self._forward(method, path, rec.body, query, rec.headers.get("content-type"))

    def _forward(self, method: str, path: str, body: bytes, query: str, ctype: str | None = "application/json"):
        resp = self.osmem.request(method, path + (f"?{query}" if query else ""), content=body or None,
                                  headers={"Content-Type": ctype or "application/json"})
        try:
            return resp.status_code, resp.json() if resp.content else {}
        except ValueError:
            return resp.status_code, {"error": resp.text}

    # -- neural_sparse ----------------------------------------------------------------

    def _rewrite_neural(self, node: Any) -> Any:
        if isinstance(node, list):
            return [self._rewrite_neural(x) for x in node]
        if not isinstance(node, dict):
            return node
        if set(node) == {"neural_sparse"}:
            ((field_name, spec),) = node["neural_sparse"].items()
            if "query_text" in spec:
                model = self.models.get(spec.get("model_id", ""))
                if model is None or model.state != "DEPLOYED":
                    raise _Refused(400, "illegal_argument_exception", "Model not ready yet. Please deploy the model first.")
                tokens = model.runner.encode(spec["query_text"])[0]  # neural-search takes the first tensor
            else:
                tokens = spec["query_tokens"]
            for token in tokens:
                assert "." not in token, f"token {token!r} cannot be a rank_features key"
            clauses = [{"rank_feature": {"field": f"{field_name}.{t}", "linear": {}, "boost": w}}
                       for t, w in tokens.items() if w > 0]
            return {"bool": {"should": clauses}}
        return {k: self._rewrite_neural(v) for k, v in node.items()}

    # -- ml-commons -------------------------------------------------------------------

    def _heap_breaker(self) -> None:
        threshold = int(self.settings.get("plugins.ml_commons.jvm_heap_memory_threshold", 85))
        if threshold < 100 and self.heap_used_percent > threshold:  # MemoryCircuitBreaker.isOpen
            raise _Refused(429, "circuit_breaking_exception",
                           "Memory Circuit Breaker is open, please check your resources!")
        if self.disk_free_bytes < 5 * GB:  # DiskCircuitBreaker.isOpen, the default threshold
            raise _Refused(429, "circuit_breaking_exception",
                           "Disk Circuit Breaker is open, please check your resources!")

    def _ml(self, rec: Recorded) -> tuple[int, Any]:
        path, method = rec.path.removeprefix("/_plugins/_ml"), rec.method
        if re.fullmatch(r"/models/[^/]+/_deploy|/_predict/.*|/models/_register(_meta)?", path):
            self._heap_breaker()
        if path == "/model_groups/_register" and method == "POST":
            name = self._json(rec)["name"]
            for gid, gname in self.groups.items():
                if gname == name:
                    raise _Refused(400, "illegal_argument_exception",
                                   f"The name you provided is already being used by a model group with ID: {gid}.")
            gid = uuid.uuid4().hex[:20]
            self.groups[gid] = name
            return 200, {"model_group_id": gid, "status": "CREATED"}
        if path == "/model_groups/_search" and method in ("GET", "POST"):
            name = _term_name(self._json(rec))
            hits = [{"_id": g, "_source": {"name": n}} for g, n in self.groups.items() if n == name]
            return 200, {"hits": {"hits": hits}}
        if path == "/models/_register_meta" and method == "POST":
            if not self.settings.get(LOCAL_FILE):
                raise _Refused(400, "illegal_argument_exception",
                               "To upload custom model from local file, user needs to enable "
                               "allow_registering_model_via_local_file settings. Otherwise please use "
                               "opensearch pre-trained models.")
            meta = self._check_meta(self._json(rec), need=("total_chunks",))
            model_id = uuid.uuid4().hex[:20]
            self.models[model_id] = FakeModel(meta=meta)
            return 200, {"model_id": model_id, "status": "CREATED"}
        m = re.fullmatch(r"/models/([^/]+)/upload_chunk/(\d+)", path)
        if m and method == "POST":
            model = self._model(m.group(1))
            n, total = int(m.group(2)), int(model.meta["total_chunks"])
            if n >= total:
                raise _Refused(400, "illegal_argument_exception", "Exceeds total number of chunks")
            if not rec.body or len(rec.body) > 10_000_000:
                raise _Refused(400, "illegal_argument_exception", "Chunk size either 0 or exceeds 10MB")
            model.chunks[n] = rec.body
            if len(model.chunks) == total:
                model.state = "REGISTERED"
            return 200, {"status": "Uploaded"}
        if path == "/models/_register" and method == "POST":
            if not self.settings.get(VIA_URL):
                raise _Refused(400, "illegal_argument_exception",
                               "To upload custom model user needs to enable allow_registering_model_via_url settings.")
            meta = self._check_meta(self._json(rec), need=("url",))
            model_id = uuid.uuid4().hex[:20]
            model = self.models[model_id] = FakeModel(meta=meta)
            task = self._task("REGISTER_MODEL", model_id)
            try:
                data = httpx.get(meta["url"], timeout=30).raise_for_status().content
                model.chunks = {0: data}
                model.state = "REGISTERED"
            except httpx.HTTPError as exc:
                task["fail"] = f"cannot download {meta['url']}: {exc}"
            return 200, {"task_id": task["id"], "status": "CREATED"}
        m = re.fullmatch(r"/models/([^/]+)/_deploy", path)
        if m and method == "POST":
            model = self._model(m.group(1))
            task = self._task("DEPLOY_MODEL", m.group(1))
            content = b"".join(model.chunks[i] for i in sorted(model.chunks))
            if hashlib.sha256(content).hexdigest() != model.meta["model_content_hash_value"]:
                task["fail"] = "model content changed"
            else:
                try:
                    model.runner = _ModelRunner(content)
                    model.runner.encode("warm up sentence")  # what TextEmbeddingModel.warmUp sends
                    task["on_done"] = lambda: setattr(model, "state", "DEPLOYED")
                    model.state = "DEPLOYING"
                except Exception as exc:  # noqa: BLE001 -- the task reports it
                    task["fail"] = f"Failed to deploy model: {exc}"
            return 200, {"task_id": task["id"], "task_type": "DEPLOY_MODEL", "status": "CREATED"}
        m = re.fullmatch(r"/tasks/([^/]+)", path)
        if m and method == "GET":
            return 200, self._poll(m.group(1))
        if path == "/models/_search" and method in ("GET", "POST"):
            name = _term_name(self._json(rec))
            hits = [{"_id": mid, "_source": {**{k: v for k, v in mod.meta.items()}, "model_state": mod.state}}
                    for mid, mod in self.models.items() if mod.meta["name"] == name]
            return 200, {"hits": {"hits": hits}}
        m = re.fullmatch(r"/models/([^/_][^/]*)", path)
        if m and method == "GET":
            model = self._model(m.group(1))
            return 200, {**model.meta, "model_state": model.state}
        m = re.fullmatch(r"/_predict/sparse_encoding/([^/]+)", path)
        if m and method == "POST":
            model = self._model(m.group(1))
            if model.state != "DEPLOYED":
                raise _Refused(400, "illegal_argument_exception", "Model not ready yet. Please deploy the model first.")
            results = []
            for text in self._json(rec)["text_docs"]:
                tensors = model.runner.encode(text)
                results.append({"output": [{"name": f"output{i}", "dataAsMap": {"response": [t]}}
                                           for i, t in enumerate(tensors)]})
            return 200, {"inference_results": results}
        return 400, {"error": f"no handler found for uri [{rec.path}] and method [{method}]"}

    def _check_meta(self, meta: dict[str, Any], need: tuple[str, ...]) -> dict[str, Any]:
        # What MLRegisterModel(Meta)Input and TextEmbeddingModelConfig insist on.
        for key in ("name", "model_format", "model_content_hash_value", "model_config", *need):
            if key not in meta:
                raise _Refused(400, "illegal_argument_exception", f"{key} is null")
        if meta["model_format"] not in ("ONNX", "TORCH_SCRIPT"):
            raise _Refused(400, "illegal_argument_exception", "Wrong model format")
        if meta.get("function_name") != "SPARSE_ENCODING":
            raise _Refused(400, "illegal_argument_exception", "expected function_name SPARSE_ENCODING")
        config = meta["model_config"]
        if config.get("embedding_dimension") is None:
            raise _Refused(400, "illegal_argument_exception", "embedding dimension is null")
        if str(config.get("framework_type", "")).upper() not in ("HUGGINGFACE_TRANSFORMERS", "SENTENCE_TRANSFORMERS"):
            raise _Refused(400, "illegal_argument_exception", "Wrong framework type")
        if meta.get("model_group_id") not in self.groups:
            raise _Refused(404, "status_exception", "Failed to find model group")
        return meta

    def _model(self, model_id: str) -> FakeModel:
        if model_id not in self.models:
            raise _Refused(404, "status_exception", "Failed to find model")
        return self.models[model_id]

    def _task(self, kind: str, model_id: str) -> dict[str, Any]:
        task = {"id": uuid.uuid4().hex[:20], "task_type": kind, "model_id": model_id, "polls": 0}
        self.tasks[task["id"]] = task
        return task

    def _poll(self, task_id: str) -> dict[str, Any]:
        if task_id not in self.tasks:
            raise _Refused(404, "status_exception", "Failed to find task")
        task = self.tasks[task_id]
        task["polls"] += 1
        out = {"model_id": task["model_id"], "task_type": task["task_type"], "function_name": "SPARSE_ENCODING",
               "is_async": True}
        if task["polls"] < self.task_polls:
            return out | {"state": "CREATED" if task["polls"] == 1 else "RUNNING"}
        if "fail" in task:
            self.models[task["model_id"]].state = "DEPLOY_FAILED" if task["task_type"] == "DEPLOY_MODEL" else "REGISTER_FAILED"
            return out | {"state": "FAILED", "error": task["fail"]}
        if "on_done" in task:
            task.pop("on_done")()
        return out | {"state": "COMPLETED"}


class _Refused(Exception):
    def __init__(self, status: int, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.status, self.kind, self.reason = status, kind, reason


def _error(kind: str, reason: str, status: int) -> dict[str, Any]:
    return {"error": {"root_cause": [{"type": kind, "reason": reason}], "type": kind, "reason": reason}, "status": status}


def _term_name(body: dict[str, Any]) -> str | None:
    text = json.dumps(body)
    m = re.search(r'"name\.keyword": "([^"]*)"', text)
    return m.group(1) if m else None
