"""Package a bundle's text encoder + sparse head as an ml-commons ``SPARSE_ENCODING`` model.

What ml-commons does with it (read from its source, ``DLModel`` and
``SparseEncodingTranslator``): unzip; exactly one ``*.onnx`` (or ``*.pt``) file at the top
level is the model, ``tokenizer.json`` next to it is loaded with HuggingFace tokenizers; per
text it feeds two int64 tensors of shape (1, seq) **by name** and turns
*every* output tensor into ``{token: weight}`` with one ``tokenizer.decode([i],
skip_special_tokens=True)`` per non-zero index i. neural-search then uses the first tensor
and queries the ``rank_features`` field with those tokens as feature names.

The names: opensearch-project/ml-commons 2.19.1.0 and 3.1.0.0,
``ml-algorithms/.../algorithms/SentenceTransformerTranslator.java`` (which
``sparse_encoding/SparseEncodingTranslator.java`` extends) names them ``input1.input_ids``
and ``input1.attention_mask``; DJL's ``Batchifier.STACK`` keeps the names while stacking to
(1, seq) (deepjavalibrary/djl ``api/.../translate/StackBatchifier.java``), and DJL's
``OrtSymbolBlock.forwardInternal`` (``engines/onnxruntime/onnxruntime-engine/...``) feeds
named tensors by name, throwing "Invalid input tensor name" for a name that is not a graph
input. So the graph's inputs carry exactly those names (:data:`SERVER_INPUTS`), or the deploy
warm-up fails and the model ends ``DEPLOY_FAILED``.

So ``text.onnx`` cannot go in as it is (its first output is the dense vector; its inputs are
``input_ids``, ``attention_mask``). The zip holds a wrapper graph, made with the ``onnx``
package (no torch):

    input1.input_ids, input1.attention_mask --Slice(:max_length)--> text graph --> sparse
        --Mul(keep)--> --Min(64)--> --top max_terms--> output   (batch, |V|), the only output

* ``keep`` zeroes the terms the server could not match against our documents: special
  tokens, and terms whose decoded token differs from the stored term (stored keys escape
  ``.`` and ``%``; CLIP's ``</w>`` forms) -- see :func:`queryable_mask`.
* ``Min(64)``: neural_sparse refuses token weights above 64 (Lucene's linear FeatureField).
* top ``max_terms``: neural_sparse makes one Lucene clause per token, and a query over
  ``indices.query.bool.max_clause_count`` (1024) fails; the client prunes the same way.
* ``Slice``: the tokenizer in the zip truncates to the model's maximum length, but ml-commons
  warms a model up with a sentence that long; the slice keeps an over-long input from
  overflowing the position embeddings whatever the tokenizer settings are honoured.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from d2s_search.backends.opensearch.features import NEURAL_SPARSE_MAX_WEIGHT, escape_term
from d2s_search.bundle import Bundle
from d2s_search.errors import BundleError

ONNX_NAME = "d2s-sparse-encoder.onnx"
INFO_NAME = "d2s-model.json"
OUTPUT = "output"
# The tensor names ml-commons' SentenceTransformerTranslator gives DJL (see the docstring).
SERVER_INPUTS = {"input_ids": "input1.input_ids", "attention_mask": "input1.attention_mask"}
ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # fixed, so the same bundle always gives the same zip hash
MAX_PROTO_BYTES = 2**31 - 1  # a single-file ONNX model must stay under protobuf's 2 GB
# Under the default max_clause_count (1024), with room for a few filter clauses.
DEFAULT_MAX_TERMS = 1000


@dataclass
class ModelPackage:
    path: Path
    sha256: str
    size: int
    name: str
    vocab_size: int
    max_length: int
    bundle_fingerprint: str
    max_terms: int | None = DEFAULT_MAX_TERMS
    dropped_terms: dict[str, list[str]] = field(default_factory=dict)

    def model_config(self) -> dict[str, Any]:
        """``model_config`` of the register request (TextEmbeddingModelConfig requires the
        dimension and framework type even for sparse models; |V| is the output size)."""
        info = {"d2s_bundle_fingerprint": self.bundle_fingerprint, "max_length": self.max_length,
                "vocab_size": self.vocab_size, "max_terms": self.max_terms, "output": OUTPUT}
        return {
            "model_type": "d2s",
            "embedding_dimension": self.vocab_size,
            "framework_type": "huggingface_transformers",
            "all_config": json.dumps(info, sort_keys=True),
        }


def model_name(bundle: Bundle) -> str:
    """The ml-commons model name: model and fingerprint, so a bundle finds its own model."""
    return f"d2s-{bundle.model_name}-{bundle.fingerprint[:12]}"


def queryable_mask(bundle: Bundle, tokenizer_json: str) -> tuple[np.ndarray, dict[str, list[str]]]:
    """(keep mask over the vocabulary, dropped terms by reason)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(tokenizer_json)
    terms = bundle.terms
    keep = bundle.allowed_mask.copy()
    decoded = tokenizer.decode_batch([[i] for i in range(len(terms))], skip_special_tokens=True)
    dropped: dict[str, list[str]] = {"decodes to another token": [], "needs escaping": []}
    for i in np.flatnonzero(keep).tolist():
        term = terms[i]
        if decoded[i] != term:
            keep[i] = False
            dropped["decodes to another token"].append(term)
        elif escape_term(term) != term:
            keep[i] = False
            dropped["needs escaping"].append(term)
    return keep, {k: v for k, v in dropped.items() if v}


def tokenizer_for_server(bundle: Bundle) -> str:
    """The bundle's tokenizer with truncation at the model's maximum length switched on."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(bundle.path / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=bundle.max_text_length)
    return tokenizer.to_str()


def sparse_encoder_graph(text_onnx: Path, keep: np.ndarray, max_length: int,
                         max_terms: int | None = DEFAULT_MAX_TERMS,
                         max_weight: float = NEURAL_SPARSE_MAX_WEIGHT):
    """The wrapper ``onnx.ModelProto`` described in the module docstring."""
    try:
        import onnx
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        raise BundleError("register-model needs the `onnx` package: pip install onnx") from None

    model = onnx.load(str(text_onnx))
    graph = model.graph
    inputs = [i.name for i in graph.input]
    if inputs != ["input_ids", "attention_mask"]:
        raise BundleError(f"{text_onnx}: expected inputs input_ids, attention_mask, found {', '.join(inputs)}")
    outputs = {o.name: o for o in graph.output}
    if "sparse" not in outputs:
        raise BundleError(f"{text_onnx}: no `sparse` output")
    dims = outputs["sparse"].type.tensor_type.shape.dim
    if len(dims) == 2 and dims[1].HasField("dim_value") and dims[1].dim_value != keep.size:
        raise BundleError(f"{text_onnx}: sparse output has {dims[1].dim_value} terms, vocabulary {keep.size}")

    renamed = {name: f"{name}__d2s_cut" for name in inputs}
    _rename_uses(graph, renamed)
    for graph_input in graph.input:  # fed by name by DJL: the translator's names
        graph_input.name = SERVER_INPUTS[graph_input.name]
    consts = [
        numpy_helper.from_array(np.array([0], dtype=np.int64), "d2s_cut_start"),
        numpy_helper.from_array(np.array([max_length], dtype=np.int64), "d2s_cut_end"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "d2s_cut_axis"),
        numpy_helper.from_array(keep.astype(np.float32), "d2s_keep"),
        numpy_helper.from_array(np.array(max_weight, dtype=np.float32), "d2s_max_weight"),
    ]
    graph.initializer.extend(consts)
    cuts = [
        helper.make_node("Slice", [SERVER_INPUTS[name], "d2s_cut_start", "d2s_cut_end", "d2s_cut_axis"],
                         [renamed[name]],
                         name=f"d2s_cut_{name}")
        for name in inputs
    ]
    capped = "d2s_capped" if max_terms is not None and max_terms < keep.size else OUTPUT
    head = [helper.make_node("Mul", ["sparse", "d2s_keep"], ["d2s_kept"], name="d2s_keep_queryable"),
            helper.make_node("Min", ["d2s_kept", "d2s_max_weight"], [capped], name="d2s_cap_weight")]
    if capped != OUTPUT:
        # Keep the max_terms largest weights: TopK, then scatter them into a row of zeros.
        graph.initializer.append(numpy_helper.from_array(np.array([max_terms], dtype=np.int64), "d2s_max_terms"))
        graph.initializer.append(numpy_helper.from_array(np.array(0.0, dtype=np.float32), "d2s_zero"))
        head += [
            helper.make_node("TopK", [capped, "d2s_max_terms"], ["d2s_top_values", "d2s_top_ids"], axis=-1,
                             name="d2s_top_terms"),
            helper.make_node("Mul", [capped, "d2s_zero"], ["d2s_zeros"], name="d2s_zero_row"),
            helper.make_node("ScatterElements", ["d2s_zeros", "d2s_top_ids", "d2s_top_values"], [OUTPUT], axis=1,
                             name="d2s_keep_top"),
        ]
    nodes = [*cuts, *graph.node, *head]
    del graph.node[:]
    graph.node.extend(nodes)  # Slice first and the head last keeps the graph topologically sorted
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["batch", keep.size]))
    model.doc_string = "d2s-search sparse text encoder for ml-commons SPARSE_ENCODING"
    onnx.checker.check_model(model)
    return model


def _rename_uses(graph, renamed: dict[str, str]) -> None:
    from onnx import AttributeProto

    for node in graph.node:
        for k, name in enumerate(node.input):
            if name in renamed:
                node.input[k] = renamed[name]
        for attr in node.attribute:  # subgraphs (If/Loop) may read outer names too
            if attr.type == AttributeProto.GRAPH:
                _rename_uses(attr.g, renamed)
            elif attr.type == AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    _rename_uses(sub, renamed)


def package_model(bundle: Bundle, out: Path, max_terms: int | None = DEFAULT_MAX_TERMS) -> ModelPackage:
    """Write the ml-commons zip for ``bundle`` to ``out`` (a .zip path)."""
    tokenizer = tokenizer_for_server(bundle)
    keep, dropped = queryable_mask(bundle, tokenizer)
    model = sparse_encoder_graph(bundle.path / "text.onnx", keep, bundle.max_text_length, max_terms)
    onnx_bytes = model.SerializeToString()
    if len(onnx_bytes) >= MAX_PROTO_BYTES:
        raise BundleError("the text encoder is over 2 GB; ml-commons needs it in one ONNX file")
    name = model_name(bundle)
    info = {
        "name": name,
        "bundle_fingerprint": bundle.fingerprint,
        "model": bundle.model_name,
        "vocab_size": bundle.vocab_size,
        "max_length": bundle.max_text_length,
        "output": OUTPUT,
        "max_terms": max_terms,
        "dropped_terms": {reason: len(terms) for reason, terms in dropped.items()},
    }
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for arcname, data in ((ONNX_NAME, onnx_bytes), ("tokenizer.json", tokenizer.encode("utf-8")),
                              (INFO_NAME, json.dumps(info, indent=2).encode("utf-8"))):
            entry = zipfile.ZipInfo(arcname, date_time=ZIP_DATE)
            entry.compress_type = zipfile.ZIP_DEFLATED
            entry.external_attr = 0o644 << 16
            zf.writestr(entry, data)
    data = buffer.getvalue()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(out)
    return ModelPackage(
        path=out, sha256=hashlib.sha256(data).hexdigest(), size=len(data), name=name,
        vocab_size=bundle.vocab_size, max_length=bundle.max_text_length,
        bundle_fingerprint=bundle.fingerprint, max_terms=max_terms, dropped_terms=dropped,
    )
