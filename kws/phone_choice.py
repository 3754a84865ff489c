"""The phoneme check's weight and window chosen per trained model on its dev split (config score.phone_check
or score.phone_check_window as a list).

One alpha does not suit every model: a model whose phoneme head reads its keyword's phonemes badly has
every positive held down by the check (English seeds that miss 99-100 % of their keywords with alpha 0.25
and 26-60 % without it, bench/results.md), while for most models the check is what keeps unheard voices'
speech quiet. So each averaged model is scored once on the dev split, the check is applied at each
candidate alpha and window (its path scores depend on neither: one Viterbi pass serves all), and the pair
with the lowest mean FRR over keywords at the export's FA/h target wins, FA/h counted over the negatives the
export counts (`ordinary`: without the dev split's near-misses and partial keywords; `all`). On a dev
split of a few minutes of negatives the target is met only with zero false alarms, so the criterion reads
"misses at the lowest threshold no dev negative reaches". Ties go to the larger alpha: where dev cannot
tell them apart, the check has measured better on speech of unheard methods (bench/results.md); then to
the smaller window, the stricter check.

The window is per model for the same reason as alpha: where the keyword head peaks on a phrase's first
syllables, before its last phoneme is heard, a frame-by-frame check holds every keyword down and dev
falls back to alpha 0, while models whose two heads agree in time lose a little to a wide window
(bench/results.md, "A window for the phoneme check").

The choice is written as phone_check.json beside the model (`alpha`, `window`, and every candidate's FRR
per keyword); score.py and export_model.py take the file as `--phone-check`.
"""

import json
import logging

import numpy as np
import torch

from kws.datalist import CONFUSABLE_KINDS, read_data_list
from kws.det import count_false_alarms_many, det_curve, negative_kind, operating_point, thresholds_for
from kws.errors import KwsError
from kws.keywords import keyword_slug
from kws.phone_check import check_window, inference_network
from kws.score import DEFAULT_MAX_BATCH_FRAMES, load_scoring_model, network_outputs, resolve_device

log = logging.getLogger("kws.phone_choice")

NEGATIVES = ("ordinary", "all")


def check_candidates(candidates):
    """The candidate alphas as sorted unique floats; an empty list or a negative alpha is an error."""
    values = sorted({float(x) for x in candidates})
    if not values or values[0] < 0:
        raise KwsError(f"score.phone_check: candidates must be numbers >= 0, at least one, got {list(candidates)}")
    return values


def window_candidates(windows):
    """The candidate windows as sorted unique ints >= 1; an empty list is an error."""
    if not len(windows):
        raise KwsError("score.phone_check_window: at least one window, got none")
    return sorted({check_window(w) for w in windows})


def frr_at_target(checked, items, num_keywords, negatives, fa_target, window_shift, thresholds):
    """{keyword index: FRR at `fa_target`} of checked scores [T, K] per item; FA/h over the negatives the
    `negatives` view counts (ordinary: confusable kinds left out when the split has any)."""
    frr = {}
    for index in range(num_keywords):
        positives = [scores[:, index] for scores, item in zip(checked, items) if item["label"] == index]
        counted = [
            (scores[:, index], item)
            for scores, item in zip(checked, items)
            if item["label"] != index and (negatives == "all" or negative_kind(item, index) not in CONFUSABLE_KINDS)
        ]
        if not positives or not counted:
            raise KwsError(f"dev split: keyword {index} needs positives and negatives to choose the phoneme check")
        seconds = float(sum(item["duration"] for _, item in counted))
        alarms = count_false_alarms_many([scores for scores, _ in counted], thresholds, window_shift)
        curve = det_curve(positives, None, seconds, thresholds, window_shift, false_alarms=alarms)
        point = operating_point(curve, fa_target)
        frr[index] = 1.0 if point is None else point["frr"]
    return frr


def best_check(dev_frr):
    """The (alpha, window) of {(alpha, window): {"mean": FRR, ...}} with the lowest mean FRR; of tied ones,
    the largest alpha, then the smallest window."""
    return max(dev_frr, key=lambda pair: (-round(dev_frr[pair]["mean"], 9), pair[0], -pair[1]))


def choose_phone_check(
    checkpoint,
    dev_data,
    dict_path,
    out,
    candidates,
    windows=(1,),
    negatives="ordinary",
    fa_target=1.0,
    window_shift=50,
    step=0.01,
    batch_size=64,
    device="cpu",
    threads=None,
    max_batch_frames=DEFAULT_MAX_BATCH_FRAMES,
):
    """Choose the check's alpha and window for `checkpoint` among `candidates` x `windows` on `dev_data`;
    write `out` (JSON, atomically) and return its content. A checkpoint without a phoneme head gets alpha 0."""
    from kws.fileio import atomic_open

    if negatives not in NEGATIVES:
        raise KwsError(f"negatives must be one of {', '.join(NEGATIVES)}, got {negatives!r}")
    if not fa_target > 0:
        raise KwsError(f"FA/h target must be a positive number, got {fa_target}")
    candidates, windows = check_candidates(candidates), window_candidates(windows)
    if threads:
        torch.set_num_threads(int(threads))
    device = resolve_device(device)
    model, payload, tokens, dictionary, fbank_conf = load_scoring_model(checkpoint, dict_path, device)
    choice = {
        "checkpoint": str(checkpoint),
        "dev_data": str(dev_data),
        "candidates": candidates,
        "windows": windows,
        "negatives": negatives,
        "fa_per_hour_target": float(fa_target),
        "criterion": "lowest mean FRR over keywords at the FA/h target; ties: the larger alpha, then the "
        "smaller window",
    }
    network, check, _ = inference_network(model, payload, max(candidates), checkpoint)
    if check is None:  # no phoneme head (or every candidate 0): nothing to weigh
        choice.update(
            {"alpha": 0.0, "window": 1, "reason": "no phoneme check to weigh" if max(candidates) else "only alpha 0"}
        )
    else:
        items = read_data_list(dev_data, dictionary=dictionary)
        outputs, path_scores = [], []
        for _, probs in network_outputs(
            network, items, fbank_conf, payload["input_dim"], device, batch_size, max_batch_frames, checkpoint
        ):
            probs = np.asarray(probs, dtype=np.float64)
            path_scores.append(check.keyword_scores(probs, check.init_state()[0])[0])
            outputs.append(probs[:, : len(tokens)])  # the keyword posteriors are all `weigh` reads
        thresholds = thresholds_for(step)
        # alpha 0 is the keyword head alone, the same at any window: tried once, as window 1
        pairs = sorted({(a, w if a else 1) for a in candidates for w in windows}, key=lambda pair: pair[::-1])
        table = {}
        for alpha, window in pairs:
            checked = [check.weigh(probs, scores, alpha, window)[0] for probs, scores in zip(outputs, path_scores)]
            frr = frr_at_target(checked, items, len(tokens), negatives, fa_target, window_shift, thresholds)
            table[alpha, window] = {keyword_slug(tokens[k]): value for k, value in frr.items()}
            table[alpha, window]["mean"] = float(np.mean(list(frr.values())))
            log.info("alpha %g, window %d: dev FRR %s", alpha, window, table[alpha, window])
        alpha, window = best_check(table)
        dev_frr = {f"alpha {a:g}" + (f", window {w}" if a else ""): row for (a, w), row in table.items()}
        choice.update({"alpha": alpha, "window": window, "dev_frr": dev_frr})
    with atomic_open(out) as handle:
        json.dump(choice, handle, indent=2)
        handle.write("\n")
    return choice


__all__ = ["choose_phone_check", "check_candidates", "window_candidates", "frr_at_target", "best_check"]
