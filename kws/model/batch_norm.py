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


class _RealFramesNorm(torch.autograd.Function):
    """y = (x - mean) / sqrt(var + eps) * weight + bias over x [B, C, T], mean and var over the frames where
    mask [B, T] is 1, and their gradient written out: autograd through the masked sums took 2.4x the time
    of BatchNorm's backward on a [16, 128, 320] batch. Every output depends on the statistics, so the
    statistics' terms sum the output gradient over every frame, and reach the real frames' inputs alone."""

    @staticmethod
    def forward(ctx, x, mask, weight, bias, eps):
        count = mask.sum()
        real = x * mask[:, None, :]  # (torch.einsum over the mask took 8x as long on a CPU)
        mean = real.sum((0, 2)) / count
        var = ((real * x).sum((0, 2)) / count - mean.square()).clamp(min=0)
        rstd = torch.rsqrt(var + eps)
        normalised = torch.addcmul((-mean * rstd)[:, None], x, rstd[:, None])
        ctx.save_for_backward(normalised, mask, weight, rstd, count)
        ctx.mark_non_differentiable(mean, var, count)
        return torch.addcmul(bias[:, None], normalised, weight[:, None]), mean, var, count

    @staticmethod
    def backward(ctx, grad, _mean, _var, _count):
        normalised, mask, weight, rstd, count = ctx.saved_tensors
        grad_weight = (grad * normalised).sum((0, 2))
        grad_bias = grad.sum((0, 2))
        # d x = rstd (g - mask / n (sum g + x^ sum g x^)), g = grad * weight
        through_stats = torch.addcmul(
            (weight * grad_bias / count)[:, None], normalised, (weight * grad_weight / count)[:, None]
        )
        through_stats.mul_(mask[:, None, :])
        grad_x = grad * (weight * rstd)[:, None]
        grad_x.sub_(through_stats.mul_(rstd[:, None]))
        return grad_x, None, grad_weight, grad_bias, None


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
        values = x.float()  # statistics in fp32 under bf16 autocast, as BatchNorm keeps them
        weight = self.weight if self.affine else values.new_ones(values.size(1))
        bias = self.bias if self.affine else values.new_zeros(values.size(1))
        y, mean, var, count = _RealFramesNorm.apply(values, mask.to(torch.float32), weight, bias, self.eps)
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                momentum = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
                # BatchNorm's running variance is the unbiased one
                self.running_mean.lerp_(mean, momentum)
                self.running_var.lerp_(var * count / (count - 1).clamp(min=1), momentum)
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
