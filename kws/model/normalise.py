"""Causal sliding-window mean normalisation of the features (`model.preprocessing.sliding_cmn`)."""

from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F


class SlidingCMN(nn.Module):
    """x(t) minus the mean of the last `window` frames (itself included), per feature: Kaldi's online
    sliding CMN, causal. It runs after global CMVN, where 0 is the training corpus's mean, and frames
    before the start of a stream count as 0: a stream starts from the corpus's mean and adapts as the
    window fills, and chunked streaming with the cache (the last window - 1 frames) is exact.

    Why: a microphone's response, the room and the level add a slowly varying offset to log-mel
    features; the global statistics are those of the training corpus, whose engines and channels a
    recording does not share. Subtracting a running mean removes what stays constant over the window.
    """

    def __init__(self, window):
        super().__init__()
        self.window = window
        self.context = window - 1

    def forward(self, x, cache: Optional[torch.Tensor] = None):
        """x [B, T, D], cache [B, D, window - 1] or None (the zero cache) -> (normalised [B, T, D], new cache)."""
        # window sums as differences of a running sum, in float64: O(T) rather than O(T x window) (a
        # pooling layer cost the default model's step 50 % at 300 frames), its rounding far below float32's,
        # so a chunked forward agrees with the full one (tests/test_model.py)
        if cache is None:
            # zeros add nothing to a running sum: the same sums as over the zero cache and x, bit for bit,
            # without summing the window - 1 zeros (training's forward: half the work at 300 frames)
            total = x.double().cumsum(dim=1)
            before = F.pad(total[:, : max(total.size(1) - self.window, 0)], (0, 0, self.window, 0))
            mean = ((total - before[:, : total.size(1)]) / self.window).to(x.dtype)
            tail = x[:, max(x.size(1) - self.context, 0) :].transpose(1, 2)
            return x - mean, F.pad(tail, (self.context - tail.size(2), 0))
        padded = torch.cat((cache, x.transpose(1, 2)), dim=2)
        total = F.pad(padded.double().cumsum(dim=2), (1, 0))
        mean = ((total[:, :, self.window :] - total[:, :, : total.size(2) - self.window]) / self.window).to(x.dtype)
        return x - mean.transpose(1, 2), padded[:, :, padded.size(2) - self.context :]
