"""Built-in model names -> plain JSON configs (open_clip style); no torch needed to read them."""

from __future__ import annotations

import json
from pathlib import Path

from d2s_search.errors import ModelError

CONFIG_DIR = Path(__file__).parent / "configs"
DEFAULT_MODEL = "blip-itm-base-coco"


def available_models() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.json"))


def load_config(name: str) -> dict:
    path = CONFIG_DIR / f"{name}.json"
    if path.is_file():
        return json.loads(path.read_text())
    local = Path(name)
    if (local / "config.json").is_file():
        return _config_from_checkpoint_dir(local)
    if "/" in name and not local.exists():
        return _config_from_hub_id(name)
    raise ModelError(
        f"unknown model {name!r}: use one of {', '.join(available_models())}, "
        "a Hugging Face id like Salesforce/blip-itm-base-coco, or a local checkpoint directory"
    )


def _config_from_hub_id(hub_id: str) -> dict:
    lowered = hub_id.lower()
    base = "clip-vit-b32" if "clip" in lowered else "blip-itm-base-coco" if "blip" in lowered else None
    if base is None:
        raise ModelError(f"cannot tell whether {hub_id!r} is a BLIP or CLIP model; pass a local directory")
    config = load_config(base)
    config["hub_id"] = hub_id
    config["description"] = f"{hub_id} (hub)"
    return config


def _config_from_checkpoint_dir(path: Path) -> dict:
    model_type = json.loads((path / "config.json").read_text()).get("model_type", "")
    if model_type not in ("blip", "clip"):
        raise ModelError(f"{path}: model_type {model_type!r} is not supported (blip, clip)")
    config = load_config("blip-itm-base-coco" if model_type == "blip" else "clip-vit-b32")
    config["hub_id"] = str(path)
    config["description"] = f"local checkpoint {path}"
    pre = path / "preprocessor_config.json"
    if pre.is_file():
        config["image"] = _image_settings_from_processor(json.loads(pre.read_text()), config["image"])
    return config


def _image_settings_from_processor(proc: dict, default: dict) -> dict:
    """Read size/mean/std from a transformers ``preprocessor_config.json``."""
    settings = dict(default)
    size = proc.get("size", {})
    if isinstance(size, dict):
        settings["size"] = int(size.get("shortest_edge") or size.get("height") or settings["size"])
    elif isinstance(size, int):
        settings["size"] = size
    settings["mean"] = proc.get("image_mean", settings["mean"])
    settings["std"] = proc.get("image_std", settings["std"])
    return settings
