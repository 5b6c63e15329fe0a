"""A factory of frozen dense image-text encoders, by name.

Names map to plain JSON files in ``onnx_export/configs/`` (open_clip style). Each builder
returns a :class:`DenseDualEncoder`: two towers producing L2-normalised dense vectors, the
tokenizer, the vocabulary projection used to initialise the sparse head, and the image
preprocessing the runtime must reproduce.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer

from d2s_search.errors import ModelError

from .dense import DenseDualEncoder, ProjectedTower
from .hub import ensure_hub_reachable
from .registry import DEFAULT_MODEL, available_models, load_config  # noqa: F401  (re-exported)
from .tokenizers_offline import bert_base_uncased_tokenizer


def build_dense_encoder(name: str) -> DenseDualEncoder:
    config = load_config(name)
    kind = config["kind"]
    if kind == "blip":
        return _build_blip(name, config)
    if kind == "clip":
        return _build_clip(name, config)
    if kind == "lavis":
        return _build_lavis(name, config)
    if kind == "offline":
        from d2s_onnx_export.offline_mini.model import build_offline

        return build_offline(name, config)
    raise ModelError(f"model config {name!r} has unknown kind {kind!r}")


def _from_pretrained(cls, hub_id: str):
    ensure_hub_reachable(hub_id)
    try:
        return cls.from_pretrained(hub_id)
    except OSError as exc:
        raise ModelError(f"cannot load {hub_id}: {str(exc).splitlines()[0]}") from None


# --- BLIP (transformers) -----------------------------------------------------------------


class _BlipImageTower(ProjectedTower):
    proj_attr = "vision_proj"

    def __init__(self, model) -> None:
        super().__init__()
        self.vision_model = model.vision_model
        self.vision_proj = model.vision_proj

    def features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.vision_model(pixel_values=pixel_values)[0][:, 0, :]


class _BlipTextTower(ProjectedTower):
    proj_attr = "text_proj"

    def __init__(self, model) -> None:
        super().__init__()
        self.text_encoder = model.text_encoder
        self.text_proj = model.text_proj

    def features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.text_encoder(input_ids=input_ids, attention_mask=attention_mask)[0][:, 0, :]


def _build_blip(name: str, config: dict) -> DenseDualEncoder:
    from transformers import BlipConfig, BlipForImageTextRetrieval

    def random_model(vocab: dict[str, int], vocab_size: int):
        text_config = dict(
            config["text_config"],
            vocab_size=vocab_size,
            bos_token_id=vocab["[CLS]"],
            pad_token_id=vocab["[PAD]"],
            sep_token_id=vocab["[SEP]"],
        )
        return BlipForImageTextRetrieval(
            BlipConfig(
                text_config=text_config,
                vision_config=config["vision_config"],
                projection_dim=config["projection_dim"],
                image_text_hidden_size=config["image_text_hidden_size"],
            )
        )

    model, tokenizer, source = _random_or_hub(name, config, random_model, BlipForImageTextRetrieval)
    return DenseDualEncoder(
        name=name,
        kind="blip",
        image_tower=_BlipImageTower(model).eval(),
        text_tower=_BlipTextTower(model).eval(),
        tokenizer=tokenizer,
        vocab_weight=model.text_encoder.embeddings.word_embeddings.weight.detach().clone(),
        dense_dim=model.text_proj.out_features,
        image=config["image"],
        max_text_length=config["max_text_length"],
        source=source,
    )


def _random_or_hub(name: str, config: dict, random_model, model_cls):
    """The model in eval mode, its tokenizer and where both came from: built from the config
    with random weights over bert-base-uncased's vocabulary (``random_init``: tests, offline),
    or loaded from the hub (``hub_id``)."""
    if config.get("random_init"):
        tokenizer, vocab_source = bert_base_uncased_tokenizer()
        torch.manual_seed(config.get("seed", 0))
        model = random_model(tokenizer.get_vocab(), tokenizer.get_vocab_size())
        source = {"model": name, "weights": f"random (seed {config.get('seed', 0)})", "vocabulary": vocab_source}
    else:
        hub_id = config["hub_id"]
        model = _from_pretrained(model_cls, hub_id)
        tokenizer = _hub_tokenizer(hub_id)
        source = {"model": name, "weights": hub_id, "vocabulary": f"{hub_id} tokenizer"}
    return model.eval(), tokenizer, source


def _hub_tokenizer(hub_id: str) -> Tokenizer:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(hub_id)
    if not getattr(tok, "is_fast", False):
        raise ModelError(f"{hub_id} has no fast tokenizer; cannot write tokenizer.json")
    return Tokenizer.from_str(tok.backend_tokenizer.to_str())


# --- CLIP (transformers) -----------------------------------------------------------------


class _ClipImageTower(ProjectedTower):
    proj_attr = "visual_projection"

    def __init__(self, model) -> None:
        super().__init__()
        self.vision_model = model.vision_model
        self.visual_projection = model.visual_projection

    def features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.vision_model(pixel_values=pixel_values).pooler_output


class _ClipTextTower(ProjectedTower):
    proj_attr = "text_projection"

    def __init__(self, model) -> None:
        super().__init__()
        self.text_model = model.text_model
        self.text_projection = model.text_projection

    def features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.text_model(input_ids=input_ids, attention_mask=attention_mask).pooler_output


def _build_clip(name: str, config: dict) -> DenseDualEncoder:
    from transformers import CLIPConfig, CLIPModel

    def random_model(vocab: dict[str, int], vocab_size: int):
        # With a WordPiece vocabulary the pooled token is [SEP] (CLIP pools at its end token).
        text_config = dict(
            config["text_config"],
            vocab_size=vocab_size,
            eos_token_id=vocab["[SEP]"],
            bos_token_id=vocab["[CLS]"],
            pad_token_id=vocab["[PAD]"],
        )
        return CLIPModel(
            CLIPConfig(text_config=text_config, vision_config=config["vision_config"], projection_dim=config["projection_dim"])
        )

    model, tokenizer, source = _random_or_hub(name, config, random_model, CLIPModel)
    return DenseDualEncoder(
        name=name,
        kind="clip",
        image_tower=_ClipImageTower(model).eval(),
        text_tower=_ClipTextTower(model).eval(),
        tokenizer=tokenizer,
        vocab_weight=model.text_model.embeddings.token_embedding.weight.detach().clone(),
        dense_dim=model.text_projection.out_features,
        image=config["image"],
        max_text_length=config["max_text_length"],
        source=source,
    )


# --- LAVIS BLIP / ALBEF retrieval (optional environment) ---------------------------------


class _LavisImageTower(ProjectedTower):
    proj_attr = "vision_proj"

    def __init__(self, model) -> None:
        super().__init__()
        self.visual_encoder = model.visual_encoder
        self.vision_proj = model.vision_proj

    def features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.visual_encoder.forward_features(pixel_values)[:, 0, :]


class _LavisTextTower(ProjectedTower):
    """LAVIS' ``compute_sim_matrix`` path: ``text_encoder.forward_text`` then ``text_proj``."""

    proj_attr = "text_proj"

    def __init__(self, model) -> None:
        super().__init__()
        self.text_encoder = model.text_encoder
        self.text_proj = model.text_proj

    def features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.text_encoder(input_ids, attention_mask=attention_mask, return_dict=True, mode="text")
        return out.last_hidden_state[:, 0, :]


def _build_lavis(name: str, config: dict) -> DenseDualEncoder:
    try:
        from lavis.models import load_model
    except ImportError:
        raise ModelError(
            f"{name} needs LAVIS: install salesforce-lavis in its own environment (it needs transformers<4.56)"
        ) from None
    model = load_model(config["lavis_name"], config["lavis_type"], is_eval=True, device="cpu")
    lavis_tok = model.tokenizer  # bert-base-uncased + [DEC]/[ENC]
    from transformers import BertTokenizerFast

    fast = BertTokenizerFast.from_pretrained("bert-base-uncased")
    fast.add_special_tokens({"bos_token": "[DEC]"})
    fast.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
    if len(fast) != len(lavis_tok):
        raise ModelError(f"{name}: tokenizer size {len(lavis_tok)} differs from bert-base-uncased+[DEC]+[ENC]")
    return DenseDualEncoder(
        name=name,
        kind="lavis",
        image_tower=_LavisImageTower(model).eval(),
        text_tower=_LavisTextTower(model).eval(),
        tokenizer=Tokenizer.from_str(fast.backend_tokenizer.to_str()),
        vocab_weight=model.text_encoder.embeddings.word_embeddings.weight.detach().clone(),
        dense_dim=model.text_proj.out_features,
        image=config["image"],
        max_text_length=config["max_text_length"],
        source={"model": name, "weights": f"LAVIS {config['lavis_name']}/{config['lavis_type']}"},
    )
