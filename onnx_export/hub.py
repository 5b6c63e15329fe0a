"""Reaching the Hugging Face hub, checked before anything heavy is imported."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from d2s_search.errors import HubUnreachableError


def ensure_hub_reachable(hub_id: str, timeout: float = 3.0) -> None:
    """Fail fast, in one line, when a hub model is not cached and the hub cannot be reached.

    transformers would otherwise retry for half a minute and end in a long message.
    """
    if Path(hub_id).exists() or os.environ.get("HF_HUB_OFFLINE") == "1":
        return
    try:
        from huggingface_hub import try_to_load_from_cache

        if isinstance(try_to_load_from_cache(hub_id, "config.json"), str):
            return  # cached: loading works offline
    except Exception:
        pass
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    parsed = urlparse(endpoint)
    host, port = parsed.hostname or "huggingface.co", parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return
    except OSError as exc:
        raise HubUnreachableError(
            f"cannot download {hub_id} from the Hugging Face hub ({host}: {exc.__class__.__name__}); "
            "for a real model without the hub run `d2s-search export-onnx --model offline-mini`, "
            "or `--model tiny-blip` for a random-weight trial"
        ) from None
