"""File names as text that every store and every output can take, without losing a byte.

POSIX file names are bytes; Python shows the ones that are not UTF-8 with lone surrogates
(``b"bad\\xff.jpg"`` -> ``"bad\\udcff.jpg"``), which SQLite, JSON bodies and terminals refuse.
``path_to_text`` turns each such byte into the four characters ``\\xff``, so the stored path
is valid UTF-8 and is also the escaped form shown to users; ``text_to_path`` gives back the
exact name to open. A backslash is doubled only where it would otherwise read as an escape
(before another backslash or an ``x``), so every ordinary path is stored unchanged.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_ESCAPE = re.compile(r"\\(\\|x[0-9a-fA-F]{2})")


def path_to_text(path: str | os.PathLike[str] | bytes) -> str:
    """Lossless, UTF-8-encodable text for a file name (see the module docstring)."""
    raw = os.fsencode(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and "\\" not in text:
        return text  # the common case: nothing to escape
    tokens: list[str] = []  # one token per character or per undecodable byte
    position = 0
    while position < len(raw):
        try:
            chunk = raw[position:].decode("utf-8")
            tokens.extend(chunk)
            break
        except UnicodeDecodeError as exc:
            tokens.extend(raw[position : position + exc.start].decode("utf-8"))
            for byte in raw[position + exc.start : position + exc.end]:
                tokens.append(f"\\x{byte:02x}")
            position += exc.end
    out = []
    for index, token in enumerate(tokens):
        if token == "\\":
            following = tokens[index + 1] if index + 1 < len(tokens) else ""
            out.append("\\\\" if following[:1] in ("\\", "x") and following else "\\")
        else:
            out.append(token)
    return "".join(out)


def text_to_path(text: str) -> str:
    """The file name ``path_to_text`` was given (undecodable bytes as surrogate escapes)."""
    if "\\" not in text:
        return text
    raw = bytearray()
    position = 0
    for match in _ESCAPE.finditer(text):
        raw += text[position : match.start()].encode("utf-8", "surrogateescape")
        escape = match.group(1)
        raw += b"\\" if escape == "\\" else bytes([int(escape[1:], 16)])
        position = match.end()
    raw += text[position:].encode("utf-8", "surrogateescape")
    return os.fsdecode(bytes(raw))


def stored_path(text: str) -> Path:
    """``Path`` to open for a path read back from an index."""
    return Path(text_to_path(text))
