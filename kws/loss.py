"""Utterance-level losses on per-frame keyword logits, vectorised over batch and keywords.

Every loss has the signature `(logits [B, T, K], lengths [B], targets [B], min_duration=0) -> (loss, acc)`:
`targets` are keyword ids (-1 = filler), `lengths` the valid frames per utterance (clamped to [1, T]),
`min_duration` (frames) the earliest frame at which the target keyword may count: one number, or one
per utterance ([B]); `window_end` (optional, [B]) the frame before which it must count
(training_config.end_anchor: a window around where each positive's keyword ends); `weights` (optional,
[B]) each utterance's weight in the loss (training_config.confusable_weight), 1 when absent. `loss` is a
scalar tensor, `acc` a 0-dim float32 tensor (fraction of utterances decided correctly, unweighted; a
tensor so that the training loop reads it only when it logs, not once per step).
"""

import torch
import torch.nn.functional as F

from kws.errors import KwsError


def _check(logits, lengths, targets):
    if logits.dim() != 3:
        raise ValueError(f"logits must be [B, T, K], got shape {tuple(logits.shape)}")
    batch, frames, num_keywords = logits.shape
    lengths = torch.as_tensor(lengths, device=logits.device).reshape(-1).long()
    targets = torch.as_tensor(targets, device=logits.device).reshape(-1).long()
    if lengths.numel() != batch or targets.numel() != batch:
        raise ValueError(f"lengths ({lengths.numel()}) and targets ({targets.numel()}) must have B={batch} entries")
    # Checked on the host only: on a GPU the check would make every step wait for the device. Training
    # lists are checked when read (kws.datalist), so a GPU never sees an id out of range from them.
    if batch and targets.device.type == "cpu" and (targets.min() < -1 or targets.max() >= num_keywords):
        raise KwsError(
            f"keyword id out of range: targets must be -1 (filler) or 0..{num_keywords - 1}, "
            f"got {sorted(set(targets.tolist()))}"
        )
    return lengths.clamp(1, max(frames, 1)), targets


def _target_window(lengths, min_duration, window_end=None):
    """(start, stop) [B] of each utterance's target window: from min_duration (a number or [B]), or 0
    where the utterance is not longer than that (WeKws), to window_end ([B], at most the length; never
    empty), else to the length."""
    if isinstance(min_duration, torch.Tensor):
        floor = min_duration.to(lengths.device).long().expand_as(lengths)
    else:  # a number: filled on the device (a host scalar copied to a GPU would wait for its queue)
        floor = torch.full_like(lengths, int(min_duration))
    start = torch.where(lengths > floor, floor, torch.zeros_like(lengths))
    if window_end is None:
        return start, lengths
    stop = torch.minimum(lengths, torch.as_tensor(window_end, device=lengths.device).long().expand_as(lengths))
    return start, torch.maximum(stop, start + 1)


class _PooledLogitsCPU(torch.autograd.Function):
    """pooled_logits on CPU in one autograd node: zmax [B, K] from logits [B, T, K].

    The plain vectorised form (a masked copy of the logits through masked_fill with a broadcast
    [B, T, 1] mask, then amax, plus a gather for the target window) is slow on CPU: the broadcast
    masked_fill alone costs ~15x a plain reduction, and autograd then adds several full-size passes.
    Here the forward reduces each utterance's contiguous [length, K] slice in place (no copy) and the
    backward makes one [B, T, K] gradient, zero except at each maximum's frame (torch.max's choice on
    ties, as its own gradient), found within the valid frames (the target keyword's: within its window).
    """

    @staticmethod
    def forward(ctx, logits, lengths, start, stop, targets):
        batch, frames, num_keywords = logits.shape
        values = logits.new_empty(batch, num_keywords)
        frame = torch.empty(batch, num_keywords, dtype=torch.int64)
        for b, length in enumerate(lengths.tolist()):
            torch.max(logits[b, :length], dim=0, out=(values[b], frame[b]))
        t = torch.arange(frames).unsqueeze(0)
        window = (t < stop.unsqueeze(1)) & (t >= start.unsqueeze(1))  # [B, T]
        rows = (targets >= 0).nonzero().squeeze(1)
        cols = targets[rows]
        target_logits = logits[rows, :, cols].masked_fill(~window[rows], float("-inf"))  # [R, T]
        ztarget, target_frame = target_logits.max(dim=1)
        values[rows, cols] = ztarget
        frame[rows, cols] = target_frame
        ctx.save_for_backward(frame)
        ctx.shape, ctx.dtype = logits.shape, logits.dtype
        return values

    @staticmethod
    def backward(ctx, grad):
        (frame,) = ctx.saved_tensors
        out = grad.new_zeros(ctx.shape, dtype=ctx.dtype)
        out.scatter_(1, frame.unsqueeze(1), grad.unsqueeze(1).to(ctx.dtype))
        return out, None, None, None, None


def _pooled_logits_cpu(logits, lengths, targets, min_duration, window_end):
    """pooled_logits for CPU tensors with several keywords (see _PooledLogitsCPU)."""
    num_keywords = logits.shape[2]
    dtype = torch.promote_types(logits.dtype, torch.float32)
    start, stop = _target_window(lengths, min_duration, window_end)
    zmax = _PooledLogitsCPU.apply(logits, lengths, start, stop, targets).to(dtype)
    is_target = targets.unsqueeze(1) == torch.arange(num_keywords).unsqueeze(0)
    return zmax, is_target


def pooled_logits(logits, lengths, targets, min_duration=0, window_end=None):
    """Per-utterance, per-keyword max logit [B, K] over the frames that count for it, and the target mask.

    For the target keyword of an utterance: frames [min_duration, length), or all valid frames when
    length <= min_duration (WeKws); with `window_end`, frames before it only. For other keywords and
    fillers: all valid frames [0, length).
    max_t sigmoid(z_t) = sigmoid(max_t z_t), so pooling the logits pools the posteriors.
    Returns (zmax [B, K] in at least float32, is_target [B, K] bool).
    """
    lengths, targets = _check(logits, lengths, targets)
    if logits.device.type == "cpu" and logits.shape[0] > 0 and logits.shape[1] > 0 and logits.shape[2] >= 8:
        return _pooled_logits_cpu(logits, lengths, targets, min_duration, window_end)
    batch, frames, num_keywords = logits.shape
    t = torch.arange(frames, device=logits.device).unsqueeze(0)  # [1, T]
    valid = t < lengths.unsqueeze(1)  # [B, T]
    start, stop = _target_window(lengths, min_duration, window_end)
    window = (t < stop.unsqueeze(1)) & (t >= start.unsqueeze(1))  # [B, T]
    keyword_ids = torch.arange(num_keywords, device=logits.device)
    is_target = targets.unsqueeze(1) == keyword_ids.unsqueeze(0)  # [B, K]
    mask = torch.where(is_target.unsqueeze(1), window.unsqueeze(2), valid.unsqueeze(2))  # [B, T, K]
    dtype = torch.promote_types(logits.dtype, torch.float32)  # half/bfloat16 -> float32; float64 stays
    masked = logits.to(dtype).masked_fill(~mask, float("-inf"))
    return masked.amax(dim=1), is_target


def max_pooling_loss(logits, lengths, targets, min_duration=0, window_end=None, weights=None):
    """WeKws max-pooling loss, vectorised and numerically stable.

    Per utterance, summed over keywords k: -log(max_t p_tk) for the target keyword (frames from
    min_duration on, see `pooled_logits`) and -log(1 - max_t p_tk) = -log(min_t (1 - p_tk)) for every
    other keyword (all for fillers) over the valid frames; the sum is divided by the batch size.
    Computed as softplus(-zmax) / softplus(zmax) on the pooled logit (no probability clamping).
    With `weights`, each utterance's sum is multiplied by its weight before the division.
    acc: an utterance is right when its target keyword fires (max posterior >= 0.5) and no other keyword
    does (all < 0.5; for fillers: no keyword fires).
    """
    zmax, is_target = pooled_logits(logits, lengths, targets, min_duration, window_end)
    batch = max(zmax.size(0), 1)
    per_term = torch.where(is_target, F.softplus(-zmax), F.softplus(zmax))
    if weights is not None:
        per_term = per_term * torch.as_tensor(weights, device=zmax.device, dtype=zmax.dtype).reshape(-1, 1)
    loss = per_term.sum() / batch
    with torch.no_grad():
        fired = zmax >= 0
        correct = (fired == is_target).all(dim=1)
        acc = correct.float().mean() if correct.numel() else zmax.new_zeros(())
    return loss, acc


def cross_entropy_loss(logits, lengths, targets, min_duration=0, window_end=None, weights=None):
    """Utterance-level softmax cross entropy over K + 1 classes with an implicit filler class.

    The model keeps its K per-frame keyword logits (same model as for max pooling). Each keyword's
    logits are max-pooled over time exactly as in `max_pooling_loss` (target window from min_duration
    on), and a constant logit 0 is appended for the filler class, which sits at index K; the target
    class is the keyword id, or K for fillers (-1). Averaged over the batch. With one keyword this is
    the same as the max-pooling loss's binary decision, since softmax([z, 0])[0] = sigmoid(z). With
    `weights`, each utterance's term is multiplied by its weight (the mean still divides by B).
    acc: fraction of utterances whose argmax class equals the target class.
    """
    zmax, _ = pooled_logits(logits, lengths, targets, min_duration, window_end)
    _, targets = _check(logits, lengths, targets)
    num_keywords = zmax.size(1)
    scores = torch.cat((zmax, zmax.new_zeros(zmax.size(0), 1)), dim=1)  # [B, K + 1]
    classes = torch.where(targets < 0, torch.full_like(targets, num_keywords), targets)
    if scores.size(0) == 0:
        return scores.sum(), scores.new_zeros(())
    per_utterance = F.cross_entropy(scores, classes, reduction="none")
    if weights is not None:
        per_utterance = per_utterance * torch.as_tensor(weights, device=scores.device, dtype=scores.dtype)
    loss = per_utterance.mean()
    with torch.no_grad():
        acc = (scores.argmax(dim=1) == classes).float().mean()
    return loss, acc


def prefix_negative_loss(logits, targets, prefix_end):
    """The target keyword as a negative on the utterance's own prefixes (training_config.prefix_negatives).

    A positive "你好问问" holds "你好问", a negative of its own: frames [0, prefix_end[b]) of each positive
    (targets >= 0) are where only part of its keyword has been heard, so its keyword must not fire there.
    Per such row, softplus(max_t z_t) over those frames (-log(1 - max_t p_t), as for a filler in
    `max_pooling_loss`), summed and divided by the batch size; rows with prefix_end <= 0 and fillers add
    nothing. logits [B, T, K], targets [B], prefix_end [B] (frames; clamped to T). Returns a scalar tensor.
    """
    batch, frames, _ = logits.shape
    targets = torch.as_tensor(targets, device=logits.device).reshape(-1).long()
    prefix_end = torch.as_tensor(prefix_end, device=logits.device).reshape(-1).long().clamp(max=frames)
    counted = (targets >= 0) & (prefix_end > 0)  # [B]; a mask, not a row selection: that would sync a GPU
    dtype = torch.promote_types(logits.dtype, torch.float32)
    target_logits = logits.gather(2, targets.clamp(min=0).view(-1, 1, 1).expand(-1, frames, 1)).squeeze(2)
    outside = torch.arange(frames, device=logits.device).unsqueeze(0) >= prefix_end.unsqueeze(1)
    outside = outside | ~counted.unsqueeze(1)
    zmax = target_logits.to(dtype).masked_fill(outside, float("-inf")).amax(dim=1)  # -inf: softplus 0
    return F.softplus(zmax).sum() / max(batch, 1)


CRITERIA = {"max_pooling": max_pooling_loss, "ce": cross_entropy_loss, "cross_entropy": cross_entropy_loss}


def criterion(name):
    """The loss function for `training_config.criterion` (max_pooling | ce | cross_entropy)."""
    try:
        return CRITERIA[name]
    except (KeyError, TypeError):
        raise KwsError(f"training_config.criterion: unknown criterion {name!r} ({' | '.join(CRITERIA)})") from None
