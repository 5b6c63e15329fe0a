"""The model bundle on disk: written by ``export-onnx``, read by everything at runtime.

    <bundle>/image.onnx      pixel_values -> dense, sparse, features
    <bundle>/text.onnx       input_ids, attention_mask -> dense, sparse, features
    <bundle>/tokenizer.json  a `tokenizers` tokenizer
    <bundle>/vocab.txt       one display term per sparse output dimension
    <bundle>/projections.safetensors  the towers' projections (features -> dense), format 2
    <bundle>/manifest.json   source model, dims, preprocessing, head, file hashes, fingerprint

Format ``d2s-bundle/2`` added the ``features`` output (the pre-projection vector) and the
projections file, listed under ``outputs``; ``d2s-bundle/1`` bundles (dense and sparse only)
are still read.

The fingerprint covers everything that changes the vectors (files, preprocessing, dims);
an index remembers it and refuses a bundle with another one.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from . import bundle_stamp
from .backends.base import IndexIdentity
from .errors import BundleError
from .regular_files import open_regular, read_regular

BUNDLE_FORMAT = "d2s-bundle/2"
READABLE_FORMATS = ("d2s-bundle/1", BUNDLE_FORMAT)
BUNDLE_FILES = ("image.onnx", "text.onnx", "tokenizer.json", "vocab.txt")
PROJECTIONS_FILE = "projections.safetensors"
OUTPUTS = ("dense", "sparse", "features")  # graph outputs of format 2, in this order
# Manifest keys that define the vectors; everything else (parity, timestamps) is report.
MAX_TEXT_FILE = 64 * 1024 * 1024  # manifest.json and vocab.txt are far smaller
FINGERPRINT_KEYS = ("format", "model", "dense_dim", "vocab_size", "text", "image", "head", "precision", "files")


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open_regular(path) as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def compute_fingerprint(manifest: dict) -> str:
    core = {key: manifest.get(key) for key in FINGERPRINT_KEYS}
    canonical = json.dumps(core, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


@dataclass
class Bundle:
    path: Path
    manifest: dict = field(repr=False)

    @classmethod
    def load(cls, path: str | Path, verify_hashes: bool = False) -> Bundle:
        """Open and validate a bundle: sizes, the manifest's fingerprint, and every file's
        hash. Hashes are checked once and remembered in a stamp (see :mod:`.bundle_stamp`),
        so later loads are instant until a file changes; ``verify_hashes`` always re-hashes."""
        path = Path(path).expanduser()
        manifest_path = path / "manifest.json"
        if not path.is_dir():
            raise BundleError(f"no model bundle at {path}: run `d2s-search export-onnx` first or pass --bundle DIR")
        if not manifest_path.is_file():
            raise BundleError(f"{path} is not a model bundle (no manifest.json)")
        try:
            manifest = json.loads(read_regular(manifest_path, MAX_TEXT_FILE).decode("utf-8"))
        except (OSError, ValueError) as exc:
            raise BundleError(f"{manifest_path} is unreadable: {exc}") from None
        if manifest.get("format") not in READABLE_FORMATS:
            raise BundleError(f"{path}: unsupported bundle format {manifest.get('format')!r} (expected {BUNDLE_FORMAT})")
        bundle = cls(path=path, manifest=manifest)
        bundle.validate(verify_hashes)
        return bundle

    def validate(self, verify_hashes: bool) -> None:
        files = self.manifest.get("files", {})
        if not isinstance(files, dict):
            raise BundleError(f"{self.path}: manifest.json has no file list")
        states: dict[str, tuple] = {}
        optional = [PROJECTIONS_FILE] if PROJECTIONS_FILE in files else []  # format 2
        for name in (*BUNDLE_FILES, *optional):
            entry = files.get(name)
            file = self.path / name
            if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str):
                raise BundleError(f"{self.path}: manifest lists no {name}")
            if not file.is_file():
                raise BundleError(f"{self.path}: {name} is missing")
            st = file.stat()
            if st.st_size != entry.get("bytes"):
                raise BundleError(f"{self.path}: {name} has changed since export (size differs); re-export the bundle")
            states[name] = (st, entry["sha256"])
        fingerprint = self.manifest.get("fingerprint")
        if compute_fingerprint(self.manifest) != fingerprint:
            raise BundleError(f"{self.path}: manifest.json was edited (fingerprint does not match); re-export the bundle")
        if not verify_hashes and bundle_stamp.is_verified(self.path, fingerprint, states):
            return
        for name, (_, sha) in states.items():
            try:
                actual = sha256_file(self.path / name)
            except OSError as exc:
                raise BundleError(f"{self.path}: cannot read {name}: {exc.strerror or exc}") from None
            if actual != sha:
                raise BundleError(f"{self.path}: {name} has changed since export (hash differs); re-export the bundle")
        # Remember the check only if no file changed while it was hashed.
        now = {name: (os.stat(self.path / name), sha) for name, (_, sha) in states.items()}
        if all(bundle_stamp.file_state(now[n][0]) == bundle_stamp.file_state(states[n][0]) for n in states):
            bundle_stamp.write_stamp(self.path, fingerprint, now)

    # -- properties the runtime needs ---------------------------------------------------

    @property
    def fingerprint(self) -> str:
        return self.manifest["fingerprint"]

    @property
    def dense_dim(self) -> int:
        return int(self.manifest["dense_dim"])

    @property
    def vocab_size(self) -> int:
        return int(self.manifest["vocab_size"])

    @property
    def image_settings(self) -> dict:
        return self.manifest["image"]

    @property
    def max_text_length(self) -> int:
        return int(self.manifest["text"]["max_length"])

    @property
    def model_name(self) -> str:
        return self.manifest["model"]["name"]

    @property
    def outputs(self) -> dict[str, dict[str, int]]:
        """Per graph (``image``, ``text``) the output names and widths."""
        listed = self.manifest.get("outputs")
        if isinstance(listed, dict):
            return listed
        both = {"dense": self.dense_dim, "sparse": self.vocab_size}  # format 1
        return {"image": dict(both), "text": dict(both)}

    @property
    def has_features(self) -> bool:
        out = self.outputs
        return all("features" in out.get(side, {}) for side in ("image", "text"))

    def require_features(self) -> Path:
        """The projections file of a bundle with a ``features`` output (else a one-line error)."""
        projections = self.path / PROJECTIONS_FILE
        if not self.has_features or not projections.is_file():
            raise BundleError(f"{self.path} has no `features` output (exported before bundle format 2); "
                              "re-export it with `d2s-search export-onnx`")
        return projections

    @cached_property
    def terms(self) -> list[str]:
        try:
            terms = read_regular(self.path / "vocab.txt", MAX_TEXT_FILE).decode("utf-8").split("\n")
        except (OSError, ValueError) as exc:
            raise BundleError(f"{self.path}: vocab.txt is unreadable: {exc}") from None
        if terms and terms[-1] == "":
            terms.pop()
        if len(terms) != self.vocab_size:
            raise BundleError(f"{self.path}: vocab.txt has {len(terms)} terms, manifest says {self.vocab_size}")
        return terms

    @cached_property
    def allowed_mask(self) -> np.ndarray:
        """True for dimensions that may be output terms (not special, not unused)."""
        mask = np.ones(self.vocab_size, dtype=bool)
        mask[np.asarray(self.manifest["text"]["excluded_ids"], dtype=np.int64)] = False
        return mask

    def identity(self) -> IndexIdentity:
        return IndexIdentity(fingerprint=self.fingerprint, dense_dim=self.dense_dim, model=self.model_name,
                             bundle_path=str(self.path.resolve()))

    def summary(self) -> dict:
        m = self.manifest
        return {
            "path": str(self.path),
            "model": m["model"]["name"],
            "fingerprint": self.fingerprint,
            "dense_dim": self.dense_dim,
            "vocab_size": self.vocab_size,
            "precision": m.get("precision"),
            "head_trained": m["head"].get("trained"),
        }
