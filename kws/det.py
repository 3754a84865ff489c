"""Detection-error-tradeoff statistics and metrics, with WeKws `compute_det.py` semantics.

For one keyword and each threshold t in 0.00, 0.01, ..., 0.99 (step 0.01 by default):

* positives are the utterances labelled with that keyword (data.list `txt`: its token, or its id in
  WeKws's older lists); one is falsely rejected when its maximum frame posterior is < t.
  FRR = false rejects / positives.
* every other utterance (fillers *and* other keywords) is filler; its `duration` (data.list,
  seconds) counts toward the filler hours. False alarms: scan its frames; a frame >= t counts one
  false alarm and the scan continues `window_shift` frames later (WeKws `i += window_shift`).
  FA/h = max(n_FA, 1e-6) / filler hours.

Stats files hold `threshold fa_per_hour frr` per line (6 decimals), exactly as WeKws writes them.
metrics.json: run settings plus `keywords`, a mapping keyword name (`hi_xiaowen`) -> summary
(token, positives, filler hours, operating points per FA/h target, the point at threshold 0.5). Each
point has the counts behind it (misses, false alarms), 95 % intervals (kws.intervals), whether the
filler hours resolve its target, and its false alarms by kind of negative (data.list `kind`: partial,
near_miss, speech, ...; another keyword's positives are `other_keyword`); each keyword lists its
worst misses and top false alarms. Its tables and reader: kws.tables.

Counting is vectorised and exact: for each threshold the greedy hold-off scan is a chain of
"next frame at or after p that is >= t" look-ups; those look-ups are precomputed for all
thresholds at once (a reversed running minimum), and the chains of all thresholds advance
together, so the Python loop runs over false alarms of the lowest threshold (<= T / window_shift
steps per utterance), never over thresholds x frames. The greedy earliest-first scan finds the
largest set of threshold-crossing frames that are at least `window_shift` apart, so the false
alarm count never increases with the threshold.

Operating points (`operating_point`): for a target FA/h, among the thresholds whose FA/h <= target,
take the lowest FRR, then the lowest FA/h; when several thresholds tie on both (common: a flat
stretch with zero false alarms and no rejections) the middle of that tied run is the operating
threshold, the one with the most margin before either error rate gets worse. When no threshold
meets the target the operating point is null. One false
alarm in the whole filler set is already 1 / filler_hours FA/h; a target below that can only be
met with zero false alarms, and the metrics flag it (`zero_fa_only`). Zero false alarms bound the
rate below 3.0 / filler_hours (95 %, one-sided): a lower target is not `resolved`.

Ordinary negatives (`ordinary` in a keyword's metrics): the same operating points with FA/h counted over
the negatives that are not confusables (data.list kinds `near_miss` and `partial`: the synthetic corpus's
deliberate near-misses and partial keywords), and beside each point how many confusable utterances the
threshold accepts (an utterance counts once, whatever its false alarms). A test set builds its
confusables to be hard, at whatever share of its hours it chooses; counted as hours of everyday audio they
would set the thresholds by that choice. This view counts them as a rate of their own. It is null when the
test set has no confusables (the real corpora): there both views are the same.

A keyword without positives in the test set is an error (its FRR is undefined), as is a test
set without filler audio (FA/h undefined).
"""

import json
import math
import os
from pathlib import Path

import numpy as np

from kws.datalist import CONFUSABLE_KINDS, FILLER, keyword_names, read_data_list, read_dictionary
from kws.errors import KwsError
from kws.intervals import ZERO_EVENTS_UPPER, binomial_interval, rate_interval
from kws.keywords import keyword_slug
from kws.tables import metrics_markdown, metrics_tsv

DEFAULT_FA_TARGETS = (0.5, 1.0, 2.0)
FA_FLOOR = 1e-6
_MAX_BLOCK = 1 << 22  # thresholds x frames per look-up table chunk (int32: 16 MiB)


def thresholds_for(step=0.01):
    """0.00, step, 2*step, ... < 1 (WeKws's `while t <= 1.0: t += step` without the float drift)."""
    if not (0 < step < 1):
        raise KwsError(f"threshold step must be in (0, 1), got {step}")
    count = int(math.floor(1.0 / step + 1e-9))
    if count * step >= 1.0 - 1e-9:
        count -= 1
    values = np.round(np.arange(count + 1) * step, 10)
    return values[values < 1.0]


def stats_name(token):
    return f"stats.{keyword_slug(token)}.txt"


# --------------------------------------------------------------------------- counting


def count_false_alarms(scores, thresholds, window_shift):
    """False alarms of one frame sequence for every threshold: int array like `thresholds`.

    Exactly WeKws's scan: i = 0; while i < T: if s[i] >= t: n += 1; i += window_shift else i += 1.
    The sequence is processed in frame chunks (about 4 M thresholds x frames each) carrying each
    threshold's next position across chunks; in a chunk, next[k, p] (first frame >= p scoring
    >= threshold k) comes from a reversed running minimum and the chains of all thresholds
    advance together: about T / window_shift numpy steps in all.
    """
    scores = np.asarray(scores, dtype=np.float64).ravel()
    thresholds = np.asarray(thresholds, dtype=np.float64).ravel()
    if window_shift < 1:
        raise KwsError(f"window_shift must be >= 1 frame, got {window_shift}")
    num_thr = len(thresholds)
    counts = np.zeros(num_thr, dtype=np.int64)
    num = scores.size
    if num == 0 or num_thr == 0:
        return counts
    chunk = max(4 * window_shift, 1024, _MAX_BLOCK // num_thr)
    pos = np.zeros(num_thr, dtype=np.int64)  # absolute index of the next frame to examine
    for c0 in range(0, num, chunk):
        seg = scores[c0 : c0 + chunk]
        size = seg.size
        rows = np.nonzero((thresholds <= seg.max()) & (pos < c0 + size))[0]
        if rows.size == 0:
            continue
        above = seg[None, :] >= thresholds[rows, None]
        nxt = np.full((rows.size, size + 1), size, dtype=np.int32)
        nxt[:, :size] = np.where(above, np.arange(size, dtype=np.int32)[None, :], size)
        nxt = np.minimum.accumulate(nxt[:, ::-1], axis=1)[:, ::-1]
        local = np.maximum(pos[rows] - c0, 0)
        found = np.zeros(rows.size, dtype=np.int64)
        active = np.arange(rows.size)
        while active.size:
            hit = nxt[active, local[active]].astype(np.int64)
            fired = hit < size
            found[active[fired]] += 1
            local[active] = np.where(fired, hit + window_shift, size)
            active = active[fired & (local[active] < size)]
        counts[rows] += found
        pos[rows] = c0 + local
    return counts


def count_false_alarms_many(score_lists, thresholds, window_shift, chunk_frames=1 << 22):
    """Total false alarms over many utterances, for every threshold.

    Utterances are concatenated (up to `chunk_frames` per pass) with `window_shift` frames of
    -inf between them: a hold-off that starts in one utterance ends inside the gap and the gap
    never fires, so the scan restarts exactly at the next utterance's first frame, as in WeKws's
    per-utterance loop — at a fraction of the per-call overhead for many short utterances.
    """
    thresholds = np.asarray(thresholds, dtype=np.float64)
    if window_shift < 1:
        raise KwsError(f"window_shift must be >= 1 frame, got {window_shift}")
    total = np.zeros(len(thresholds), dtype=np.int64)
    gap = np.full(window_shift, -np.inf)
    pending, size = [], 0
    for scores in score_lists:
        scores = np.asarray(scores, dtype=np.float64).ravel()
        if scores.size == 0:
            continue
        pending += [scores, gap]
        size += scores.size + window_shift
        if size >= chunk_frames:
            total += count_false_alarms(np.concatenate(pending), thresholds, window_shift)
            pending, size = [], 0
    if pending:
        total += count_false_alarms(np.concatenate(pending), thresholds, window_shift)
    return total


def false_rejects(max_scores, thresholds):
    """Number of positives whose maximum score is < threshold, for every threshold."""
    ordered = np.sort(np.asarray(max_scores, dtype=np.float64))
    return np.searchsorted(ordered, np.asarray(thresholds, dtype=np.float64), side="left")


def det_curve(positive_scores, filler_scores, filler_seconds, thresholds, window_shift, false_alarms=None):
    """FA/h and FRR per threshold from positive and filler score sequences.

    false_alarms: the fillers' false alarms per threshold when already counted (compute_det sums its
    counts by kind of negative), instead of counting `filler_scores` again.

    Returns dict with arrays `threshold`, `fa_per_hour`, `frr`, `false_alarms`, `false_rejects`.
    """
    thresholds = np.asarray(thresholds, dtype=np.float64)
    maxima = [float(np.max(s)) if len(s) else -math.inf for s in positive_scores]
    if not maxima:
        raise KwsError("no positive utterances")
    hours = filler_seconds / 3600.0
    if hours <= 0:
        raise KwsError("no filler audio")
    n_fr = false_rejects(maxima, thresholds)
    n_fa = (
        count_false_alarms_many(filler_scores, thresholds, window_shift)
        if false_alarms is None
        else np.asarray(false_alarms, dtype=np.int64)
    )
    return {
        "threshold": thresholds,
        "fa_per_hour": np.maximum(n_fa, FA_FLOOR) / hours,
        "frr": n_fr / len(maxima),
        "false_alarms": n_fa,
        "false_rejects": n_fr,
    }


# --------------------------------------------------------------------------- files


def read_scores(path, dictionary):
    """Read score.txt (`key KEYWORD p_1 ... p_T`): {token: {key: np.ndarray}}.

    The keyword column may be the token or its integer id (older WeKws); the first line for a
    (key, keyword) pair wins, like WeKws.
    """
    id_to_token = {str(i): t for t, i in dictionary.items() if i != FILLER}
    tokens = set(id_to_token.values())
    table = {token: {} for token in tokens}
    try:
        handle = open(path, encoding="utf-8")
    except FileNotFoundError:
        raise KwsError(f"{path}: score file not found") from None
    with handle:
        for number, line in enumerate(handle, start=1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) < 2:
                raise KwsError(f"{path}:{number}: expected `key KEYWORD p_1 ... p_T`")
            key, keyword = parts[0], parts[1]
            token = keyword if keyword in tokens else id_to_token.get(keyword)
            if token is None:
                raise KwsError(f"{path}:{number}: keyword {keyword!r} is not in the dictionary")
            if key in table[token]:
                continue
            try:
                values = np.array(parts[2:], dtype=np.float64)
            except ValueError:
                raise KwsError(f"{path}:{number}: posteriors must be numbers") from None
            if values.size == 0:
                raise KwsError(f"{path}:{number}: no frame posteriors for {key}")
            table[token][key] = values
    return table


def write_stats(path, curve):
    from kws.fileio import atomic_open

    with atomic_open(path) as out:
        for t, fa, frr in zip(curve["threshold"], curve["fa_per_hour"], curve["frr"]):
            out.write(f"{t:.6f} {fa:.6f} {frr:.6f}\n")


def read_stats(path):
    """Read a stats file -> dict of arrays threshold, fa_per_hour, frr."""
    try:
        data = np.loadtxt(path, dtype=np.float64, ndmin=2)
    except FileNotFoundError:
        raise KwsError(f"{path}: stats file not found") from None
    except ValueError as err:
        raise KwsError(f"{path}: malformed stats file ({err})") from None
    if data.shape[0] == 0 or data.shape[1] != 3:
        raise KwsError(f"{path}: expected lines `threshold fa_per_hour frr`")
    return {"threshold": data[:, 0], "fa_per_hour": data[:, 1], "frr": data[:, 2]}


# --------------------------------------------------------------------------- metrics


def operating_point(curve, target):
    """The operating point for a FA/h target, or None when no threshold meets it.

    Among the thresholds with FA/h <= target: the lowest FRR, then the lowest FA/h; when several
    thresholds tie on both, the middle one of the tied run (the lower middle for an even count),
    which keeps the most room on both sides before either FRR or FA/h gets worse.
    """
    t = np.asarray(curve["threshold"])
    fa = np.asarray(curve["fa_per_hour"])
    frr = np.asarray(curve["frr"])
    ok = np.nonzero(fa <= target * (1 + 1e-9))[0]
    if ok.size == 0:
        return None
    best_frr = frr[ok].min()
    ok = ok[frr[ok] == best_frr]
    ok = ok[fa[ok] == fa[ok].min()]
    best = int(ok[(ok.size - 1) // 2])
    point = {"threshold": float(t[best]), "frr": float(frr[best]), "fa_per_hour": float(fa[best])}
    if "false_alarms" in curve:
        point["false_alarms"] = int(curve["false_alarms"][best])
    return point


def _point_details(point, curve, index, num_positives, hours, by_kind):
    """Counts and 95 % intervals behind an operating point (kws.intervals), and FA/h by negative kind."""
    misses = int(curve["false_rejects"][index])
    alarms = int(curve["false_alarms"][index])
    point["false_rejects"] = misses
    point["false_alarms"] = alarms
    point["frr_ci95"] = list(binomial_interval(misses, num_positives))
    point["fa_per_hour_ci95"] = list(rate_interval(alarms, hours))
    point["fa_per_hour_by_kind"] = {
        kind: {
            "false_alarms": int(counts[index]),
            "hours": seconds / 3600.0,
            "fa_per_hour": int(counts[index]) / (seconds / 3600.0),
        }
        for kind, (counts, seconds) in by_kind.items()
    }
    return point


def summarize_keyword(
    token,
    curve,
    num_positives,
    num_fillers,
    filler_seconds,
    fa_targets,
    by_kind=None,
    worst_misses=(),
    top_false_alarms=(),
):
    """A keyword's metrics.json entry. by_kind: {negative kind: (false alarms per threshold, seconds)}.

    Each operating point carries its counts (misses of the positives, false alarms in the filler hours)
    with 95 % intervals; `resolved` says whether the filler hours can show the target at all: zero false
    alarms bound the rate below ZERO_EVENTS_UPPER / hours (95 %, one-sided), so a lower target is not
    resolved. `zero_fa_only`: a target below one false alarm in the filler hours (met only with zero).
    """
    hours = filler_seconds / 3600.0
    resolution = 1.0 / hours
    resolved_from = ZERO_EVENTS_UPPER / hours
    by_kind = by_kind or {}
    t = np.asarray(curve["threshold"])
    points = []
    for target in fa_targets:
        point = operating_point(curve, target)
        entry = {"fa_per_hour_target": float(target)}
        if point is None:
            entry.update(
                {
                    "threshold": None,
                    "frr": None,
                    "fa_per_hour": None,
                    "false_alarms": None,
                    "false_rejects": None,
                    "frr_ci95": None,
                    "fa_per_hour_ci95": None,
                    "fa_per_hour_by_kind": None,
                }
            )
        else:
            entry.update(point)
            _point_details(entry, curve, int(np.argmin(np.abs(t - point["threshold"]))), num_positives, hours, by_kind)
        entry["zero_fa_only"] = bool(target < resolution)
        entry["resolved"] = bool(target >= resolved_from * (1 - 1e-9))
        points.append(entry)
    half = int(np.argmin(np.abs(t - 0.5)))
    at_half = {
        "threshold": float(t[half]),
        "frr": float(curve["frr"][half]),
        "fa_per_hour": float(curve["fa_per_hour"][half]),
    }
    return {
        "token": token,
        "name": keyword_slug(token),
        "stats_file": stats_name(token),
        "num_positives": int(num_positives),
        "num_filler_utterances": int(num_fillers),
        "filler_hours": hours,
        "fa_per_hour_resolution": resolution,
        "fa_per_hour_resolved_from": resolved_from,
        "filler_hours_by_kind": {kind: seconds / 3600.0 for kind, (_, seconds) in by_kind.items()},
        "operating_points": points,
        "at_threshold_0.5": _point_details(at_half, curve, half, num_positives, hours, by_kind),
        "worst_misses": list(worst_misses),
        "top_false_alarms": list(top_false_alarms),
    }


def summarize_ordinary(curve_all, num_positives, by_kind, confusable_maxima, fa_targets):
    """The `ordinary` entry of a keyword: operating points with FA/h over the negatives that are not
    confusables, each with the confusable utterances its threshold accepts; None without confusables.

    curve_all: the keyword's full curve (its thresholds and false rejects are shared); by_kind: {kind:
    (false alarms per threshold, seconds)}; confusable_maxima: each confusable utterance's maximum score.
    """
    if not len(confusable_maxima):
        return None
    ordinary = {kind: value for kind, value in by_kind.items() if kind not in CONFUSABLE_KINDS}
    seconds = float(sum(s for _, s in ordinary.values()))
    if seconds <= 0:
        return None
    t = np.asarray(curve_all["threshold"])
    alarms = sum(counts for counts, _ in ordinary.values())
    curve = {
        "threshold": t,
        "fa_per_hour": np.maximum(alarms, FA_FLOOR) / (seconds / 3600.0),
        "frr": curve_all["frr"],
        "false_alarms": alarms,
        "false_rejects": curve_all["false_rejects"],
    }
    summary = summarize_keyword("", curve, num_positives, 0, seconds, fa_targets, ordinary)
    for point in summary["operating_points"] + [summary["at_threshold_0.5"]]:
        threshold = point.get("threshold")
        point["confusables_accepted"] = None if threshold is None else _accepted(confusable_maxima, threshold)
    return {
        "excluded_kinds": list(CONFUSABLE_KINDS),
        "filler_hours": summary["filler_hours"],
        "fa_per_hour_resolved_from": summary["fa_per_hour_resolved_from"],
        "num_confusables": len(confusable_maxima),
        "operating_points": summary["operating_points"],
        "at_threshold_0.5": summary["at_threshold_0.5"],
    }


def _accepted(maxima, threshold):
    """How many of the utterances whose maximum scores are `maxima` a threshold accepts, with a 95 % interval."""
    count = int(np.sum(np.asarray(maxima, dtype=np.float64) >= threshold))
    total = len(maxima)
    return {"count": count, "of": total, "rate": count / total, "ci95": list(binomial_interval(count, total))}


def point_at_threshold(threshold, source, positive_maxima, negatives_by_kind, window_shift):
    """The errors at one given threshold (a detector's, chosen on another test set): FRR and FA/h with
    their counts and intervals, FA/h by kind, and the ordinary view's FA/h and confusables accepted.
    negatives_by_kind: {kind: (score sequences, seconds)}."""
    thresholds = np.array([threshold], dtype=np.float64)
    by_kind = {
        kind: (count_false_alarms_many(scores, thresholds, window_shift), seconds)
        for kind, (scores, seconds) in negatives_by_kind.items()
    }
    seconds = float(sum(s for _, s in by_kind.values()))
    alarms = sum(counts for counts, _ in by_kind.values())
    misses = false_rejects(positive_maxima, thresholds)
    curve = {"false_rejects": misses, "false_alarms": alarms}
    point = {
        "threshold": float(threshold),
        "source": source,
        "frr": float(misses[0]) / len(positive_maxima),
        "fa_per_hour": float(alarms[0]) / (seconds / 3600.0),
    }
    _point_details(point, curve, 0, len(positive_maxima), seconds / 3600.0, by_kind)
    ordinary = {kind: value for kind, value in by_kind.items() if kind not in CONFUSABLE_KINDS}
    confusable = [
        np.max(x) for kind, (scores, _) in negatives_by_kind.items() if kind in CONFUSABLE_KINDS for x in scores
    ]
    ordinary_seconds = float(sum(s for _, s in ordinary.values()))
    if confusable and ordinary_seconds > 0:
        count = int(sum(int(counts[0]) for counts, _ in ordinary.values()))
        point["ordinary"] = {
            "false_alarms": count,
            "hours": ordinary_seconds / 3600.0,
            "fa_per_hour": count / (ordinary_seconds / 3600.0),
            "fa_per_hour_ci95": list(rate_interval(count, ordinary_seconds / 3600.0)),
            "confusables_accepted": _accepted(confusable, threshold),
        }
    else:
        point["ordinary"] = None
    return point


def negative_kind(item, index):
    """What a negative of keyword `index` is: `other_keyword` for another keyword's positive, else the
    data.list `kind` (the synthetic corpus's partial, near_miss, speech, ...), else `filler`."""
    if item["label"] is not None and item["label"] >= 0 and item["label"] != index:
        return "other_keyword"
    return item.get("kind") or "filler"


def _described(item, score, kind):
    return {
        "key": item["key"],
        "kind": kind,
        "engine": item.get("engine", ""),
        "voice": item.get("voice", ""),
        "max_score": round(score, 6),
        "duration": item["duration"],
    }


def compute_det(
    score_path,
    data_list_path,
    dict_path,
    out_dir,
    step=0.01,
    window_shift=50,
    fa_targets=DEFAULT_FA_TARGETS,
    experiment=None,
    stats_dir=None,
    num_listed=10,
    reference_thresholds=None,
):
    """Write metrics.{json,tsv,md} into `out_dir` and stats.<kw>.txt per keyword into `stats_dir`
    (default `<out_dir>/det`); return the metrics. `stats_file` in the metrics is relative to `out_dir`.
    num_listed: how many worst misses and top false alarms each keyword lists.
    reference_thresholds: {token: (threshold, where it came from)}, e.g. the exported detector's, chosen on
    another test set: each keyword's `at_reference_threshold` gives this test set's errors there.
    """
    from kws.fileio import atomic_open, ensure_dir

    if window_shift < 1:
        raise KwsError(f"window_shift must be >= 1 frame, got {window_shift}")
    fa_targets = [float(x) for x in fa_targets]
    if not fa_targets or any(not (x > 0) for x in fa_targets):
        raise KwsError(f"FA/h targets must be positive numbers, got {fa_targets}")
    dictionary = read_dictionary(dict_path)
    tokens = keyword_names(dictionary)
    if not tokens:
        raise KwsError(f"{dict_path}: no keywords (only fillers)")
    items = read_data_list(data_list_path, dictionary=dictionary)
    scores = read_scores(score_path, dictionary)
    thresholds = thresholds_for(step)
    out_dir = Path(out_dir)
    stats_dir = Path(stats_dir) if stats_dir is not None else out_dir / "det"
    if experiment is None:
        experiment = Path(out_dir).resolve().name
    keywords, curves = {}, []
    for index, token in enumerate(tokens):
        table = scores[token]
        missing = [item["key"] for item in items if item["key"] not in table]
        if missing:
            raise KwsError(
                f"{score_path}: no scores for keyword {token} of {len(missing)} utterance(s) of "
                f"{data_list_path} (first: {missing[0]}); score and test data do not match"
            )
        known = {item["key"] for item in items}
        extra = [key for key in table if key not in known]
        if extra:
            raise KwsError(f"{score_path}: utterance {extra[0]!r} ({token}) is not in {data_list_path}")
        positives = [item for item in items if item["label"] == index]
        fillers = [item for item in items if item["label"] != index]
        if not positives:
            raise KwsError(
                f"{data_list_path}: keyword {token} has no positive utterances in the test set, "
                f"so its false reject rate is undefined"
            )
        filler_seconds = float(sum(item["duration"] for item in fillers))
        if filler_seconds <= 0:
            raise KwsError(f"{data_list_path}: no filler audio for keyword {token}, so FA/h is undefined")
        kinds = [negative_kind(item, index) for item in fillers]
        by_kind = {}
        for kind in sorted(set(kinds)):
            mine = [item for item, k in zip(fillers, kinds) if k == kind]
            by_kind[kind] = (
                count_false_alarms_many([table[item["key"]] for item in mine], thresholds, window_shift),
                float(sum(item["duration"] for item in mine)),
            )
        # each utterance is scanned on its own, so the kinds' counts add up to the fillers' count
        curve = det_curve(
            [table[item["key"]] for item in positives],
            None,
            filler_seconds,
            thresholds,
            window_shift,
            false_alarms=sum(counts for counts, _ in by_kind.values()),
        )
        curves.append((token, curve))
        peak = {item["key"]: float(np.max(table[item["key"]])) for item in items}
        worst = sorted(positives, key=lambda item: (peak[item["key"]], item["key"]))[:num_listed]
        loudest = sorted(zip(fillers, kinds), key=lambda pair: (-peak[pair[0]["key"]], pair[0]["key"]))
        summary = summarize_keyword(
            token,
            curve,
            len(positives),
            len(fillers),
            filler_seconds,
            fa_targets,
            by_kind,
            worst_misses=[_described(item, peak[item["key"]], "keyword") for item in worst],
            top_false_alarms=[_described(item, peak[item["key"]], kind) for item, kind in loudest[:num_listed]],
        )
        summary["ordinary"] = summarize_ordinary(
            curve,
            len(positives),
            by_kind,
            [peak[item["key"]] for item, kind in zip(fillers, kinds) if kind in CONFUSABLE_KINDS],
            fa_targets,
        )
        if reference_thresholds is not None:
            if token not in reference_thresholds:
                raise KwsError(f"no reference threshold for keyword {token}")
            negatives = {
                kind: (
                    [table[item["key"]] for item, k in zip(fillers, kinds) if k == kind],
                    by_kind[kind][1],
                )
                for kind in by_kind
            }
            summary["at_reference_threshold"] = point_at_threshold(
                *reference_thresholds[token], [peak[item["key"]] for item in positives], negatives, window_shift
            )
        summary["stats_file"] = os.path.relpath(stats_dir / stats_name(token), out_dir)
        if summary["name"] in keywords:
            raise KwsError(
                f"{dict_path}: keywords {keywords[summary['name']]['token']} and {token} "
                f"share the file name {stats_name(token)}"
            )
        keywords[summary["name"]] = summary
    # Every keyword checked before anything is written: a bad keyword leaves no other's stats behind.
    ensure_dir(out_dir)
    ensure_dir(stats_dir)
    for token, curve in curves:
        write_stats(stats_dir / stats_name(token), curve)
    metrics = {
        "experiment": experiment,
        "score": str(score_path),
        "test_data": str(data_list_path),
        "step": step,
        "window_shift": window_shift,
        "fa_targets": fa_targets,
        "keywords": keywords,
    }
    with atomic_open(out_dir / "metrics.json") as handle:
        json.dump(metrics, handle, indent=2)
        handle.write("\n")
    with atomic_open(out_dir / "metrics.tsv") as handle:
        handle.write(metrics_tsv(metrics))
    with atomic_open(out_dir / "metrics.md") as handle:
        handle.write(metrics_markdown(metrics))
    return metrics
