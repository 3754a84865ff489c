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

import collections
import logging
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from kws.device import to_device
from kws.errors import KwsError

log = logging.getLogger("kws.phones")

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


class PhoneOutputs(nn.Module):
    """A KWSModel and its averaged phoneme head at inference: forward(feats, cache) ->
    (cat(keyword posteriors [B, T, K], phoneme probabilities relative to the frame's best [B, T, V + 1]),
    new cache). The relative probabilities exp(logit - max logit) lie in (0, 1] (the log-softmax's
    normaliser cancels), so an export checks them to the same absolute tolerance as the posteriors."""

    def __init__(self, model, phone_head):
        super().__init__()
        self.model = model
        self.phone_head = phone_head

    def forward(self, feats, cache: Optional[torch.Tensor] = None):
        hidden, new_cache = self.model.hidden(feats, cache)
        phone = self.phone_head(hidden)
        relative = torch.exp(phone - phone.max(dim=-1, keepdim=True).values)
        return torch.cat([torch.sigmoid(self.model.classifier(hidden)), relative], dim=-1), new_cache


class PhoneCheck:
    """The phoneme head as a second-stage check of each keyword (score.phone_check): the checked score of
    keyword k at frame t is p_k(t) * exp(alpha * s_k(t) / |P_k|), where s_k(t) is the best path over the CTC
    topology of k's phonemes P_k that ends at t (on the last phoneme or the blank after it), started at any
    frame, each frame counting log y_t(label) - max_c log y_t(c): 0 when the head agrees, less when the
    keyword's phonemes were not said (a near-miss, or speech the keyword head scores high for its timbre).

    Causal and exact in chunks: `apply(outputs, state)` reads frames in order and carries the Viterbi's state
    (one float per CTC state of every keyword), so the streaming detector and offline scoring compute the same
    numbers. `outputs` [T, K + V + 1] is what PhoneOutputs computes. Keywords without phonemes pass unchanged.
    """

    FLOOR = 1e-30  # relative probabilities below it count as this (log: -69)

    def __init__(self, labels, alpha):
        """labels: per keyword (index order) its phoneme class ids (1-based, as phone_targets numbers them),
        or None/[] to leave it unchecked; alpha >= 0 (0: the keyword head alone)."""
        self.num_keywords, self.alpha = len(labels), float(alpha)
        states, from_prev, skip, start, self.checked, self.lengths, self.last = [], [], [], [], [], [], []
        for k, label in enumerate(labels):
            if not label:
                continue
            base = len(states)
            for i, state in enumerate([BLANK] + [x for label_id in label for x in (int(label_id), BLANK)]):
                states.append(state)
                from_prev.append(i > 0)
                skip.append(i >= 2 and state != BLANK and state != states[base + i - 2])  # blank between distinct
                start.append(i < 2)  # a path may start on the first blank or the first phoneme, at any frame
            self.checked.append(k)
            self.lengths.append(len(label))
            self.last.append(len(states) - 1)
        self.states, self.from_prev = np.array(states, dtype=np.int64), np.array(from_prev, dtype=bool)
        self.skip, self.start = np.array(skip, dtype=bool), np.array(start, dtype=bool)
        self.last, self.lengths = np.array(self.last, dtype=np.int64), np.array(self.lengths, dtype=np.float64)

    def init_state(self):
        """The Viterbi state before the first frame: no path yet."""
        return np.full(len(self.states), -np.inf)

    def path_scores(self, relative_log, state):
        """(s [T, checked keywords] of frames `relative_log` [T, V + 1] = log y - max log y, new state)."""
        emit = np.asarray(relative_log, dtype=np.float64)[:, self.states]
        scores = np.empty((emit.shape[0], len(self.last)))
        delta = state
        for t in range(emit.shape[0]):
            best = delta.copy()
            best[1:] = np.where(self.from_prev[1:], np.maximum(best[1:], delta[:-1]), best[1:])
            best[2:] = np.where(self.skip[2:], np.maximum(best[2:], delta[:-2]), best[2:])
            best = np.where(self.start, np.maximum(best, 0.0), best)
            delta = best + emit[t]
            scores[t] = np.maximum(delta[self.last], delta[self.last - 1])
        return scores, delta

    def apply(self, outputs, state):
        """(checked posteriors [T, K] float64 of outputs [T, K + V + 1], new state)."""
        outputs = np.asarray(outputs, dtype=np.float64)
        if not len(self.last) or self.alpha == 0.0:
            return outputs[:, : self.num_keywords].copy(), state
        scores, state = self.keyword_scores(outputs, state)
        return self.weigh(outputs, scores, self.alpha), state

    def keyword_scores(self, outputs, state):
        """(path scores s [T, checked keywords] of outputs [T, K + V + 1] float64, new state): the part of
        the check that does not depend on alpha."""
        relative_log = np.log(np.maximum(outputs[:, self.num_keywords :], self.FLOOR))
        return self.path_scores(relative_log, state)

    def weigh(self, outputs, scores, alpha):
        """The posteriors [T, K] of outputs [T, K + V + 1] float64 checked at `alpha` by path scores s."""
        checked = outputs[:, : self.num_keywords].copy()
        if len(self.last) and alpha != 0.0:
            checked[:, self.checked] *= np.exp(alpha * scores / self.lengths)
        return checked


def keyword_path_scores(log_probs, labels):
    """[T] scores s(t) of one keyword's CTC path (PhoneCheck's, unnormalised) over phoneme log-probabilities
    `log_probs` [T, classes] of a whole utterance."""
    relative = log_probs - log_probs.max(axis=1, keepdims=True)
    check = PhoneCheck([labels], 1.0)
    return check.path_scores(relative, check.init_state())[0][:, 0]


def phone_check_alpha(value):
    """--phone-check's value: a number (alpha), or a phone_check.json that choose_phone_check.py wrote (its
    `alpha`, chosen on a dev split)."""
    import argparse
    import json

    try:
        return float(value)
    except ValueError:
        pass
    try:
        with open(value, encoding="utf-8") as handle:
            alpha = json.load(handle)["alpha"]
    except FileNotFoundError:
        raise argparse.ArgumentTypeError(f"{value}: neither a number nor a phone_check.json file") from None
    except (ValueError, KeyError, TypeError) as err:
        raise argparse.ArgumentTypeError(f"{value}: not a phone_check.json with an `alpha` ({err})") from None
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha >= 0:
        raise argparse.ArgumentTypeError(f"{value}: `alpha` must be a number >= 0, got {alpha!r}")
    return float(alpha)


def add_phone_check_argument(parser):
    """--phone-check ALPHA, as score.py and export_model.py take it (config score.phone_check)."""
    parser.add_argument(
        "--phone-check",
        type=phone_check_alpha,
        default=0.0,
        metavar="ALPHA",
        help="weight of the phoneme head's check of each keyword (checkpoints trained with training_config."
        "phone_ctc): scores become p * exp(ALPHA * path score per phoneme); 0 (default): p alone; or the "
        "phone_check.json of choose_phone_check.py, the alpha chosen on a dev split",
    )


def inference_network(model, payload, alpha, where):
    """(network, PhoneCheck or None, meta or None) of a checkpoint's model for scoring and export.

    alpha 0, or a checkpoint without a phoneme head (trained without training_config.phone_ctc, or on a
    corpus without phonemes): StreamingWrapper(model), the keyword posteriors alone. Else PhoneOutputs with the
    checkpoint's (averaged) head, the PhoneCheck of its keywords' phonemes and the check's description, which
    the exports store in their metadata so that the detector runs the same check."""
    from kws.model import StreamingWrapper

    alpha = float(alpha or 0.0)
    if not alpha >= 0.0:
        raise KwsError(f"score.phone_check must be a number >= 0 (the check's weight alpha), got {alpha!r}")
    if alpha == 0.0:
        return StreamingWrapper(model).eval(), None, None
    if payload.get("phone_head") is None or not payload.get("keyword_phones"):
        log.warning("%s: no phoneme head (trained without training_config.phone_ctc): scoring without the check", where)
        return StreamingWrapper(model).eval(), None, None
    classes = {p: i + 1 for i, p in enumerate(payload["phones"])}
    spoken = payload["keyword_phones"]
    if len(spoken) != model.num_keywords:
        raise KwsError(f"{where}: keyword_phones has {len(spoken)} entries for {model.num_keywords} keywords")
    labels = [[classes[p] for p in phones] if phones else None for phones in spoken]
    head = PhoneCTCModel(model, len(classes)).phone_head  # the head as training built it
    head.load_state_dict(payload["phone_head"])
    network = PhoneOutputs(model, head.to(next(model.parameters()).device)).eval()
    meta = {"alpha": alpha, "keyword_phones": spoken, "labels": labels, "classes": len(classes) + 1}
    return network, PhoneCheck(labels, alpha), meta
