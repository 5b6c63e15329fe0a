"""Frozen features of the offline model's two backbones, computed once and cached.

Images go through the runtime's own preprocessing, texts through the bundle tokenizer's
truncation, so the cached features are what the exported graphs compute.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from d2s_onnx_export.offline_mini.align_data import (
    Captioned,
    cache_key,
    cached,
    open_rgb,
    view_pixels,
)


class Backbones:
    """The frozen image (EfficientNet-Lite0, or DINOv2-small when the config's
    ``backbones.image.kind`` is ``dinov2-onnx``) and MiniLM feature extractors, built on first use."""

    def __init__(self, config: dict) -> None:
        self.config = config
        self._image = self._text = self._tokenizer = None

    @property
    def image(self):
        if self._image is None:
            from d2s_onnx_export.offline_mini import backbones as B

            spec = self.config.get("backbones", {}).get("image", {})
            if spec.get("kind") == "dinov2-onnx":
                self._image = B.DinoV2OnnxFeatures(spec.get("pooling", "cls"))
            else:
                self._image = B.freeze(B.EfficientNetLite0Features())
        return self._image

    @property
    def text(self):
        if self._text is None:
            from d2s_onnx_export.offline_mini.backbones import MiniLMFeatures, freeze

            self._text = freeze(MiniLMFeatures())
        return self._text

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from d2s_onnx_export.tokenizers_offline import bert_base_uncased_tokenizer

            self._tokenizer = bert_base_uncased_tokenizer()[0]
        return self._tokenizer

    def identity(self, what: str) -> dict:
        """What the ``images`` or ``texts`` features depend on (the weights' hashes are in the
        model config); text features are shared by configs with different image towers."""
        c, towers = self.config, self.config.get("backbones", {})
        if what == "texts":
            return {"max_text_length": c["max_text_length"], "backbone": towers.get("text", {})}
        return {"image": c["image"], "backbone": towers.get("image", {})}

    @torch.no_grad()
    def encode_images(self, items: Sequence[Captioned], views: Sequence[str], batch: int = 32, progress=None) -> dict:
        pooled = logits = None  # widths come from the backbone (1280 + 1000 classes, or DINOv2's)
        task = progress.add_task("image features", total=len(items)) if progress else None
        for start in range(0, len(items), batch):
            chunk = items[start : start + batch]
            images = [open_rgb(it.path) for it in chunk]
            for v, view in enumerate(views):
                px = torch.from_numpy(np.stack([view_pixels(im, self.config["image"], view) for im in images]))
                p, lg = self.image(px)
                if pooled is None:
                    pooled = np.zeros((len(items), len(views), p.shape[1]), np.float32)
                    logits = np.zeros((len(items), len(views), lg.shape[1]), np.float32)
                pooled[start : start + len(chunk), v] = p.numpy()
                logits[start : start + len(chunk), v] = lg.numpy()
            if progress:
                progress.update(task, advance=len(chunk))
        return {"pooled": pooled, "logits": logits}

    @torch.no_grad()
    def encode_texts(self, texts: Sequence[str], batch: int = 128) -> np.ndarray:
        from d2s_search.encoder import tokenize_batch

        out = np.zeros((len(texts), 384), np.float32)
        for start in range(0, len(texts), batch):
            ids, mask = tokenize_batch(self.tokenizer, texts[start : start + batch], self.config["max_text_length"])
            out[start : start + len(ids)] = self.text(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
        return out


def image_features(bb: Backbones, items: Sequence[Captioned], views: Sequence[str], cache_dir: Path, progress=None) -> dict:
    key = cache_key({"what": "images", **bb.identity("images"), "views": list(views), "files": [it.image_id for it in items]})
    return cached(cache_dir / f"img-{items[0].source if items else 'none'}-{key}.npz",
                  lambda: bb.encode_images(items, views, progress=progress))


def text_features(bb: Backbones, texts: Sequence[str], cache_dir: Path, tag: str) -> np.ndarray:
    key = cache_key({"what": "texts", **bb.identity("texts"), "texts": list(texts)})
    return cached(cache_dir / f"txt-{tag}-{key}.npz", lambda: {"z": bb.encode_texts(texts)})["z"]
