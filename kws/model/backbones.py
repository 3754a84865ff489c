"""Streaming backbones: hidden features [B, T, D] -> [B, T, H], with one cache tensor carried between chunks.

Every backbone has `input_dim`, `output_dim`, `init_cache(batch_size, device=None, dtype=None)` (the zero
cache, one tensor) and `forward(x, cache=None) -> (y, new_cache)`; `cache=None` equals the zero cache, so a
full-utterance forward equals a chunked forward that carries the cache (eval mode).

Convolutions are causal: each block left-pads its own input with its (kernel_size - 1) * dilation previous
frames (zeros at the start of a stream), like WeKws's TCN. The TCN-style caches are those left contexts
concatenated along time, [B, C, sum(receptive - 1)] (WeKws's layout).
"""

from typing import Optional

import torch
from torch import nn

from kws.model.depthwise import DepthwiseConv1d


def _with_context(x, cache):
    """Prepend cached left context [B, C, P] to x [B, C, T]; return (padded, new_cache [B, C, P])."""
    padded = torch.cat((cache, x), dim=2)
    context = cache.size(2)
    return padded, padded[:, :, padded.size(2) - context :]


class CnnBlock(nn.Module):
    """Causal dilated conv -> BatchNorm -> ReLU -> Dropout, plus the residual input (WeKws CnnBlock)."""

    def __init__(self, channels, kernel_size, dilation, dropout=0.1):
        super().__init__()
        self.context = (kernel_size - 1) * dilation
        self.cnn = nn.Sequential(
            nn.Conv1d(channels, channels, kernel_size, dilation=dilation),
            nn.BatchNorm1d(channels),
            nn.ReLU(),
            nn.Dropout(dropout),
        )

    def forward(self, x, cache):
        padded, new_cache = _with_context(x, cache)
        return self.cnn(padded) + x, new_cache


class DsCnnBlock(CnnBlock):
    """Depthwise-separable variant: depthwise dilated conv -> BN -> ReLU -> pointwise -> BN -> ReLU -> Dropout."""

    def __init__(self, channels, kernel_size, dilation, dropout=0.1):
        super().__init__(channels, kernel_size, dilation, dropout)
        self.cnn = nn.Sequential(
            DepthwiseConv1d(channels, kernel_size, dilation),
            nn.BatchNorm1d(channels),
            nn.ReLU(),
            nn.Conv1d(channels, channels, 1),
            nn.BatchNorm1d(channels),
            nn.ReLU(),
            nn.Dropout(dropout),
        )


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the gradient contiguous. The gradient that comes back through the
    [B, C, T] -> [B, T, C] transpose at a backbone's output is a strided view; every ReLU, BatchNorm and
    convolution backward of the blocks then runs on it ~10x slower than on a contiguous tensor (measured:
    ReLU backward 1.8 ms against 0.16 ms on [16, 64, 320]); one copy here saves them all."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous()


@torch.jit.unused
def _contiguous_grad(x):
    return _ContiguousGrad.apply(x)


class TCN(nn.Module):
    """Residual causal dilated conv blocks, dilation 1, 2, 4, ... (`ds: true` for depthwise-separable)."""

    def __init__(self, hidden_dim, num_layers=4, kernel_size=8, dropout=0.1, ds=False):
        super().__init__()
        block = DsCnnBlock if ds else CnnBlock
        self.input_dim = self.output_dim = hidden_dim
        self.network = nn.ModuleList(block(hidden_dim, kernel_size, 2**i, dropout) for i in range(num_layers))
        self.cache_frames = sum(b.context for b in self.network)

    def init_cache(self, batch_size: int, device: Optional[torch.device] = None, dtype: Optional[torch.dtype] = None):
        return torch.zeros(batch_size, self.output_dim, self.cache_frames, device=device, dtype=dtype)

    def forward(self, x, cache: Optional[torch.Tensor] = None):
        if cache is None:
            cache = x.new_zeros((x.size(0), self.output_dim, self.cache_frames))
        x = x.transpose(1, 2)
        new_caches, offset = [], 0
        for block in self.network:
            x, c = block(x, cache[:, :, offset : offset + block.context])
            new_caches.append(c)
            offset += block.context
        if self.training and x.requires_grad and not torch.jit.is_scripting():
            x = _contiguous_grad(x)
        return x.transpose(1, 2), torch.cat(new_caches, dim=2)


class MdtcBlock(nn.Module):
    """WeKws MDTC TCNBlock: depthwise dilated conv -> BN -> pointwise -> BN -> ReLU -> 1x1 conv -> BN,
    then ReLU of (that + input) when the channel counts match, else ReLU of it alone."""

    def __init__(self, in_channels, res_channels, kernel_size, dilation):
        super().__init__()
        self.in_channels, self.res_channels = in_channels, res_channels
        self.context = (kernel_size - 1) * dilation
        self.conv1 = nn.Sequential(
            DepthwiseConv1d(in_channels, kernel_size, dilation),
            nn.BatchNorm1d(in_channels),
            nn.Conv1d(in_channels, res_channels, 1),
        )
        self.bn1 = nn.BatchNorm1d(res_channels)
        self.conv2 = nn.Conv1d(res_channels, res_channels, 1)
        self.bn2 = nn.BatchNorm1d(res_channels)
        self.relu = nn.ReLU()

    def forward(self, x, cache):
        padded, new_cache = _with_context(x, cache)
        y = self.relu(self.bn1(self.conv1(padded)))
        y = self.bn2(self.conv2(y))
        if self.in_channels == self.res_channels:
            y = y + x
        return self.relu(y), new_cache


class MDTC(nn.Module):
    """Multi-scale depthwise temporal convolution (WeKws MDTC, causal).

    A first block maps input_dim -> hidden_dim, then `stack_num` stacks of `stack_size` blocks with
    dilations 1, 2, 4, ...; the outputs of the stacks are summed. The cache is [B, C, sum(context)] with
    C = max(input_dim, hidden_dim); blocks with fewer channels use (and fill) the first channels only.
    Unlike WeKws (which zero-pads the input once, with no working cache) every block pads its own input,
    so streaming with the cache is exact.
    """

    def __init__(self, input_dim, hidden_dim=64, stack_num=4, stack_size=4, kernel_size=5):
        super().__init__()
        self.input_dim, self.output_dim = input_dim, hidden_dim
        self.stack_size = stack_size
        # blocks[0] is the input block; then stack_num stacks of stack_size blocks, flattened.
        blocks = [MdtcBlock(input_dim, hidden_dim, kernel_size, 1)]
        for _ in range(stack_num):
            blocks.extend(MdtcBlock(hidden_dim, hidden_dim, kernel_size, 2**i) for i in range(stack_size))
        self.blocks = nn.ModuleList(blocks)
        self.cache_channels = max(input_dim, hidden_dim)
        self.cache_frames = sum(b.context for b in self.blocks)

    def init_cache(self, batch_size: int, device: Optional[torch.device] = None, dtype: Optional[torch.dtype] = None):
        return torch.zeros(batch_size, self.cache_channels, self.cache_frames, device=device, dtype=dtype)

    def forward(self, x, cache: Optional[torch.Tensor] = None):
        if cache is None:
            cache = x.new_zeros((x.size(0), self.cache_channels, self.cache_frames))
        x = x.transpose(1, 2)
        new_caches = []
        total = x.new_zeros((x.size(0), self.output_dim, x.size(2)))
        offset = 0
        for i, block in enumerate(self.blocks):
            x, c_out = block(x, cache[:, : block.in_channels, offset : offset + block.context])
            offset += block.context
            missing = self.cache_channels - block.in_channels
            if missing > 0:
                c_out = torch.cat((c_out, c_out.new_zeros((c_out.size(0), missing, c_out.size(2)))), dim=1)
            new_caches.append(c_out)
            if i > 0 and i % self.stack_size == 0:  # the last block of a stack
                total = total + x
        if self.training and total.requires_grad and not torch.jit.is_scripting():
            total = _contiguous_grad(total)
        return total.transpose(1, 2), torch.cat(new_caches, dim=2)


class GRU(nn.Module):
    """Unidirectional multi-layer GRU; cache [B, num_layers, hidden] (the hidden state, batch first)."""

    def __init__(self, hidden_dim, num_layers=2, dropout=0.0):
        super().__init__()
        self.input_dim = self.output_dim = hidden_dim
        self.num_layers = num_layers
        self.gru = nn.GRU(
            hidden_dim,
            hidden_dim,
            num_layers=num_layers,
            batch_first=True,
            dropout=float(dropout) if num_layers > 1 else 0.0,
        )

    def init_cache(self, batch_size: int, device: Optional[torch.device] = None, dtype: Optional[torch.dtype] = None):
        return torch.zeros(batch_size, self.num_layers, self.output_dim, device=device, dtype=dtype)

    def forward(self, x, cache: Optional[torch.Tensor] = None):
        if cache is None:
            cache = x.new_zeros((x.size(0), self.num_layers, self.output_dim))
        y, h = self.gru(x, cache.transpose(0, 1).contiguous())
        return y, h.transpose(0, 1)
