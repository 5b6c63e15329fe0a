"""Request bodies with a hard size cap, enforced before and while they are read.

FastAPI parses a multipart upload completely (spooling it to a temp file) before the
handler can look at its size, so a 3 GiB body would land in /tmp before a 413. This ASGI
middleware answers 413 from ``Content-Length`` without reading anything, and for bodies
without a length (chunked) it counts while streaming and stops at the cap: the app sees
a disconnect, and its own answer is dropped in favour of the 413.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class BodyLimit:
    def __init__(self, app, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            try:
                length = int(declared)
            except ValueError:
                await self._answer(send, 400, "the Content-Length header is not a number")
                return
            if length > self.max_bytes:
                await self._answer(send, 413, self._too_large())
                return
        received = 0
        answered = False
        started = False

        async def capped_receive() -> Message:
            nonlocal received, answered
            if answered:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    answered = True
                    if not started:
                        await self._answer(send, 413, self._too_large())
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if answered:
                return  # the 413 went out already
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, capped_receive, guarded_send)
        except Exception:
            if not answered:  # a failure from the cut-off body is expected; anything else is not
                raise

    def _too_large(self) -> str:
        return f"the request is over {self.max_bytes / 2**20:.0f} MiB; send a smaller picture"

    @staticmethod
    async def _answer(send: Send, status: int, detail: str) -> None:
        body = json.dumps({"detail": detail, "field": "image" if status == 413 else None}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
