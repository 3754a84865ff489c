"""Utterance-level losses on per-frame keyword logits, vectorised over batch and keywords.

Every loss has the signature `(logits [B, T, K], lengths [B], targets [B], min_duration=0) -> (loss, acc)`:
`targets` are keyword ids (-1 = filler), `lengths` the valid frames per utterance (clamped to [1, T]),
`min_duration` (frames) the earliest frame at which the target keyword may count. `loss` is a scalar
tensor, `acc` a Python float (fraction of utterances decided correctly).
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
    if batch and (targets.min() < -1 or targets.max() >= num_keywords):
        raise KwsError(f"keyword id out of range: targets must be -1 (filler) or 0..{num_keywords - 1}, "
                       f"got {sorted(set(targets.tolist()))}")
    return lengths.clamp(1, max(frames, 1)), targets


def pooled_logits(logits, lengths, targets, min_duration=0):
    """Per-utterance, per-keyword max logit [B, K] over the frames that count for it, and the target mask.

    For the target keyword of an utterance: frames [min_duration, length), or all valid frames when
    length <= min_duration (WeKws). For other keywords and fillers: all valid frames [0, length).
    max_t sigmoid(z_t) = sigmoid(max_t z_t), so pooling the logits pools the posteriors.
    Returns (zmax [B, K] in at least float32, is_target [B, K] bool).
    """
    lengths, targets = _check(logits, lengths, targets)
    batch, frames, num_keywords = logits.shape
    t = torch.arange(frames, device=logits.device).unsqueeze(0)                # [1, T]
    valid = t < lengths.unsqueeze(1)                                            # [B, T]
    start = torch.where(lengths > min_duration, torch.full_like(lengths, int(min_duration)),
                        torch.zeros_like(lengths))
    window = valid & (t >= start.unsqueeze(1))                                  # [B, T]
    keyword_ids = torch.arange(num_keywords, device=logits.device)
    is_target = targets.unsqueeze(1) == keyword_ids.unsqueeze(0)                # [B, K]
    mask = torch.where(is_target.unsqueeze(1), window.unsqueeze(2), valid.unsqueeze(2))  # [B, T, K]
    dtype = torch.promote_types(logits.dtype, torch.float32)   # half/bfloat16 -> float32; float64 stays
    masked = logits.to(dtype).masked_fill(~mask, float("-inf"))
    return masked.amax(dim=1), is_target


def max_pooling_loss(logits, lengths, targets, min_duration=0):
    """WeKws max-pooling loss, vectorised and numerically stable.

    Per utterance, summed over keywords k: -log(max_t p_tk) for the target keyword (frames from
    min_duration on, see `pooled_logits`) and -log(1 - max_t p_tk) = -log(min_t (1 - p_tk)) for every
    other keyword (all for fillers) over the valid frames; the sum is divided by the batch size.
    Computed as softplus(-zmax) / softplus(zmax) on the pooled logit (no probability clamping).
    acc: an utterance is right when its target keyword fires (max posterior >= 0.5) and no other keyword
    does (all < 0.5; for fillers: no keyword fires).
    """
    zmax, is_target = pooled_logits(logits, lengths, targets, min_duration)
    batch = max(zmax.size(0), 1)
    per_term = torch.where(is_target, F.softplus(-zmax), F.softplus(zmax))
    loss = per_term.sum() / batch
    with torch.no_grad():
        fired = zmax >= 0
        correct = (fired == is_target).all(dim=1)
        acc = correct.float().mean().item() if correct.numel() else 0.0
    return loss, acc


def cross_entropy_loss(logits, lengths, targets, min_duration=0):
    """Utterance-level softmax cross entropy over K + 1 classes with an implicit filler class.

    The model keeps its K per-frame keyword logits (same model as for max pooling). Each keyword's
    logits are max-pooled over time exactly as in `max_pooling_loss` (target window from min_duration
    on), and a constant logit 0 is appended for the filler class, which sits at index K; the target
    class is the keyword id, or K for fillers (-1). Averaged over the batch. With one keyword this is
    the same as the max-pooling loss's binary decision, since softmax([z, 0])[0] = sigmoid(z).
    acc: fraction of utterances whose argmax class equals the target class.
    """
    zmax, _ = pooled_logits(logits, lengths, targets, min_duration)
    _, targets = _check(logits, lengths, targets)
    num_keywords = zmax.size(1)
    scores = torch.cat((zmax, zmax.new_zeros(zmax.size(0), 1)), dim=1)        # [B, K + 1]
    classes = torch.where(targets < 0, torch.full_like(targets, num_keywords), targets)
    if scores.size(0) == 0:
        return scores.sum(), 0.0
    loss = F.cross_entropy(scores, classes)
    with torch.no_grad():
        acc = (scores.argmax(dim=1) == classes).float().mean().item()
    return loss, acc


CRITERIA = {"max_pooling": max_pooling_loss, "ce": cross_entropy_loss, "cross_entropy": cross_entropy_loss}


def criterion(name):
    """The loss function for `training_config.criterion` (max_pooling | ce | cross_entropy)."""
    try:
        return CRITERIA[name]
    except (KeyError, TypeError):
        raise KwsError(f"training_config.criterion: unknown criterion {name!r} "
                       f"({' | '.join(CRITERIA)})") from None
