"""The D2S distillation loss (Nguyen et al., "Multimodal Learned Sparse Retrieval with
Probabilistic Expansion Control", ECIR 2024; options in docs/training.md, "Training").

Teacher: ``T = softmax(z_I z_C^T / tau)`` from the frozen dense vectors (always fp32:
scores / 0.001 overflow fp16). Student logits: ``S = s_I s_C^T`` with no temperature.
Per direction the soft cross-entropy ``-sum_j T_ij log softmax(S)_ij`` averaged over rows;
the two directions (image->caption, caption->image) are averaged.

Total: ``L = (1 - lambda) * CE + lambda * eta_t * (R(s_I) + R(s_C)) / 2 + mu * LEX`` where the sparsity
regulariser R is L1 (the paper) or SPLADE's FLOPS regulariser (Paria et al. 2020;
Formal et al. 2021): ``FLOPS(s) = sum_j (mean_rows |s_j|)^2``, a smooth stand-in for the
expected number of multiplications, which penalises most the terms that fire in many rows
of the batch (co-activation) and barely the rare ones. With L1,
``L1(s) = mean_rows sum_j |s_j|`` and ``eta_t = eta * min(1, (t / T_warmup)^2)`` (the
authors' quadratic ramp). With lambda = 0.5 this is exactly half the authors' loss
``CE + eta_t * (L1_I + L1_C) / 2``, i.e. the same optimum and, under Adam, the same updates.

``LEX`` (optional, ``mu`` = ``TrainConfig.lexical``, 0 by default: not in the paper) asks the
image side to say what its captions say: per image, the share of its sparse vector's mass
that is *not* on words of its captions, ``1 - sum_{j in W_i} s_ij / sum_j s_ij``, averaged
over the batch. Image term precision (the share of a photo's top terms that are words of its
captions) is what it moves; the distillation alone leaves photos with related but unsaid
words (``bicycle`` for ``bike``, ``grass`` for a dog).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


def soft_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean over rows of ``-sum_j target_ij * log_softmax(logits)_ij``."""
    return -(target * F.log_softmax(logits.float(), dim=1)).sum(dim=1).mean()


def teacher_distributions(
    z_img: torch.Tensor, z_cap: torch.Tensor, tau: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise teacher targets for image->caption and caption->image."""
    with torch.no_grad():
        scores = z_img.float() @ z_cap.float().t() / tau
        return torch.softmax(scores, dim=1), torch.softmax(scores.t(), dim=1)


def l1(s: torch.Tensor) -> torch.Tensor:
    return s.float().abs().sum(dim=1).mean()


def flops_reg(s: torch.Tensor) -> torch.Tensor:
    """SPLADE's FLOPS regulariser: sum over terms of the squared mean activation in the batch."""
    return s.float().abs().mean(dim=0).pow(2).sum()


REGULARIZERS = {"l1": l1, "flops": flops_reg}


def off_caption_mass(s: torch.Tensor, words: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Mean over rows of the share of the row's mass outside its caption words (``words``: a
    0/1 matrix of the same shape); rows with no mass count 0 (nothing said, nothing wrong)."""
    s = s.float().abs()
    total = s.sum(dim=1)
    on = (s * words).sum(dim=1)
    return torch.where(total > 0, 1.0 - on / (total + eps), torch.zeros_like(total)).mean()


def quadratic_ramp(step: int, warmup_steps: int) -> float:
    """Weight multiplier of the L1 term: 0 at step 0, 1 from ``warmup_steps`` on."""
    if warmup_steps <= 0:
        return 1.0
    return min(1.0, (step / warmup_steps) ** 2)


@dataclass
class LossParts:
    total: torch.Tensor
    ce_i2c: float
    ce_c2i: float
    l1_img: float
    l1_cap: float
    eta_t: float
    reg_img: float = 0.0  # the regulariser actually used (= l1_* for "l1")
    reg_cap: float = 0.0
    lex: float = 0.0  # off_caption_mass of the image side (when mu > 0)


def d2s_loss(
    s_img: torch.Tensor,
    s_cap: torch.Tensor,
    z_img: torch.Tensor,
    z_cap: torch.Tensor,
    tau: float = 1e-3,
    eta: float = 1e-3,
    lam: float = 0.5,
    step: int = 0,
    warmup_steps: int = 0,
    regularizer: str = "l1",
    mu: float = 0.0,
    image_words: torch.Tensor | None = None,
    image_eta_scale: float = 1.0,
) -> LossParts:
    """``image_eta_scale`` weighs the images' sparsity term against the captions' (SPLADE's
    separate lambda_d / lambda_q: below 1, documents may keep more terms than queries)."""
    if regularizer not in REGULARIZERS:
        raise ValueError(f"unknown regulariser {regularizer!r}; choose from {', '.join(REGULARIZERS)}")
    t_i2c, t_c2i = teacher_distributions(z_img, z_cap, tau)
    logits = s_img.float() @ s_cap.float().t()
    ce_i2c = soft_cross_entropy(logits, t_i2c)
    ce_c2i = soft_cross_entropy(logits.t(), t_c2i)
    l1_i, l1_c = l1(s_img), l1(s_cap)
    reg = REGULARIZERS[regularizer]
    r_i, r_c = (l1_i, l1_c) if regularizer == "l1" else (reg(s_img), reg(s_cap))
    eta_t = eta * quadratic_ramp(step, warmup_steps)
    total = (1.0 - lam) * (ce_i2c + ce_c2i) / 2 + lam * eta_t * (image_eta_scale * r_i + r_c) / 2
    lex = 0.0
    if mu > 0:
        if image_words is None:
            raise ValueError("the lexical term needs the images' caption words")
        off = off_caption_mass(s_img, image_words)
        total = total + mu * off
        lex = float(off.detach())
    return LossParts(
        total, float(ce_i2c.detach()), float(ce_c2i.detach()), float(l1_i.detach()),
        float(l1_c.detach()), float(eta_t), float(r_i.detach()), float(r_c.detach()), lex
    )
