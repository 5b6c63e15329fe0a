"""An exponential moving average of the head's weights (Polyak averaging).

On a small caption set the head's validation R@1 moves by a few queries from epoch to epoch,
and the best-epoch choice follows that noise. The average of the recent weights is a smoother
head: it is what is validated and saved when the option is on, while the optimiser keeps
stepping the live weights. The decay ramps up as in TensorFlow's ExponentialMovingAverage,
min(decay, (1 + n) / (10 + n)) after n updates, so the first steps do not pin the average to
the initialisation.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


class WeightAverage:
    def __init__(self, module: torch.nn.Module, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"the average's decay must be in (0, 1), got {decay}")
        self.decay = decay
        self.updates = 0
        self.shadow = {k: v.detach().clone() for k, v in module.state_dict().items()}

    def current_decay(self) -> float:
        return min(self.decay, (1 + self.updates) / (10 + self.updates))

    @torch.no_grad()
    def update(self, module: torch.nn.Module) -> None:
        """Fold the module's weights after an optimiser step into the average."""
        self.updates += 1
        d = self.current_decay()
        for k, v in module.state_dict().items():
            if v.dtype.is_floating_point:
                self.shadow[k].mul_(d).add_(v.detach(), alpha=1.0 - d)
            else:
                self.shadow[k].copy_(v)

    @contextmanager
    def applied(self, module: torch.nn.Module) -> Iterator[None]:
        """The module holds the averaged weights inside the block, its own weights after it."""
        live = {k: v.detach().clone() for k, v in module.state_dict().items()}
        module.load_state_dict(self.shadow)
        try:
            yield
        finally:
            module.load_state_dict(live)

    def state_dict(self) -> dict:
        return {"decay": self.decay, "updates": self.updates,
                "shadow": {k: v.detach().cpu() for k, v in self.shadow.items()}}

    def load_state_dict(self, state: dict) -> None:
        if state.get("decay") != self.decay or set(state.get("shadow", {})) != set(self.shadow):
            raise ValueError("the stored weight average belongs to another head or decay")
        self.updates = int(state["updates"])
        for k, v in state["shadow"].items():
            self.shadow[k].copy_(v)
