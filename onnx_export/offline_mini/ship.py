"""Put a trained alignment run and D2S head into a built-in offline model.

Copies the run's ``projections.safetensors``, stores the head's small layers (W1, its bias, the per-term output bias if any,
LayerNorm) as ``head.safetensors`` — W2 must still be MiniLM's word-embedding matrix, which
is checked and not stored — and records both files' SHA-256 and size in the model config.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from d2s_onnx_export.head import load_head
from d2s_onnx_export.offline_mini.model import HEAD_FILE, PROJECTIONS_FILE, weights_dir
from d2s_onnx_export.offline_mini.parts import save_tensors, sha256_file, word_terms_mask
from d2s_onnx_export.registry import CONFIG_DIR

from d2s_search.errors import ModelError

SMALL_LAYERS = ("proj.weight", "proj.bias", "norm.weight", "norm.bias")


def ship_weights(model: str, run_dir: Path, head_path: Path, config_path: Path | None = None) -> dict:
    config_path = config_path or CONFIG_DIR / f"{model}.json"
    config = json.loads(config_path.read_text())
    if config.get("kind") != "offline":
        raise ModelError(f"{model} is not an offline model")
    head = load_head(head_path)
    from d2s_search.train.modeling import minilm_word_embeddings

    w2 = minilm_word_embeddings()  # what the builder rebuilds W2 from
    output_terms = _output_terms(head.vocab.weight.detach(), w2)
    if output_terms is None:
        raise ModelError(f"{head_path}: W2 is not MiniLM's word embeddings (or their `words` subset); "
                         "train with --freeze-vocab so only the small layers change")
    if head.config.notes.get("output_terms") == "words":  # excluded in the head (train --output-terms words)
        output_terms = "words"
    if head.config.dense_dim != config["dense_dim"]:
        raise ModelError(f"{head_path}: expected a {config['dense_dim']}-d head")
    align = json.loads((run_dir / "align.json").read_text())
    out = weights_dir(config)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(run_dir / PROJECTIONS_FILE, out / PROJECTIONS_FILE)
    state = head.state_dict()
    notes = {k: v for k, v in head.config.notes.items()
             if k in ("expansion", "eta", "query_mask", "best_epoch", "regularizer", "bias_init", "output_terms",
                      "proj_init", "sources")}
    notes["vocab_init"] = f"minilm word embeddings, frozen ({output_terms} terms)"  # not a local file path
    layers = SMALL_LAYERS + (("vocab.bias",) if head.config.output_bias else ())  # the per-term bias is small
    save_tensors({k: state[k] for k in layers}, out / HEAD_FILE, metadata={"notes": json.dumps(notes)})
    config["output_terms"] = output_terms
    config["document_shift"] = head.config.document_shift  # chosen by `train --flops-budget`: the image side
    config["query_word_boost"] = head.config.query_word_boost  # likewise: a query's own words
    config["weights"] = {
        name: {"sha256": sha256_file(out / name), "bytes": (out / name).stat().st_size}
        for name in (PROJECTIONS_FILE, HEAD_FILE)
    }
    config["training"] = {
        "alignment": {"best_epoch": align["best_epoch"], "config": align["config"], "sources": align["sources"],
                      "test_dense": {k: round(v, 4) for k, v in align["test"].items()}},
        "head": notes,
    }
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    return {"config": str(config_path), "weights": config["weights"]}


def _output_terms(w2: torch.Tensor, embeddings: torch.Tensor) -> str | None:
    """``all`` if W2 is MiniLM's matrix, ``words`` if it is that matrix with every row outside
    :func:`word_terms_mask` zeroed (``--vocab-init`` file from `d2s-search align vocab`)."""
    if w2.shape != embeddings.shape:
        return None
    if torch.equal(w2, embeddings):
        return "all"
    from d2s_onnx_export.tokenizers_offline import bert_base_uncased_tokenizer

    keep = word_terms_mask(bert_base_uncased_tokenizer()[0], w2.shape[0])
    if torch.equal(w2[keep], embeddings[keep]) and not w2[~keep].any():
        return "words"
    return None
