"""An exponential moving average of the weights that train (`training_config.ema_decay`).

The average is the model that is evaluated, checkpointed and averaged; the weights the optimizer moves
train on underneath it and travel in each checkpoint too, so a resumed run is the same run.
"""

import copy

import torch

DEFAULT_WARMUP = 10  # TensorFlow's: training_config.ema_warmup when unset


class WeightAverage:
    """`module`'s parameters and floating buffers (BatchNorm's statistics) averaged after every optimizer
    step: average <- d * average + (1 - d) * weights, d = min(decay, (1 + n) / (warmup + n)) at the n-th
    update (TensorFlow's ExponentialMovingAverage with num_updates, whose warm-up constant is 10), so the
    first updates do not leave the average near the initial weights. Under the warm-up the average weighs
    the n-th step's weights about as n^(warmup - 2): it spans about the last 1 / (warmup - 1) of the steps
    so far, and warmup 2 is the plain mean of every step's weights (Polyak's). Integer buffers are copied.
    Everything stays on the device and in place: an update costs no host sync (a step skipped for a
    non-finite gradient is still an update, of weights that did not move)."""

    def __init__(self, module, decay, warmup=DEFAULT_WARMUP):
        self.decay = float(decay)
        self.warmup = float(warmup)
        self.updates = 0
        self.module = copy.deepcopy(module)
        for parameter in self.module.parameters():
            parameter.requires_grad_(False)
        # state_dict() tensors share storage with the modules' own: updating them updates the average
        pairs = list(zip(self.module.state_dict().values(), module.state_dict().values()))
        self._averaged = [mine for mine, _ in pairs if mine.is_floating_point()]
        self._weights = [theirs for mine, theirs in pairs if mine.is_floating_point()]
        self._copied = [(mine, theirs) for mine, theirs in pairs if not mine.is_floating_point()]

    @property
    def current_decay(self):
        """The decay of the latest update. The warm-up holds it under `decay` for the first
        (warmup * decay - 1) / (1 - decay) updates (4,490 at 0.998 and warmup 10), which can be the whole
        run: then the warm-up alone sets the average, and `decay` itself never acts."""
        return min(self.decay, (1 + self.updates) / (self.warmup + self.updates))

    def update(self):
        self.updates += 1
        decay = self.current_decay
        with torch.no_grad():
            torch._foreach_lerp_(self._averaged, self._weights, 1.0 - decay)
            for target, value in self._copied:
                target.copy_(value)
