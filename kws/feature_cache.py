"""Feature cache: the fbank features of one corpus split, computed once, memory-mapped for training.

Layout of a cache folder (one per split and feature setting):

    feats.npy     float32 (or float16) [total_frames, num_mel_bins], the utterances' frames concatenated
    offsets.npy   int64 [N + 1]; utterance i is feats[offsets[i]:offsets[i + 1]]
    meta.json     {"format", "version", "keys" [N], "fbank_conf", "dtype", "dim", "num_frames",
                   "data_list", "data_list_sha256"}

Features are `kws.features.compute_fbank` with **dither 0**: a cache is deterministic, so training from
it does not add the configured fbank dither (WeKws's dither 1.0 only changes frames of near-digital
silence, which the augmented corpora do not have). SpecAugment, shuffling and batching still happen at
training time (kws.dataset). The folder is written next to its final name and renamed into place, so a
killed build never leaves a half cache under the final name; opening checks shapes, offsets, keys,
fbank settings and the data.list digest and stops with a clear KwsError on any mismatch.

    python scripts/cache_features.py --data-list data/train/data.list --fbank-json '{"num_mel_bins": 40}' \
        --out results/features/fbank40/train --threads 2
"""

import hashlib
import json
import multiprocessing
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from kws.errors import KwsError

FORMAT = "kwsflow-feature-cache"
VERSION = 1
FILES = ("feats.npy", "offsets.npy", "meta.json")
CHUNK = 64


def _settings(fbank_conf):
    """The fbank settings that determine cached features (dither is excluded: caches use 0)."""
    from kws.features import fbank_settings

    settings = fbank_settings(fbank_conf)
    settings.pop("dither", None)
    return {key: (float(value) if key != "num_mel_bins" else int(value)) for key, value in sorted(settings.items())}


def file_digest(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fbank_chunk(task):
    """Worker: fbank (dither 0) of a chunk of (wav path) -> list of float32 arrays."""
    paths, fbank_conf = task
    from kws.audio import read_wav
    from kws.features import compute_fbank

    torch.set_num_threads(1)
    return [compute_fbank(read_wav(path), fbank_conf, dither=0.0).numpy() for path in paths]


def _frame_counts(items, fbank_conf):
    import soundfile

    from kws.dataset import num_frames

    counts = []
    for item in items:
        try:
            samples = soundfile.info(str(item["wav"])).frames
        except Exception as err:  # noqa: BLE001 - any unreadable wav is the user's to fix
            raise KwsError(f"{item['wav']}: cannot read audio for the feature cache ({err})") from None
        counts.append(num_frames(samples, fbank_conf))
    return counts


def build_cache(data_list, out_dir, fbank_conf=None, threads=1, dtype="float32", items=None):
    """Compute the features of every utterance of `data_list` into the cache folder `out_dir`.

    Returns the number of utterances. `threads` > 1 computes in that many processes.
    """
    from kws.datalist import read_data_list

    if dtype not in ("float32", "float16"):
        raise KwsError(f"feature cache dtype must be float32 or float16, got {dtype!r}")
    data_list = Path(data_list)
    if items is None:
        items = read_data_list(data_list)
    settings = _settings(fbank_conf)
    conf = {**settings, "dither": 0.0}
    keys = [item["key"] for item in items]
    if len(set(keys)) != len(keys):
        raise KwsError(f"{data_list}: duplicate utterance keys; a feature cache needs unique keys")
    counts = _frame_counts(items, conf)
    offsets = np.zeros(len(items) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    dim = int(settings["num_mel_bins"])

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        feats = np.lib.format.open_memmap(tmp / "feats.npy", mode="w+", dtype=np.dtype(dtype),
                                          shape=(int(offsets[-1]), dim))
        tasks = [([item["wav"] for item in items[i:i + CHUNK]], conf) for i in range(0, len(items), CHUNK)]
        workers = min(max(1, int(threads)), max(1, len(tasks)))
        if workers > 1:
            pool = multiprocessing.get_context("spawn").Pool(workers)
            results = pool.imap(_fbank_chunk, tasks)
        else:
            pool, results = None, map(_fbank_chunk, tasks)
        try:
            index = 0
            for chunk in results:
                for array in chunk:
                    if array.shape != (counts[index], dim):
                        raise KwsError(f"{items[index]['wav']}: fbank gave {array.shape}, expected "
                                       f"({counts[index]}, {dim}) frames (file changed while caching?)")
                    feats[offsets[index]:offsets[index + 1]] = array
                    index += 1
        finally:
            if pool is not None:
                pool.terminate()
                pool.join()
        feats.flush()
        del feats
        np.save(tmp / "offsets.npy", offsets)
        meta = {"format": FORMAT, "version": VERSION, "keys": keys, "wavs": [str(item["wav"]) for item in items],
                "fbank_conf": settings, "dtype": dtype,
                "dim": dim, "num_frames": int(offsets[-1]), "data_list": str(data_list),
                "data_list_sha256": file_digest(data_list) if data_list.is_file() else None}
        with open(tmp / "meta.json", "w", encoding="utf-8") as handle:
            json.dump(meta, handle)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private; a cache is an ordinary output folder
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return len(items)


class FeatureCache:
    """A cache folder opened read-only. `features(key)` -> float32 Tensor [T, D] (a copy).

    The big array is memory-mapped lazily in each process (DataLoader workers reopen it rather than
    receiving a pickled copy).
    """

    def __init__(self, path, fbank_conf=None, data_list=None, items=None):
        self.path = Path(path)
        meta_path = self.path / "meta.json"
        if not self.path.is_dir():
            raise KwsError(f"{self.path}: feature cache folder not found (build it with scripts/cache_features.py)")
        try:
            with open(meta_path, encoding="utf-8") as handle:
                meta = json.load(handle)
        except FileNotFoundError:
            raise KwsError(f"{meta_path}: feature cache is incomplete (meta.json missing); rebuild it") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise KwsError(f"{meta_path}: feature cache is corrupt (unreadable meta.json: {err}); rebuild it") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise KwsError(f"{meta_path}: not a kwsflow feature cache of version {VERSION}; rebuild it")
        self.meta = meta
        self.keys = list(meta.get("keys") or [])
        self.dim = int(meta.get("dim", -1))
        try:
            self.offsets = np.load(self.path / "offsets.npy", allow_pickle=False)
            feats = np.load(self.path / "feats.npy", mmap_mode="r", allow_pickle=False)
        except FileNotFoundError as err:
            raise KwsError(f"{self.path}: feature cache is incomplete ({Path(err.filename).name} missing); "
                           f"rebuild it") from None
        except (ValueError, OSError, EOFError) as err:
            raise KwsError(f"{self.path}: feature cache is corrupt ({err}); rebuild it") from None
        offsets = self.offsets
        problem = None
        if offsets.dtype != np.int64 or offsets.ndim != 1 or offsets.size != len(self.keys) + 1:
            problem = f"offsets.npy has shape {offsets.shape}, expected ({len(self.keys) + 1},)"
        elif offsets[0] != 0 or np.any(np.diff(offsets) < 0):
            problem = "offsets.npy is not an increasing index starting at 0"
        elif feats.ndim != 2 or feats.shape != (int(offsets[-1]), self.dim) or offsets[-1] != meta.get("num_frames"):
            problem = f"feats.npy has shape {feats.shape}, the index says ({int(offsets[-1])}, {self.dim})"
        elif str(feats.dtype) != meta.get("dtype"):
            problem = f"feats.npy is {feats.dtype}, meta.json says {meta.get('dtype')}"
        elif len(set(self.keys)) != len(self.keys):
            problem = "duplicate keys in meta.json"
        if problem:
            raise KwsError(f"{self.path}: feature cache is corrupt ({problem}); rebuild it")
        del feats
        self._feats = None
        self.row = {key: i for i, key in enumerate(self.keys)}
        if fbank_conf is not None and _settings(fbank_conf) != meta.get("fbank_conf"):
            raise KwsError(f"{self.path}: feature cache was built with fbank settings {meta.get('fbank_conf')}, "
                           f"this run uses {_settings(fbank_conf)}; rebuild it")
        stale = (data_list is not None and meta.get("data_list_sha256") is not None and Path(data_list).is_file()
                 and file_digest(data_list) != meta["data_list_sha256"])
        if stale and items is None:
            raise KwsError(f"{self.path}: feature cache is stale: {data_list} changed since it was built "
                           f"(from {meta.get('data_list')}); rebuild it")
        if stale:
            # Another list (e.g. a subset): fine when every utterance maps to the same wav as when cached.
            wavs = meta.get("wavs") or []
            for item in items:
                i = self.row.get(item["key"])
                if i is not None and (i >= len(wavs) or wavs[i] != str(item["wav"])):
                    raise KwsError(f"{self.path}: feature cache is stale: {data_list} changed since it was built "
                                   f"(from {meta.get('data_list')}; {item['key']} now reads {item['wav']}); "
                                   f"rebuild it")
        if items is not None:
            missing = [item["key"] for item in items if item["key"] not in self.row]
            if missing:
                raise KwsError(f"{self.path}: feature cache has no features for {len(missing)} utterance(s) "
                               f"of the data list (first: {missing[0]}); rebuild it")

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_feats"] = None  # never pickle the mapped array: each process maps the file itself
        return state

    @property
    def feats(self):
        if self._feats is None:
            self._feats = np.load(self.path / "feats.npy", mmap_mode="r", allow_pickle=False)
        return self._feats

    def __len__(self):
        return len(self.keys)

    def __contains__(self, key):
        return key in self.row

    def num_frames(self, key):
        i = self.row[key]
        return int(self.offsets[i + 1] - self.offsets[i])

    def features(self, key):
        i = self.row[key]
        array = np.array(self.feats[self.offsets[i]:self.offsets[i + 1]], dtype=np.float32)
        return torch.from_numpy(array)


def open_cache(path, fbank_conf=None, data_list=None, items=None):
    return FeatureCache(path, fbank_conf=fbank_conf, data_list=data_list, items=items)
