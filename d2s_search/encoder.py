"""Runtime encoders: ONNX Runtime sessions over a model bundle (no torch).

Images: PIL image -> the source model's preprocessing -> ``image.onnx``.
Text: ``tokenizers`` -> ``text.onnx``. Both give a dense vector and |V| sparse weights
(and, from format-2 bundles on request, the pre-projection ``features``);
:meth:`Encoder.to_terms` turns a sparse row into ``{term: weight}`` with special/unused
tokens and zeros removed and optional pruning.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tokenizers import Tokenizer

from .bundle import Bundle
from .errors import BundleError
from .terms import split_word_flags, whole_word_positions

# What a bundle's manifest says (text.own_words) when its text graph boosts typed words only.
OWN_WORDS = "whole words"

if TYPE_CHECKING:  # PIL is imported where images are handled: a text query never needs it
    from PIL import Image


# --- preprocessing -------------------------------------------------------------------


def preprocess_image(image: Image.Image, settings: dict) -> np.ndarray:
    """RGB PIL image -> float32 (3, S, S), matching the transformers image processors of
    BLIP (``resize: exact``) and CLIP (``resize: shortest_edge`` + center crop)."""
    from PIL import Image

    size = int(settings["size"])
    resample = {"bicubic": Image.Resampling.BICUBIC, "bilinear": Image.Resampling.BILINEAR}[
        settings.get("resample", "bicubic")]
    if image.mode != "RGB":
        image = image.convert("RGB")
    if settings["resize"] == "exact":
        image = image.resize((size, size), resample=resample)
    elif settings["resize"] == "shortest_edge":
        w, h = image.size
        short, long = (w, h) if w <= h else (h, w)
        new_long = int(size * long / short)
        new_w, new_h = (size, new_long) if w <= h else (new_long, size)
        image = image.resize((new_w, new_h), resample=resample)
    else:
        raise BundleError(f"unknown resize mode {settings['resize']!r} in bundle")
    array = np.asarray(image, dtype=np.float32)
    if settings.get("crop"):
        h, w = array.shape[:2]
        top, left = (h - size) // 2, (w - size) // 2
        array = array[top : top + size, left : left + size]
    array = array * np.float32(1 / 255)
    array = (array - np.asarray(settings["mean"], dtype=np.float32)) / np.asarray(settings["std"], dtype=np.float32)
    return np.ascontiguousarray(array.transpose(2, 0, 1))


def tokenize_batch(tokenizer: Tokenizer, texts: Sequence[str], max_length: int, pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Token ids and attention mask, truncated to ``max_length`` (special tokens kept) and
    right-padded to the longest text."""
    if tokenizer.truncation is None or tokenizer.truncation.get("max_length") != max_length:
        tokenizer.enable_truncation(max_length=max_length)
    if tokenizer.padding is not None:
        tokenizer.no_padding()  # we pad ourselves, to the longest text of the batch
    encodings = tokenizer.encode_batch(list(texts))
    longest = max(len(e.ids) for e in encodings)
    ids = np.full((len(encodings), longest), pad_id, dtype=np.int64)
    mask = np.zeros((len(encodings), longest), dtype=np.int64)
    for row, enc in enumerate(encodings):
        ids[row, : len(enc.ids)] = enc.ids
        mask[row, : len(enc.ids)] = 1
    return ids, mask


# --- sessions ------------------------------------------------------------------------


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def make_session(path: str, device: str = "auto", threads: int | None = None, warn: Callable[[str], None] = _warn,
                 quick_start: Path | None = None):
    """An ONNX Runtime session on CUDA when it really loads, else CPU (said once, in one line).

    ``quick_start`` (a cache folder) is for a process that runs one query: weights are not
    pre-packed (session creation 0.3-0.5 s faster, each run ~10 ms slower) and the graph
    optimised on the first such run is saved there and loaded as is afterwards.
    """
    import onnxruntime as ort

    want_cuda = device in ("auto", "cuda")
    available = ort.get_available_providers()
    providers = ["CPUExecutionProvider"]
    if want_cuda and "CUDAExecutionProvider" in available:
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    if quick_start is not None and providers == ["CPUExecutionProvider"]:
        session = _quick_session(ort, path, _session_options(ort, threads), quick_start)
        if session is not None:
            return session
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # ORT's own provider warning; ours follows
            session = ort.InferenceSession(path, _session_options(ort, threads), providers=providers)
    except Exception as exc:  # a corrupt or foreign .onnx file
        raise BundleError(f"cannot load {path}: {str(exc).splitlines()[0][:200]}") from None
    if "CUDAExecutionProvider" in providers and "CUDAExecutionProvider" not in session.get_providers():
        warn("the CUDA provider did not load (check the CUDA/cuDNN libraries); running on CPU")
    elif want_cuda and "CUDAExecutionProvider" not in available and cpu_build_over_gpu_build(Path(ort.__file__).parent):
        warn("onnxruntime-gpu is installed, but onnxruntime's files replaced it (both unpack into one folder): "
             "pip install --force-reinstall --no-deps onnxruntime-gpu; running on CPU")
    elif device == "cuda" and "CUDAExecutionProvider" not in available:
        warn("onnxruntime has no CUDA provider here (install the `gpu` extra); running on CPU")
    return session


def cpu_build_over_gpu_build(package_dir: Path) -> bool:
    """Whether ONNX Runtime's folder holds a CUDA provider library that its build does not
    offer: what installing onnxruntime after (or over) onnxruntime-gpu leaves (pip unpacks both
    into ``onnxruntime/``, and installs the GPU one first when both are asked for)."""
    capi = package_dir / "capi"
    return any((capi / name).is_file() for name in ("libonnxruntime_providers_cuda.so",
                                                     "onnxruntime_providers_cuda.dll"))


def _session_options(ort, threads: int | None):
    opts = ort.SessionOptions()
    opts.log_severity_level = 3  # ORT's own provider-failure logs are replaced by our one line
    if threads:
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    return opts


# The cached graph keeps its weights beside it as external data, which ONNX Runtime maps from
# the file instead of parsing them out of one large protobuf: session creation 0.06-0.1 s
# against 0.25-0.35 s for the 92 MB offline-mini text graph (docs/design-decisions.md).
QUICK_GRAPH, QUICK_WEIGHTS = "graph.onnx", "weights.data"


def _quick_session(ort, path: str, opts, cached: Path):
    """A CPU session from the optimised graph cached in the folder ``cached`` (made on first
    use); None to fall back to the bundle's graph."""
    import os
    import shutil

    opts.add_session_config_entry("session.disable_prepacking", "1")
    if (cached / QUICK_GRAPH).is_file():
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        try:
            return ort.InferenceSession(str(cached / QUICK_GRAPH), opts, providers=["CPUExecutionProvider"])
        except Exception:  # damaged cache: made again from the bundle's graph
            _remove_quick_cache(cached)
    # EXTENDED, not ALL: what is saved must not depend on this machine's CPU layout.
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    opts.add_session_config_entry("session.optimized_model_external_initializers_file_name", QUICK_WEIGHTS)
    opts.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    tmp = cached.with_name(f".tmp-{os.getpid()}-{cached.name}")
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        opts.optimized_model_filepath = str(tmp / QUICK_GRAPH)
        session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    except Exception:
        shutil.rmtree(tmp, ignore_errors=True)
        return None
    try:
        os.replace(tmp, cached)  # whole folder at once; fails when another process made it first
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    legacy = cached.with_name(cached.name + ".onnx")  # the one-file cache of earlier versions
    with contextlib.suppress(OSError):
        if legacy.is_file() and not legacy.is_symlink():
            legacy.unlink()
    return session


def _remove_quick_cache(cached: Path) -> None:
    """Only the files this module writes there, then the folder if that leaves it empty."""
    for name in (QUICK_GRAPH, QUICK_WEIGHTS):
        (cached / name).unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # not empty: something else was put there
        cached.rmdir()


def optimized_graph_cache(bundle: Bundle, name: str) -> Path:
    """The folder where the optimised ``name`` graph of this bundle is cached, keyed by the
    graph's hash in the manifest and the ONNX Runtime version."""
    import onnxruntime as ort

    from .settings import cache_dir

    digest = str(bundle.manifest.get("files", {}).get(name, {}).get("sha256", bundle.fingerprint))[:24]
    return cache_dir() / "onnx" / f"{digest}-ort{ort.__version__}-{Path(name).stem}"


@dataclass
class TextEncoding:
    dense: np.ndarray  # (B, d)
    sparse: np.ndarray  # (B, |V|)
    token_ids: list[list[int]]  # the texts' own tokens (special tokens removed)
    features: np.ndarray | None = None  # (B, f) pre-projection vectors, when asked for
    # The typed words among them: tokens that are whole words, not fragments of a split word
    # (d2s_search.terms); None from encoders that do not tell them apart.
    typed_ids: list[list[int]] | None = None


class Encoder:
    """Both encoders of a bundle; sessions are created on first use (a text query never
    loads the image graph)."""

    def __init__(self, bundle: Bundle, device: str = "auto", threads: int | None = None,
                 quick_start: bool = False) -> None:
        self.bundle = bundle
        self.quick_start = quick_start  # a one-query process: see make_session
        self.device = device
        self.threads = threads
        self.tokenizer = Tokenizer.from_file(str(bundle.path / "tokenizer.json"))
        self.max_length = bundle.max_text_length
        self.pad_id = int(bundle.manifest["text"].get("pad_id", 0))
        self._allowed = bundle.allowed_mask
        self._terms = bundle.terms
        # A head trained without expansion (exp=0) only ever saw queries masked to their own
        # tokens; its queries must be masked the same way at search time.
        notes = bundle.manifest.get("head", {}).get("notes") or {}
        self.queries_use_own_tokens_only = notes.get("query_mask") == "own_tokens"
        # A text graph exported before typed words were told apart adds the query word boost at
        # every allowed input token, fragments of split words included: taken back off here.
        boost = bundle.manifest.get("head", {}).get("query_word_boost") or 0.0
        whole = bundle.manifest["text"].get("own_words") == OWN_WORDS
        self._fragment_boost = float(boost) if isinstance(boost, (int, float)) and not whole else 0.0

    @cached_property
    def image_session(self):
        return make_session(str(self.bundle.path / "image.onnx"), self.device, self.threads)

    @cached_property
    def text_session(self):
        cached = optimized_graph_cache(self.bundle, "text.onnx") if self.quick_start else None
        return make_session(str(self.bundle.path / "text.onnx"), self.device, self.threads, quick_start=cached)

    @property
    def providers(self) -> list[str]:
        return self.text_session.get_providers()

    # -- encoding ---------------------------------------------------------------------

    def preprocess(self, image: Image.Image) -> np.ndarray:
        return preprocess_image(image, self.bundle.image_settings)

    def encode_pixels(self, pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        dense, sparse = self.image_session.run(["dense", "sparse"], {"pixel_values": pixels.astype(np.float32, copy=False)})
        return dense, sparse

    def encode_pixels_with_features(self, pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Dense, sparse and pre-projection vectors of preprocessed images."""
        self.bundle.require_features()
        dense, sparse, feats = self.image_session.run(
            ["dense", "sparse", "features"], {"pixel_values": pixels.astype(np.float32, copy=False)})
        return dense, sparse, feats

    def image_features(self, images: Sequence[Image.Image]) -> tuple[np.ndarray, np.ndarray]:
        """Dense and pre-projection vectors of images."""
        dense, _, feats = self.encode_pixels_with_features(np.stack([self.preprocess(im) for im in images]))
        return dense, feats

    def encode_images(self, images: Sequence[Image.Image]) -> tuple[np.ndarray, np.ndarray]:
        return self.encode_pixels(np.stack([self.preprocess(im) for im in images]))

    def encode_texts(self, texts: Sequence[str], features: bool = False) -> TextEncoding:
        ids, mask = tokenize_batch(self.tokenizer, texts, self.max_length, self.pad_id)
        if features:
            self.bundle.require_features()
        names = ["dense", "sparse", "features"] if features else ["dense", "sparse"]
        out = self.text_session.run(names, {"input_ids": ids, "attention_mask": mask})
        own = [[int(t) for t, m in zip(row, mrow) if m and self._allowed[t]] for row, mrow in zip(ids, mask)]
        whole = whole_word_positions(ids, mask, *split_word_flags(self.tokenizer, len(self._allowed), only=ids))
        typed = [[int(t) for t, w in zip(row, wrow) if w and self._allowed[t]] for row, wrow in zip(ids, whole)]
        sparse = out[1]
        if self._fragment_boost:
            sparse = self._unboost_fragments(sparse, own, typed)
        return TextEncoding(dense=out[0], sparse=sparse, token_ids=own, features=out[2] if features else None,
                            typed_ids=typed)

    def _unboost_fragments(self, sparse: np.ndarray, own: list[list[int]], typed: list[list[int]]) -> np.ndarray:
        """The boost the graph added at tokens that are only fragments of split words, removed
        (the graph's plain weights there are >= 0; rounding is clipped)."""
        sparse = np.array(sparse, copy=True)
        for row, (all_ids, typed_ids) in enumerate(zip(own, typed)):
            fragments = sorted(set(all_ids) - set(typed_ids))
            if fragments:
                sparse[row, fragments] = np.maximum(sparse[row, fragments] - np.float32(self._fragment_boost), 0.0)
        return sparse

    # -- sparse rows -> terms -------------------------------------------------------------

    def to_terms(self, row: np.ndarray, top_k: int | None = None, max_ratio: float | None = None) -> dict[str, float]:
        """``{term: weight}`` of the positive, allowed dimensions of one sparse row.

        ``top_k`` keeps the k largest weights; ``max_ratio`` keeps weights >= ratio * max.
        """
        idx = np.flatnonzero((row > 0) & self._allowed)
        weights = row[idx]
        if max_ratio and idx.size:
            keep = weights >= max_ratio * weights.max()
            idx, weights = idx[keep], weights[keep]
        if top_k is not None and idx.size > top_k:
            keep = np.argpartition(-weights, top_k - 1)[:top_k]
            idx, weights = idx[keep], weights[keep]
        return dict(zip(map(self._terms.__getitem__, idx.tolist()), weights.tolist()))

    def own_terms(self, token_ids: Sequence[int]) -> set[str]:
        terms = self._terms
        return {terms[i] for i in token_ids}
