"""Joint sparse-dense self-distillation (the CIKM 2025 follow-up of Nguyen et al., ECIR 2024).

The dense projection layers (BLIP/ALBEF ``text_proj`` / ``vision_proj``, CLIP's
``text_projection`` / ``visual_projection``) are fine-tuned together with the sparse head,
from stored pre-projection features ``f`` (``embed --features`` writes them):

    h = normalize(proj(f))                  dense vectors (the improved dense model)
    z = head(h)                             sparse vectors (captions masked by PEC if asked)
    s_dense = h_t h_i^T / tau               tau learnable, clamped to [0.001, 0.5]
    s_sparse = z_t z_i^T
    s_inter = w1 * s_dense + w2 * s_sparse
    L  = (l1 * NCE(s_dense) + l2 * NCE(s_sparse) + l3 * NCE(s_inter)) / 2
    L' = (l1 * KD(s_dense <- s_inter) + l2 * KD(s_sparse <- s_inter)) / 2
    total = (L + L') / 2 + ramp_t * (eta_t * L1(z_t) + eta_i * L1(z_i)) / 2

NCE is the symmetric InfoNCE with the batch's pairs as positives; KD the symmetric soft
cross-entropy towards softmax of the fused scores; ``ramp_t`` the quadratic warm-up ramp of
the L1 weights. The scale is the public code's, term for term: ``holi-lab/mm-sparse-retrieval``
at commit 4c4f18e97a642d4c7e61b0789146a78ea53df52b, ``loss.py`` (``BICELoss``: ``L`` and ``L'``
divided by its two score kinds, dense and sparse, then ``0.5 * (L + L')``; the regulariser
``0.5 * (text_reg + img_reg)``; ``l3`` is 1 there), so the L1 term weighs twice as much against the contrastive and
distillation terms as ``eta`` read alone suggests. The scale matters beyond the ratio: the
gradient is clipped to norm 1.0 (``train.py``: ``gradient_clip_val=1.0``).

Optimiser, as ``lightning_model.py`` (``configure_optimizers``, ``finetune_from_proj``) and
``training_config/blip-coco.json`` set it: one AdamW group over every parameter and the
temperature, lr 5e-5, betas (0.9, 0.999), eps 1e-8, weight decay 0.05; linear warm-up over
20% of the steps, then linear decay. The temperature is the parameter itself (not its log):
Adam moves a parameter by about the learning rate a step, so tau moves ~5e-5 a step, where a
log-tau at 0.07 would move ~0.07 * 5e-5 (14x slower: frozen over a run of a few thousand steps).

Where this module departs from that code, on purpose:

* batches are drawn per image (:func:`image_batches`): no batch holds two captions of one
  image, so InfoNCE never treats a caption's own image as a negative (the public code draws
  random pairs);
* the caption->image distillation is towards the transposed fused distribution; the public
  code's second direction pairs ``s.t()`` with the row softmax of the untransposed fused
  scores (caption j pulled towards image j's distribution over captions);
* fp32 throughout (the public code runs 16-bit mixed precision on a GPU); the loss is the same.

Defaults that differ from its ``blip-coco.json`` (20 epochs, validation subset and epoch rule,
the head's W2, the document shift chosen after training): docs/training.md, "Joint sparse-dense
training".

``JointConfig.detach_fused`` makes the fused distribution a fixed target (stop-gradient); by
default the gradient flows through it, as in the public code.

Inputs: ``img_feats`` / ``text_feats`` (same layout as the embeddings) and
``projections.safetensors`` with ``text_proj.weight`` / ``vision_proj.weight`` (biases
optional: CLIP's projections have none).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from d2s_onnx_export.head import SparseHead, save_head
from torch import nn

from d2s_search import metrics as M
from d2s_search.errors import ModelError
from d2s_search.train.data import PairSplit
from d2s_search.train.losses import l1, quadratic_ramp, soft_cross_entropy
from d2s_search.train.pec import PEC
from d2s_search.train.trainer import _lr_lambda, query_mask_for, validate, validation_subset
from d2s_search.train.vocab import CaptionTokens, document_frequency

TAU_MIN, TAU_MAX = 1e-3, 0.5
PROJECTIONS = ("text_proj", "vision_proj")


@dataclass
class JointConfig:
    lr: float = 5e-5
    eta_text: float = 5e-4  # q_reg
    eta_image: float = 3e-5  # d_reg
    w1: float = 0.1
    w2: float = 0.1
    lambda1: float = 0.9  # InfoNCE on dense scores
    lambda2: float = 0.3  # InfoNCE on sparse scores
    lambda3: float = 1.0  # InfoNCE on the fused scores
    tau: float = 0.07  # initial value of the learnable temperature
    weight_decay: float = 0.05  # AdamW, on every parameter and the temperature (the public code's)
    grad_clip: float = 1.0  # max gradient norm over all parameters (0 = none)
    detach_fused: bool = False  # True: the fused distribution is a fixed distillation target
    epochs: int = 20
    batch_size: int = 256
    warmup: float = 0.2  # share of steps: lr warm-up and the L1 ramp
    expansion: str = "1"  # PEC mode on captions, as in D2S training (0, 1, c, c+w)
    schedule: str = "paper"
    seed: int = 0
    val_images: int = 1000  # validate on the first N val images (0 = all)
    select_after_warmup: bool = True  # as in D2S training: barely regularised epochs can't win
    select_max_flops: float = 0.0  # > 0: only epochs whose validation FLOPs stay within this budget can win
    device: str = "auto"

    def resolved_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)


def load_projections(path: str | Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    p = Path(path)
    if not p.is_file():
        raise ModelError(f"projection weights not found: {p} (needed by --objective joint; "
                         "`d2s-search embed --features` writes them next to the features)")
    try:
        state = load_file(str(p))
    except Exception as exc:  # a truncated or foreign file
        raise ModelError(f"cannot read {p}: {str(exc).splitlines()[0][:160]}") from None
    missing = [f"{n}.weight" for n in PROJECTIONS if f"{n}.weight" not in state]
    if missing:
        raise ModelError(f"{p} lacks {', '.join(missing)}")
    if state["text_proj.weight"].shape[0] != state["vision_proj.weight"].shape[0]:
        raise ModelError(f"{p}: text_proj and vision_proj map to different widths")
    return {k: v.float() for k, v in state.items()}


def _linear(state: dict[str, torch.Tensor], name: str) -> nn.Linear:
    w = state[f"{name}.weight"]
    bias = state.get(f"{name}.bias")
    layer = nn.Linear(w.shape[1], w.shape[0], bias=bias is not None)
    with torch.no_grad():
        layer.weight.copy_(w)
        if bias is not None:
            layer.bias.copy_(bias)
    return layer


class JointModel(nn.Module):
    def __init__(self, head: SparseHead, proj: dict[str, torch.Tensor], tau: float) -> None:
        super().__init__()
        self.head = head
        self.text_proj = _linear(proj, "text_proj")
        self.vision_proj = _linear(proj, "vision_proj")
        # tau itself is the parameter, as in the public code: see the module docstring
        self.temperature = nn.Parameter(torch.tensor(float(tau)))
        self.clamp_tau()

    def tau(self) -> torch.Tensor:
        return self.temperature

    def clamp_tau(self) -> None:
        """Keep the parameter itself in range (as the authors do), so it can move back."""
        with torch.no_grad():
            self.temperature.clamp_(TAU_MIN, TAU_MAX)

    def dense(self, f_t: torch.Tensor, f_i: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return F.normalize(self.text_proj(f_t), dim=-1), F.normalize(self.vision_proj(f_i), dim=-1)

    def projections(self) -> dict[str, torch.Tensor]:
        return {f"{n}.{p}": t.detach().cpu().contiguous() for n in PROJECTIONS
                for p, t in getattr(self, n).state_dict().items()}


def nce(scores: torch.Tensor) -> torch.Tensor:
    """Symmetric InfoNCE; row i's positive is column i."""
    labels = torch.arange(len(scores), device=scores.device)
    return (F.cross_entropy(scores, labels) + F.cross_entropy(scores.t(), labels)) / 2


def kd(scores: torch.Tensor, target_scores: torch.Tensor, detach: bool = False) -> torch.Tensor:
    """Symmetric soft cross-entropy of ``scores`` towards softmax of ``target_scores`` (row-wise
    for scores -> columns, column-wise for the other direction)."""
    t = target_scores.detach() if detach else target_scores
    return (soft_cross_entropy(scores, t.softmax(1)) + soft_cross_entropy(scores.t(), t.t().softmax(1))) / 2


def joint_loss(model: JointModel, f_t, f_i, cfg: JointConfig, step: int, warmup: int,
               text_mask: torch.Tensor | None = None) -> dict:
    h_t, h_i = model.dense(f_t, f_i)
    z_t, z_i = model.head(h_t), model.head(h_i, document=True)  # images are documents: the head's shift
    if text_mask is not None:  # PEC: captions restricted to their own (+ drawn) terms
        z_t = z_t * text_mask
    s_dense = h_t @ h_i.t() / model.tau()
    s_sparse = z_t @ z_i.t()
    s_inter = cfg.w1 * s_dense + cfg.w2 * s_sparse
    ramp = quadratic_ramp(step, warmup)
    parts = {
        "nce_dense": nce(s_dense), "nce_sparse": nce(s_sparse), "nce_inter": nce(s_inter),
        "kd_dense": kd(s_dense, s_inter, cfg.detach_fused), "kd_sparse": kd(s_sparse, s_inter, cfg.detach_fused),
        "l1_text": l1(z_t), "l1_image": l1(z_i),
    }
    # The public code's scale (module docstring): L and L' over its two score kinds, their sum
    # halved, the regulariser halved once.
    contrastive = (cfg.lambda1 * parts["nce_dense"] + cfg.lambda2 * parts["nce_sparse"]
                   + cfg.lambda3 * parts["nce_inter"]) / 2
    distill = (cfg.lambda1 * parts["kd_dense"] + cfg.lambda2 * parts["kd_sparse"]) / 2
    reg = ramp * (cfg.eta_text * parts["l1_text"] + cfg.eta_image * parts["l1_image"]) / 2
    return {"total": (contrastive + distill) / 2 + reg, **{k: float(v.detach()) for k, v in parts.items()}}


def make_optimizer(model: JointModel, cfg: JointConfig) -> torch.optim.AdamW:
    """One AdamW group over every parameter, the temperature included (the public code's)."""
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.999), eps=1e-8,
                             weight_decay=cfg.weight_decay)


def optimizer_step(model: JointModel, opt: torch.optim.Optimizer, loss: torch.Tensor, cfg: JointConfig) -> float:
    """Backward, clip the gradient norm to ``cfg.grad_clip``, step, keep tau in range; returns
    the gradient norm before clipping."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    params = [p for p in model.parameters() if p.grad is not None]
    if cfg.grad_clip > 0:
        norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip))
    else:
        norm = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params]))) if params else 0.0
    opt.step()
    model.clamp_tau()
    return norm


def image_batches(caption_image: np.ndarray, batch_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """One epoch of caption-row batches with no two captions of the same image in a batch.

    Each image's captions are shuffled and dealt into rounds (round r holds the r-th caption
    of every image that has one); batches are cut inside a round, so every caption is used
    once per epoch. A lone caption left at the end of a round joins an earlier batch without
    its image (that batch holds ``batch_size + 1``); it is dropped only if there is none.
    """
    cap_img = np.asarray(caption_image, dtype=np.int64)
    order = rng.permutation(len(cap_img))
    by_image = order[np.argsort(cap_img[order], kind="stable")]  # random order within images
    starts = np.r_[0, np.flatnonzero(np.diff(cap_img[by_image])) + 1]
    rank = np.arange(len(by_image)) - np.repeat(starts, np.diff(np.r_[starts, len(by_image)]))
    batches: list[np.ndarray] = []
    for r in range(int(rank.max()) + 1 if len(rank) else 0):
        rows = rng.permutation(by_image[rank == r])
        for chunk in (rows[i : i + batch_size] for i in range(0, len(rows), batch_size)):
            if len(chunk) > 1:
                batches.append(chunk)
                continue
            # A lone caption has no negatives: add it to a batch without its image instead.
            home = next((k for k, b in enumerate(batches) if cap_img[chunk[0]] not in cap_img[b]), None)
            if home is not None:
                batches[home] = np.append(batches[home], chunk)
    return [batches[k] for k in rng.permutation(len(batches))]


@torch.no_grad()
def project(model: JointModel, split: PairSplit) -> PairSplit:
    """The split with its features mapped through the (fine-tuned) projections."""
    device = model.temperature.device
    h_t, h_i = model.dense(torch.as_tensor(split.text_emb, device=device), torch.as_tensor(split.image_emb, device=device))
    return PairSplit(split.name, split.caption_ids, split.captions, h_t.cpu().numpy(), split.image_ids,
                     h_i.cpu().numpy(), split.caption_image)


def dense_metrics(split: PairSplit) -> dict:
    _, _, pq = M.evaluate_scores(split.text_emb @ split.image_emb.T, split.qrels(), doc_ids=split.image_ids)
    return M.aggregate(pq)


def train_joint(
    head: SparseHead, proj: dict[str, torch.Tensor], train_feats: PairSplit, cfg: JointConfig,
    out_dir: str | Path, val_feats: PairSplit | None = None, val_tokens: CaptionTokens | None = None,
    train_tokens: CaptionTokens | None = None, log: Callable[[dict], None] | None = None,
) -> dict:
    """Fine-tune projections + head; saves ``head.pt`` and ``projections.safetensors`` of the
    epoch with the best validation sparse R@1, and reports dense and sparse metrics.

    ``train_tokens`` (the training captions' token ids) are needed for expansion control
    (``cfg.expansion`` other than ``"1"``).
    """
    from safetensors.torch import save_file

    if head.config.dense_dim != proj["text_proj.weight"].shape[0]:
        raise ModelError(f"head expects {head.config.dense_dim}-d vectors, the projections give "
                         f"{proj['text_proj.weight'].shape[0]}-d")
    for side, name, feats in (("text", "text_proj", train_feats.text_emb), ("image", "vision_proj", train_feats.image_emb)):
        if proj[f"{name}.weight"].shape[1] != feats.shape[1]:
            raise ModelError(f"{name} takes {proj[f'{name}.weight'].shape[1]}-d input, the {side} features are "
                             f"{feats.shape[1]}-d (features and projections.safetensors come from different models?)")
    if cfg.expansion != "1" and train_tokens is None:
        raise ModelError(f"expansion {cfg.expansion!r} needs the training captions' token ids")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    device = cfg.resolved_device()
    model = JointModel(head, proj, cfg.tau).to(device)
    rng = np.random.default_rng(cfg.seed)
    cap_img = np.asarray(train_feats.caption_image)
    steps = len(image_batches(cap_img, cfg.batch_size, np.random.default_rng(0)))  # same count every epoch
    total, warmup = steps * cfg.epochs, int(steps * cfg.epochs * cfg.warmup)
    opt = make_optimizer(model, cfg)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(total, warmup))
    pec = (PEC(cfg.expansion, train_tokens, document_frequency(train_tokens), cfg.epochs, cfg.schedule, cfg.seed)
           if cfg.expansion != "1" else None)
    val, val_tokens = validation_subset(val_feats, val_tokens, cfg.val_images)
    f_t_all = torch.as_tensor(train_feats.text_emb, dtype=torch.float32)
    f_i_all = torch.as_tensor(train_feats.image_emb, dtype=torch.float32)
    cap_img_t = torch.as_tensor(cap_img)
    (out / "config.json").write_text(json.dumps({**asdict(cfg), "head": asdict(head.config)}, indent=2))
    head.config.notes = {**head.config.notes, "objective": "joint", "expansion": cfg.expansion,
                         "eta": cfg.eta_text, "query_mask": query_mask_for(cfg.expansion)}
    history, best, best_epoch, step = [], -math.inf, -1, 0
    for epoch in range(cfg.epochs):
        t0 = time.perf_counter()
        model.train()
        batches = image_batches(cap_img, cfg.batch_size, rng)
        sums: dict[str, float] = {}
        for rows in batches:
            rows_t = torch.as_tensor(rows)
            mask = pec.draw(rows, epoch, device=device)[0] if pec is not None else None
            parts = joint_loss(model, f_t_all[rows_t].to(device), f_i_all[cap_img_t[rows_t]].to(device), cfg, step,
                               warmup, mask)
            parts["grad_norm"] = optimizer_step(model, opt, parts["total"], cfg)
            sched.step()
            step += 1
            for k, v in parts.items():
                sums[k] = sums.get(k, 0.0) + float(v.detach() if torch.is_tensor(v) else v) / len(batches)
        entry = {"epoch": epoch + 1, **sums, "tau": float(model.tau().detach()), "steps": step}
        model.eval()
        if val is not None:
            vs = project(model, val)
            entry["val_dense"] = dense_metrics(vs)
            entry["val_sparse"] = validate(model.head, vs, val_tokens, cfg.expansion, device)
        entry["seconds"] = time.perf_counter() - t0
        entry["eligible"] = not cfg.select_after_warmup or step >= warmup or epoch == cfg.epochs - 1
        if cfg.select_max_flops > 0 and val is not None:
            entry["eligible"] = entry["eligible"] and entry["val_sparse"]["FLOPs"] <= cfg.select_max_flops
        history.append(entry)
        score = entry["val_sparse"]["R@1"] if val is not None else -entry["total"]
        if entry["eligible"] and score > best:
            best, best_epoch = score, epoch + 1
            head.config.trained = True
            head.config.notes = {**head.config.notes, "best_epoch": epoch + 1, "joint": asdict(cfg),
                                 "val": entry.get("val_sparse", {}), "val_dense": entry.get("val_dense", {})}
            save_head(head, out / "head.pt")
            tmp = out / "projections.safetensors.tmp"
            save_file(model.projections(), str(tmp), metadata={"objective": "joint", "epoch": str(epoch + 1)})
            tmp.replace(out / "projections.safetensors")
        (out / "history.json").write_text(json.dumps(history, indent=2))
        if log:
            log(entry)
    if best_epoch < 0:
        raise ModelError(f"no epoch met the selection rule (FLOPs <= {cfg.select_max_flops:g} on validation); "
                         "train longer, raise the L1 weights or the budget")
    best_entry = history[best_epoch - 1]
    return {"out_dir": str(out), "head": str(out / "head.pt"), "projections": str(out / "projections.safetensors"),
            "best_epoch": best_epoch, "best_val_sparse_r1": best, "best_val": best_entry.get("val_sparse", {}),
            "best_val_dense": best_entry.get("val_dense", {}), "epochs": cfg.epochs, "steps": step,
            "history": history}
