"""Phoneme supervision beside the keyword loss (training_config.phone_ctc), for corpora that know what
each utterance says.

The keyword loss gives one bit per utterance: a max over its frames, for or against each keyword. A
near-miss that differs from the keyword in one early phoneme ("day kws" for "hey kws", 嗨小吴 for 嗨小问)
then teaches the model only that this whole utterance was wrong, and a small model settles for what the
two share (measured: English train loss stuck at 0.30 with 3.5x the parameters or twice the context). An
auxiliary CTC loss over the utterance's phonemes asks every frame of every utterance, fillers included,
what is being said; the shared backbone must then tell /h/ from /d/. Checkpoints keep the head apart from
the model (`phone_head`), so averaging, export and the detector see the same KWSModel as without it; at
inference it can check each keyword's score (kws.phone_check, a module of its own so that changing the
check rescores without retraining).

The synthetic corpus writes `utt2phones` (eSpeak NG's phonemes of each utterance's text, stress marks and
tone digits dropped) and make_list copies it into data.list as `phones` (space-separated); real corpora
have none and train as before.
"""

import collections

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


def phone_ctc_loss(phone_logits, lengths, keys, targets, skip=None):
    """Mean CTC loss (per target phoneme, as F.ctc_loss's `mean`) over the batch's utterances with targets
    and not in `skip` (host bools [B], or None); a zero that still reaches every parameter of the head (DDP
    expects a gradient for each) when none has."""
    skipped = [False] * len(keys) if skip is None else skip.tolist()
    rows = [b for b, key in enumerate(keys) if key in targets and not skipped[b]]
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


def keyword_phones(items, num_keywords):
    """Per keyword index, the phonemes of the most common `phones` of its training positives said alone (those
    with a keyword_end; a tie goes to the first seen, so the list's order decides), or None when it has none
    (the phoneme check then passes that keyword unchanged)."""
    result = []
    for index in range(num_keywords):
        counts = collections.Counter(
            item["phones"]
            for item in items
            if item.get("label") == index and item.get("keyword_end") is not None and item.get("phones")
        )
        result.append(counts.most_common(1)[0][0].split() if counts else None)
    return result
