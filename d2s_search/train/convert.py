"""Conversions of heads: the authors' released checkpoints in, an ONNX head graph out.

Authors' layout (``lsr-multimodal`` ``MLM`` / ``D2SModel``): state-dict keys
``proj.{weight,bias}`` (d -> 768), ``vocab_layer_norm.{weight,bias}`` (DistilBERT MLM,
eps 1e-12) and ``vocab_projector.{weight,bias}`` (768 -> 30522), stored as
``model.safetensors`` / ``pytorch_model.bin`` in a hub directory (with ``config.json``
giving ``dense_size``) or as a raw ``model.pt`` state dict written by their train.py.
Forward: ``log1p(relu(vocab_projector(vocab_layer_norm(proj(z)))))`` — the same as
:class:`SparseHead` with ``output_bias=True``; we add the fixed exclusion of special and
``[unused*]`` tokens.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
from d2s_onnx_export.head import HeadConfig, SparseHead

from d2s_search.errors import ModelError

KEY_MAP = {
    "proj.weight": "proj.weight",
    "proj.bias": "proj.bias",
    "vocab_layer_norm.weight": "norm.weight",
    "vocab_layer_norm.bias": "norm.bias",
    "vocab_projector.weight": "vocab.weight",
    "vocab_projector.bias": "vocab.bias",
}
DISTILBERT_LN_EPS = 1e-12


def _read_state(path: Path) -> dict[str, torch.Tensor]:
    if path.is_dir():
        for name in ("model.safetensors", "pytorch_model.bin", "model.pt"):
            if (path / name).is_file():
                return _read_state(path / name)
        raise ModelError(f"{path} holds no model.safetensors, pytorch_model.bin or model.pt")
    if not path.is_file():
        raise ModelError(f"checkpoint not found: {path}")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure is the same user error
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        raise ModelError(f"{path} is not a readable torch checkpoint ({first})") from exc
    if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict):
        raise ModelError(f"{path} does not hold a state dict")
    return obj


def convert_authors_head(path: str | Path, excluded_ids: list[int]) -> SparseHead:
    """A :class:`SparseHead` with the weights of an authors' D2S checkpoint."""
    p = Path(path)
    state = {k.removeprefix("model."): v for k, v in _read_state(p).items()}
    missing = [k for k in KEY_MAP if k not in state]
    if missing:
        raise ModelError(
            f"{p} is not a D2S (DistilBERT MLM layout) checkpoint: missing {', '.join(missing)}"
        )
    w1, w2 = state["proj.weight"], state["vocab_projector.weight"]
    if w2.shape[1] != w1.shape[0]:
        raise ModelError(f"{p}: proj output {w1.shape[0]} does not match vocab_projector input {w2.shape[1]}")
    config = HeadConfig(
        dense_dim=int(w1.shape[1]),
        vocab_size=int(w2.shape[0]),
        hidden_dim=int(w1.shape[0]),
        output_bias=True,
        layer_norm_eps=DISTILBERT_LN_EPS,
        excluded_ids=[i for i in excluded_ids if i < w2.shape[0]],
        trained=True,
        notes={"source": str(p), "converted_from": "authors' D2S (DistilBERT MLM layout)"},
    )
    cfg_file = (p if p.is_dir() else p.parent) / "config.json"
    if cfg_file.is_file():
        try:
            dense_size = json.loads(cfg_file.read_text()).get("dense_size")
        except json.JSONDecodeError:
            dense_size = None
        if dense_size is not None and int(dense_size) != config.dense_dim:
            raise ModelError(f"{cfg_file} says dense_size {dense_size}, weights say {config.dense_dim}")
    head = SparseHead(config)
    head.load_state_dict({KEY_MAP[k]: state[k].float() for k in KEY_MAP})
    return head


class _BothSides(torch.nn.Module):
    """A head with a document shift or a document terms cap as one graph: the query side and
    the document side."""

    def __init__(self, head: SparseHead) -> None:
        super().__init__()
        self.head = head

    def forward(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.head(z), self.head(z, document=True)


def export_head_onnx(head: SparseHead, path: str | Path, opset: int = 17) -> Path:
    """The head alone as an ONNX graph: input ``dense`` (B, d), output ``sparse`` (B, |V|),
    and ``sparse_document`` (the image side) when the head's two sides differ (a document or
    query shift, or an image's strongest terms only).

    The head's query-encoding rules (``query_mask`` note; ``query_word_boost`` with the
    excluded terms, applied by the caller: the graph sees no tokens) travel as model metadata.
    """
    import onnx

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    head = head.eval().cpu()
    dummy = torch.zeros(2, head.config.dense_dim)
    graph, outputs = head, ["sparse"]
    if head.config.document_shift or head.config.document_terms or head.config.query_shift:
        graph, outputs = _BothSides(head), ["sparse", "sparse_document"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # legacy exporter deprecation notice
        torch.onnx.export(
            graph, (dummy,), str(p), input_names=["dense"], output_names=outputs,
            dynamic_axes={"dense": {0: "batch"}, **{name: {0: "batch"} for name in outputs}},
            opset_version=opset, dynamo=False,
        )
    model = onnx.load(str(p))
    for k, v in {"query_mask": str(head.config.notes.get("query_mask", "none")),
                 "d2s_head": json.dumps({"dense_dim": head.config.dense_dim, "vocab_size": head.config.vocab_size,
                                         **({"query_word_boost": head.config.query_word_boost,
                                             "excluded_ids": sorted(set(head.config.excluded_ids))}
                                            if head.config.query_word_boost else {})})}.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = k, v
    onnx.save(model, str(p))
    return p
