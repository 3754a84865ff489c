"""BatchNorm statistics over a batch's real frames only (training_config.bn_real_frames).

A training batch pads every utterance to its longest, and nn.BatchNorm1d's batch statistics count the
padded frames as frames: on the default corpus 43 % of an unsorted batch's frames are padding. What a
real frame is normalised by in training then depends on how much padding its batch happened to hold,
and the running statistics that evaluation uses mix speech with padding (and differ between sorted and
unsorted batching, which pad 1.1x and 2.3x the real frames). With the option, each BatchNorm of the
trained model counts the real frames alone, in its batch statistics and in its running ones.

Only training changes: in eval mode (validation, scoring, the exports, the detector) a
RealFramesBatchNorm1d is nn.BatchNorm1d, its parameters and buffers are BatchNorm's, so checkpoints load
into the model build_model makes and nothing downstream knows the option.
"""

import contextlib
from typing import Optional

import torch
from torch import nn


class RealFramesBatchNorm1d(nn.BatchNorm1d):
    """nn.BatchNorm1d over [B, C, T] whose training statistics count only the frames of `frame_mask`
    ([B, T] bool, set by `real_frames` while a training batch runs; None: every frame, as BatchNorm)."""

    frame_mask: Optional[torch.Tensor] = None

    def forward(self, x):
        mask = self.frame_mask
        if not self.training or mask is None:
            return super().forward(x)
        if mask.shape != (x.size(0), x.size(2)):
            raise ValueError(f"frame mask {tuple(mask.shape)} does not fit a [B, C, T] input {tuple(x.shape)}")
        weights = mask[:, None, :].to(torch.float32)
        count = weights.sum()
        values = x.float()  # statistics in fp32 under bf16 autocast, as BatchNorm keeps them
        mean = (values * weights).sum((0, 2)) / count
        centred = values - mean[:, None]
        var = (centred.square() * weights).sum((0, 2)) / count
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                momentum = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
                # BatchNorm's running variance is the unbiased one
                self.running_mean.lerp_(mean, momentum)
                self.running_var.lerp_(var * count / (count - 1).clamp(min=1), momentum)
        y = centred * torch.rsqrt(var + self.eps)[:, None]
        if self.affine:
            y = y * self.weight[:, None] + self.bias[:, None]
        return y.to(x.dtype)


def use_real_frames(model):
    """Make every nn.BatchNorm1d of `model` a RealFramesBatchNorm1d, in place, and return them. The class is
    swapped on the same objects, so parameters, buffers, their names and what holds them (an optimizer, a
    parent module) stay as they are."""
    swapped = []
    for module in model.modules():
        if type(module) is nn.BatchNorm1d:
            module.__class__ = RealFramesBatchNorm1d
            swapped.append(module)
    return swapped


@contextlib.contextmanager
def real_frames(norms, lengths, frames):
    """While the block runs, the RealFramesBatchNorm1d `norms` count the first lengths[b] of `frames` frames
    of each utterance b (lengths [B], on the batch's device); no norms: nothing to do."""
    if not norms:
        yield
        return
    mask = torch.arange(frames, device=lengths.device)[None, :] < lengths[:, None]
    for norm in norms:
        norm.frame_mask = mask
    try:
        yield
    finally:
        for norm in norms:
            norm.frame_mask = None


__all__ = ["RealFramesBatchNorm1d", "use_real_frames", "real_frames"]
