"""The local index's filter columns: every document's metadata as arrays in search-row order,
from which a :class:`~d2s_search.filters.SearchFilter` becomes one bool per row (the allow
mask the searches take), facets are counted and the library is ordered.

Read from SQLite the first time a filter, facet or browse needs them after a change (about
0.1 s per 100,000 documents), then kept with the search state's generation and the
metadata version (:mod:`.metadata_table`). Rows are matched to documents by ``seq``, the
order the search structures are cut in.
"""

from __future__ import annotations

import math
import sqlite3
from dataclasses import dataclass, field

import numpy as np

from ...filters import BUILT_IN_FIELDS, EARTH_RADIUS_M, Condition, SearchFilter, folder_prefix
from . import metadata_table
from . import paths as doc_paths

KEYWORD_KINDS = ("keyword",)
NUMBER_KINDS = ("number", "date", "boolean")  # booleans as 0 / 1
MASKS_KEPT = 16


@dataclass
class Keywords:
    codes: np.ndarray  # int32 per row, -1: none
    values: list[str]
    by_value: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.by_value = {v: i for i, v in enumerate(self.values)}

    def code_of(self, value: str) -> int:
        return self.by_value.get(value, -1)


@dataclass
class FilterColumns:
    key: tuple  # (index id, generation, metadata version) it was read at
    rows: int
    ids_rank: np.ndarray  # per row: the rank of its document id (browse's tie order)
    taken: np.ndarray  # float64 per row, NaN: none
    lat: np.ndarray
    lon: np.ndarray
    numbers: dict[str, np.ndarray] = field(default_factory=dict)  # float64 per row, NaN: none
    keywords: dict[str, Keywords] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)
    path_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # one entry per stored path
    path_folders: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # its parent folder's code
    folders: list[str] = field(default_factory=list)
    _masks: dict = field(default_factory=dict, repr=False)  # SearchFilter -> its mask, oldest first

    # -- a filter as an allow mask --------------------------------------------------------------

    def mask(self, f: SearchFilter) -> np.ndarray:
        """One bool per row: whether the document passes ``f`` (SearchFilter.allows). The last
        few are kept: a page or a user refining the words searches with the same filter again
        (a date range at 123k documents: 0.03 of a 0.3 ms search). Not to be written to."""
        kept = self._masks.get(f)
        if kept is None:
            kept = self._masks[f] = self._mask(f)
            kept.flags.writeable = False
            while len(self._masks) > MASKS_KEPT:
                self._masks.pop(next(iter(self._masks)))
        return kept

    def _mask(self, f: SearchFilter) -> np.ndarray:
        allowed = np.ones(self.rows, dtype=bool)
        with np.errstate(invalid="ignore"):  # NaN (no value) compares False, as intended
            if f.after is not None:
                allowed &= self.taken >= f.after
            if f.before is not None:
                allowed &= self.taken < f.before
            if f.folders:
                allowed &= self._in_folders(f.folders)
            if f.near is not None:
                allowed &= self._near(*f.near)
            for group in f.alternatives():
                either = np.zeros(self.rows, dtype=bool)
                for condition in group:
                    either |= self._holds(condition)
                allowed &= either
        return allowed

    def _in_folders(self, folders: tuple[str, ...]) -> np.ndarray:
        prefixes = [folder_prefix(f) for f in folders]
        # a folder of a stored path is under a filter folder when "folder/" starts with "filter/"
        wanted = [i for i, name in enumerate(self.folders) if any(folder_prefix(name).startswith(p) for p in prefixes)]
        out = np.zeros(self.rows, dtype=bool)
        if wanted:
            out[self.path_rows[np.isin(self.path_folders, np.asarray(wanted, dtype=np.int32))]] = True
        return out

    def _near(self, lat: float, lon: float, km: float) -> np.ndarray:
        p1, p2 = math.radians(lat), np.radians(self.lat)
        h = np.sin((p2 - p1) / 2) ** 2 + math.cos(p1) * np.cos(p2) * np.sin(np.radians(self.lon - lon) / 2) ** 2
        distance = 2 * EARTH_RADIUS_M * np.arcsin(np.minimum(1.0, np.sqrt(h)))
        return distance <= km * 1000  # NaN (no GPS): False

    def _holds(self, c: Condition) -> np.ndarray:
        if c.field in self.keywords:
            kw = self.keywords[c.field]
            code = kw.code_of(c.value) if isinstance(c.value, str) else -1
            same = kw.codes == code if code >= 0 else np.zeros(self.rows, dtype=bool)
            return ~same if c.op == "!=" else same if c.op == "=" else np.zeros(self.rows, dtype=bool)
        column = self.numbers.get(c.field)
        if column is None:  # no document has the field
            return np.full(self.rows, c.op == "!=")
        if isinstance(c.value, str):  # a text value against a number: nothing is equal
            return np.full(self.rows, c.op == "!=")
        v = float(c.value)
        if c.op == "=":
            return column == v
        if c.op == "!=":
            return ~(column == v)
        return {">=": column >= v, "<=": column <= v, ">": column > v, "<": column < v}[c.op]

    # -- facets and the library ----------------------------------------------------------------

    def facets(self, allowed: np.ndarray | None, size: int) -> dict[str, list[tuple[str, int]]]:
        out: dict[str, list[tuple[str, int]]] = {}
        keep = np.ones(self.path_rows.size, dtype=bool) if allowed is None else allowed[self.path_rows]
        if self.folders:
            pairs = np.unique(self.path_rows[keep] * len(self.folders) + self.path_folders[keep])  # a document once a folder
            out["folder"] = _top(np.bincount(pairs % len(self.folders), minlength=len(self.folders)), self.folders, size)
        else:
            out["folder"] = []
        for name in ["camera", *sorted(n for n, t in self.types.items() if t in ("keyword", "boolean"))]:
            if name in self.keywords:
                kw = self.keywords[name]
                codes = kw.codes if allowed is None else kw.codes[allowed]
                codes = codes[codes >= 0]
                out[name] = _top(np.bincount(codes, minlength=len(kw.values)), kw.values, size)
            elif name in self.numbers:  # a boolean field
                column = self.numbers[name] if allowed is None else self.numbers[name][allowed]
                counts = np.array([int(np.sum(column == 0)), int(np.sum(column == 1))])
                out[name] = _top(counts, ["false", "true"], size)
            else:
                out[name] = []
        return out

    def browse_order(self, allowed: np.ndarray | None, k: int, offset: int) -> np.ndarray:
        """Rows of the k pictures after ``offset`` in library order: taken most recently first,
        undated last, then by document id."""
        rows = np.arange(self.rows) if allowed is None else np.flatnonzero(allowed)
        taken = self.taken[rows]
        undated = np.isnan(taken)
        order = np.lexsort((self.ids_rank[rows], -np.where(undated, 0.0, taken), undated))
        return rows[order[offset:offset + k]]


def _top(counts: np.ndarray, values: list[str], size: int) -> list[tuple[str, int]]:
    nonzero = [(values[i], int(c)) for i, c in enumerate(counts.tolist()) if c > 0]
    nonzero.sort(key=lambda vc: (-vc[1], vc[0]))
    return nonzero[:size]


def load(db: sqlite3.Connection, seqs: np.ndarray, key: tuple) -> FilterColumns:
    """The columns of the documents whose ``seq`` are ``seqs`` (the search rows, ascending)."""
    n = int(seqs.size)
    types = metadata_table.field_types(db)
    has_meta = metadata_table.has_table(db)
    select = ("SELECT d.seq, d.id, d.width, d.height, d.size_bytes, d.path"
              + (", m.taken_at, m.camera, m.lat, m.lon, m.fields FROM docs d LEFT JOIN metadata m ON m.id = d.id"
                 if has_meta else " FROM docs d") + " ORDER BY d.seq")
    records = db.execute(select).fetchall()
    found = np.fromiter((r[0] for r in records), dtype=np.int64, count=len(records))
    at = np.searchsorted(seqs, found)
    ok = (at < n) & (seqs[np.minimum(at, max(n - 1, 0))] == found) if n else np.zeros(found.size, dtype=bool)
    row_of_record = np.where(ok, at, -1)

    nan = np.full(n, np.nan)
    taken, lat, lon = nan.copy(), nan.copy(), nan.copy()
    numbers = {name: nan.copy() for name in ("width", "height", "size_bytes")}
    ids = [""] * n
    keyword_values: dict[str, dict[str, int]] = {"camera": {}}
    keyword_codes: dict[str, np.ndarray] = {"camera": np.full(n, -1, dtype=np.int32)}
    for name, kind in types.items():
        if kind in KEYWORD_KINDS:
            keyword_values[name], keyword_codes[name] = {}, np.full(n, -1, dtype=np.int32)
        else:
            numbers[name] = nan.copy()
    for record, row in zip(records, row_of_record.tolist()):
        if row < 0:
            continue
        ids[row] = str(record[1])
        for name, value in zip(("width", "height", "size_bytes"), record[2:5]):
            if isinstance(value, (int, float)):
                numbers[name][row] = float(value)
        if not has_meta:
            continue
        m = metadata_table.from_row(*record[6:11])
        if m.taken_at is not None:
            taken[row] = m.taken_at
        if m.location is not None:
            lat[row], lon[row] = m.location
        if m.camera:
            keyword_codes["camera"][row] = keyword_values["camera"].setdefault(m.camera, len(keyword_values["camera"]))
        for name, value in m.fields.items():
            kind = types.get(name)
            if kind in KEYWORD_KINDS and isinstance(value, str):
                values = keyword_values[name]
                keyword_codes[name][row] = values.setdefault(value, len(values))
            elif kind == "boolean" and isinstance(value, bool):
                numbers[name][row] = 1.0 if value else 0.0
            elif kind in ("number", "date") and isinstance(value, float):
                numbers[name][row] = value
    numbers["taken"] = taken
    ids_rank = np.empty(n, dtype=np.int64)
    ids_rank[np.argsort(np.asarray(ids, dtype=object), kind="stable")] = np.arange(n)

    path_rows, path_folders, folder_codes = [], [], {}
    id_to_row = {ids[r]: r for r in range(n) if ids[r]}
    more = db.execute("SELECT id, path FROM copies ORDER BY rowid").fetchall() if doc_paths.has_copies(db) else []
    shown = [(row, record[5]) for record, row in zip(records, row_of_record.tolist())]  # the docs read once
    for row, path in shown + [(id_to_row.get(i, -1), p) for i, p in more]:
        if row < 0 or not isinstance(path, str):
            continue
        parent = path.rsplit("/", 1)[0] if "/" in path else ""
        path_rows.append(row)
        path_folders.append(folder_codes.setdefault(parent, len(folder_codes)))
    return FilterColumns(
        key=key, rows=n, ids_rank=ids_rank, taken=taken, lat=lat, lon=lon, numbers=numbers,
        keywords={name: Keywords(keyword_codes[name], list(keyword_values[name])) for name in keyword_codes},
        types={**BUILT_IN_FIELDS, **types}, path_rows=np.asarray(path_rows, dtype=np.int64),
        path_folders=np.asarray(path_folders, dtype=np.int32), folders=list(folder_codes),
    )
