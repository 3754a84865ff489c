"""A depthwise Conv1d whose CPU backward is two forward convolutions (issue 15, item 5).

oneDNN's depthwise-convolution backward on CPU takes 10-25x its forward (measured on [16, 64, 320],
kernel 8: forward 0.25 ms, backward 3-7 ms, fp32 and bf16 alike); it dominated the default model's
training step. Both gradients are convolutions oneDNN runs fast in the forward direction:

- input: the output gradient, padded by the context on both sides, correlated with the flipped kernel;
- weight: each (batch, channel) row of the input correlated with its output-gradient row (one group per
  row, stride = dilation picks the kernel's taps), summed over the batch.

The module is an nn.Conv1d (same parameters and state_dict keys as WeKws's), and only its CPU training
forward takes this path; eval, TorchScript export and CUDA use the stock convolution.
"""

import torch
import torch.nn.functional as F
from torch import nn


class _DepthwiseConv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, dilation):
        ctx.save_for_backward(x, weight)
        ctx.dilation = dilation
        return F.conv1d(x, weight, bias, dilation=dilation, groups=x.size(1))

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        dilation = ctx.dilation
        batch, channels, frames = grad.shape
        grad = grad.contiguous()
        context = (weight.size(-1) - 1) * dilation
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            padded = F.pad(grad, (context, context))
            grad_x = F.conv1d(padded, weight.flip(-1), dilation=dilation, groups=channels)
        if ctx.needs_input_grad[1]:
            rows = x.contiguous().view(1, batch * channels, x.size(2))
            taps = F.conv1d(rows, grad.view(batch * channels, 1, frames), stride=dilation, groups=batch * channels)
            grad_w = taps.view(batch, channels, -1).sum(0).unsqueeze(1)
        if ctx.needs_input_grad[2]:
            grad_b = grad.sum((0, 2))
        return grad_x, grad_w, grad_b, None


@torch.jit.unused
def _depthwise_train(x, weight, bias, dilation: int):
    if torch.is_autocast_enabled("cpu"):  # the stock conv would be cast by autocast; do the same
        dtype = torch.get_autocast_dtype("cpu")
        x, weight, bias = x.to(dtype), weight.to(dtype), bias.to(dtype)
    return _DepthwiseConv.apply(x, weight, bias, dilation)


class DepthwiseConv1d(nn.Conv1d):
    """nn.Conv1d(channels, channels, kernel_size, dilation=dilation, groups=channels), no padding."""

    def __init__(self, channels, kernel_size, dilation=1):
        super().__init__(channels, channels, kernel_size, dilation=dilation, groups=channels)

    def forward(self, x):
        if (
            not torch.jit.is_scripting()
            and self.training
            and x.device.type == "cpu"
            and self.bias is not None
            and torch.is_grad_enabled()
        ):
            return _depthwise_train(x, self.weight, self.bias, self.dilation[0])
        return self._conv_forward(x, self.weight, self.bias)
