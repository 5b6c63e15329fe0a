"""File names as text that every store and every output can take, without losing a byte.

POSIX file names are bytes; Python shows the ones that are not UTF-8 with lone surrogates
(``b"bad\\xff.jpg"`` -> ``"bad\\udcff.jpg"``), which SQLite, JSON bodies and terminals refuse.
``path_to_text`` turns each such byte into the four characters ``\\xff``, so the stored path
is valid UTF-8 and is also the escaped form shown to users; ``text_to_path`` gives back the
exact name to open. A backslash is doubled only where it would otherwise read as an escape
(before another backslash or an ``x``), so every ordinary path is stored unchanged.

A name may also hold characters a terminal acts on instead of showing (``ESC ] 0 ; ... BEL``
retitles it, a newline splits a line). They are valid UTF-8, so they are stored as they are
(JSON escapes them itself); :func:`shown` writes them, for human-readable output only, as
``\\xNN`` escapes of their UTF-8 bytes: the same scheme, so ``text_to_path`` still gives
back the exact name from what was shown.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_ESCAPE = re.compile(r"\\(\\|x[0-9a-fA-F]{2})")
# What a terminal acts on instead of showing: C0 controls (ESC starts a sequence, BEL ends a
# title, CR/LF move the cursor), DEL, C1 controls (U+009B is CSI to some terminals), the line
# and paragraph separators, and the bidirectional overrides that reorder the text around them.
UNSHOWABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def path_to_text(path: str | os.PathLike[str] | bytes, *, printable: bool = False) -> str:
    """Lossless, UTF-8-encodable text for a file name (see the module docstring); with
    ``printable``, also without a character a terminal would act on (see :func:`shown`)."""
    raw = os.fsencode(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and "\\" not in text and not (printable and UNSHOWABLE.search(text)):
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
    if printable:
        tokens = [
            "".join(f"\\x{b:02x}" for b in t.encode("utf-8"))
            if len(t) == 1 and UNSHOWABLE.match(t)
            else t
            for t in tokens
        ]
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


def shown(text: str) -> str:
    """``text`` (a stored path, or a line naming one) fit for a terminal: each character a
    terminal would act on becomes ``\\xNN`` escapes of its UTF-8 bytes (a newline ``\\x0a``,
    ESC ``\\x1b``), a backslash before one doubled, as :func:`path_to_text` writes undecodable
    bytes; so ``text_to_path`` maps what was shown back to the exact name. Text without such
    characters comes back unchanged (one regular-expression search)."""
    if not UNSHOWABLE.search(text):
        return text
    try:
        return path_to_text(text_to_path(text), printable=True)
    except UnicodeEncodeError:  # a lone surrogate that is no escaped byte: not a path's text
        return UNSHOWABLE.sub(
            lambda m: "".join(f"\\x{b:02x}" for b in m.group().encode("utf-8")), text
        )
