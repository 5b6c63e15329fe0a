"""Export a dense encoder + sparse head to an ONNX model bundle and check parity.

Each graph has outputs ``dense`` (the model's L2-normalised vector), ``sparse`` (the head's
|V| weights) and ``features`` (the pre-projection vector the dense one is projected from;
``embed --features`` stores it for joint training). Batch and sequence length are dynamic.
The towers' projections are also written as ``projections.safetensors``; ``projections=``
replaces them with joint-trained ones (``train --objective joint``), which changes the dense
vectors and so the bundle's fingerprint.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from d2s_search import __version__
from d2s_search.bundle import (
    BUNDLE_FORMAT,
    OUTPUTS,
    PROJECTIONS_FILE,
    Bundle,
    compute_fingerprint,
    sha256_file,
)
from d2s_search.encoder import OWN_WORDS
from d2s_search.errors import ModelError, ParityError
from d2s_search.terms import split_word_flags

from .dense import ProjectedTower
from .head import SparseHead, finite_setting, head_summary, load_head, terms_setting
from .models import DenseDualEncoder, build_dense_encoder
from .tokenizers_offline import display_terms, excluded_token_ids, tokenizer_json

PARITY_TOLERANCE = 1e-4
OPSET = 17
PRECISIONS = ("fp32", "fp16", "int8")


def _outputs(tower: ProjectedTower, head: SparseHead, *inputs: torch.Tensor,
             document: bool = False) -> tuple[torch.Tensor, ...]:
    feats = tower.features(*inputs)
    dense = torch.nn.functional.normalize(tower.project(feats), dim=-1)
    return dense, head(dense, document=document), feats


class ImageGraph(nn.Module):
    """pixel_values -> (dense, sparse, features), in the order of ``OUTPUTS``; images are the
    documents, so their sparse side carries the head's ``document_shift``."""

    def __init__(self, tower: ProjectedTower, head: SparseHead) -> None:
        super().__init__()
        self.tower, self.head = tower, head

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return _outputs(self.tower, self.head, pixel_values, document=True)


class TextGraph(nn.Module):
    """input_ids, attention_mask -> (dense, sparse, features); the query's own words carry the
    head's ``query_word_boost``. With the ``tokenizer``, own words are the tokens that are whole
    words (d2s_search.terms): a typed word split into several tokens boosts none of its
    fragments. The graph tells them apart from the input ids alone, so it does the same wherever
    it runs (ONNX Runtime here, ml-commons in a cluster)."""

    def __init__(self, tower: ProjectedTower, head: SparseHead, tokenizer=None) -> None:
        super().__init__()
        self.tower, self.head = tower, head
        self.whole_words = tokenizer is not None
        size = head.config.vocab_size
        joins, opens = split_word_flags(tokenizer, size) if tokenizer is not None else (np.zeros(size, bool),) * 2
        self.register_buffer("joins", torch.from_numpy(joins.astype(np.float32)), persistent=False)
        self.register_buffer("opens", torch.from_numpy(opens.astype(np.float32)), persistent=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        dense, sparse, feats = _outputs(self.tower, self.head, input_ids, attention_mask)
        own = attention_mask * self.whole_word_mask(input_ids, attention_mask) if self.whole_words else attention_mask
        return dense, self.head.with_own_words(sparse, input_ids, own), feats

    def whole_word_mask(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """1 where a token neither joins the one before it nor is joined by the next (the torch
        twin of d2s_search.terms.whole_word_positions)."""
        real = attention_mask.to(self.joins.dtype)
        join, open_ = self.joins[input_ids] * real, self.opens[input_ids] * real
        edge = torch.zeros_like(join[:, :1])
        joined_next = torch.cat([join[:, 1:], edge], dim=1)
        open_before = torch.cat([edge, open_[:, :-1]], dim=1)
        return real * (1 - join) * (1 - open_) * (1 - joined_next) * (1 - open_before)


@dataclass
class ExportResult:
    bundle: Bundle
    parity: dict  # {"image": {"dense": maxabs, "sparse": maxabs, "features": maxabs}, "text": {...}}
    seconds: float


def build_head(encoder: DenseDualEncoder, head_path: str | Path | None) -> SparseHead:
    vocab_size = encoder.vocab_weight.shape[0]
    excluded = excluded_token_ids(encoder.tokenizer, vocab_size)
    if head_path is None:
        if encoder.default_head is not None:  # the model ships a trained head (offline-mini)
            return encoder.default_head.eval()
        return SparseHead.from_vocab_projection(encoder.dense_dim, encoder.vocab_weight, excluded_ids=excluded)
    head = load_head(head_path)
    c = head.config
    if c.dense_dim != encoder.dense_dim or c.vocab_size != vocab_size:
        raise ModelError(
            f"head {head_path} expects dense dim {c.dense_dim} / vocabulary {c.vocab_size}, "
            f"model {encoder.name} has {encoder.dense_dim} / {vocab_size}"
        )
    merged = sorted(set(c.excluded_ids) | set(excluded))
    if merged != sorted(set(c.excluded_ids)):
        # Rebuild so the in-graph mask also covers this tokenizer's special tokens.
        state = head.state_dict()
        c.excluded_ids = merged
        head = SparseHead(c)
        head.load_state_dict(state)
    return head.eval()


TRACE_TEXTS = ["a dog sitting in the back seat of a car", "two children play on the beach", "snow"]
PARITY_TEXTS = ["people walking down a busy city street at night", "a red bike", "grass", "surf", "x"]


def sample_inputs(encoder: DenseDualEncoder, texts: list[str], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Deterministic inputs: noise images and captions of different lengths (padding is
    exercised). Parity uses another batch size and sequence length than tracing."""
    gen = torch.Generator().manual_seed(seed)
    size = int(encoder.image["size"])
    pixels = torch.randn(len(texts), 3, size, size, generator=gen)
    ids, mask = tokenize(encoder.tokenizer, texts, encoder.max_text_length)
    return pixels, torch.from_numpy(ids), torch.from_numpy(mask)


def tokenize(tokenizer, texts: list[str], max_length: int) -> tuple[np.ndarray, np.ndarray]:
    """Same tokenisation as the runtime encoder (imported here to avoid drift)."""
    from d2s_search.encoder import tokenize_batch

    return tokenize_batch(tokenizer, texts, max_length)


def export_bundle(
    model: str,
    out_dir: str | Path,
    head_path: str | Path | None = None,
    precision: str = "fp32",
    tolerance: float = PARITY_TOLERANCE,
    overwrite: bool = False,
    progress=None,
    projections: str | Path | None = None,
    document_shift: float | None = None,
    query_word_boost: float | None = None,
    document_terms: int | None = None,
    query_shift: float | None = None,
) -> ExportResult:
    """``document_shift``, ``query_word_boost``, ``document_terms``, ``query_shift``: override the
    head's (None: keep what training chose)."""
    if precision not in PRECISIONS:
        raise ModelError(f"precision must be one of {', '.join(PRECISIONS)}")
    out_dir = Path(out_dir).expanduser().resolve()
    if out_dir.exists() and any(out_dir.iterdir()):
        # Only ever replace a previous bundle, never some other folder's contents.
        if not (out_dir / "manifest.json").is_file():
            raise ModelError(f"{out_dir} exists and is not a model bundle; choose another --out")
        if not overwrite:
            raise ModelError(f"{out_dir} already holds a bundle; pass overwrite=True to replace it")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    step = progress or (lambda msg: None)
    step(f"building {model}")
    encoder = build_dense_encoder(model)
    if projections is not None:
        step("loading fine-tuned projections")
        load_projections_into(encoder, projections)
    head = build_head(encoder, head_path)
    for name, value in (("document_shift", document_shift), ("query_word_boost", query_word_boost),
                        ("query_shift", query_shift)):
        if value is not None:
            setattr(head.config, name, finite_setting(value, name.replace("_", " ")))
    if document_terms is not None:
        head.config.document_terms = terms_setting(document_terms, "document terms")
    image_graph = ImageGraph(encoder.image_tower, head).eval()
    text_graph = TextGraph(encoder.text_tower, head, encoder.tokenizer).eval()
    pixels, ids, mask = sample_inputs(encoder, TRACE_TEXTS)

    tmp = Path(tempfile.mkdtemp(prefix=".export-", dir=out_dir.parent))  # same filesystem: atomic rename
    try:
        step("exporting image graph")
        _export(image_graph, (pixels,), tmp / "image.onnx", ["pixel_values"], {"pixel_values": {0: "batch"}})
        step("exporting text graph")
        _export(
            text_graph,
            (ids, mask),
            tmp / "text.onnx",
            ["input_ids", "attention_mask"],
            {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}},
        )
        if precision != "fp32":
            step(f"converting to {precision}")
            for name in ("image.onnx", "text.onnx"):
                convert_precision(tmp / name, precision)
        step("checking parity against torch")
        parity = check_parity(image_graph, text_graph, tmp, *sample_inputs(encoder, PARITY_TEXTS, seed=1))
        worst = max(v for graph in parity.values() for v in graph.values())
        if precision == "fp32" and worst > tolerance:
            raise ParityError(f"ONNX output differs from torch by {worst:.2e} (> {tolerance:.0e}); not writing the bundle")

        vocab_size = encoder.vocab_weight.shape[0]
        (tmp / "tokenizer.json").write_text(tokenizer_json(encoder.tokenizer), encoding="utf-8")
        (tmp / "vocab.txt").write_text("\n".join(display_terms(encoder.tokenizer, vocab_size)) + "\n", encoding="utf-8")
        feature_dims = write_projections(encoder, tmp / PROJECTIONS_FILE, "joint" if projections is not None else "model")
        manifest = _manifest(encoder, head, precision, tmp, parity, feature_dims, projections)
        manifest["head_source"] = head_source(head_path, encoder.name)  # not fingerprinted: where, not what
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.replace(out_dir)
        out_dir.chmod(0o755)  # mkdtemp made it private
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ExportResult(bundle=Bundle.load(out_dir, verify_hashes=True), parity=parity, seconds=time.perf_counter() - start)


def _export(module: nn.Module, args: tuple, path: Path, input_names: list[str], dynamic_axes: dict) -> None:
    axes = dict(dynamic_axes)
    axes.update({name: {0: "batch"} for name in OUTPUTS})
    # The tracer warns about shape checks in transformers that are constant for our inputs
    # (parity is checked on another batch size and sequence length right after).
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript exporter; see docs
        torch.onnx.export(
            module,
            args,
            str(path),
            input_names=input_names,
            output_names=list(OUTPUTS),
            dynamic_axes=axes,
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
        )


def convert_precision(path: Path, precision: str) -> None:
    if precision == "int8":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        out = path.with_suffix(".int8.onnx")
        quantize_dynamic(str(path), str(out), weight_type=QuantType.QInt8)
        out.replace(path)
    elif precision == "fp16":
        import onnx
        from onnxruntime.transformers.float16 import convert_float_to_float16

        model = convert_float_to_float16(onnx.load(str(path)), keep_io_types=True)
        onnx.save(model, str(path))


def check_parity(image_graph, text_graph, folder: Path, pixels, ids, mask) -> dict:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    results = {}
    with torch.no_grad():
        want_img = [t.numpy() for t in image_graph(pixels)]
        want_txt = [t.numpy() for t in text_graph(ids, mask)]
    img = ort.InferenceSession(str(folder / "image.onnx"), opts, providers=["CPUExecutionProvider"])
    txt = ort.InferenceSession(str(folder / "text.onnx"), opts, providers=["CPUExecutionProvider"])
    got_img = img.run(list(OUTPUTS), {"pixel_values": pixels.numpy()})
    got_txt = txt.run(list(OUTPUTS), {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
    for name, want, got in (("image", want_img, got_img), ("text", want_txt, got_txt)):
        results[name] = {out: float(np.max(np.abs(w - g))) for out, w, g in zip(OUTPUTS, want, got, strict=True)}
    return results


PROJECTION_KEYS = {"text": "text_proj", "image": "vision_proj"}


def load_projections_into(encoder: DenseDualEncoder, path: str | Path) -> None:
    """Replace both towers' projections by those in ``path`` (written by joint training)."""
    from safetensors.torch import load_file

    p = Path(path)
    if not p.is_file():
        raise ModelError(f"projections file not found: {p}")
    try:
        state = load_file(str(p))
    except Exception as exc:  # a truncated or foreign file
        raise ModelError(f"cannot read {p}: {str(exc).splitlines()[0][:160]}") from None
    for side, tower in (("text", encoder.text_tower), ("image", encoder.image_tower)):
        key = PROJECTION_KEYS[side]
        have = tower.projection_state()
        new = {k: state[f"{key}.{k}"].float() for k in ("weight", "bias") if f"{key}.{k}" in state}
        if "weight" not in new or new["weight"].shape != have["weight"].shape:
            got = tuple(new["weight"].shape) if "weight" in new else "none"
            raise ModelError(f"{p}: {key}.weight is {got}, {encoder.name}'s {side} projection is "
                             f"{tuple(have['weight'].shape)} (trained on another model's features?)")
        tower.load_projection(new)


def write_projections(encoder: DenseDualEncoder, path: Path, source: str) -> dict[str, int]:
    """The towers' projections as ``{text_proj,vision_proj}.{weight,bias}``; returns the
    feature widths."""
    from safetensors.torch import save_file

    tensors, dims = {}, {}
    for side, tower in (("text", encoder.text_tower), ("image", encoder.image_tower)):
        for k, v in tower.projection_state().items():
            tensors[f"{PROJECTION_KEYS[side]}.{k}"] = v.detach().float().contiguous()
        dims[side] = int(tensors[f"{PROJECTION_KEYS[side]}.weight"].shape[1])
    save_file(tensors, str(path), metadata={"model": encoder.name, "source": source})
    path.chmod(0o644)
    return dims


def head_source(head_path: str | Path | None, model: str) -> dict:
    """Where a bundle's head came from, recorded in its manifest outside the fingerprint (a
    head file moved elsewhere is the same head): ``train extract-head`` rebuilds it from there."""
    if head_path is None:
        return {"model": model}
    path = Path(head_path).expanduser().resolve()
    return {"file": str(path), "sha256": sha256_file(path)}


def _manifest(encoder: DenseDualEncoder, head: SparseHead, precision: str, folder: Path, parity: dict,
              feature_dims: dict[str, int], projections: str | Path | None) -> dict:
    import onnx
    import transformers

    vocab_size = encoder.vocab_weight.shape[0]
    vocab = encoder.tokenizer.get_vocab(with_added_tokens=True)
    pad_id = vocab.get("[PAD]", vocab.get("<|endoftext|>", 0))
    manifest = {
        "format": BUNDLE_FORMAT,
        "model": {"name": encoder.name, "kind": encoder.kind, "source": encoder.source},
        "dense_dim": encoder.dense_dim,
        "vocab_size": vocab_size,
        "text": {
            "max_length": encoder.max_text_length,
            "pad_id": pad_id,
            "excluded_ids": sorted(set(head.config.excluded_ids)),
            "own_words": OWN_WORDS,  # the text graph boosts whole-word tokens only (TextGraph)
        },
        "image": {k: encoder.image[k] for k in ("size", "resize", "crop", "resample", "mean", "std")},
        "head": head_summary(head),
        "precision": precision,
        "files": {
            name: {"sha256": sha256_file(folder / name), "bytes": (folder / name).stat().st_size}
            for name in ("image.onnx", "text.onnx", "tokenizer.json", "vocab.txt", PROJECTIONS_FILE)
        },
        "outputs": {side: {"dense": encoder.dense_dim, "sparse": vocab_size, "features": feature_dims[side]}
                    for side in ("image", "text")},
        "projections": {"source": "joint training" if projections is not None else "model",
                        **({"from": Path(projections).name} if projections is not None else {})},
        "parity": {"tolerance": PARITY_TOLERANCE, "max_abs_diff": parity},
        "exporter": {
            "d2s-search": __version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "onnx": onnx.__version__,
            "opset": OPSET,
        },
        "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    manifest["fingerprint"] = compute_fingerprint(manifest)
    return manifest
