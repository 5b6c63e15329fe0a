"""The sparse head inside a model bundle, as a head file (``d2s-search train extract-head``).

A bundle's graphs hold the head, but not in a form ``evaluate --head`` reads. Export records
where the head came from (the manifest's ``head_source``, outside the fingerprint): a head file
(``export-onnx --head FILE``, with its SHA-256) or the model's own head (offline-mini's shipped
head, or the untrained vocabulary-initialised one). That head is rebuilt from its source with
the bundle's document shift, query word boost and excluded terms, and checked against the
bundle's own graphs before it is written: a head that does not reproduce them is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from d2s_search.bundle import Bundle, sha256_file
from d2s_search.errors import ModelError

from .head import SparseHead, finite_setting, load_head, terms_setting

# fp32 graphs reproduce torch within the export's parity tolerance (1e-4); quantised graphs
# differ more, so they are checked coarsely (relative to the largest weight).
TOLERANCE = {"fp32": 1e-3}
COARSE_TOLERANCE = 5e-2
PROBE_TEXTS = ["a dog running on the beach", "two people riding bikes in the city at night", "snow"]


@dataclass
class ExtractedHead:
    head: SparseHead
    source: str  # said to the user: where the head came from
    max_difference: float  # against the bundle's graphs, on probe pictures and captions


def extract_head(bundle: Bundle) -> ExtractedHead:
    """The bundle's head, rebuilt from its recorded source and checked against the bundle."""
    recorded = bundle.manifest.get("head_source")
    if isinstance(recorded, dict) and isinstance(recorded.get("file"), str):
        head, source = _from_file(bundle, recorded), f"the head file {recorded['file']}"
    else:
        from .export import build_head
        from .models import build_dense_encoder

        head = build_head(build_dense_encoder(bundle.model_name), None)
        source = f"{bundle.model_name}'s own head" + (
            "" if head.config.trained else " (untrained, vocabulary init)"
        )
    head = _with_bundle_settings(head, bundle)
    difference = _max_difference(head, bundle)
    precision = bundle.manifest.get("precision", "fp32")
    allowed = TOLERANCE.get(precision, COARSE_TOLERANCE)
    if difference > allowed:
        if recorded is None:
            raise ModelError(
                f"{bundle.path} was exported with a head its manifest does not name (exported before "
                "bundles recorded their head): pass that head file to `evaluate --head`, or export "
                "the bundle again with `--head FILE`"
            )
        raise ModelError(
            f"the head rebuilt from {source} does not reproduce {bundle.path} (differs by "
            f"{difference:.2g}, more than {allowed:g}): its source changed since the export"
        )
    return ExtractedHead(head, source, difference)


def _from_file(bundle: Bundle, recorded: dict) -> SparseHead:
    path = Path(recorded["file"])
    if not path.is_file():
        raise ModelError(
            f"{bundle.path} was exported with the head file {path}, which is gone: pass a copy of it "
            "to `evaluate --head` directly"
        )
    if sha256_file(path) != recorded.get("sha256"):
        raise ModelError(
            f"{bundle.path} was exported with the head file {path}, which has changed since (its "
            "SHA-256 differs): the bundle's head is no longer in a file"
        )
    return load_head(path)


def _with_bundle_settings(head: SparseHead, bundle: Bundle) -> SparseHead:
    """The bundle's document shift, query word boost, document terms and excluded terms (export
    may override the first three and adds the tokenizer's special tokens to the last)."""
    summary = bundle.manifest.get("head", {})
    c = head.config
    c.document_shift = finite_setting(
        summary.get("document_shift", 0.0), "the bundle's document shift"
    )
    c.query_word_boost = finite_setting(
        summary.get("query_word_boost", 0.0), "the bundle's query word boost"
    )
    c.document_terms = terms_setting(summary.get("document_terms", 0), "the bundle's document terms")
    c.query_shift = finite_setting(summary.get("query_shift", 0.0), "the bundle's query shift")
    excluded = sorted(int(i) for i in bundle.manifest["text"]["excluded_ids"])
    if excluded != sorted(set(c.excluded_ids)):  # rebuilt: the in-graph mask follows the ids
        state = head.state_dict()
        c.excluded_ids = excluded
        head = SparseHead(c)
        head.load_state_dict(state)
    return head.eval()


@torch.no_grad()
def _max_difference(head: SparseHead, bundle: Bundle) -> float:
    """The largest difference between the bundle's sparse outputs and ``head`` applied to the
    bundle's dense outputs: on probe pictures (documents, with the shift) and captions (every
    term but the captions' own tokens, where the text graph adds the query word boost)."""
    from PIL import Image

    from d2s_search.encoder import Encoder

    encoder = Encoder(bundle, device="cpu")
    rng = np.random.default_rng(0)
    pictures = [
        Image.fromarray(rng.integers(0, 256, (96, 128, 3), dtype=np.uint8)) for _ in range(3)
    ]
    dense, sparse = encoder.encode_images(pictures)
    ours = head(torch.from_numpy(dense), document=True).numpy()
    worst = float(np.max(np.abs(ours - sparse))) / _scale(sparse, bundle)
    text = encoder.encode_texts(PROBE_TEXTS)
    ours = head(torch.from_numpy(text.dense)).numpy()
    from d2s_search.encoder import tokenize_batch

    ids, _ = tokenize_batch(encoder.tokenizer, PROBE_TEXTS, encoder.max_length, encoder.pad_id)
    away = np.ones_like(ours, dtype=bool)
    for row, row_ids in enumerate(ids):
        away[row, row_ids] = False
    worst = max(
        worst, float(np.max(np.abs(ours - text.sparse)[away])) / _scale(text.sparse, bundle)
    )
    return worst


def _scale(sparse: np.ndarray, bundle: Bundle) -> float:
    """1 for fp32 graphs (absolute differences); the largest weight for quantised ones."""
    if bundle.manifest.get("precision", "fp32") == "fp32":
        return 1.0
    return max(1.0, float(np.max(np.abs(sparse))))
