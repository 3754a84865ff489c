"""The phoneme head at inference: a second-stage check of each keyword's score (config score.phone_check,
score.phone_check_window), run alike by scoring, the exports and the streaming detector.

The head is trained beside the keyword loss (kws.phones, training_config.phone_ctc); this module only
reads it, so a change to the check rescores and re-exports without retraining.
"""

import collections
import logging
from typing import Optional

import numpy as np
import torch
from torch import nn

from kws.errors import KwsError
from kws.phones import BLANK, PhoneCTCModel

log = logging.getLogger("kws.phone_check")


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


def trailing_max(values, window, history=None):
    """(m [T, C], new history): m[t] = the max of values [T, C] over frames t - window + 1 .. t, the frames
    before the first read from `history` (the last window - 1 rows of the frames before; None: no frames,
    -inf). Chunk by chunk with the history carried == the whole at once."""
    values = np.asarray(values, dtype=np.float64)
    if history is None:
        history = np.full((window - 1, values.shape[1]), -np.inf)
    joined = np.concatenate([history, values])
    if window == 1 or not len(values):
        return values.copy(), joined[len(joined) - (window - 1) :]
    maxed = np.lib.stride_tricks.sliding_window_view(joined, window, axis=0).max(axis=-1)
    return maxed, joined[len(joined) - (window - 1) :]


class PhoneCheck:
    """The phoneme head as a second-stage check of each keyword (score.phone_check): the checked score of
    keyword k at frame t is max p_k * exp(alpha * max s_k / |P_k|), both maxima over the last `window`
    frames (t - window + 1 .. t), where p_k is the keyword head's posterior and s_k(t) the best path over the
    CTC topology of k's phonemes P_k that ends at t (on the last phoneme or the blank after it), started at
    any frame, each frame counting log y_t(label) - max_c log y_t(c): 0 when the head agrees, less when the
    keyword's phonemes were not said (a near-miss, or speech the keyword head scores high for its timbre).

    The window lets the two heads agree a little apart: a keyword head that fires on the phrase's first
    syllables peaks before its last phoneme is heard, when no path through all of them exists yet, so a
    frame-by-frame product (window 1) holds every keyword down (English seeds: the keyword head's peak a
    median 23-60 frames before the path's end, bench/results.md). Window 1 is the frame-by-frame check.

    Causal and exact in chunks: `apply(outputs, state)` reads frames in order and carries the Viterbi's state
    (one float per CTC state of every keyword) and the last window - 1 frames of p and s, so the streaming
    detector and offline scoring compute the same numbers. `outputs` [T, K + V + 1] is what PhoneOutputs
    computes. Keywords without phonemes pass unchanged.
    """

    FLOOR = 1e-30  # relative probabilities below it count as this (log: -69)

    def __init__(self, labels, alpha, window=1):
        """labels: per keyword (index order) its phoneme class ids (1-based, as phone_targets numbers them),
        or None/[] to leave it unchecked; alpha >= 0 (0: the keyword head alone); window: frames >= 1."""
        self.num_keywords, self.alpha, self.window = len(labels), float(alpha), check_window(window)
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
        self.states = np.array(states, dtype=np.int64)
        # the transitions as what path_scores adds to each predecessor: 0 where allowed, -inf where not
        self.prev_penalty = np.where(np.array(from_prev[1:], dtype=bool), 0.0, -np.inf)
        self.skip_penalty = np.where(np.array(skip[2:], dtype=bool), 0.0, -np.inf)
        self.start_floor = np.where(np.array(start, dtype=bool), 0.0, -np.inf)
        self.last, self.lengths = np.array(self.last, dtype=np.int64), np.array(self.lengths, dtype=np.float64)

    def init_state(self):
        """The state before the first frame: no path yet, no frames in the window."""
        return np.full(len(self.states), -np.inf), None

    def path_scores(self, relative_log, delta):
        """(s [T, checked keywords] of frames `relative_log` [T, V + 1] = log y - max log y, new Viterbi
        state) from the Viterbi state `delta` (init_state()[0] before the first frame).

        A frame's step is max(stay, come from the state before, skip the blank before, start here) plus the
        frame's emission, for every keyword's states at once. A transition a state lacks adds -inf to that
        predecessor, so the step is six whole-array operations into arrays allocated once: this frame loop
        is where scoring and the deployed check spend their time, and max is exact, so the scores are the
        same bits as a masked step's (bench/results.md, "The phoneme check's frame loop")."""
        emit = np.asarray(relative_log, dtype=np.float64)[:, self.states]
        frames, count, size = emit.shape[0], len(self.last), len(self.states)
        delta = np.array(delta, dtype=np.float64)
        best, from_prev, skip = np.empty(size), np.empty(max(size - 1, 0)), np.empty(max(size - 2, 0))
        ends = np.empty((frames, 2 * count))  # per frame: each keyword's last phoneme, then the blank after it
        last_two = np.concatenate([self.last - 1, self.last])
        add, maximum = np.add, np.maximum
        for t in range(frames):
            add(delta[:-1], self.prev_penalty, out=from_prev)
            add(delta[:-2], self.skip_penalty, out=skip)
            maximum(delta, self.start_floor, out=best)
            maximum(best[1:], from_prev, out=best[1:])
            maximum(best[2:], skip, out=best[2:])
            add(best, emit[t], out=delta)
            ends[t] = delta[last_two]
        return maximum(ends[:, :count], ends[:, count:]), delta

    def apply(self, outputs, state):
        """(checked posteriors [T, K] float64 of outputs [T, K + V + 1], new state)."""
        outputs = np.asarray(outputs, dtype=np.float64)
        if not len(self.last) or self.alpha == 0.0:
            return outputs[:, : self.num_keywords].copy(), state
        delta, history = state
        scores, delta = self.keyword_scores(outputs, delta)
        checked, history = self.weigh(outputs, scores, self.alpha, self.window, history)
        return checked, (delta, history)

    def keyword_scores(self, outputs, delta):
        """(path scores s [T, checked keywords] of outputs [T, K + V + 1] float64, new Viterbi state): the
        part of the check that depends neither on alpha nor on the window."""
        relative_log = np.log(np.maximum(outputs[:, self.num_keywords :], self.FLOOR))
        return self.path_scores(relative_log, delta)

    def weigh(self, outputs, scores, alpha, window, history=None):
        """(the posteriors [T, K] of outputs [T, K + V + 1] float64 checked at `alpha` by path scores s
        over `window` frames, new history), the frames before from `history` (None: none)."""
        checked = outputs[:, : self.num_keywords].copy()
        if not len(self.last) or alpha == 0.0:
            return checked, history
        both, history = trailing_max(np.concatenate([checked[:, self.checked], scores], axis=1), window, history)
        count = len(self.checked)
        checked[:, self.checked] = both[:, :count] * np.exp(alpha * both[:, count:] / self.lengths)
        return checked, history


def check_window(window):
    """The check's window as an int >= 1; anything else is an error naming score.phone_check_window."""
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
        raise KwsError(f"score.phone_check_window: frames must be whole numbers >= 1, got {window!r}")
    return int(window)


def keyword_path_scores(log_probs, labels):
    """[T] scores s(t) of one keyword's CTC path (PhoneCheck's, unnormalised) over phoneme log-probabilities
    `log_probs` [T, classes] of a whole utterance."""
    relative = log_probs - log_probs.max(axis=1, keepdims=True)
    check = PhoneCheck([labels], 1.0)
    return check.path_scores(relative, check.init_state()[0])[0][:, 0]


class ChosenCheck(collections.namedtuple("ChosenCheck", "path alpha window")):
    """A phone_check.json as --phone-check read it: its alpha and window (1 in files written before windows)."""


def phone_check_alpha(value):
    """--phone-check's value: a number (alpha), or a phone_check.json that choose_phone_check.py wrote
    (ChosenCheck: its `alpha` and `window`, chosen on a dev split)."""
    import argparse
    import json

    try:
        return float(value)
    except ValueError:
        pass
    try:
        with open(value, encoding="utf-8") as handle:
            chosen = json.load(handle)
        alpha, window = chosen["alpha"], chosen.get("window", 1)
    except FileNotFoundError:
        raise argparse.ArgumentTypeError(f"{value}: neither a number nor a phone_check.json file") from None
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise argparse.ArgumentTypeError(f"{value}: not a phone_check.json with an `alpha` ({err})") from None
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha >= 0:
        raise argparse.ArgumentTypeError(f"{value}: `alpha` must be a number >= 0, got {alpha!r}")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise argparse.ArgumentTypeError(f"{value}: `window` must be a whole number >= 1, got {window!r}")
    return ChosenCheck(value, float(alpha), window)


def add_phone_check_argument(parser):
    """--phone-check ALPHA and --phone-check-window FRAMES, as score.py and export_model.py take them (config
    score.phone_check, score.phone_check_window); phone_check_setting(args) reads them."""
    parser.add_argument(
        "--phone-check",
        type=phone_check_alpha,
        default=0.0,
        metavar="ALPHA",
        help="weight of the phoneme head's check of each keyword (checkpoints trained with training_config."
        "phone_ctc): scores become max p * exp(ALPHA * max path score per phoneme), both maxima over the last "
        "--phone-check-window frames; 0 (default): p alone; or the phone_check.json of choose_phone_check.py, "
        "the alpha and window chosen on a dev split",
    )
    parser.add_argument(
        "--phone-check-window",
        type=int,
        default=None,
        metavar="FRAMES",
        help="frames over which the two heads may agree apart (default 1: frame by frame); with a "
        "phone_check.json, the file's",
    )


def phone_check_setting(args):
    """(alpha, window) of parsed --phone-check / --phone-check-window; a window given beside a
    phone_check.json (which has its own) is an error."""
    value, window = args.phone_check, args.phone_check_window
    if isinstance(value, ChosenCheck):
        if window is not None:
            raise KwsError(f"--phone-check-window: {value.path} already gives the window ({value.window}); drop one")
        return value.alpha, value.window
    return value, check_window(1 if window is None else window)


def inference_network(model, payload, alpha, where, window=1):
    """(network, PhoneCheck or None, meta or None) of a checkpoint's model for scoring and export; `window`:
    the check's (PhoneCheck).

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
    check = PhoneCheck(labels, alpha, window)
    meta = {
        "alpha": alpha,
        "window": check.window,
        "keyword_phones": spoken,
        "labels": labels,
        "classes": len(classes) + 1,
    }
    return network, check, meta
