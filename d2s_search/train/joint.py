"""Joint sparse-dense self-distillation (the CIKM 2025 follow-up of Nguyen et al., ECIR 2024).

The dense projection layers (BLIP/ALBEF ``text_proj`` / ``vision_proj``) are fine-tuned
together with the sparse head, from stored pre-projection features ``f``:

    h = normalize(proj(f))                  dense vectors (the improved dense model)
    z = head(h)                             sparse vectors
    s_dense = h_t h_i^T / tau               tau learnable, clamped to [0.001, 0.5]
    s_sparse = z_t z_i^T
    s_inter = w1 * s_dense + w2 * s_sparse
    L = l1 * NCE(s_dense) + l2 * NCE(s_sparse) + NCE(s_inter)
        + KD(s_dense <- softmax(s_inter)) + KD(s_sparse <- softmax(s_inter))
        + eta_t * L1(z_t) + eta_i * L1(z_i)

NCE is the symmetric InfoNCE with the batch's pairs as positives; KD the symmetric soft
cross-entropy towards the (detached) fused distribution. The L1 weights ramp like the
sparse objective's. Inputs: ``img_feats`` / ``text_feats`` (same layout as embeddings) and
``projections.safetensors`` with ``text_proj.{weight,bias}`` and ``vision_proj.{weight,bias}``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from d2s_search import metrics as M
from d2s_search.errors import ModelError
from d2s_search.train.data import PairSplit
from d2s_search.train.losses import l1, quadratic_ramp, soft_cross_entropy
from d2s_search.train.trainer import _lr_lambda, validate
from onnx_export.head import SparseHead, save_head


@dataclass
class JointConfig:
    lr: float = 5e-5
    eta_text: float = 5e-4  # q_reg
    eta_image: float = 3e-5  # d_reg
    w1: float = 0.1
    w2: float = 0.1
    lambda1: float = 0.9
    lambda2: float = 0.3
    tau: float = 0.07  # initial value of the learnable temperature
    epochs: int = 10
    batch_size: int = 256
    warmup: float = 0.2
    seed: int = 0


def load_projections(path: str | Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    p = Path(path)
    if not p.is_file():
        raise ModelError(f"projection weights not found: {p} (needed by --objective joint)")
    state = load_file(str(p))
    need = ["text_proj.weight", "text_proj.bias", "vision_proj.weight", "vision_proj.bias"]
    missing = [k for k in need if k not in state]
    if missing:
        raise ModelError(f"{p} lacks {', '.join(missing)}")
    return state


class JointModel(nn.Module):
    def __init__(self, head: SparseHead, proj: dict[str, torch.Tensor], tau: float) -> None:
        super().__init__()
        self.head = head
        self.text_proj = nn.Linear(proj["text_proj.weight"].shape[1], proj["text_proj.weight"].shape[0])
        self.vision_proj = nn.Linear(proj["vision_proj.weight"].shape[1], proj["vision_proj.weight"].shape[0])
        with torch.no_grad():
            for name in ("text_proj", "vision_proj"):
                getattr(self, name).weight.copy_(proj[f"{name}.weight"])
                getattr(self, name).bias.copy_(proj[f"{name}.bias"])
        self.log_tau = nn.Parameter(torch.tensor(math.log(tau)))

    def tau(self) -> torch.Tensor:
        return self.log_tau.exp().clamp(1e-3, 0.5)

    def dense(self, f_t: torch.Tensor, f_i: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return F.normalize(self.text_proj(f_t), dim=-1), F.normalize(self.vision_proj(f_i), dim=-1)


def _nce(scores: torch.Tensor) -> torch.Tensor:
    labels = torch.arange(len(scores), device=scores.device)
    return (F.cross_entropy(scores, labels) + F.cross_entropy(scores.t(), labels)) / 2


def _kd(scores: torch.Tensor, target_scores: torch.Tensor) -> torch.Tensor:
    t = target_scores.detach()
    return (soft_cross_entropy(scores, t.softmax(1)) + soft_cross_entropy(scores.t(), t.t().softmax(1))) / 2


def joint_loss(model: JointModel, f_t, f_i, cfg: JointConfig, step: int, warmup: int) -> dict:
    h_t, h_i = model.dense(f_t, f_i)
    z_t, z_i = model.head(h_t), model.head(h_i)
    s_dense = h_t @ h_i.t() / model.tau()
    s_sparse = z_t @ z_i.t()
    s_inter = cfg.w1 * s_dense + cfg.w2 * s_sparse
    ramp = quadratic_ramp(step, warmup)
    parts = {
        "nce_dense": _nce(s_dense), "nce_sparse": _nce(s_sparse), "nce_inter": _nce(s_inter),
        "kd_dense": _kd(s_dense, s_inter), "kd_sparse": _kd(s_sparse, s_inter),
        "l1_text": l1(z_t), "l1_image": l1(z_i),
    }
    total = (cfg.lambda1 * parts["nce_dense"] + cfg.lambda2 * parts["nce_sparse"] + parts["nce_inter"]
             + parts["kd_dense"] + parts["kd_sparse"]
             + ramp * (cfg.eta_text * parts["l1_text"] + cfg.eta_image * parts["l1_image"]))
    return {"total": total, **{k: float(v.detach()) for k, v in parts.items()}}


@torch.no_grad()
def project(model: JointModel, split: PairSplit) -> PairSplit:
    """The split with its features mapped through the (fine-tuned) projections."""
    h_t, h_i = model.dense(torch.as_tensor(split.text_emb), torch.as_tensor(split.image_emb))
    return PairSplit(split.name, split.caption_ids, split.captions, h_t.numpy(), split.image_ids,
                     h_i.numpy(), split.caption_image)


def dense_metrics(split: PairSplit) -> dict:
    _, _, pq = M.evaluate_scores(split.text_emb @ split.image_emb.T, split.qrels(), doc_ids=split.image_ids)
    return M.aggregate(pq)


def train_joint(
    head: SparseHead, proj: dict[str, torch.Tensor], train_feats: PairSplit, cfg: JointConfig,
    out_dir: str | Path, val_feats: PairSplit | None = None, val_tokens=None,
) -> dict:
    """Fine-tune projections + head; saves ``head.pt`` and ``projections.safetensors`` of the
    epoch with the best validation sparse R@1, and reports dense and sparse metrics."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    model = JointModel(head, proj, cfg.tau)
    n = len(train_feats.caption_ids)
    steps = math.ceil(n / cfg.batch_size)
    total, warmup = steps * cfg.epochs, int(steps * cfg.epochs * cfg.warmup)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(total, warmup))
    rng = np.random.default_rng(cfg.seed)
    f_t_all = torch.as_tensor(train_feats.text_emb)
    f_i_all = torch.as_tensor(train_feats.image_emb)
    cap_img = torch.as_tensor(train_feats.caption_image)
    history, best, step = [], -math.inf, 0
    for epoch in range(cfg.epochs):
        perm = rng.permutation(n)
        sums: dict[str, float] = {}
        for b in range(steps):
            rows = torch.as_tensor(perm[b * cfg.batch_size : (b + 1) * cfg.batch_size])
            parts = joint_loss(model, f_t_all[rows], f_i_all[cap_img[rows]], cfg, step, warmup)
            opt.zero_grad(set_to_none=True)
            parts["total"].backward()
            opt.step()
            sched.step()
            step += 1
            for k, v in parts.items():
                sums[k] = sums.get(k, 0.0) + float(v.detach() if torch.is_tensor(v) else v) / steps
        entry = {"epoch": epoch + 1, **sums, "tau": float(model.tau().detach())}
        if val_feats is not None:
            vs = project(model, val_feats)
            entry["val_dense"] = dense_metrics(vs)
            entry["val_sparse"] = validate(model.head, vs, val_tokens, "1", torch.device("cpu"))
        history.append(entry)
        score = entry["val_sparse"]["R@1"] if val_feats is not None else -entry["total"]
        if score > best:
            best = score
            head.config.trained = True
            head.config.notes = {**head.config.notes, "objective": "joint", "best_epoch": epoch + 1,
                                 "joint": asdict(cfg)}
            save_head(head, out / "head.pt")
            save_file({f"{n}.{p}": t.detach().contiguous() for n in ("text_proj", "vision_proj")
                       for p, t in getattr(model, n).state_dict().items()}, str(out / "projections.safetensors"))
        (out / "history.json").write_text(json.dumps(history, indent=2))
    return {"out_dir": str(out), "head": str(out / "head.pt"), "projections": str(out / "projections.safetensors"),
            "history": history, "best_val_sparse_r1": best}
