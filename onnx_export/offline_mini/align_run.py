"""One alignment run end to end: data -> cached features -> training -> files.

Writes to ``out_dir``:
  ``projections.safetensors``  the trained image/text projections (what the model ships)
  ``align.json``               settings, splits, sources, per-epoch history, val/test metrics
  ``embeddings/``              aligned dense vectors of the flickr8k photos and captions in
                               the authors' layout (``img_embs.npy``, ``text_embs.npy``, ids,
                               ``dataset_meta.json`` with the train/val/test split), the input
                               of ``d2s-search train`` and ``d2s-search evaluate``
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from d2s_onnx_export.offline_mini.align import (
    AlignConfig,
    EvalSet,
    TrainSet,
    evaluate_dense,
    projection_tensors,
    train_alignment,
)
from d2s_onnx_export.offline_mini.align_data import (
    VIEWS,
    Captioned,
    flickr_photos,
    openclipart_items,
    split_photos,
)
from d2s_onnx_export.offline_mini.align_features import Backbones, image_features, text_features

CLIPART_VIEWS = ("full", "full-flip")  # drawings: keep the whole picture


@dataclass
class AlignSources:
    flickr_root: Path
    n_test: int = 200
    n_val: int = 100
    split_seed: int = 0
    views: tuple[str, ...] = VIEWS
    clipart: int = 0  # drawings from openclipart-png added to training (0 = none)
    clipart_root: Path | None = None
    clipart_categories: tuple[str, ...] = ()  # top-level folders to keep (empty = all)


def _caption_rows(items: list[Captioned]) -> tuple[list[str], np.ndarray]:
    texts, owner = [], []
    for i, it in enumerate(items):
        texts.extend(it.captions)
        owner.extend([i] * len(it.captions))
    return texts, np.asarray(owner, dtype=np.int64)


def _eval_set(bb: Backbones, items: list[Captioned], cache: Path, tag: str, progress,
              views: tuple[str, ...] = ("center",)) -> EvalSet:
    """The runtime's view of each photo (``center``) and all its captions."""
    feats = image_features(bb, items, views, cache, progress)
    v = views.index("center")
    texts, owner = _caption_rows(items)
    return EvalSet(feats["pooled"][:, v], feats["logits"][:, v], text_features(bb, texts, cache, tag), owner)


def _train_set(bb: Backbones, items: list[Captioned], clip: list[Captioned], views, cache: Path, progress) -> TrainSet:
    feats = image_features(bb, items, views, cache, progress)
    pooled, logits = feats["pooled"], feats["logits"]
    n_views = np.full(len(items), len(views), np.int64)
    texts, owner = _caption_rows(items)
    if clip:
        cf = image_features(bb, clip, CLIPART_VIEWS, cache, progress)
        pad = len(views) - len(CLIPART_VIEWS)
        pooled = np.concatenate([pooled, np.pad(cf["pooled"], ((0, 0), (0, max(pad, 0)), (0, 0)))[:, : len(views)]])
        logits = np.concatenate([logits, np.pad(cf["logits"], ((0, 0), (0, max(pad, 0)), (0, 0)))[:, : len(views)]])
        n_views = np.concatenate([n_views, np.full(len(clip), min(len(CLIPART_VIEWS), len(views)), np.int64)])
        ctexts, cowner = _caption_rows(clip)
        texts += ctexts
        owner = np.concatenate([owner, cowner + len(items)])
    return TrainSet(pooled, logits, text_features(bb, texts, cache, "train"), owner, n_views)


def class_embeddings(bb: Backbones, cache: Path) -> torch.Tensor:
    from d2s_onnx_export.offline_mini.parts import class_prompts

    return torch.from_numpy(text_features(bb, class_prompts(), cache, "classes"))


def run_alignment(
    model_config: dict,
    sources: AlignSources,
    config: AlignConfig,
    out_dir: Path,
    cache_dir: Path,
    progress=None,
    log=None,
) -> dict:
    from d2s_onnx_export.offline_mini.parts import save_tensors

    torch.set_num_threads(min(torch.get_num_threads(), 2))
    bb = Backbones(model_config)
    splits = split_photos(flickr_photos(sources.flickr_root), sources.n_test, sources.n_val, sources.split_seed)
    clip = openclipart_items(**({"root": sources.clipart_root} if sources.clipart_root else {}),
                             limit=sources.clipart, seed=sources.split_seed,
                             categories=sources.clipart_categories) if sources.clipart else []
    train = _train_set(bb, splits["train"], clip, sources.views, cache_dir, progress)
    val = _eval_set(bb, splits["val"], cache_dir, "val", progress)
    test = _eval_set(bb, splits["test"], cache_dir, "test", progress)
    if config.solver == "ridge":
        from d2s_onnx_export.offline_mini.ridge import fit_ridge_alignment

        model, summary = fit_ridge_alignment(train, val, config)
    else:
        class_emb = class_embeddings(bb, cache_dir) if config.bridge else None
        model, summary = train_alignment(train, val, config, class_emb, log=log)
    summary["test"] = evaluate_dense(model, test)
    summary["sources"] = {
        "flickr8k": {"train_photos": len(splits["train"]), "val_photos": len(splits["val"]),
                     "test_photos": len(splits["test"]), "split_seed": sources.split_seed,
                     "views": list(sources.views)},
        "openclipart": {"drawings": len(clip), "categories": list(sources.clipart_categories)},
    }
    summary["splits"] = {k: [it.image_id for it in v] for k, v in splits.items()}
    summary["data"], summary["cache"] = str(Path(sources.flickr_root).resolve()), str(Path(cache_dir).resolve())
    out_dir.mkdir(parents=True, exist_ok=True)
    save_tensors(projection_tensors(model), out_dir / "projections.safetensors",
                 metadata={"dim": str(config.dim), "bridge": str(model.image.use_bridge), "solver": config.solver})
    write_aligned_embeddings(model, {"train": _eval_set(bb, splits["train"], cache_dir, "train", progress, tuple(sources.views)),
                                     "val": val, "test": test}, splits, out_dir / "embeddings")
    summary["files"] = {"projections": str(out_dir / "projections.safetensors"),
                        "embeddings": str(out_dir / "embeddings")}
    (out_dir / "align.json").write_text(json.dumps(summary, indent=2))
    return summary


@torch.no_grad()
def write_aligned_embeddings(model, sets: dict[str, EvalSet], splits: dict[str, list[Captioned]], out: Path) -> None:
    """Aligned vectors in the authors' layout, for ``d2s-search train/evaluate --data``."""
    from d2s_search.train.data import write_embeddings

    img_ids, img_rows, txt_ids, txt_rows, meta = [], [], [], [], {"images": []}
    for name in ("train", "val", "test"):
        data, items = sets[name], splits[name]
        img = model.embed_images(torch.from_numpy(data.pooled), torch.from_numpy(data.logits)).numpy()
        txt = model.embed_texts(torch.from_numpy(data.text)).numpy()
        k = 0
        for i, it in enumerate(items):
            img_ids.append(it.image_id)
            img_rows.append(img[i])
            sentences = []
            for cap in it.captions:
                sid = f"{it.image_id}#{len(sentences)}"
                sentences.append({"sentid": sid, "raw": cap})
                txt_ids.append(sid)
                txt_rows.append(txt[k])
                k += 1
            meta["images"].append({"imgid": it.image_id, "filename": it.image_id, "split": name, "sentences": sentences})
    write_embeddings(out, "img", img_ids, np.stack(img_rows), fmt="npy")
    write_embeddings(out, "text", txt_ids, np.stack(txt_rows), fmt="npy")
    (out / "dataset_meta.json").write_text(json.dumps(meta))
