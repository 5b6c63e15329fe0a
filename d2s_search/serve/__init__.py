"""``d2s-search serve``: a local search page and JSON API over any backend.

Runtime only (FastAPI, ONNX Runtime): nothing here imports torch.
"""

from .app import create_app

__all__ = ["create_app"]
