"""A local stand-in for OpenSearch Dashboards' saved-objects import API, on 127.0.0.1.

It enforces what the real ``POST /api/saved_objects/_import`` does (as in Dashboards 2.x):
the ``osd-xsrf`` header, multipart form data with a ``file`` part named ``*.ndjson``, one
object per line, ``overwrite`` or a ``conflict`` error, and ``missing_references`` errors
for references that are neither in the file nor stored already. With ``auth`` set it acts
like the security plugin (401 without the right basic credentials) and files objects
under the ``securitytenant`` header. ``not_ready`` answers 503 that many times first, like
Dashboards while it starts.
"""

from __future__ import annotations

import base64
import email.parser
import email.policy
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

SUPPORTED_TYPES = {"index-pattern", "search", "visualization", "dashboard", "config", "query"}


class FakeDashboards:
    def __init__(self, *, auth: tuple[str, str] | None = None, not_ready: int = 0) -> None:
        self.auth = auth
        self.not_ready = not_ready
        self.requests: list[dict[str, Any]] = []
        self.objects: dict[tuple[str | None, str, str], dict[str, Any]] = {}  # (tenant, type, id)
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                fake._handle(self)

            do_GET = do_POST

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        parts = urlsplit(h.path)
        body = h.rfile.read(int(h.headers.get("Content-Length") or 0))
        headers = {k.lower(): v for k, v in h.headers.items()}
        self.requests.append({"method": h.command, "path": parts.path, "query": parse_qs(parts.query),
                              "headers": headers, "body": body})
        status, payload = self._route(h.command, parts.path, parse_qs(parts.query), headers, body)
        data = json.dumps(payload).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _route(self, method: str, path: str, query: dict, headers: dict, body: bytes) -> tuple[int, Any]:
        if self.not_ready > 0:
            self.not_ready -= 1
            return 503, {"statusCode": 503, "error": "Service Unavailable",
                         "message": "OpenSearch Dashboards server is not ready yet"}
        if self.auth:
            want = "Basic " + base64.b64encode(f"{self.auth[0]}:{self.auth[1]}".encode()).decode()
            if headers.get("authorization") != want:
                return 401, {"statusCode": 401, "error": "Unauthorized", "message": "Authentication required"}
        tenant = headers.get("securitytenant")
        if method == "GET" and path.startswith("/api/saved_objects/"):
            _, _, _, kind, obj_id = path.split("/", 4)
            obj = self.objects.get((tenant, kind, obj_id))
            return (200, obj) if obj else (404, {"statusCode": 404, "error": "Not Found",
                                                 "message": f"Saved object [{kind}/{obj_id}] not found"})
        if method != "POST" or path != "/api/saved_objects/_import":
            return 404, {"statusCode": 404, "error": "Not Found", "message": "Not Found"}
        if "osd-xsrf" not in headers:
            return 400, {"statusCode": 400, "error": "Bad Request", "message": "Request must contain a osd-xsrf header."}
        filename, content = _file_part(headers.get("content-type", ""), body)
        if filename is None:
            return 400, {"statusCode": 400, "error": "Bad Request", "message": "[request body.file]: expected value"}
        if not filename.endswith(".ndjson"):
            return 415, {"statusCode": 415, "error": "Unsupported Media Type",
                         "message": f"Invalid file extension {filename.rsplit('.', 1)[-1]}"}
        overwrite = query.get("overwrite", ["false"])[0] == "true"
        objects = [json.loads(line) for line in content.decode("utf-8").splitlines() if line.strip()]
        return 200, self._import(objects, tenant, overwrite)

    def _import(self, objects: list[dict[str, Any]], tenant: str | None, overwrite: bool) -> dict[str, Any]:
        errors, ok = [], []
        in_file = {(o["type"], o["id"]) for o in objects}
        for obj in objects:
            key = (tenant, obj["type"], obj["id"])
            title = obj.get("attributes", {}).get("title", "")
            if obj["type"] not in SUPPORTED_TYPES:
                errors.append({"id": obj["id"], "type": obj["type"], "title": title,
                               "error": {"type": "unsupported_type"}})
                continue
            missing = [r for r in obj.get("references", [])
                       if (r["type"], r["id"]) not in in_file and (tenant, r["type"], r["id"]) not in self.objects]
            if missing:
                errors.append({"id": obj["id"], "type": obj["type"], "title": title,
                               "error": {"type": "missing_references",
                                         "references": [{"type": r["type"], "id": r["id"]} for r in missing]}})
                continue
            if key in self.objects and not overwrite:
                errors.append({"id": obj["id"], "type": obj["type"], "title": title, "error": {"type": "conflict"}})
                continue
            ok.append(obj)
        if errors:
            return {"success": False, "successCount": 0, "errors": errors}
        for obj in ok:
            self.objects[(tenant, obj["type"], obj["id"])] = obj
        return {"success": True, "successCount": len(ok),
                "successResults": [{"type": o["type"], "id": o["id"], "meta": {"title": o["attributes"].get("title")}}
                                   for o in ok]}


def _file_part(content_type: str, body: bytes) -> tuple[str | None, bytes]:
    if not content_type.startswith("multipart/form-data"):
        return None, b""
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + body
    )
    for part in message.iter_parts():
        if part.get_param("name", header="content-disposition") == "file":
            return part.get_filename(), part.get_payload(decode=True)
    return None, b""
