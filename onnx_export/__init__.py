"""Torch side of d2s-search: the model factory (configs/), sparse head, ONNX export, offline_mini/.
May import torch, transformers and d2s_search's runtime modules (bundle, errors, encoder); never the CLI.

Nothing under ``d2s_search`` (the runtime) imports this package except the ``export-onnx``
command, lazily.
"""
