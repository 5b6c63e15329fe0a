"""The identity of a local index (``meta``): what its values must look like, and how a repair
restores them from what survives a damaged ``meta`` table.

The identity is the random index id, the bundle that filled the index (fingerprint, model,
path) and the size of its dense vectors. SQLite's ``meta`` table holds it; the manifest
``d2s-index.json`` keeps a copy (written whenever the bundle is recorded), the documents
themselves say their dense size, and the search cache's header repeats the index id, the dense
size and the generation. Every value is read back as untrusted text.
"""

from __future__ import annotations

import math
import re
import sqlite3
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..base import IndexIdentity
from .store import FORMAT, MANIFEST_NAME

INDEX_ID = re.compile(r"[0-9a-f]{32}")  # uuid4().hex, as written at creation
ANY_FORMAT = re.compile(r"d2s-local/[0-9]{1,6}")  # this or another version's format
MAX_DIM = 1 << 16
# Set when a repair could not establish the bundle: the index then refuses to be tied to a
# bundle nobody named (even while it holds no documents).
BUNDLE_UNKNOWN = "bundle_unknown"
BUNDLE_KEYS = ("bundle_fingerprint", "bundle_model", "bundle_path")


def shown(value: str) -> str:
    """A stored value as it may be printed: escaped, cut short."""
    return repr(value[:40] + ("…" if len(value) > 40 else ""))


def count(value: str | None) -> int | None:
    """A non-negative counter (generation, mutations) or None when it is not one."""
    if value is None or not value.isascii() or not value.isdigit() or len(value) > 18:
        return None
    return int(value)


def dim(value: str | None) -> int | None:
    n = count(value)
    return n if n is not None and 0 < n <= MAX_DIM else None


def timestamp(value: str | None) -> float | None:
    try:
        t = float(value) if value is not None and len(value) < 40 else None
    except ValueError:
        return None
    return t if t is not None and math.isfinite(t) and t >= 0 else None


def fingerprint(value: str | None) -> str | None:
    ok = value is not None and 0 < len(value) <= 128 and value.isascii() and value.isprintable()
    return value if ok else None


def problems(meta: Mapping[str, str]) -> dict[str, str]:
    """key -> why its value cannot be used, for every value in ``meta`` that is present but
    not what this package writes (a missing key is not a problem here)."""
    found: dict[str, str] = {}
    if "index_id" in meta and not INDEX_ID.fullmatch(meta["index_id"]):
        found["index_id"] = f"index_id is {shown(meta['index_id'])}, not an index id"
    if "format" in meta and not ANY_FORMAT.fullmatch(meta["format"]):
        found["format"] = f"format is {shown(meta['format'])}, not an index format"
    for key in ("generation", "mutations"):
        if key in meta and count(meta[key]) is None:
            found[key] = f"{key} is {shown(meta[key])}, not a counter"
    if "dense_dim" in meta and dim(meta["dense_dim"]) is None:
        found["dense_dim"] = f"dense_dim is {shown(meta['dense_dim'])}, not a vector size"
    for key in ("created_at", "last_ingest_at"):
        if key in meta and timestamp(meta[key]) is None:
            found[key] = f"{key} is {shown(meta[key])}, not a time"
    if "bundle_fingerprint" in meta and fingerprint(meta["bundle_fingerprint"]) is None:
        found["bundle_fingerprint"] = (
            f"bundle_fingerprint is {shown(meta['bundle_fingerprint'])}, not a fingerprint"
        )
    if (
        "bundle_fingerprint" in meta
        and "bundle_fingerprint" not in found
        and "dense_dim" not in meta
    ):
        found["dense_dim"] = "dense_dim is missing beside the bundle's fingerprint"
    return found


def recorded_bundle(meta: Mapping[str, str]) -> IndexIdentity | None:
    """The bundle ``meta`` records (None: none, or values that cannot be used)."""
    fp, size = fingerprint(meta.get("bundle_fingerprint")), dim(meta.get("dense_dim"))
    if fp is None or size is None:
        return None
    return IndexIdentity(fp, size, meta.get("bundle_model", ""), meta.get("bundle_path", ""))


def manifest_bundle(manifest: Mapping) -> IndexIdentity | None:
    """The bundle the manifest records (None: none, or not in the form this package writes)."""
    body = manifest.get("bundle")
    if not isinstance(body, dict):
        return None
    fp, size = body.get("fingerprint"), body.get("dense_dim")
    model, path = body.get("model", ""), body.get("path", "")
    if (
        not isinstance(fp, str)
        or fingerprint(fp) is None
        or type(size) is not int
        or not 0 < size <= MAX_DIM
    ):
        return None
    if not isinstance(model, str) or not isinstance(path, str):
        return None
    return IndexIdentity(fp, size, model, path)


def manifest_index_id(manifest: Mapping) -> str | None:
    value = manifest.get("index_id")
    return value if isinstance(value, str) and INDEX_ID.fullmatch(value) else None


def row_dims(db: sqlite3.Connection) -> dict[int, int]:
    """Dense size -> how many documents store vectors of that size (whole float32s only)."""
    out: dict[int, int] = {}
    for length, n in db.execute("SELECT LENGTH(dense), COUNT(*) FROM docs GROUP BY LENGTH(dense)"):
        if isinstance(length, int) and length > 0 and length % 4 == 0:
            out[length // 4] = out.get(length // 4, 0) + int(n)
    return out


def majority(dims: Mapping[int, int]) -> int | None:
    """The dense size most documents have (None: no document has a usable one)."""
    return max(dims, key=lambda d: (dims[d], -d)) if dims else None


@dataclass
class Cached:
    """What the search cache's header says of the index (read before a repair rewrites it)."""

    index_id: str
    generation: int
    mutations: int
    dim: int


@dataclass
class Plan:
    """What is wrong with the identity ``meta`` holds, and what a repair writes instead."""

    problems: list[str] = field(default_factory=list)  # for `index check`
    set: dict[str, str] = field(default_factory=dict)
    remove: list[str] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)  # what a repair did, and from what
    unresolved: list[str] = field(default_factory=list)  # what a repair cannot establish
    dense_dim: int | None = None  # the index's dense size once the plan is applied (None: unknown)

    @property
    def changes(self) -> bool:
        return bool(self.set or self.remove)


def plan(
    meta: Mapping[str, str],
    manifest: Mapping,
    dims: Mapping[int, int],
    cached: Cached | None,
    documents: int,
) -> Plan:
    """Compare the identity in ``meta`` with what survives elsewhere: the manifest, the
    documents' dense sizes (``dims``, from :func:`row_dims`) and the cache's header."""
    out = Plan()
    bad = problems(meta)
    out.problems.extend(f"meta: {why}" for why in bad.values())
    ok = {k: v for k, v in meta.items() if k not in bad}
    index_id = _plan_index_id(out, meta, ok, manifest, cached)
    if "format" in bad:
        out.set["format"] = FORMAT
        out.restored.append(f"format {FORMAT}")
    cache_dim = (
        cached.dim if cached is not None and cached.index_id == index_id and cached.dim else None
    )
    _plan_bundle(out, meta, ok, manifest_bundle(manifest), dims, cache_dim, documents)
    for key in ("created_at", "last_ingest_at"):
        if key in bad:
            out.remove.append(key)
            out.restored.append(f"{key} dropped (not a time)")
    counters = [key for key in ("generation", "mutations") if key in bad]
    if counters:
        out.restored.append(f"{' and '.join(counters)} past the search cache's")
    if (
        out.changes or counters
    ):  # a new generation no cache anywhere can claim, and no cache extends across it
        generation, mutations = count(ok.get("generation")) or 0, count(ok.get("mutations")) or 0
        if cached is not None:
            generation, mutations = (
                max(generation, cached.generation),
                max(mutations, cached.mutations),
            )
        out.set["generation"], out.set["mutations"] = str(generation + 1), str(mutations + 1)
    return out


def _plan_index_id(
    out: Plan,
    meta: Mapping[str, str],
    ok: Mapping[str, str],
    manifest: Mapping,
    cached: Cached | None,
) -> str:
    index_id = ok.get("index_id")
    if index_id is not None:
        return index_id
    if "index_id" not in meta:
        out.problems.append("meta: the index id is missing")
    index_id, source = manifest_index_id(manifest), f"from {MANIFEST_NAME}"
    if index_id is None and cached is not None and INDEX_ID.fullmatch(cached.index_id):
        index_id, source = cached.index_id, "from the search cache"
    if index_id is None:
        index_id, source = uuid.uuid4().hex, "new (nothing that survives records the old one)"
    out.set["index_id"] = index_id
    out.restored.append(f"index id {source}")
    return index_id


def _plan_bundle(
    out: Plan,
    meta: Mapping[str, str],
    ok: Mapping[str, str],
    saved: IndexIdentity | None,
    dims: Mapping[int, int],
    cache_dim: int | None,
    documents: int,
) -> None:
    """The bundle and dense size: the documents' own size decides over every record; then
    ``meta``'s record, the manifest's copy, the cache's header."""
    rows_dim = majority(dims)
    fp, size = fingerprint(ok.get("bundle_fingerprint")), dim(ok.get("dense_dim"))
    if fp is not None and size is not None and rows_dim is not None and size != rows_dim:
        out.problems.append(
            f"meta: the recorded bundle makes {size}-dimensional vectors, but "
            f"{dims[rows_dim]} of {documents} document(s) store {rows_dim}-dimensional ones"
        )
        fp = size = None  # a record the documents contradict
    if fp is not None and size is None:  # the record lost its size: the documents, or a copy of it
        same = saved if saved is not None and saved.fingerprint == fp else None
        size = rows_dim or (same.dense_dim if same else None)
        if size is None:
            fp = None  # a bundle of unknown size cannot be checked against anything
        else:
            out.set["dense_dim"] = str(size)
            out.restored.append(
                f"dense size {size} from {'the stored vectors' if rows_dim else MANIFEST_NAME}"
            )
    if fp is None and "bundle_fingerprint" not in meta and documents:
        out.problems.append(
            f"meta: no record of the bundle that filled the {documents} document(s)"
        )
    if fp is None and saved is not None and (rows_dim is None or saved.dense_dim == rows_dim):
        out.set.update(
            {
                "bundle_fingerprint": saved.fingerprint,
                "bundle_model": saved.model,
                "bundle_path": saved.bundle_path,
                "dense_dim": str(saved.dense_dim),
            }
        )
        out.restored.append(
            f"bundle {saved.fingerprint[:12]} ({saved.model or '?'}) from {MANIFEST_NAME}"
        )
        fp, size = saved.fingerprint, saved.dense_dim
    if fp is not None:
        if BUNDLE_UNKNOWN in meta:
            out.remove.append(BUNDLE_UNKNOWN)
        out.dense_dim = size
        return
    if not ("bundle_fingerprint" in meta or documents or BUNDLE_UNKNOWN in meta):
        return  # a new index: nothing recorded, nothing to disagree with
    if BUNDLE_UNKNOWN in meta and not documents:
        out.problems.append(
            "meta: the bundle that filled the index is unknown (a repair could not restore it)"
        )
    out.remove.extend(k for k in BUNDLE_KEYS if k in meta)
    if meta.get(BUNDLE_UNKNOWN) != "1":
        out.set[BUNDLE_UNKNOWN] = "1"
    # the size alone, kept so that a bundle named later is checked against it
    size = rows_dim or cache_dim
    if size is not None and ok.get("dense_dim") != str(size):
        out.set["dense_dim"] = str(size)
        out.restored.append(
            f"dense size {size} from {'the stored vectors' if rows_dim else 'the search cache'}"
        )
    elif size is None and "dense_dim" in meta:
        out.remove.append("dense_dim")
    out.dense_dim = size
    vectors = f" (its vectors have {size} dimensions)" if size else ""
    out.unresolved.append(
        "the bundle that filled the index is not recorded anywhere that survives: "
        f"the next ingest or query needs --bundle with it{vectors}"
    )


def apply(db: sqlite3.Connection, change: Plan) -> None:
    """Inside a write transaction: write what :func:`plan` decided."""
    for key in change.remove:
        db.execute("DELETE FROM meta WHERE key = ?", (key,))
    db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", sorted(change.set.items()))
