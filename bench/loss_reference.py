"""A straightforward per-utterance, per-keyword max-pooling loss (WeKws style), the benchmark's reference.

Same definition as kws.loss.max_pooling_loss: for the target keyword -log(max_t p_t) over the frames from
min_duration on (all valid frames when the utterance is not longer than min_duration), for every other
keyword (all of them for fillers) -log(min_t (1 - p_t)) over the valid frames; summed, divided by the
batch size. Posteriors are clamped to [1e-8, 1] as WeKws does.
"""

import torch


def max_pooling_loss_loop(logits, lengths, targets, min_duration=0):
    probs = torch.sigmoid(logits)
    batch, _, num_keywords = probs.shape
    loss = probs.new_zeros(())
    for i in range(batch):
        length = int(lengths[i])
        target = int(targets[i])
        for k in range(num_keywords):
            if k == target:
                start = min_duration if length > min_duration else 0
                p = probs[i, start:length, k].clamp(1e-8, 1.0)
                loss = loss - torch.log(p.max())
            else:
                p = (1 - probs[i, :length, k]).clamp(1e-8, 1.0)
                loss = loss - torch.log(p.min())
    return loss / batch
