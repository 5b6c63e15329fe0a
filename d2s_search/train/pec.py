"""Probabilistic expansion control (PEC), the D2S paper's Algorithm 1.

Per training batch:

* caption level: ``E_C ~ Bernoulli(p_c)``; ``E_C = 0`` masks every caption vector in the
  batch to the caption's own token ids (no expansion), ``E_C = 1`` lets it expand;
* word level (mode ``c+w``, only when ``E_C = 1``): each vocabulary term draws
  ``E_v ~ Bernoulli(p_v)``; a caption may use its own tokens plus the terms with ``E_v = 1``.
  Frequent words (high df) get a low ``p_v`` early, so they are discouraged as expansions.
* image vectors are never masked.

Schedules, with training progress ``r(e)`` at epoch ``e`` (0-based) of ``E``:
``p_c = r`` and ``p_v = 1 - df_v * (1 - r)``, i.e. ``p_v`` starts at ``1 - df_v`` and rises
by ``df_v / E`` per epoch. Shapes of ``r``:

* ``paper``   ``r = min(1, e / E)`` (0 at the first epoch, rising by 1/E);
* ``authors`` ``r = min(1, e / (0.95 E))`` (the public code's ramp, fully expanded from 95%
  of training on);
* ``reverse`` ``r = 1 - e / E`` (expansion allowed first, then taken away).

Word-level gating, two readings: by default a caption keeps its own tokens and may expand
into the terms drawn with ``E_v = 1`` (own words are never gated); ``gate_own_words`` is
Algorithm 1 read literally, where ``E_v`` gates every term, the caption's own words included
(a frequent own word such as "a" or "the" is then often masked early in training).

Modes: ``0`` always masked, ``1`` never masked, ``c`` caption level only, ``c+w`` both.
"""

from __future__ import annotations

import numpy as np
import torch

from d2s_search.train.vocab import CaptionTokens

MODES = ("0", "1", "c", "c+w")
SHAPES = ("paper", "authors", "reverse")


def progress(epoch: int, epochs: int, shape: str = "paper") -> float:
    if shape not in SHAPES:
        raise ValueError(f"unknown schedule shape {shape!r}; choose from {', '.join(SHAPES)}")
    epochs = max(epochs, 1)
    if shape == "paper":
        return min(1.0, epoch / epochs)
    if shape == "authors":
        return min(1.0, epoch / (0.95 * epochs))
    return max(0.0, 1.0 - epoch / epochs)


def caption_expansion_prob(mode: str, epoch: int, epochs: int, shape: str = "paper") -> float:
    """p_c: probability that a batch's captions may expand."""
    if mode not in MODES:
        raise ValueError(f"unknown expansion mode {mode!r}; choose from {', '.join(MODES)}")
    if mode == "0":
        return 0.0
    if mode == "1":
        return 1.0
    return progress(epoch, epochs, shape)


def word_expansion_prob(
    df: np.ndarray, mode: str, epoch: int, epochs: int, shape: str = "paper"
) -> np.ndarray:
    """p_v per vocabulary term (all ones unless mode is ``c+w``)."""
    if mode != "c+w":
        return np.ones_like(df, dtype=np.float64)
    r = progress(epoch, epochs, shape)
    return np.clip(1.0 - df * (1.0 - r), 0.0, 1.0)


def own_token_mask(tokens: CaptionTokens, rows: np.ndarray, device=None) -> torch.Tensor:
    """(B, |V|) 0/1 mask with ones at each caption's own token ids."""
    rows = np.asarray(rows, dtype=np.int64)
    starts, ends = tokens.indptr[rows], tokens.indptr[rows + 1]
    lengths = ends - starts
    cols = np.concatenate([tokens.indices[s:e] for s, e in zip(starts, ends, strict=True)])
    r = np.repeat(np.arange(len(rows)), lengths)
    mask = torch.zeros(len(rows), tokens.vocab_size, device=device)
    if len(cols):
        mask[torch.as_tensor(r, device=device), torch.as_tensor(cols, device=device)] = 1.0
    return mask


class PEC:
    """Draws the caption masks of each batch; seeded and checkpointable."""

    def __init__(
        self,
        mode: str,
        tokens: CaptionTokens,
        df: np.ndarray,
        epochs: int,
        shape: str = "paper",
        seed: int = 0,
        gate_own_words: bool = False,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown expansion mode {mode!r}; choose from {', '.join(MODES)}")
        progress(0, epochs, shape)  # validates shape
        self.mode, self.tokens, self.epochs, self.shape = mode, tokens, epochs, shape
        self.df = np.asarray(df, dtype=np.float64)
        self.gate_own_words = gate_own_words
        self.generator = torch.Generator().manual_seed(seed)

    def p_c(self, epoch: int) -> float:
        return caption_expansion_prob(self.mode, epoch, self.epochs, self.shape)

    def p_v(self, epoch: int) -> np.ndarray:
        return word_expansion_prob(self.df, self.mode, epoch, self.epochs, self.shape)

    def draw(self, rows: np.ndarray, epoch: int, device=None) -> tuple[torch.Tensor | None, int]:
        """Mask for the captions ``rows`` of one batch (None = no masking) and E_C."""
        if self.mode == "1":
            return None, 1
        e_c = 0 if self.mode == "0" else int(torch.bernoulli(
            torch.tensor(self.p_c(epoch), dtype=torch.float64), generator=self.generator
        ).item())
        if e_c == 1 and self.mode == "c":
            return None, 1
        mask = own_token_mask(self.tokens, rows, device=device)
        if e_c == 1:  # c+w: own tokens plus the terms drawn as allowed expansions
            p_v = torch.as_tensor(self.p_v(epoch), dtype=torch.float64)
            e_v = torch.bernoulli(p_v, generator=self.generator).to(mask.dtype).to(mask.device)
            if self.gate_own_words:  # literal Algorithm 1: E_v gates own words as well
                mask = e_v.unsqueeze(0).expand_as(mask).clone()
            else:
                mask = torch.maximum(mask, e_v.unsqueeze(0))
        return mask, e_c

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
