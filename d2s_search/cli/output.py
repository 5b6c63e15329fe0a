"""How every command prints: JSON with ``--json``, plain lines otherwise.

Either way nothing a terminal would act on reaches it from a file name or a server's text:
lines pass through :func:`~d2s_search.pathtext.shown` (control characters as ``\\xNN``, which
map back to the exact name), JSON escapes them as ``\\uNNNN``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Sequence

import click

from d2s_search.pathtext import shown

# JSON itself escapes U+0000-U+001F only; the rest of what a terminal acts on, escaped alike
# (outside strings JSON holds none of these, so the text stays the same JSON value).
_JSON_UNSHOWABLE = re.compile("[\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def json_text(payload: dict, indent: int | None = 2) -> str:
    text = json.dumps(payload, indent=indent, ensure_ascii=False, default=str)
    return _JSON_UNSHOWABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def emit_json(payload: dict) -> None:
    click.echo(json_text(payload))


def echo_line(line: str, err: bool = False) -> None:
    """One human-readable line, with what a terminal would act on escaped (:func:`shown`)."""
    click.echo(shown(line), err=err)


def emit(payload: dict, as_json: bool, lines: Iterable[str]) -> None:
    """``payload`` as JSON, or the human-readable ``lines``."""
    if as_json:
        emit_json(payload)
    else:
        for line in lines:
            echo_line(line)


def fit_path(path: str, width: int, sep: str = "/") -> str:
    """``path`` in about ``width`` characters: whole folders are dropped from the left
    (shown as ``…``), the file name is never cut."""
    if len(path) <= width or sep not in path:
        return path
    head, _, name = path.rpartition(sep)
    room = width - len(name) - 2  # "…" and the separator before the name
    tail = head[-room:] if room > 0 else ""
    tail = tail[tail.index(sep):] if sep in tail else ""  # start at a folder boundary
    return f"…{tail}{sep}{name}"


def terminal_width() -> int:
    """Columns to lay text out in, found as rich finds them: ``$COLUMNS``, else the first of
    stdin, stdout and stderr that is a terminal, else 80."""
    import os

    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    for fd in (0, 1, 2):
        try:
            return os.get_terminal_size(fd).columns or 80
        except (OSError, ValueError):
            continue
    return 80


def wrap_items(items: Sequence[str], width: int, sep: str = ",") -> list[str]:
    """``items`` in lines of at most ``width`` terminal cells, ``sep`` after every item but the
    last, broken between items (an item wider than a line between its words, a word wider
    than a line folded)."""
    from rich.cells import cell_len, chop_cells

    pieces = [item + (sep if n < len(items) - 1 else "") for n, item in enumerate(items)]
    words = [word for piece in pieces for word in (piece.split(" ") if cell_len(piece) > width else [piece])]
    lines: list[str] = []
    line = ""
    for word in words:
        joined = f"{line} {word}" if line else word
        if cell_len(joined) <= width:
            line = joined
            continue
        if line:
            lines.append(line)
        *full, line = chop_cells(word, width) or [""]
        lines.extend(full)
    return [*lines, line] if line else lines


def table_lines(headers: Sequence[str], rows: Sequence[Sequence[str]], items: Sequence[Sequence[str]],
                right: Collection[int] = (), width: int = 80, min_last: int = 24) -> list[str]:
    """A borderless table, columns two spaces apart (widths in terminal cells, so wide
    characters line up): ``rows`` hold the leading columns (indexes in ``right`` right-aligned),
    ``items`` the last one, wrapped by :func:`wrap_items` into what ``width`` leaves (at least
    ``min_last``). The first line is the header."""
    from rich.cells import cell_len, set_cell_size

    lead = [list(headers[:-1]), *map(list, rows)]
    widths = [max(cell_len(row[i]) for row in lead) for i in range(len(headers) - 1)]
    room = max(min_last, width - sum(widths) - 2 * len(widths))

    def leading(row: Sequence[str]) -> str:
        return "  ".join(" " * (w - cell_len(c)) + c if i in right else set_cell_size(c, w)
                         for i, (c, w) in enumerate(zip(row, widths)))

    lines = [f"{leading(headers[:-1])}  {headers[-1]}".rstrip()]
    blank = " " * (sum(widths) + 2 * len(widths))
    for row, row_items in zip(rows, items):
        wrapped = wrap_items(row_items, room) or [""]
        lines.append(f"{leading(row)}  {wrapped[0]}".rstrip())
        lines.extend(blank + more for more in wrapped[1:])
    return lines


def print_watch_batch(batch, as_json: bool, prefix: str = "", err: bool = False) -> None:
    """One applied watch batch (``ingest --watch``, ``serve --watch``): a JSON object with the
    time on one line, or the time and its counts, each rejected file before it on stderr."""
    from datetime import datetime

    at = datetime.now().astimezone().isoformat(timespec="seconds")
    if as_json:
        click.echo(json_text({"batch": batch.to_json(), "at": at}, indent=None))
        return
    for path, reason in batch.rejected:
        echo_line(f"{prefix}rejected {path}: {reason}", err=True)
    echo_line(f"{prefix}{at[11:19]} {batch.line()}", err=err)
