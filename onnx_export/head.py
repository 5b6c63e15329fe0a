"""The Dense2Sparse projection head, shared by export and training.

    z1 = W1 z            (d -> w; with ``mlp_dim``: + W4 gelu(W3 z))
    z2 = LayerNorm(z1)
    s  = W2 z2           (w -> |V|), W2 initialised from a vocabulary projection
    s  = log(1 + relu(s)) * allowed                    (documents: relu(s + document_shift);
                                                        queries: relu(s + query_shift))
    s += query_word_boost * own(query tokens) * allowed (queries, in the text graph)
    s  = s * (s > floor)                               (documents: a few common terms' floors)
    s  = top_k(s, document_terms)                      (documents, when document_terms > 0)

A document (image) is encoded with ``document_shift`` added to every vocabulary score before
the ReLU: documents keep more terms than queries (the same ranking of terms, the smallest
ones added); ``query_shift`` does the same for queries (more, fainter expansion terms: the
strongest ones, those a person reads, stay first). A query's own words (its allowed input tokens) get ``query_word_boost`` added
to their weights, so what the user typed is always searched. Both are chosen after training
on validation data within a FLOPs budget (:func:`d2s_search.train.calibrate.choose_document_shift`);
0 = the head's plain output.

``document_terms`` keeps a document's strongest terms only: past the first hundred or so an
image's terms are the shift's faint tail (0.01-0.1 weights on words half the collection shares),
which cost postings and explanations and add little to a score (docs/design-decisions.md,
"At most 150 words per picture").

``document_floors`` (term id -> weight) hold back a term that would otherwise be on far more
images than the captions use it for (``sitting`` on 60% of pictures, in the captions of 18%):
below its floor an image does not carry it. Set after training by
:func:`d2s_search.train.calibrate.choose_document_floors`.

``allowed`` is a fixed 0/1 buffer over the vocabulary that zeroes special and ``[unused*]``
tokens inside the graph, so no exported model can ever emit them as terms.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

HEAD_FORMAT = "d2s-head/1"


@dataclass
class HeadConfig:
    dense_dim: int
    vocab_size: int
    hidden_dim: int = 768
    output_bias: bool = False
    # DistilBERT's MLM vocab_layer_norm uses 1e-12; kept so converted heads are exact.
    layer_norm_eps: float = 1e-5
    excluded_ids: list[int] = field(default_factory=list)
    # Free-form provenance: "untrained (vocabulary init)", training run settings, ...
    trained: bool = False
    notes: dict = field(default_factory=dict)
    # Added to the vocabulary scores of documents (images) only: see the module docstring.
    document_shift: float = 0.0
    # Added to the weights of a query's own (allowed) tokens: see the module docstring.
    query_word_boost: float = 0.0
    # Added to the vocabulary scores of queries only: see the module docstring.
    query_shift: float = 0.0
    # > 0: a residual branch W4 gelu(W3 z) of this width added to W1 z (W4 starts at zero, so
    # the head starts as the linear one); 0 = the paper's linear head.
    mlp_dim: int = 0
    # > 0: a document keeps at most this many terms, its strongest (see the module docstring).
    document_terms: int = 0
    # term id -> the weight an image's term must exceed (see the module docstring).
    document_floors: dict[int, float] = field(default_factory=dict)


class SparseHead(nn.Module):
    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        self.config = config
        self.proj = nn.Linear(config.dense_dim, config.hidden_dim)
        self.norm = nn.LayerNorm(config.hidden_dim, eps=config.layer_norm_eps)
        self.vocab = nn.Linear(config.hidden_dim, config.vocab_size, bias=config.output_bias)
        self.mlp = None
        if config.mlp_dim > 0:
            self.mlp = nn.Sequential(nn.Linear(config.dense_dim, config.mlp_dim), nn.GELU(),
                                     nn.Linear(config.mlp_dim, config.hidden_dim))
        allowed = torch.ones(config.vocab_size)
        if config.excluded_ids:
            allowed[torch.tensor(sorted(set(config.excluded_ids)), dtype=torch.long)] = 0.0
        self.register_buffer("allowed", allowed, persistent=False)
        floor = torch.zeros(config.vocab_size)
        for term, weight in config.document_floors.items():
            floor[int(term)] = float(weight)
        self.register_buffer("floor", floor, persistent=False)

    @classmethod
    def from_vocab_projection(
        cls,
        dense_dim: int,
        vocab_weight: torch.Tensor,
        vocab_bias: torch.Tensor | None = None,
        excluded_ids: list[int] | None = None,
        seed: int = 0,
    ) -> SparseHead:
        """A head whose W2 is a copy of a vocabulary projection (e.g. word embeddings).

        The hidden width follows the projection's width; W1 gets a seeded default init.
        """
        vocab_size, hidden = vocab_weight.shape
        config = HeadConfig(
            dense_dim=dense_dim,
            vocab_size=vocab_size,
            hidden_dim=hidden,
            output_bias=vocab_bias is not None,
            excluded_ids=list(excluded_ids or []),
            trained=False,
            notes={"init": "vocabulary projection"},
        )
        gen_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        head = cls(config)
        torch.random.set_rng_state(gen_state)
        with torch.no_grad():
            head.vocab.weight.copy_(vocab_weight)
            if vocab_bias is not None:
                head.vocab.bias.copy_(vocab_bias)
        return head

    def logits(self, z: torch.Tensor) -> torch.Tensor:
        """Pre-activation vocabulary scores (used by training for masking before the log)."""
        z1 = self.proj(z)
        if self.mlp is not None:
            z1 = z1 + self.mlp(z)
        return self.vocab(self.norm(z1))

    def forward(self, z: torch.Tensor, document: bool = False) -> torch.Tensor:
        logits = self.logits(z)
        if document and self.config.document_shift:
            logits = logits + self.config.document_shift
        elif not document and self.config.query_shift:
            logits = logits + self.config.query_shift
        sparse = torch.log1p(torch.relu(logits)) * self.allowed
        if document and self.config.document_floors:
            sparse = sparse * (sparse > self.floor).to(sparse.dtype)
        keep = self.config.document_terms
        if document and 0 < keep < sparse.shape[-1]:
            values, ids = torch.topk(sparse, keep, dim=-1)
            sparse = torch.zeros_like(sparse).scatter(-1, ids, values)
        return sparse

    def with_own_words(self, sparse: torch.Tensor, token_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """A query's sparse vector with ``query_word_boost`` added at its own allowed tokens
        (``token_ids`` B x T, ``mask`` 1 for its own words: real tokens, or the whole-word ones).
        Padding and special tokens are never allowed terms, so they add nothing. Added, not
        assigned: a token that is an own word at one position and not at another is one."""
        if not self.config.query_word_boost:
            return sparse
        own = torch.zeros_like(sparse).scatter_add(1, token_ids.long(), mask.to(sparse.dtype))
        return sparse + self.config.query_word_boost * torch.clamp(own, max=1.0) * self.allowed


def save_head(head: SparseHead, path: str | Path) -> Path:
    """Save a head as one ``.pt`` file holding its config and weights."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": HEAD_FORMAT,
        "config": asdict(head.config),
        "state_dict": {k: v.detach().cpu() for k, v in head.state_dict().items()},
    }
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(payload, tmp)
    tmp.replace(path)
    return path


def load_head(path: str | Path) -> SparseHead:
    """Load a head saved by :func:`save_head`."""
    path = Path(path)
    if not path.is_file():
        from d2s_search.errors import ModelError

        raise ModelError(f"head checkpoint not found: {path}")
    payload = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(payload, dict) or payload.get("format") != HEAD_FORMAT:
        from d2s_search.errors import ModelError

        raise ModelError(
            f"{path} is not a d2s head checkpoint (expected format {HEAD_FORMAT!r}); "
            "authors' DistilBERT-layout heads are converted with `d2s-search train convert-head`"
        )
    config = HeadConfig(**payload["config"])
    for name in ("document_shift", "query_word_boost", "query_shift"):
        finite_setting(getattr(config, name), f"{path}: its {name.replace('_', ' ')}")
    if not isinstance(config.mlp_dim, int) or not 0 <= config.mlp_dim <= 65536:
        from d2s_search.errors import ModelError

        raise ModelError(f"{path}: its mlp width must be an integer in 0..65536, got {config.mlp_dim!r}")
    config.document_terms = terms_setting(config.document_terms, f"{path}: its document terms")
    config.document_floors = floors_setting(config.document_floors, config.vocab_size, f"{path}: its document floors")
    head = SparseHead(config)
    head.load_state_dict(payload["state_dict"])
    return head


def finite_setting(value, what: str) -> float:
    """``value`` as a float, or a one-line ModelError naming ``what``: a head setting (document
    shift, query word boost) read back from a file or given on the command line."""
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        from d2s_search.errors import ModelError

        raise ModelError(f"{what} must be a finite number, not {value!r}")
    return float(value)


def terms_setting(value, what: str) -> int:
    """``value`` as a count of document terms (0 = all), or a one-line ModelError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1_000_000:
        from d2s_search.errors import ModelError

        raise ModelError(f"{what} must be a whole number of terms in 0..1000000 (0 = all), not {value!r}")
    return int(value)


def floors_setting(value, vocab_size: int, what: str) -> dict[int, float]:
    """``value`` as term id -> floor (ids inside the vocabulary, finite weights >= 0), or a
    one-line ModelError naming ``what``."""
    ok = isinstance(value, dict) and all(
        isinstance(k, int) and not isinstance(k, bool) and 0 <= k < vocab_size
        and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
        for k, v in value.items())
    if not ok:
        from d2s_search.errors import ModelError

        raise ModelError(f"{what} must map term ids below {vocab_size} to finite weights >= 0")
    return {int(k): float(v) for k, v in value.items()}


def head_summary(head: SparseHead) -> dict:
    """The head settings recorded in a bundle manifest."""
    c = head.config
    return json.loads(
        json.dumps(
            {
                "dense_dim": c.dense_dim,
                "hidden_dim": c.hidden_dim,
                "vocab_size": c.vocab_size,
                "output_bias": c.output_bias,
                "excluded_terms": len(set(c.excluded_ids)),
                "trained": c.trained,
                "notes": c.notes,
                **({"document_shift": c.document_shift} if c.document_shift else {}),
                **({"query_word_boost": c.query_word_boost} if c.query_word_boost else {}),
                **({"query_shift": c.query_shift} if c.query_shift else {}),
                **({"document_terms": c.document_terms} if c.document_terms else {}),
                **({"document_floors": len(c.document_floors)} if c.document_floors else {}),
            }
        )
    )
