"""Torch side of d2s-search: build dense encoders, attach the sparse head, export ONNX bundles.

Nothing under ``d2s_search`` (the runtime) imports this package except the ``export-onnx``
command, lazily.
"""
