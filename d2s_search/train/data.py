"""Precomputed dense embeddings of image-caption datasets: reading, writing, splits.

Torch-free. Two on-disk layouts are read:

* **authors' layout** (also what ``d2s-search embed`` writes): ``img_embs.parquet`` and
  ``text_embs.parquet`` with columns ``id, emb`` (or ``img_embs.npy`` + ``img_ids.json`` and
  ``text_embs.npy`` + ``text_ids.json``) plus a Karpathy-style ``dataset_meta.json``
  (``images[].imgid, split, sentences[].sentid, raw``). Ids are compared as strings.
* **paired rows** (e.g. ``flickr8k-100-clip-b32``): ``image_embeddings.npy`` and
  ``text_embeddings.npy`` whose row i is one (image, caption) pair, and ``metadata.csv``
  with ``image_id`` and ``caption`` per row. Splits are drawn per image with a seed.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from d2s_search.errors import D2SError


class DatasetError(D2SError):
    """The embeddings or dataset metadata are missing, inconsistent or unreadable."""


@dataclass
class PairSplit:
    """One split: captions (queries) and images (documents) with their dense vectors."""

    name: str
    caption_ids: list[str]
    captions: list[str]
    text_emb: np.ndarray  # (n_captions, d) float32
    image_ids: list[str]
    image_emb: np.ndarray  # (n_images, d) float32
    caption_image: np.ndarray  # (n_captions,) index of each caption's image in image_ids
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.caption_ids) != len(self.text_emb) or len(self.captions) != len(self.text_emb):
            raise DatasetError(f"split {self.name}: caption ids, texts and vectors differ in length")
        if len(self.image_ids) != len(self.image_emb):
            raise DatasetError(f"split {self.name}: image ids and vectors differ in length")
        if len(self.caption_image) != len(self.caption_ids):
            raise DatasetError(f"split {self.name}: caption->image map has the wrong length")

    @property
    def dim(self) -> int:
        return int(self.text_emb.shape[1])

    def qrels(self) -> list[np.ndarray]:
        """Relevant image indices per caption (text->image retrieval)."""
        return [np.array([int(j)]) for j in self.caption_image]

    def head(self, n_images: int) -> PairSplit:
        """The first ``n_images`` images and their captions (for quick validation)."""
        keep = self.caption_image < n_images
        return PairSplit(
            self.name,
            [c for c, k in zip(self.caption_ids, keep, strict=True) if k],
            [c for c, k in zip(self.captions, keep, strict=True) if k],
            self.text_emb[keep],
            self.image_ids[:n_images],
            self.image_emb[:n_images],
            self.caption_image[keep],
        )


# ----------------------------------------------------------------------------- reading


def _read_parquet_embs(path: Path) -> tuple[list[str], np.ndarray]:
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=["id", "emb"])
    ids = [str(x) for x in table.column("id").to_pylist()]
    col = table.column("emb").combine_chunks()
    n = len(col)
    flat = col.flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    if n and flat.size % n:
        raise DatasetError(f"{path}: vectors of unequal length")
    return ids, flat.reshape(n, -1 if n else 0)


def read_embeddings(directory: str | Path, side: str, kind: str = "embs") -> tuple[list[str], np.ndarray]:
    """Ids and vectors of one side (``img`` or ``text``) in the authors' layout.

    ``kind="feats"`` reads the pre-projection features (``img_feats.parquet``, ...) that the
    joint objective fine-tunes the projection layers from.
    """
    d = Path(directory)
    pq_path = d / f"{side}_{kind}.parquet"
    npy_path = d / f"{side}_{kind}.npy"
    if pq_path.is_file():
        return _read_parquet_embs(pq_path)
    if npy_path.is_file():
        ids_path = d / f"{side}_ids.json"
        if not ids_path.is_file():
            raise DatasetError(f"{npy_path} has no ids file {ids_path.name}")
        ids = [str(x) for x in json.loads(ids_path.read_text())]
        embs = np.load(npy_path).astype(np.float32, copy=False)
        if len(ids) != len(embs):
            raise DatasetError(f"{npy_path}: {len(embs)} vectors but {len(ids)} ids")
        return ids, embs
    raise DatasetError(f"no {side}_{kind}.parquet or {side}_{kind}.npy in {d}")


def write_embeddings(
    directory: str | Path, side: str, ids: Sequence[str], embs: np.ndarray, fmt: str = "parquet",
    kind: str = "embs",
) -> Path:
    """Write one side in the authors' layout (parquet ``id, emb`` or npy + ids json)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    embs = np.ascontiguousarray(embs, dtype=np.float32)
    if fmt == "npy":
        np.save(d / f"{side}_{kind}.npy", embs)
        (d / f"{side}_ids.json").write_text(json.dumps([str(i) for i in ids]))
        return d / f"{side}_{kind}.npy"
    import pyarrow as pa
    import pyarrow.parquet as pq

    n, dim = embs.shape
    emb_col = pa.FixedSizeListArray.from_arrays(pa.array(embs.reshape(-1)), dim)
    # Cast to a variable list so the file matches the authors' `list<float>` schema.
    emb_col = emb_col.cast(pa.list_(pa.float32()))
    table = pa.table({"id": pa.array([str(i) for i in ids]), "emb": emb_col})
    path = d / f"{side}_{kind}.parquet"
    tmp = path.with_suffix(".parquet.tmp")
    pq.write_table(table, tmp)
    tmp.replace(path)
    return path


def _split_from_meta(
    meta: dict,
    split_names: Sequence[str],
    name: str,
    txt_ids: list[str],
    txt_embs: np.ndarray,
    img_ids: list[str],
    img_embs: np.ndarray,
) -> PairSplit | None:
    t_row = {t: i for i, t in enumerate(txt_ids)}
    i_row = {t: i for i, t in enumerate(img_ids)}
    cap_ids: list[str] = []
    caps: list[str] = []
    cap_rows: list[int] = []
    im_ids: list[str] = []
    im_rows: list[int] = []
    cap_img: list[int] = []
    missing = 0
    for image in meta.get("images", []):
        if image.get("split") not in split_names:
            continue
        iid = str(image.get("imgid", image.get("id")))
        if iid not in i_row:
            missing += 1
            continue
        sents = []
        for s in image.get("sentences", []):
            sid = str(s.get("sentid", s.get("id")))
            if sid in t_row:
                sents.append((sid, s.get("raw", "")))
            else:
                missing += 1
        if not sents:
            continue
        idx = len(im_ids)
        im_ids.append(iid)
        im_rows.append(i_row[iid])
        for sid, raw in sents:
            cap_ids.append(sid)
            caps.append(raw)
            cap_rows.append(t_row[sid])
            cap_img.append(idx)
    if not im_ids:
        return None
    return PairSplit(
        name,
        cap_ids,
        caps,
        txt_embs[np.asarray(cap_rows, dtype=np.int64)],
        im_ids,
        img_embs[np.asarray(im_rows, dtype=np.int64)],
        np.asarray(cap_img, dtype=np.int64),
        extra={"missing_vectors": missing},
    )


SPLITS = {"train": ("train",), "val": ("val", "dev"), "test": ("test",)}


def load_authors_layout(directory: str | Path, kind: str = "embs", same_dim: bool = True) -> dict[str, PairSplit]:
    """Splits of the authors' layout; ``same_dim=False`` allows image and text vectors of
    different widths (pre-projection features: e.g. CLIP's 768-d image, 512-d text)."""
    d = Path(directory)
    meta_path = d / "dataset_meta.json"
    if not meta_path.is_file():
        raise DatasetError(f"no dataset_meta.json in {d}")
    try:
        meta = json.loads(meta_path.read_text())
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{meta_path} is not valid JSON: {exc}") from exc
    img_ids, img_embs = read_embeddings(d, "img", kind)
    txt_ids, txt_embs = read_embeddings(d, "text", kind)
    if same_dim and img_embs.shape[1] != txt_embs.shape[1]:
        raise DatasetError(
            f"image vectors are {img_embs.shape[1]}-d but text vectors {txt_embs.shape[1]}-d"
        )
    out: dict[str, PairSplit] = {}
    for name, members in SPLITS.items():
        split = _split_from_meta(meta, members, name, txt_ids, txt_embs, img_ids, img_embs)
        if split is not None:
            out[name] = split
    return out


def load_paired_rows(
    directory: str | Path, val_fraction: float = 0.2, test_fraction: float = 0.0, seed: int = 0
) -> dict[str, PairSplit]:
    """Row-paired npy files + metadata.csv; images are assigned to splits with ``seed``."""
    d = Path(directory)
    try:
        img = np.load(d / "image_embeddings.npy").astype(np.float32, copy=False)
        txt = np.load(d / "text_embeddings.npy").astype(np.float32, copy=False)
    except FileNotFoundError as exc:
        raise DatasetError(f"{d}: {exc.filename} not found") from exc
    with open(d / "metadata.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    if not (len(rows) == len(img) == len(txt)):
        raise DatasetError(f"{d}: metadata rows, image rows and text rows differ in number")
    image_ids = [r.get("image_id") or r.get("image") or "" for r in rows]
    uniq = sorted(set(image_ids))
    perm = np.random.default_rng(seed).permutation(len(uniq))
    n_val = round(val_fraction * len(uniq))
    n_test = round(test_fraction * len(uniq))
    assign = {}
    for rank, k in enumerate(perm):
        assign[uniq[k]] = "val" if rank < n_val else "test" if rank < n_val + n_test else "train"
    out: dict[str, PairSplit] = {}
    for name in ("train", "val", "test"):
        rows_in = [i for i, iid in enumerate(image_ids) if assign[iid] == name]
        if not rows_in:
            continue
        im_ids: list[str] = []
        im_first: dict[str, int] = {}
        cap_img = []
        for i in rows_in:
            iid = image_ids[i]
            if iid not in im_first:
                im_first[iid] = len(im_ids)
                im_ids.append(iid)
            cap_img.append(im_first[iid])
        # The image vector of an image is the one on its first row (rows repeat it).
        first_row = {}
        for i in rows_in:
            first_row.setdefault(image_ids[i], i)
        out[name] = PairSplit(
            name,
            [str(i) for i in rows_in],
            [rows[i].get("caption", "") for i in rows_in],
            txt[rows_in],
            im_ids,
            img[[first_row[i] for i in im_ids]],
            np.asarray(cap_img, dtype=np.int64),
        )
    return out


def load_dataset(directory: str | Path, **kwargs) -> dict[str, PairSplit]:
    """Recognise the layout of ``directory`` and load its splits."""
    d = Path(directory)
    if not d.is_dir():
        raise DatasetError(f"embeddings directory not found: {d}")
    if (d / "dataset_meta.json").is_file():
        return load_authors_layout(d)
    if (d / "image_embeddings.npy").is_file() and (d / "metadata.csv").is_file():
        return load_paired_rows(d, **kwargs)
    raise DatasetError(
        f"{d} holds neither img_embs/text_embs + dataset_meta.json nor "
        "image_embeddings.npy + text_embeddings.npy + metadata.csv"
    )
