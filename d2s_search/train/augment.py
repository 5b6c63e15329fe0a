"""Pair mixing: a label-free augmentation for distillation.

The D2S loss needs no labels, only the frozen dense teacher's scores between the batch's
vectors (``losses.teacher_distributions``). So a mix of two pairs is a valid training pair:
caption ``a`` mixed with caption ``b`` and image ``a`` with image ``b``, with the same weight,
scored by the teacher like any other. Each mix is a new point between two captions (in
MiniLM's space, roughly a caption that says both), so a head trained on a fixed set of
captions sees many more distinct inputs; the measurement that motivated it: more distinct
caption pairs raised the whole caption-benchmark frontier (docs/design-decisions.md, "More caption
pairs").

A mix keeps the mean length of its two inputs (the teacher's temperature is tuned to the
inputs' scale), and its caption may use the words of both captions (the PEC masks are
joined).
"""

from __future__ import annotations

import torch

# Which side of each pair is mixed: both (a new pair), only the images (documents: a caption
# against a blend of its image and another), only the captions (queries).
MIX_SIDES = ("both", "images", "captions")


class PairMixer:
    """Replaces a share of each batch's pairs by mixes with another pair of the batch."""

    def __init__(self, share: float, seed: int, most: float = 1.0, neighbours: int = 0) -> None:
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"the mixed share must be in [0, 1], got {share}")
        if not 0.0 < most <= 1.0:
            raise ValueError(f"the partner's largest weight must be in (0, 1], got {most}")
        if neighbours < 0:
            raise ValueError(f"the number of neighbours must be >= 0, got {neighbours}")
        self.share, self.most, self.neighbours = share, most, neighbours
        self.generator = torch.Generator().manual_seed(seed)

    def draw(self, batch: int, z: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per row: whether it is mixed, its partner row and its own weight (in [1 - most, 1]).
        With ``neighbours`` > 0 the partner is one of the row's most similar rows of ``z``
        (cosine), drawn uniformly; else any other row."""
        mixed = torch.rand(batch, generator=self.generator) < self.share
        # A partner other than the row itself (a row mixed with itself is not a new point).
        partner = (torch.arange(batch) + torch.randint(1, max(batch, 2), (batch,), generator=self.generator)) % batch
        if self.neighbours and batch > 1:
            if z is None:
                raise ValueError("neighbour mixing needs the batch's vectors")
            unit = torch.nn.functional.normalize(z.detach().float().cpu(), dim=1)
            sim = unit @ unit.T
            sim.fill_diagonal_(-float("inf"))
            m = min(self.neighbours, batch - 1)
            near = sim.topk(m, dim=1).indices  # ties: torch's order, deterministic on CPU
            pick = torch.randint(0, m, (batch,), generator=self.generator)
            partner = near[torch.arange(batch), pick]
        u = torch.rand(batch, generator=self.generator)
        weight = u if self.most == 1.0 else 1.0 - self.most * u  # U(1 - most, 1); most 1: the draws as first measured
        if batch < 2:
            mixed = torch.zeros(batch, dtype=torch.bool)
        return mixed, partner, weight

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])


def mix_vectors(z: torch.Tensor, mixed: torch.Tensor, partner: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``w z_i + (1 - w) z_partner`` rescaled to the two inputs' mean length, on mixed rows."""
    mixed, partner, weight = mixed.to(z.device), partner.to(z.device), weight.to(z.device, z.dtype)
    other = z[partner]
    w = weight.unsqueeze(1)
    blend = w * z + (1 - w) * other
    length = w * z.norm(dim=1, keepdim=True) + (1 - w) * other.norm(dim=1, keepdim=True)
    blend = blend * (length / blend.norm(dim=1, keepdim=True).clamp_min(1e-12))
    return torch.where(mixed.unsqueeze(1), blend, z)


def join_rows(m: torch.Tensor | None, mixed: torch.Tensor, partner: torch.Tensor) -> torch.Tensor | None:
    """A 0/1 row matrix (PEC mask, caption words) with each mixed row joined with its partner's."""
    if m is None:
        return None
    mixed, partner = mixed.to(m.device), partner.to(m.device)
    return torch.where(mixed.unsqueeze(1), torch.maximum(m, m[partner]), m)


def check_mix_side(side: str) -> None:
    if side not in MIX_SIDES:
        raise ValueError(f"mix_side must be one of {', '.join(MIX_SIDES)} (the mixed side), got {side!r}")


def mix_pairs(zc: torch.Tensor, zi: torch.Tensor, mask: torch.Tensor | None, draw: tuple[torch.Tensor, ...],
              side: str = "both", words: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """A batch's captions, images, caption PEC mask and images' caption words (0/1 rows, or
    None) with ``draw`` (:meth:`PairMixer.draw`) applied to the ``side`` of :data:`MIX_SIDES`
    asked for: a mixed image may show both images' words."""
    check_mix_side(side)
    if side != "images":
        zc, mask = mix_vectors(zc, *draw), join_rows(mask, *draw[:2])
    if side != "captions":
        zi, words = mix_vectors(zi, *draw), join_rows(words, *draw[:2])
    return zc, zi, mask, words

