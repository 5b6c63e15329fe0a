"""Dense2Sparse (D2S) training: data, vocabulary statistics, losses, PEC schedule, trainer, joint, convert.
Torch side: may import torch, d2s_onnx_export.head and d2s_search's runtime modules; never the CLI.

Kept light on purpose: importing this package must not import torch, so the torch-free
helpers (``data``, ``vocab``) can be used by evaluation at runtime. Modules that need
torch (``losses``, ``pec``, ``modeling``, ``trainer``, ``joint``, ``convert``) import it
themselves.
"""
