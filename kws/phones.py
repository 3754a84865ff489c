"""Phoneme supervision beside the keyword loss (training_config.phone_ctc), for corpora that know what
each utterance says.

The keyword loss gives one bit per utterance: a max over its frames, for or against each keyword. A
near-miss that differs from the keyword in one early phoneme ("day kws" for "hey kws", 嗨小吴 for 嗨小问)
then teaches the model only that this whole utterance was wrong, and a small model settles for what the
two share (measured: English train loss stuck at 0.30 with 3.5x the parameters or twice the context). An
auxiliary CTC loss over the utterance's phonemes asks every frame of every utterance, fillers included,
what is being said; the shared backbone must then tell /h/ from /d/. The head is used in training only:
checkpoints keep it apart from the model (`phone_head`), so averaging, export and the detector see the
same KWSModel as without it.

The synthetic corpus writes `utt2phones` (eSpeak NG's phonemes of each utterance's text, stress marks and
tone digits dropped) and make_list copies it into data.list as `phones` (space-separated); real corpora
have none and train as before.
"""

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from kws.device import to_device

BLANK = 0


def phone_vocabulary(items):
    """The sorted phonemes of the items' `phones` (the CTC classes after the blank), [] when none has any."""
    return sorted({p for item in items for p in (item.get("phones") or "").split()})


def phone_targets(items, vocabulary, skip=()):
    """{key: LongTensor of class ids (1-based; 0 is the blank)} of the items with phones, but for the keys
    in `skip` (utterances trained on a window of their audio, whose phonemes are not all in it). Phonemes
    outside the vocabulary (a cv list's) are left out."""
    index = {p: i + 1 for i, p in enumerate(vocabulary)}
    targets = {}
    for item in items:
        if item["key"] in skip or not item.get("phones"):
            continue
        ids = [index[p] for p in item["phones"].split() if p in index]
        if ids:
            targets[item["key"]] = torch.tensor(ids, dtype=torch.long)
    return targets


class PhoneCTCModel(nn.Module):
    """A KWSModel and a per-frame phoneme classifier on its backbone's output, for training:
    forward(feats) -> (keyword logits [B, T, K], phoneme logits [B, T, V + 1])."""

    def __init__(self, model, num_phones):
        super().__init__()
        self.model = model
        hidden = model.classifier.linear.in_features
        self.phone_head = nn.Linear(hidden, num_phones + 1)

    def forward(self, feats):
        hidden, _ = self.model.hidden(feats)
        return self.model.classifier(hidden), self.phone_head(hidden)


def phone_ctc_loss(phone_logits, lengths, keys, targets):
    """Mean CTC loss (per target phoneme, as F.ctc_loss's `mean`) over the batch's utterances with targets;
    a zero that still reaches every parameter of the head (DDP expects a gradient for each) when none has."""
    rows = [b for b, key in enumerate(keys) if key in targets]
    if not rows:
        return phone_logits.float().sum() * 0.0
    labels = [targets[keys[b]] for b in rows]
    device = phone_logits.device
    selected = phone_logits if len(rows) == len(keys) else phone_logits.index_select(0, to_device(rows, device))
    log_probs = selected.float().log_softmax(dim=-1).transpose(0, 1)  # [T, R, V + 1]
    # F.ctc_loss reads the lengths on the host: lengths given there cost no host sync
    input_lengths = torch.as_tensor(lengths).reshape(-1).cpu()[rows].long()
    return F.ctc_loss(
        log_probs,
        to_device(torch.cat(labels), device),
        input_lengths,
        torch.tensor([len(label) for label in labels]),
        blank=BLANK,
        reduction="mean",
        zero_infinity=True,  # an utterance sped up below one frame per phoneme: no gradient, not inf
    )


def keyword_path_scores(log_probs, labels):
    """[T] scores of the best CTC path over `labels` (phoneme class ids, as phone_targets numbers them)
    that ends at each frame t (on the last label or the blank after it), started at any frame: a
    free-start Viterbi over the keyword's CTC topology. Each frame of a path counts
    log_probs[t, label] - max_c log_probs[t, c], so a path the head itself would take scores 0 and every
    other one less. Causal (frame t reads frames <= t only), O(2 len(labels) + 1) a frame: a streaming
    detector can run it. `log_probs`: [T, classes] numpy log-probabilities of the phoneme head.
    (bench/probe_phone_verify.py uses it as a second-stage check of each keyword firing.)"""
    relative = log_probs - log_probs.max(axis=1, keepdims=True)
    states = [BLANK]
    for label in labels:
        states += [int(label), BLANK]
    states = np.array(states)
    skip = np.zeros(len(states), dtype=bool)
    skip[2:] = (states[2:] != BLANK) & (states[2:] != states[:-2])  # blank between distinct labels may go
    emit = relative[:, states]
    delta = np.full(len(states), -np.inf)
    scores = np.empty(log_probs.shape[0])
    for t in range(log_probs.shape[0]):
        best = delta.copy()
        best[1:] = np.maximum(best[1:], delta[:-1])
        best[2:] = np.where(skip[2:], np.maximum(best[2:], delta[:-2]), best[2:])
        best[:2] = np.maximum(best[:2], 0.0)  # a path may start at this frame
        delta = best + emit[t]
        scores[t] = max(delta[-1], delta[-2])
    return scores
