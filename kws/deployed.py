"""The deployed detector scored: an exported model run through kws-detect's streaming path (streaming fbank,
model cache, the thresholds stored in the export, the refractory period) over a whole test split, streams
included, and set beside the offline figures from score.txt at the same thresholds.

Per keyword: a positive is detected when the detector fires for its keyword at least once; every firing
on another utterance is a false alarm (FA/h over the same filler hours as kws.det). The offline figures
at the exported threshold are counted twice: with the DET's hold-off (`window_shift`, as metrics.json
reports them) and with the detector's refractory period as hold-off, which is what the streaming path
must reproduce: the exported posteriors equal offline scoring within the export check's tolerance, so
only utterances whose peak lies that close to a threshold may fall the other way. `check_agreement`
fails when a count differs by more than COUNT_TOLERANCE of it (at least one utterance).
"""

import math
import os
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import numpy as np

from kws.detect import DEFAULT_CHUNK_MS
from kws.errors import KwsError

COUNT_TOLERANCE = 0.01  # of a count (misses, false alarms), and at least 1

_worker = {}


def _init_worker(model_path, thresholds, refractory, backend):
    import torch

    from kws.detect import Detector
    from kws.runners import load_exported

    torch.set_num_threads(1)
    runner = load_exported(model_path, threads=1, backend=backend)
    _worker["detector"] = Detector(runner, thresholds, refractory=refractory)


def _detect(job):
    """Keyword indices the detector fires for on each (key, wav) of the job, fed chunk_ms at a time."""
    from kws.audio import read_wav

    pairs, chunk_ms = job
    detector = _worker["detector"]
    chunk_samples = max(1, int(round(detector.fbank.sample_rate * chunk_ms / 1000.0)))
    fired = {}
    for key, wav in pairs:
        detector.reset()
        samples = read_wav(wav)
        hits = []
        for start in range(0, samples.size, chunk_samples):
            hits += [d["index"] for d in detector.accept(samples[start : start + chunk_samples])]
        fired[key] = hits
    return fired


def stream_detections(model_path, items, thresholds, refractory, chunk_ms=DEFAULT_CHUNK_MS, workers=1, backend=None):
    """{key: [keyword index of each detection]} for every data.list item, each utterance its own stream."""
    if not chunk_ms > 0:
        raise KwsError(f"chunk_ms must be positive, got {chunk_ms}")
    pairs = [(item["key"], item["wav"]) for item in items]
    # long streams first, so the workers finish together
    order = sorted(range(len(items)), key=lambda i: -items[i]["duration"])
    jobs = [([pairs[i] for i in order[w :: workers * 8]], chunk_ms) for w in range(workers * 8)]
    fired = {}
    if workers <= 1:
        _init_worker(model_path, thresholds, refractory, backend)
        for job in jobs:
            fired.update(_detect(job))
        return fired
    with ProcessPoolExecutor(
        workers,
        mp_context=get_context("spawn"),
        initializer=_init_worker,
        initargs=(os.fspath(model_path), list(thresholds), refractory, backend),
    ) as pool:
        for part in pool.map(_detect, [job for job in jobs if job[0]]):
            fired.update(part)
    return fired


def _counts(index, items, detected, alarms):
    """FRR and FA/h of keyword `index`: detected[key] of its positives, alarms[key] of the others."""
    positives = [item for item in items if item["label"] == index]
    fillers = [item for item in items if item["label"] != index]
    misses = sum(1 for item in positives if not detected[item["key"]])
    count = sum(alarms[item["key"]] for item in fillers)
    hours = sum(item["duration"] for item in fillers) / 3600.0
    return {
        "positives": len(positives),
        "misses": misses,
        "frr": misses / len(positives),
        "false_alarms": int(count),
        "filler_hours": hours,
        "fa_per_hour": count / hours,
    }


def deployed_figures(items, tokens, scores, fired, thresholds, hold_off_frames, window_shift):
    """Per keyword token: the streaming figures and the offline ones at the same threshold.

    scores: {token: {key: frame posteriors}} (kws.det.read_scores); fired: stream_detections' result.
    """
    from kws.det import count_false_alarms

    figures = {}
    for index, token in enumerate(tokens):
        t = float(thresholds[index])
        table = scores[token]
        peak_reached = {key: float(np.max(values)) >= t for key, values in table.items()}
        offline = {
            name: _counts(
                index,
                items,
                peak_reached,
                {key: int(count_false_alarms(values, [t], hold_off)[0]) for key, values in table.items()},
            )
            for name, hold_off in (("offline_refractory", hold_off_frames), ("offline_window_shift", window_shift))
        }
        streaming = _counts(
            index,
            items,
            {key: index in hits for key, hits in fired.items()},
            {key: hits.count(index) for key, hits in fired.items()},
        )
        figures[token] = {"threshold": t, "streaming": streaming, **offline}
    return figures


def check_agreement(figures, tolerance=COUNT_TOLERANCE):
    """KwsError when the streaming counts differ from the offline ones (same hold-off) beyond tolerance."""
    problems = []
    for token, fig in figures.items():
        for what in ("misses", "false_alarms"):
            stream, offline = fig["streaming"][what], fig["offline_refractory"][what]
            allowed = max(1, math.floor(tolerance * max(stream, offline)))
            if abs(stream - offline) > allowed:
                problems.append(f"{token} {what}: streaming {stream}, offline {offline} (allowed {allowed})")
    if problems:
        raise KwsError(
            "the deployed detector disagrees with offline scoring at the exported thresholds: " + "; ".join(problems)
        )


def evaluate_deployed(
    model_path,
    data_list,
    dict_path,
    score_path,
    refractory,
    window_shift=50,
    chunk_ms=DEFAULT_CHUNK_MS,
    workers=1,
    backend=None,
):
    """Run the exported model over data_list as kws-detect would, at the thresholds stored in it; return the
    report, after check_agreement."""
    from kws.datalist import keyword_names, read_data_list, read_dictionary
    from kws.det import read_scores
    from kws.detect import Detector
    from kws.runners import load_exported

    runner = load_exported(model_path, backend=backend)
    meta = runner.meta
    dictionary = read_dictionary(dict_path)
    tokens = keyword_names(dictionary)
    if list(meta["keywords"]) != tokens:
        raise KwsError(f"{model_path}: keywords {meta['keywords']} but {dict_path} has {tokens}")
    thresholds = [float(meta["thresholds"][token]) for token in tokens]
    items = read_data_list(data_list, dictionary=dictionary)
    scores = read_scores(score_path, dictionary)
    for token in tokens:
        missing = [item["key"] for item in items if item["key"] not in scores[token]]
        if missing:
            raise KwsError(
                f"{score_path}: no scores for {token} of {missing[0]} ({data_list}); score and test data do not match"
            )
    fired = stream_detections(model_path, items, thresholds, refractory, chunk_ms, workers, backend)
    hold_off = max(1, Detector(runner, thresholds, refractory=refractory).refractory_frames)
    figures = deployed_figures(items, tokens, scores, fired, thresholds, hold_off, window_shift)
    report = {
        "test_data": os.fspath(data_list),
        "utterances": len(items),
        "hours": sum(item["duration"] for item in items) / 3600.0,
        "chunk_ms": chunk_ms,
        "refractory_seconds": refractory,
        "refractory_frames": hold_off,
        "window_shift": window_shift,
        "count_tolerance": COUNT_TOLERANCE,
        "keywords": figures,
    }
    check_agreement(figures)
    return report


def deployed_markdown(report):
    """deployed.md: the streaming detector's FRR and FA/h at the exported thresholds beside the offline ones."""
    lines = [
        "# The deployed detector on the test split",
        "",
        f"The exported ONNX model run as `kws-detect` runs it ({report['chunk_ms']:g} ms chunks, refractory "
        f"{report['refractory_seconds']:g} s) over all {report['utterances']} test utterances "
        f"({report['hours']:.2f} h, long streams included), each its own stream; offline: score.txt at the same "
        f"threshold, false alarms counted with the DET's hold-off ({report['window_shift']} frames) and with the "
        f"refractory period ({report['refractory_frames']} frames).",
        "",
        "| Keyword | Threshold | Scored | FRR | Misses | FA/h | False alarms | Filler hours |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for token, fig in report["keywords"].items():
        for label, key in (
            ("streaming (deployed)", "streaming"),
            ("offline, refractory hold-off", "offline_refractory"),
            ("offline, DET hold-off", "offline_window_shift"),
        ):
            f = fig[key]
            lines.append(
                f"| {token} | {fig['threshold']:.2f} | {label} | {100 * f['frr']:.2f} % | "
                f"{f['misses']} / {f['positives']} | {f['fa_per_hour']:.2f} | {f['false_alarms']} | "
                f"{f['filler_hours']:.2f} |"
            )
    lines += [
        "",
        "The export fails when a streaming count differs from the offline one with the same hold-off by "
        f"more than {100 * report['count_tolerance']:g} % of it (at least one).",
    ]
    return "\n".join(lines) + "\n"
