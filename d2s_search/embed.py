"""Precompute dense embeddings of an image-caption dataset, stored with ids, resumable.

Inputs: a Karpathy-style JSON (``images[].filename``/``filepath``, ``split``,
``sentences[].raw``, optional ``imgid``/``sentid``) or a CSV with ``image,caption`` rows.
Output, in the authors' layout that ``d2s-search train`` reads:
``img_embs.parquet`` / ``text_embs.parquet`` (``id, emb``; or ``.npy`` + ``_ids.json``)
and ``dataset_meta.json`` (Karpathy-style, with the ids used).

Encoders are plain callables so anything plugs in:
``text_fn(list[str]) -> (B, d)`` and ``image_fn(list[Path]) -> (B, d)``. For a model bundle
:func:`bundle_encoders` wraps :class:`d2s_search.encoder.Encoder` (ONNX, no torch).

With ``features`` (``embed --features``, a format-2 bundle) the pre-projection vectors are
stored too, as ``img_feats`` / ``text_feats`` with the same ids, and the bundle's
``projections.safetensors`` is copied next to them: together with ``dataset_meta.json``
that is everything ``train --objective joint`` reads.

Resuming: vectors are written in chunks under ``<out>/.parts/<side>/`` next to an
``embed_state.json`` naming the encoder; a re-run with the same encoder skips finished
chunks, and the final files are assembled once every chunk exists.
"""

from __future__ import annotations

import csv
import json
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from d2s_search.errors import D2SError, ImageRejected, NoInputError
from d2s_search.train.data import write_embeddings

TextFn = Callable[[Sequence[str]], np.ndarray]
ImageFn = Callable[[Sequence[Path]], np.ndarray]


class EmbedError(D2SError):
    """The dataset file cannot be read or the output cannot be resumed."""


@dataclass
class Item:
    image_id: str
    image_path: Path | None
    split: str
    sentences: list[tuple[str, str]] = field(default_factory=list)  # (sentid, raw)


# ----------------------------------------------------------------------------- readers


def read_karpathy(path: str | Path, image_root: str | Path | None = None) -> list[Item]:
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise EmbedError(f"cannot read Karpathy JSON {p}: {exc}") from exc
    root = Path(image_root) if image_root else p.parent
    items, next_sent = [], 0
    for n, img in enumerate(data.get("images", [])):
        fname = img.get("filename")
        fpath = root / img.get("filepath", "") / fname if fname else None
        sents = []
        for s in img.get("sentences", []):
            sid = s.get("sentid", next_sent)
            next_sent = max(next_sent, int(sid) + 1) if str(sid).isdigit() else next_sent + 1
            sents.append((str(sid), s.get("raw", "")))
        items.append(Item(str(img.get("imgid", n)), fpath, img.get("split", "train"), sents))
    if not items:
        raise NoInputError(f"{p} lists no images")
    return items


def read_caption_csv(
    path: str | Path,
    image_root: str | Path | None = None,
    val_fraction: float = 0.1,
    test_fraction: float = 0.1,
    seed: int = 0,
) -> list[Item]:
    """``image,caption`` rows; images get ids in order of appearance and a seeded split."""
    p = Path(path)
    root = Path(image_root) if image_root else p.parent
    by_image: dict[str, Item] = {}
    try:
        with open(p, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            if not reader.fieldnames or not {"image", "caption"} <= set(reader.fieldnames):
                raise EmbedError(f"{p} needs the columns image,caption")
            for sent, row in enumerate(reader):
                name = row["image"]
                if name not in by_image:
                    by_image[name] = Item(str(len(by_image)), root / name, "train")
                by_image[name].sentences.append((str(sent), row["caption"]))
    except OSError as exc:
        raise EmbedError(f"cannot read {p}: {exc}") from exc
    items = list(by_image.values())
    if not items:
        raise NoInputError(f"{p} has no rows")
    order = np.random.default_rng(seed).permutation(len(items))
    n_val, n_test = round(val_fraction * len(items)), round(test_fraction * len(items))
    for rank, k in enumerate(order):
        items[k].split = "val" if rank < n_val else "test" if rank < n_val + n_test else "train"
    return items


def read_dataset(path: str | Path, image_root=None, **kwargs) -> list[Item]:
    p = Path(path)
    if p.suffix.lower() == ".json":
        return read_karpathy(p, image_root)
    if p.suffix.lower() in (".csv", ".txt"):
        return read_caption_csv(p, image_root, **kwargs)
    raise EmbedError(f"unknown dataset file type {p.suffix!r}: give a Karpathy .json or a .csv")


def dataset_meta(items: Sequence[Item]) -> dict:
    return {
        "images": [
            {
                "imgid": it.image_id,
                "filename": it.image_path.name if it.image_path else None,
                "filepath": str(it.image_path.parent) if it.image_path else None,
                "split": it.split,
                "sentences": [{"sentid": s, "raw": r} for s, r in it.sentences],
            }
            for it in items
        ]
    }


# ----------------------------------------------------------------------------- chunked writer


def _encode_batch(encode, xs: list) -> tuple[list[np.ndarray | None], list[str]]:
    """Vectors of a batch; on a rejection, retry one by one to find the bad input(s)."""
    try:
        v = np.asarray(encode(xs), dtype=np.float32)
        return list(v), [""] * len(xs)
    except ImageRejected:
        rows, reasons = [], []
        for x in xs:
            try:
                rows.append(np.asarray(encode([x]), dtype=np.float32)[0])
                reasons.append("")
            except ImageRejected as exc:
                rows.append(None)
                reasons.append(str(exc) or "rejected")
        return rows, reasons


Chunk = tuple[list[str], list[np.ndarray], list[str], list[str]]  # kept ids, their rows, rejected ids, reasons
# Encodes the chunks of one side elsewhere (``embed --engine ray``): (side, [(chunk number, ids,
# inputs)], batch size) -> (chunk number, its result) as each one is done, in any order.
ChunkRunner = Callable[[str, list[tuple[int, list[str], list]], int], "Iterator[tuple[int, Chunk]]"]


def encode_chunk(encode: Callable[[Sequence], np.ndarray], ids: Sequence[str], inputs: Sequence, batch_size: int,
                 advance: Callable[[int], None] | None = None) -> Chunk:
    """One chunk's vectors, batch by batch; rejected inputs with their reasons."""
    keep, vecs, rej, why = [], [], [], []
    for b in range(0, len(ids), batch_size):
        bi, bx = list(ids[b : b + batch_size]), list(inputs[b : b + batch_size])
        rows, reasons = _encode_batch(encode, bx)
        for i, row, reason in zip(bi, rows, reasons, strict=True):
            if row is not None and row.size and np.all(np.isfinite(row)):
                keep.append(i)
                vecs.append(row)
            else:
                rej.append(i)
                why.append(reason or "not encodable (non-finite vector)")
        if advance:
            advance(len(bi))
    return keep, vecs, rej, why


def embed_side(
    out: Path,
    side: str,
    ids: Sequence[str],
    inputs: Sequence,
    encode: Callable[[Sequence], np.ndarray] | None,
    batch_size: int = 64,
    chunk_size: int = 2048,
    fmt: str = "parquet",
    progress=None,
    features_from: int | None = None,
    runner: ChunkRunner | None = None,
) -> dict:
    """Encode ``inputs`` chunk by chunk (resumable) and write ``<side>_embs``.

    Inputs the encoder rejects (:class:`ImageRejected`) are left out and reported.
    ``features_from``: the encoder returns ``[dense | features]`` rows; columns from this
    index on are written as ``<side>_feats``. ``runner``: the chunks are encoded by it (on
    other processes or machines) instead of by ``encode``; each part is written as it arrives,
    and the result is the same.
    """
    parts = out / ".parts" / side
    parts.mkdir(parents=True, exist_ok=True)
    ids = [str(i) for i in ids]
    n_chunks = (len(ids) + chunk_size - 1) // chunk_size
    rejected_in: dict[int, list[dict]] = {}  # chunk -> its rejected inputs (chunks may finish in any order)
    reused = 0
    task = progress.add_task(f"embedding {side}", total=len(ids)) if progress else None

    def advance(n: int) -> None:
        if progress:
            progress.update(task, advance=n)

    todo: list[int] = []
    for c in range(n_chunks):
        lo, hi = c * chunk_size, min((c + 1) * chunk_size, len(ids))
        f = parts / f"{c:06d}.npz"
        if f.is_file():
            with np.load(f, allow_pickle=False) as z:
                done = [str(x) for x in z["ids"]] + [str(x) for x in z["rejected"]]
                reasons = [str(x) for x in z["reasons"]]
                rej_ids = [str(x) for x in z["rejected"]]
            if sorted(done) == sorted(ids[lo:hi]):
                rejected_in[c] = [{"id": i, "reason": r} for i, r in zip(rej_ids, reasons, strict=True)]
                reused += 1
                advance(hi - lo)
                continue
        todo.append(c)

    def write_part(c: int, chunk: Chunk) -> None:
        keep, vecs, rej, why = chunk
        rejected_in[c] = [{"id": i, "reason": r} for i, r in zip(rej, why, strict=True)]
        arr = np.stack(vecs) if vecs else np.zeros((0, 0), np.float32)
        tmp = parts / f"{c:06d}.tmp.npz"
        np.savez(tmp, ids=np.asarray(keep, dtype=str), embs=arr,
                 rejected=np.asarray(rej, dtype=str), reasons=np.asarray(why, dtype=str))
        tmp.replace(parts / f"{c:06d}.npz")

    def bounds(c: int) -> tuple[int, int]:
        return c * chunk_size, min((c + 1) * chunk_size, len(ids))

    if runner is not None:
        work = [(c, ids[slice(*bounds(c))], list(inputs[slice(*bounds(c))])) for c in todo]
        for c, chunk in runner(side, work, batch_size):
            write_part(c, chunk)
            advance(len(chunk[0]) + len(chunk[2]))
    else:
        for c in todo:
            lo, hi = bounds(c)
            write_part(c, encode_chunk(encode, ids[lo:hi], inputs[lo:hi], batch_size, advance))
    rejected = [r for c in sorted(rejected_in) for r in rejected_in[c]]
    all_ids, all_vecs, first_reason = [], [], ""
    for c in range(n_chunks):
        with np.load(parts / f"{c:06d}.npz", allow_pickle=False) as z:
            if len(z["ids"]):
                all_ids += [str(x) for x in z["ids"]]
                all_vecs.append(z["embs"])
            if not first_reason and len(z["reasons"]):
                first_reason = " ".join(f"{z['rejected'][0]}: {z['reasons'][0]}".split())[:200]
    if not all_vecs:
        # the first reason says what went wrong for all of them (e.g. paths under the wrong root)
        hint = " (image paths are read relative to --image-root)" if side == "img" else ""
        raise EmbedError(f"no {side} input could be encoded" + (f"; the first: {first_reason}" if first_reason else "") + hint)
    embs = np.vstack(all_vecs)
    result = {"side": side, "count": len(all_ids), "rejected": rejected, "reused_chunks": reused, "chunks": n_chunks}
    if features_from is not None:
        write_embeddings(out, side, all_ids, embs[:, features_from:], fmt, kind="feats")
        result["features_dim"] = int(embs.shape[1] - features_from)
        embs = embs[:, :features_from]
    write_embeddings(out, side, all_ids, embs, fmt)
    return {**result, "dim": int(embs.shape[1])}


def embed_dataset(
    items: Sequence[Item],
    out: str | Path,
    text_fn: TextFn,
    image_fn: ImageFn | None,
    encoder_name: str,
    batch_size: int = 64,
    fmt: str = "parquet",
    progress=None,
    keep_parts: bool = False,
    features_from: int | None = None,
    projections: Path | None = None,
    runner: ChunkRunner | None = None,
) -> dict:
    """Embed captions (and images if ``image_fn``) of ``items`` into ``out``.

    ``features_from``/``projections``/``runner``: see :func:`embed_side` and the module docstring.
    """
    o = Path(out)
    o.mkdir(parents=True, exist_ok=True)
    state_file = o / "embed_state.json"
    state = {"encoder": encoder_name, "items": len(items)}
    if features_from is not None:
        state["features"] = True
    if state_file.is_file():
        old = json.loads(state_file.read_text())
        if old != state:
            raise EmbedError(
                f"{o} holds a run with other settings ({old}); use another --out or delete it"
            )
    state_file.write_text(json.dumps(state))
    sent_ids = [s for it in items for s, _ in it.sentences]
    sent_txt = [r for it in items for _, r in it.sentences]
    summary = {"out": str(o), "images": len(items), "captions": len(sent_ids)}
    summary["text"] = embed_side(o, "text", sent_ids, sent_txt, text_fn, batch_size, fmt=fmt, progress=progress,
                                 features_from=features_from, runner=runner)
    if image_fn is not None:
        with_path = [it for it in items if it.image_path is not None]
        summary["img"] = embed_side(
            o, "img", [it.image_id for it in with_path], [it.image_path for it in with_path],
            image_fn, batch_size, fmt=fmt, progress=progress, features_from=features_from, runner=runner,
        )
    if projections is not None:
        shutil.copyfile(projections, o / projections.name)
        summary["projections"] = str(o / projections.name)
    (o / "dataset_meta.json").write_text(json.dumps(dataset_meta(items)))
    if not keep_parts:
        shutil.rmtree(o / ".parts", ignore_errors=True)
        state_file.unlink(missing_ok=True)
    return summary


# ----------------------------------------------------------------------------- encoders


def bundle_encoders(bundle_path: str | Path, device: str = "auto", features: bool = False) -> tuple[TextFn, ImageFn, str]:
    """Dense text and image encoders of a model bundle (ONNX Runtime, no torch).

    With ``features`` each row is ``[dense | features]`` (the bundle must have the output).
    """
    from d2s_search.bundle import Bundle
    from d2s_search.encoder import Encoder
    from d2s_search.images import load_image

    bundle = Bundle.load(bundle_path)
    enc = Encoder(bundle, device=device)
    if features:
        bundle.require_features()

    def text_fn(texts: Sequence[str]) -> np.ndarray:
        out = enc.encode_texts(list(texts), features=features)
        return np.hstack([out.dense, out.features]) if features else out.dense

    def image_fn(paths: Sequence[Path]) -> np.ndarray:
        images = []
        for p in paths:
            try:
                images.append(load_image(Path(p)).image)
            except ImageRejected:
                raise
            except (OSError, ValueError) as exc:
                raise ImageRejected(f"{p}: {exc}") from exc
        if features:
            return np.hstack(enc.image_features(images))
        dense, _ = enc.encode_images(images)
        return dense

    return text_fn, image_fn, f"bundle:{bundle.fingerprint}"
