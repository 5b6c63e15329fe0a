"""A query picture given by http(s) URL: fetched with a timeout and the size cap ``serve``
applies to uploads, only when the server says it is an image; any failure is one line."""

from __future__ import annotations

import time

from .errors import QueryImageError
from .images import QUERY_MAX_BYTES
from .redact import one_line, strip_url_credentials

TIMEOUT_SECONDS = 10.0  # connect, and each read
DEADLINE_SECONDS = 30.0  # the whole download: a server dripping bytes does not hold the query
MAX_REDIRECTS = 5


def is_url(text: str) -> bool:
    return text[:8].lower().startswith(("http://", "https://"))


def fetch_image(url: str, max_bytes: int = QUERY_MAX_BYTES, timeout: float | None = None,
                deadline: float | None = None, as_what: str = "a query") -> bytes:
    """The body of ``url``: an answer 200 with an ``image/*`` content type, at most
    ``max_bytes`` (refused from ``Content-Length`` before reading, else counted while read).
    ``as_what`` names the use in messages ("cannot use URL as a query: ...")."""
    import httpx

    timeout = TIMEOUT_SECONDS if timeout is None else timeout
    deadline = DEADLINE_SECONDS if deadline is None else deadline

    shown = strip_url_credentials(url)

    def failed(reason: str) -> QueryImageError:
        return QueryImageError(one_line(f"cannot use {shown} as {as_what}: {reason}"))

    limit = f"over the {max_bytes / 2**20:.0f} MiB limit for {'a query picture' if as_what == 'a query' else as_what}"
    started = time.monotonic()
    try:
        with httpx.Client(timeout=timeout, follow_redirects=True, max_redirects=MAX_REDIRECTS) as client, \
                client.stream("GET", url, headers={"Accept": "image/*"}) as reply:
            if reply.status_code != 200:
                raise failed(f"the server answered {reply.status_code} {reply.reason_phrase}".rstrip())
            kind = reply.headers.get("content-type", "").split(";")[0].strip().lower()
            if not kind.startswith("image/"):
                raise failed(f"not a picture (content type {kind or 'not given'})")
            declared = reply.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > max_bytes:
                raise failed(f"{int(declared) / 2**20:.0f} MiB, {limit}")
            data = bytearray()
            for chunk in reply.iter_bytes():
                data += chunk
                if len(data) > max_bytes:
                    raise failed(limit)
                if time.monotonic() - started > deadline:
                    raise failed(f"the download took over {deadline:g} s")
    except httpx.TooManyRedirects:
        raise failed(f"more than {MAX_REDIRECTS} redirects") from None
    except httpx.TimeoutException:
        raise failed(f"no answer within {timeout:g} s") from None
    except httpx.InvalidURL as exc:
        raise failed(f"not a valid URL ({exc})") from None
    except httpx.HTTPError as exc:
        raise failed(f"{type(exc).__name__}: {exc}") from None
    if not data:
        raise failed("the server sent an empty body")
    return bytes(data)
