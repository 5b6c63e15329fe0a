"""Aligning the offline model's frozen towers: small projections trained with InfoNCE.

Both backbones are frozen and their features cached (:mod:`align_features`); only
:class:`d2s_onnx_export.offline_mini.parts.ImageProjection` and ``TextProjection`` train, with a
symmetric InfoNCE loss and a learnable temperature (CLIP's ``logit_scale``, clamped at 100).

Each epoch visits every training image once, in batches, with one of its captions and one
of its augmented views drawn at random (so no batch holds two captions of one photo, which
would be false negatives). The epoch with the best validation score (mean of dense
text->image R@1/5/10 on the ``val`` photos) is kept.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from d2s_onnx_export.offline_mini.parts import ImageProjection, TextProjection, normalize

from d2s_search import metrics as M
from d2s_search.errors import ModelError


@dataclass
class AlignConfig:
    dim: int = 384
    bridge: bool = True  # ImageNet class-name bridge in the image projection
    epochs: int = 40
    batch_size: int = 128
    lr: float = 1e-3
    text_lr: float = 1e-4  # the text side starts at identity and should stay near it
    weight_decay: float = 0.05
    init_temperature: float = 0.05
    seed: int = 0
    # "ridge": the closed-form map of ``ridge.fit_ridge_alignment`` (no bridge; the epochs,
    # rates and temperature above are not used); "infonce": the trained projections.
    solver: str = "infonce"
    notes: dict = field(default_factory=dict)


@dataclass
class TrainSet:
    """Per image: features of its views; per caption: text features and its image."""

    pooled: np.ndarray  # (N, V, F): F = 1280 (EfficientNet-Lite0) or the DINOv2 pooling's width
    logits: np.ndarray  # (N, V, 1000) ImageNet logits, (N, V, 0) for a tower without classifier
    text: np.ndarray  # (M, 384)
    caption_image: np.ndarray  # (M,)
    n_views: np.ndarray  # (N,) how many views each image has (<= V)


@dataclass
class EvalSet:
    pooled: np.ndarray  # (N, F), the runtime's view
    logits: np.ndarray  # (N, 1000)
    text: np.ndarray  # (M, 384)
    caption_image: np.ndarray  # (M,)


class AlignModel(torch.nn.Module):
    def __init__(self, config: AlignConfig, class_emb: torch.Tensor | None, feature_dim: int = 1280) -> None:
        super().__init__()
        self.image = ImageProjection(feature_dim, config.dim, class_emb if config.bridge else None)
        self.text = TextProjection(384, config.dim)
        self.logit_scale = torch.nn.Parameter(torch.tensor(math.log(1 / config.init_temperature)))

    def embed_images(self, pooled: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        return normalize(self.image(pooled, logits))

    def embed_texts(self, z: torch.Tensor) -> torch.Tensor:
        return normalize(self.text(z))


def info_nce(img: torch.Tensor, txt: torch.Tensor, logit_scale: torch.Tensor) -> torch.Tensor:
    scores = logit_scale.clamp(max=math.log(100)).exp() * img @ txt.t()
    target = torch.arange(len(img))
    return (F.cross_entropy(scores, target) + F.cross_entropy(scores.t(), target)) / 2


@torch.no_grad()
def evaluate_dense(model: AlignModel, data: EvalSet) -> dict:
    model.eval()
    img = model.embed_images(torch.from_numpy(data.pooled), torch.from_numpy(data.logits)).numpy()
    txt = model.embed_texts(torch.from_numpy(data.text)).numpy()
    qrels = [np.array([int(i)]) for i in data.caption_image]
    _, _, per_q = M.evaluate_scores(txt @ img.T, qrels)
    out = M.aggregate(per_q)
    out["score"] = (out["R@1"] + out["R@5"] + out["R@10"]) / 3
    return out


def _groups(model: AlignModel, config: AlignConfig) -> list[dict]:
    decay, no_decay = [], []
    for p in model.image.parameters():
        (decay if p.ndim == 2 else no_decay).append(p)
    groups = [
        {"params": decay, "lr": config.lr, "weight_decay": config.weight_decay},
        {"params": no_decay + [model.logit_scale], "lr": config.lr, "weight_decay": 0.0},
        {"params": list(model.text.parameters()), "lr": config.text_lr, "weight_decay": 0.0},
    ]
    return groups


def train_alignment(
    train: TrainSet,
    val: EvalSet,
    config: AlignConfig,
    class_emb: torch.Tensor | None,
    log=None,
) -> tuple[AlignModel, dict]:
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    if config.bridge and train.logits.shape[-1] == 0:
        raise ModelError("the class bridge needs ImageNet logits; this image tower has none (use --no-bridge)")
    model = AlignModel(config, class_emb, train.pooled.shape[-1])
    opt = torch.optim.AdamW(_groups(model, config))
    n = len(train.pooled)
    steps = config.epochs * math.ceil(n / config.batch_size)
    # 10% warm-up; very short runs (tests) need pct * steps != 1 or OneCycleLR divides by zero.
    pct = 0.1 if steps >= 25 else min(0.9, 2.5 / steps)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=[g["lr"] for g in opt.param_groups], total_steps=steps, pct_start=pct, anneal_strategy="cos"
    )
    captions_of = [np.flatnonzero(train.caption_image == i) for i in range(n)]
    pooled, logits = torch.from_numpy(train.pooled), torch.from_numpy(train.logits)
    text = torch.from_numpy(train.text)
    best = {"score": -1.0, "epoch": 0, "state": None, "val": {}}
    history = []
    for epoch in range(config.epochs):
        t0 = time.perf_counter()
        model.train()
        order = rng.permutation(n)
        total = 0.0
        for start in range(0, n, config.batch_size):
            rows = order[start : start + config.batch_size]
            if len(rows) < 2:
                continue
            caps = np.array([rng.choice(captions_of[i]) for i in rows])
            views = np.array([rng.integers(train.n_views[i]) for i in rows])
            r = torch.from_numpy(rows)
            v = torch.from_numpy(views)
            img = model.embed_images(pooled[r, v], logits[r, v])
            txt = model.embed_texts(text[torch.from_numpy(caps)])
            loss = info_nce(img, txt, model.logit_scale)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss.detach()) * len(rows)
        metrics = evaluate_dense(model, val)
        entry = {"epoch": epoch + 1, "loss": total / n, "temperature": float(1 / model.logit_scale.detach().exp()),
                 "val": metrics, "seconds": time.perf_counter() - t0}
        history.append(entry)
        if metrics["score"] > best["score"]:
            best = {"score": metrics["score"], "epoch": epoch + 1, "val": metrics,
                    "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}
        if log:
            log(entry)
    model.load_state_dict(best["state"])
    model.eval()
    return model, {"best_epoch": best["epoch"], "best_val": best["val"], "history": history, "config": asdict(config)}


def projection_tensors(model: AlignModel) -> dict[str, torch.Tensor]:
    """The shipped weights: everything trained except the temperature of the loss."""
    return {k: v for k, v in model.state_dict().items() if k != "logit_scale"}
