"""Which host names a loopback server answers to (the DNS-rebinding guard of ``serve`` and
``serve-images``): the name in the ``Host`` header, with IPv6 literals in brackets understood."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})  # what a Host header may name


def host_name(header: str) -> str:
    """``Host`` header -> host name without port (``[::1]:8765`` -> ``::1``), lowercased."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class AllowedHosts:
    """ASGI middleware: 400 for a ``Host`` naming anything else. Starlette's
    TrustedHostMiddleware cuts the header at the first ``:``, so it refuses ``[::1]:8000``."""

    def __init__(self, app: Callable[..., Awaitable[None]], allowed: Iterable[str]) -> None:
        self.app = app
        self.allowed = frozenset(host_name(h) for h in allowed)

    async def __call__(self, scope: MutableMapping[str, Any], receive, send) -> None:
        if scope["type"] in ("http", "websocket"):
            header = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1")
            if host_name(header) not in self.allowed:
                from starlette.responses import PlainTextResponse

                await PlainTextResponse("Invalid host header", status_code=400)(scope, receive, send)
                return
        await self.app(scope, receive, send)
