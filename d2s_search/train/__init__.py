"""Dense2Sparse (D2S) training: data, vocabulary statistics, loss, PEC schedule, trainer.

Kept light on purpose: importing this package must not import torch, so the torch-free
helpers (``data``, ``vocab``) can be used by evaluation at runtime. Modules that need
torch (``losses``, ``pec``, ``modeling``, ``trainer``, ``joint``, ``convert``) import it
themselves.
"""
