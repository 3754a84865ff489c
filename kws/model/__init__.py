"""Keyword-spotting models (WeKws-compatible): global CMVN -> preprocessing -> backbone -> classifier.

`build_model(model_conf, input_dim, num_keywords, cmvn)` builds a `KWSModel` from the `model:` section of a
config (WeKws layout). `KWSModel.forward(feats [B, T, D], cache=None) -> (logits [B, T, K], new_cache)`;
posteriors are `torch.sigmoid(logits)`. `cache=None` is the start of a stream (the zero cache of
`init_cache`), and a chunked forward carrying the cache equals the full forward (eval mode).
"""

from typing import Optional

import torch
from torch import nn

from kws.config import normalise_model_conf
from kws.errors import KwsError
from kws.model.backbones import GRU, MDTC, TCN
from kws.model.classifier import LinearClassifier
from kws.model.cmvn import GlobalCMVN, cmvn_mean_istd
from kws.model.normalise import SlidingCMN

__all__ = ["KWSModel", "StreamingWrapper", "build_model", "count_parameters", "GlobalCMVN", "cmvn_mean_istd"]


class KWSModel(nn.Module):
    """global_cmvn -> [sliding CMN] -> preprocessing -> backbone -> classifier; outputs per-frame logits.

    With sliding CMN (a window of W frames) the one cache tensor is [B, max(D, C), W - 1 + F]: its first
    W - 1 frames hold the last features (D channels), the rest the backbone's cache (C channels, F
    frames; a GRU's [B, layers, hidden] alike), each zero-padded to the larger channel count. Without it
    the cache is the backbone's own.
    """

    def __init__(self, input_dim, num_keywords, global_cmvn, preprocessing, backbone, classifier, sliding_cmn=0):
        super().__init__()
        self.input_dim = input_dim
        self.num_keywords = num_keywords
        self.global_cmvn = global_cmvn
        # a module either way (it has no weights: state dicts are alike), so TorchScript types both branches
        self.normaliser = SlidingCMN(max(sliding_cmn, 1))
        self.norm_context = sliding_cmn - 1 if sliding_cmn else 0
        backbone_cache = backbone.init_cache(1)
        self.backbone_channels = backbone_cache.size(1)
        self.backbone_frames = backbone_cache.size(2)
        self.cache_channels = max(input_dim, self.backbone_channels)
        self.preprocessing = preprocessing
        self.backbone = backbone
        self.classifier = classifier

    @torch.jit.export
    def init_cache(self, batch_size: int, device: Optional[torch.device] = None, dtype: Optional[torch.dtype] = None):
        """The zero cache (start of a stream) as one tensor; its shape depends on the backbone."""
        ref = self.global_cmvn.mean
        if device is None:
            device = ref.device
        if dtype is None:
            dtype = ref.dtype
        if self.norm_context > 0:
            frames = self.norm_context + self.backbone_frames
            return torch.zeros(batch_size, self.cache_channels, frames, device=device, dtype=dtype)
        return self.backbone.init_cache(batch_size, device=device, dtype=dtype)

    def forward(self, feats, cache: Optional[torch.Tensor] = None):
        x, new_cache = self.hidden(feats, cache)
        return self.classifier(x), new_cache

    def hidden(self, feats, cache: Optional[torch.Tensor] = None):
        """The backbone's output [B, T, H] (what the classifier reads) and the new cache."""
        x = self.global_cmvn(feats)
        if self.norm_context == 0:
            return self.backbone(self.preprocessing(x), cache)
        # no cache: the normaliser and the backbone make their own zeros, the backbone's in its input's dtype
        # (one float32 cache made every block's context concatenation float32 under bf16 autocast: the
        # same numbers, the training step 16 % slower)
        norm_cache: Optional[torch.Tensor] = None
        backbone_cache: Optional[torch.Tensor] = None
        if cache is not None:
            norm_cache = cache[:, : self.input_dim, : self.norm_context]
            backbone_cache = cache[:, : self.backbone_channels, self.norm_context :]
        x, norm_cache = self.normaliser(x, norm_cache)
        y, backbone_cache = self.backbone(self.preprocessing(x), backbone_cache)
        return y, torch.cat((self._padded(norm_cache), self._padded(backbone_cache)), dim=2)

    def _padded(self, cache):
        return torch.nn.functional.pad(cache, (0, 0, 0, self.cache_channels - cache.size(1)))


class StreamingWrapper(nn.Module):
    """forward(feats, cache) -> (sigmoid(logits), new_cache): what scoring and the exports compute."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, feats, cache: Optional[torch.Tensor] = None):
        logits, new_cache = self.model(feats, cache)
        return torch.sigmoid(logits), new_cache


def receptive_field(model, normalisation=True):
    """Frames of input one output frame depends on (itself included); None when unbounded (GRU).

    With `normalisation=False`, the backbone's frames alone: what the model can match a keyword over.
    A sliding CMN window (`model.preprocessing.sliding_cmn`) widens the first count by its length but only
    subtracts a mean, so a keyword longer than the second count is never seen whole: the model must decide
    from its tail alone, which cannot tell "你好问问" from the hard negative "好问问". Compare that one
    with the keywords' durations.
    """
    frames = getattr(model.backbone, "cache_frames", None)
    if frames is None:
        return None
    return frames + 1 + (getattr(model, "norm_context", 0) if normalisation else 0)


def count_parameters(model, trainable_only=False):
    """Number of parameters (buffers such as CMVN and BatchNorm statistics not included)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def _positive_int(conf, key, where, default=None):
    value = conf.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise KwsError(f"{where}.{key}: expected a positive integer, got {value!r}")
    return value


def _dropout(conf, key, where, default=None):
    value = conf.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise KwsError(f"{where}.{key}: expected a probability in [0, 1), got {value!r}")
    return float(value)


def build_model(model_conf, input_dim, num_keywords, cmvn=None):
    """Build a KWSModel from the `model:` config section.

    `cmvn` is the parsed WeKws `global_cmvn` JSON ({mean_stat, var_stat, frame_num}) or None (identity).
    Config errors raise KwsError naming the offending key (e.g. `model.backbone.type`).
    """
    if not isinstance(model_conf, dict):
        raise KwsError(f"model: expected a mapping, got {model_conf!r}")
    input_dim, num_keywords = int(input_dim), int(num_keywords)
    if input_dim < 1:
        raise KwsError(f"input_dim must be positive, got {input_dim}")
    if num_keywords < 1:
        raise KwsError(f"num_keywords must be positive, got {num_keywords}")
    # One reading of every layout (WeKws's, kwsflow's older `classifier`), defaults included.
    model_conf = normalise_model_conf(model_conf)
    hidden_dim = _positive_int(model_conf, "hidden_dim", "model")

    global_cmvn = GlobalCMVN(input_dim, cmvn)

    prep_type = model_conf["preprocessing"]["type"]
    if prep_type == "linear":
        preprocessing = nn.Sequential(nn.Linear(input_dim, hidden_dim), nn.ReLU())
        backbone_in = hidden_dim
    elif prep_type == "none":
        preprocessing = nn.Identity()
        backbone_in = input_dim
    else:
        raise KwsError(f"model.preprocessing.type: unknown type {prep_type!r} (linear|none)")
    sliding_cmn = model_conf["preprocessing"].get("sliding_cmn") or 0
    if isinstance(sliding_cmn, bool) or not isinstance(sliding_cmn, int) or sliding_cmn < 0 or sliding_cmn == 1:
        raise KwsError(
            f"model.preprocessing.sliding_cmn: expected a window of at least 2 frames or 0 (off), got {sliding_cmn!r}"
        )

    where = "model.backbone"
    bconf = model_conf.get("backbone")
    if not isinstance(bconf, dict):
        raise KwsError(f"{where}: expected a mapping, got {bconf!r}")
    btype = bconf["type"]
    if btype in ("tcn", "gru") and backbone_in != hidden_dim:
        raise KwsError(
            f"model.preprocessing.type: backbone {btype!r} needs preprocessing 'linear' "
            f"when input_dim ({input_dim}) != hidden_dim ({hidden_dim})"
        )
    if btype == "tcn":
        backbone = TCN(
            hidden_dim,
            num_layers=_positive_int(bconf, "num_layers", where),
            kernel_size=_positive_int(bconf, "kernel_size", where),
            dropout=_dropout(bconf, "dropout", where),
            ds=bool(bconf["ds"]),
        )
    elif btype == "mdtc":
        if not bconf["causal"]:
            raise KwsError(f"{where}.causal: only causal (streaming) MDTC is supported")
        backbone = MDTC(
            backbone_in,
            hidden_dim=_positive_int(bconf, "hidden_dim", where),
            stack_num=_positive_int(bconf, "num_stack", where),
            stack_size=_positive_int(bconf, "stack_size", where),
            kernel_size=_positive_int(bconf, "kernel_size", where),
        )
    else:
        backbone = GRU(
            hidden_dim, num_layers=_positive_int(bconf, "num_layers", where), dropout=_dropout(bconf, "dropout", where)
        )

    classifier = LinearClassifier(
        backbone.output_dim, num_keywords, dropout=_dropout(model_conf, "classifier_dropout", "model", 0.0)
    )
    return KWSModel(input_dim, num_keywords, global_cmvn, preprocessing, backbone, classifier, sliding_cmn)
