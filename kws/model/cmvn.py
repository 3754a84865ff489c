"""Global CMVN as model buffers, built from WeKws's `global_cmvn` statistics."""

import math

import torch
from torch import nn

from kws.errors import KwsError


def cmvn_mean_istd(cmvn, dim=None):
    """(mean, istd) float32 tensors [D] from a WeKws global_cmvn dict {mean_stat, var_stat, frame_num}.

    mean = sum / N, istd = 1 / sqrt(max(sumsq / N - mean^2, 1e-20)), as WeKws computes them.
    """
    if not isinstance(cmvn, dict):
        raise KwsError("global_cmvn: expected a mapping with mean_stat, var_stat, frame_num")
    for key in ("mean_stat", "var_stat", "frame_num"):
        if key not in cmvn:
            raise KwsError(f"global_cmvn: missing key {key!r}")
    frames = float(cmvn["frame_num"])
    if not math.isfinite(frames) or frames <= 0:
        raise KwsError(f"global_cmvn: frame_num must be positive, got {cmvn['frame_num']!r}")
    sums = torch.as_tensor(cmvn["mean_stat"], dtype=torch.float64).reshape(-1)
    sumsq = torch.as_tensor(cmvn["var_stat"], dtype=torch.float64).reshape(-1)
    if sums.numel() != sumsq.numel():
        raise KwsError(f"global_cmvn: mean_stat has {sums.numel()} values but var_stat has {sumsq.numel()}")
    if dim is not None and sums.numel() != dim:
        raise KwsError(f"global_cmvn: statistics are {sums.numel()}-dimensional but the features are {dim}-dimensional")
    mean = sums / frames
    var = torch.clamp(sumsq / frames - mean * mean, min=1e-20)
    istd = 1.0 / torch.sqrt(var)
    if not (torch.isfinite(mean).all() and torch.isfinite(istd).all()):
        raise KwsError("global_cmvn: statistics contain non-finite values")
    return mean.float(), istd.float()


class GlobalCMVN(nn.Module):
    """(x - mean) * istd with `mean` and `istd` as buffers; identity (mean 0, istd 1) when cmvn is None.

    The buffers exist either way, so state dicts of models with and without CMVN have the same keys.
    """

    def __init__(self, dim, cmvn=None, norm_var=True):
        super().__init__()
        if cmvn is None:
            mean, istd = torch.zeros(dim), torch.ones(dim)
        else:
            mean, istd = cmvn_mean_istd(cmvn, dim)
            if not norm_var:
                istd = torch.ones(dim)
        self.register_buffer("mean", mean)
        self.register_buffer("istd", istd)

    def forward(self, x):
        return (x - self.mean) * self.istd
