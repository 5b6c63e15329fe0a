"""Keep secrets out of everything the program prints, logs or answers.

Two nets, used by every output path (CLI errors and messages, ``--json``, the web API's
errors, log lines, error text copied from a server):

- :func:`strip_url_credentials` removes ``user:password@`` from a URL before it is shown;
- :func:`scrub` removes what looks like a credential from any text: ``Authorization``
  values, ``Basic``/``Bearer``/``ApiKey`` tokens, ``password=``/``api_key: ...`` pairs,
  user info in URLs, and every secret the program was given (:func:`remember`), also in
  its Basic-auth (base64) form. A proxy that reflects the request headers into its error
  body thus shows ``***``, not the key.
"""

from __future__ import annotations

import base64
import re
import threading
from urllib.parse import urlsplit, urlunsplit

MASK = "***"
_MIN_SECRET = 4  # shorter "secrets" would mask ordinary words

_known: set[str] = set()
_lock = threading.Lock()

_PATTERNS = (
    # Authorization: Basic dXNlcjpwYXNz / "authorization": "ApiKey abc" / authorization=...
    (re.compile(r"""(?i)((?:proxy-)?authori[sz]ation["']?\s*[:=]\s*["']?)(?:(?:basic|bearer|apikey|api-key|token|digest)\s+)?[^\s"',;}\]]+"""),
     r"\1" + MASK),
    # A bare scheme + token anywhere (echoed header values without their name).
    (re.compile(r"\b(Basic|Bearer|ApiKey|BASIC|BEARER)\s+([A-Za-z0-9+/=._~-]{8,})"), lambda m: _bare_token(m)),
    # password=..., "api_key": "...", secret: ..., token=...
    (re.compile(r"""(?i)((?:api[_-]?key|x-api-key|password|passwd|pwd|secret|(?:access[_-]?|auth[_-]?)?token)["']?\s*[:=]\s*["']?)[^\s"'&,;}\]]+"""),
     r"\1" + MASK),
    # scheme://user:password@host
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^\s/@\"']+@"), r"\1" + MASK + "@"),
)


def _bare_token(match: re.Match) -> str:
    """Mask ``Basic <base64 of user:password>`` and token-like Bearer/ApiKey values, but
    leave prose alone ("Basic settings", "bearer of news")."""
    scheme, token = match.group(1), match.group(2)
    if scheme.lower() == "basic":
        try:
            looks_secret = b":" in base64.b64decode(token + "=" * (-len(token) % 4), validate=True)
        except ValueError:
            looks_secret = False
    else:
        looks_secret = len(token) >= 12 or any(c.isdigit() for c in token)
    return f"{scheme} {MASK}" if looks_secret else match.group(0)


def remember(*secrets: str | None, user: str | None = None) -> None:
    """Secrets to mask wherever they appear; with ``user``, also the Basic-auth token of
    ``user:secret`` (what a reflecting proxy would echo)."""
    with _lock:
        for secret in secrets:
            if not secret or len(secret) < _MIN_SECRET:
                continue
            _known.add(secret)
            if user:
                _known.add(base64.b64encode(f"{user}:{secret}".encode()).decode())


def scrub(text: str) -> str:
    """``text`` with every credential-looking part replaced by ``***``."""
    if not text:
        return text
    with _lock:
        known = sorted(_known, key=len, reverse=True)
    for secret in known:
        text = text.replace(secret, MASK)
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def strip_url_credentials(url: str) -> str:
    """``https://u:p@host:9200/x?api_key=k`` -> ``https://host:9200/x?api_key=***``."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
    except ValueError:
        return scrub(url)
    if parts.username is None and parts.password is None:
        return scrub(url)
    netloc = f"[{host}]" if ":" in host else host
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is not None:
        netloc += f":{port}"
    return scrub(urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment)))


def one_line(text: str, limit: int = 300) -> str:
    """Server text fit for a message: tags dropped, whitespace collapsed, cut, scrubbed."""
    text = re.sub(r"(?is)<(script|style)\b.*?</\1>", " ", text)
    text = re.sub(r"<[^>]+>", " ", text)
    text = " ".join(text.split())
    return scrub(text)[:limit]
