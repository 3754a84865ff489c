"""Global CMVN statistics in WeKws's `global_cmvn` JSON: {"mean_stat": [D], "var_stat": [D], "frame_num": N}.

`mean_stat` and `var_stat` are raw sums and sums of squares of fbank features (dither 0) over a
data list. Sums are accumulated in float64: per utterance, then per fixed-size chunk of the list,
then over chunks in list order, so the result does not depend on the number of worker processes.
"""

import json
import math
import multiprocessing
from pathlib import Path

import numpy as np
import torch

from kws.audio import SAMPLE_RATE, read_wav
from kws.datalist import read_data_list, read_text
from kws.errors import KwsError
from kws.features import compute_fbank, fbank_settings
from kws.fileio import atomic_open

CHUNK_SIZE = 32
VAR_FLOOR = 1e-20


def _window_samples(fbank_conf):
    return int(SAMPLE_RATE * float(fbank_settings(fbank_conf)["frame_length"]) * 0.001)


def _chunk_stats(task):
    """(source, [(key, wav)], fbank_conf) -> (sum [D] float64, sum of squares [D] float64, frames)."""
    source, chunk, fbank_conf = task
    torch.set_num_threads(1)
    dim = int(fbank_settings(fbank_conf)["num_mel_bins"])
    window = _window_samples(fbank_conf)
    total = np.zeros(dim, dtype=np.float64)
    total_sq = np.zeros(dim, dtype=np.float64)
    frames = 0
    for key, wav in chunk:
        try:
            samples = read_wav(wav)
        except KwsError as err:
            raise KwsError(f"{source}: utterance {key!r}: {err}") from None
        if len(samples) < window:
            continue  # shorter than one analysis window: no frames
        feats = compute_fbank(samples, fbank_conf, dither=0.0).to(torch.float64)
        total += feats.sum(dim=0).numpy()
        total_sq += (feats * feats).sum(dim=0).numpy()
        frames += int(feats.shape[0])
    return total, total_sq, frames


def compute_cmvn(items, fbank_conf=None, threads=1, source="data.list", chunk_size=CHUNK_SIZE):
    """CMVN stats over `items` (dicts with key and wav). `threads` > 1 uses that many processes."""
    fbank_conf = fbank_settings(fbank_conf)
    for name in ("num_mel_bins", "frame_length", "frame_shift"):
        value = fbank_conf[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise KwsError(f"fbank_conf.{name}: must be a positive number, got {value!r}")
    pairs = [(item["key"], item["wav"]) for item in items]
    tasks = [(str(source), pairs[start : start + chunk_size], fbank_conf) for start in range(0, len(pairs), chunk_size)]
    dim = int(fbank_conf["num_mel_bins"])
    total = np.zeros(dim, dtype=np.float64)
    total_sq = np.zeros(dim, dtype=np.float64)
    frames = 0
    workers = min(max(1, int(threads)), len(tasks))
    if workers > 1:
        # spawn: forking a process whose torch thread pools are running can deadlock.
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            results = pool.imap(_chunk_stats, tasks)
            for part_sum, part_sq, part_frames in results:
                total += part_sum
                total_sq += part_sq
                frames += part_frames
    else:
        for task in tasks:
            part_sum, part_sq, part_frames = _chunk_stats(task)
            total += part_sum
            total_sq += part_sq
            frames += part_frames
    if frames == 0:
        raise KwsError(f"{source}: no feature frames (every utterance is shorter than one window)")
    return {"mean_stat": total.tolist(), "var_stat": total_sq.tolist(), "frame_num": frames}


def compute_cmvn_file(data_list, out, fbank_conf=None, threads=1):
    """Read a data.list, compute its CMVN stats and write them atomically to `out`; returns the stats."""
    items = read_data_list(data_list)
    stats = compute_cmvn(items, fbank_conf, threads=threads, source=data_list)
    with atomic_open(out) as handle:
        json.dump(stats, handle)
        handle.write("\n")
    return stats


def check_cmvn(stats, source="global_cmvn"):
    """Validate a parsed global_cmvn mapping; returns it."""
    if not isinstance(stats, dict):
        raise KwsError(f"{source}: expected a JSON object with mean_stat, var_stat, frame_num")
    missing = [name for name in ("mean_stat", "var_stat", "frame_num") if name not in stats]
    if missing:
        raise KwsError(f"{source}: missing field(s) {', '.join(missing)}")
    frames = stats["frame_num"]
    if isinstance(frames, bool) or not isinstance(frames, (int, float)) or not frames > 0 or not math.isfinite(frames):
        raise KwsError(f"{source}: frame_num must be a positive number, got {frames!r}")
    for name in ("mean_stat", "var_stat"):
        values = stats[name]
        if (
            not isinstance(values, list)
            or not values
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values)
        ):
            raise KwsError(f"{source}: {name} must be a non-empty list of finite numbers")
    if len(stats["mean_stat"]) != len(stats["var_stat"]):
        raise KwsError(f"{source}: mean_stat has {len(stats['mean_stat'])} values, var_stat {len(stats['var_stat'])}")
    return stats


def read_cmvn(path):
    """Load and validate a global_cmvn JSON file -> dict."""
    path = Path(path)
    text = read_text(path, "CMVN file")
    try:
        stats = json.loads(text)
    except json.JSONDecodeError as err:
        raise KwsError(f"{path}:{err.lineno}: malformed JSON ({err.msg})") from None
    except RecursionError:
        raise KwsError(f"{path}: malformed JSON (nested too deeply)") from None
    return check_cmvn(stats, source=str(path))


def cmvn_tensors(stats):
    """Parsed stats -> (mean, istd) float32 tensors; istd = 1 / sqrt(max(var, 1e-20)) as in WeKws."""
    check_cmvn(stats)
    frames = float(stats["frame_num"])
    mean = torch.tensor(stats["mean_stat"], dtype=torch.float64) / frames
    var = torch.tensor(stats["var_stat"], dtype=torch.float64) / frames - mean * mean
    istd = 1.0 / torch.sqrt(torch.clamp(var, min=VAR_FLOOR))
    return mean.to(torch.float32), istd.to(torch.float32)


def load_cmvn(path):
    """A global_cmvn file -> (mean, istd) float32 tensors of shape [D]."""
    return cmvn_tensors(read_cmvn(path))
