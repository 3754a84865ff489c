"""Audio store: one corpus split's audio decoded once into a memory-mapped array, for training.

Layout of a store folder (one per split):

    samples.npy   int16 [total_samples], the utterances' 16 kHz samples concatenated
    offsets.npy   int64 [N + 1]; utterance i is samples[offsets[i]:offsets[i + 1]]
    meta.json     {"format", "version", "keys" [N], "wavs" [N], "sample_rate", "num_samples",
                   "data_list", "data_list_sha256"}

An epoch is then index shuffling and slicing, not thousands of file opens and WAV decodes; fbank,
dither and augmentation are computed on each batch (kws.features.batch_fbank, kws.dataset). Samples are
the wav's 16-bit PCM values as read (`read_wav(path) * 32768`, exactly, for 16-bit files). The folder is
written next to its final name and renamed into place, so a killed build never leaves a half store under
the final name; opening checks shapes, offsets, keys and the data.list digest and stops with a clear
KwsError on any mismatch.

    python scripts/pack_audio.py --data-list data/train/data.list --out results/audio/train --threads 2
"""

import json
import multiprocessing
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from kws.errors import KwsError
from kws.fileio import current_umask, file_digest

FORMAT = "kwsflow-audio-store"
VERSION = 1
CHUNK = 64


def _decode_chunk(paths):
    """Worker: the int16 samples of each wav."""
    from kws.audio import read_wav

    return [np.round(read_wav(path) * 32768.0).clip(-32768, 32767).astype(np.int16) for path in paths]


def build_store(data_list, out_dir, threads=1, items=None):
    """Decode every utterance of `data_list` into the store folder `out_dir`. Returns the count."""
    from kws.datalist import read_data_list

    data_list = Path(data_list)
    if items is None:
        items = read_data_list(data_list)
    keys = [item["key"] for item in items]
    if len(set(keys)) != len(keys):
        raise KwsError(f"{data_list}: duplicate utterance keys; an audio store needs unique keys")
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        tasks = [[str(item["wav"]) for item in items[i : i + CHUNK]] for i in range(0, len(items), CHUNK)]
        workers = min(max(1, int(threads)), max(1, len(tasks)))
        pool = multiprocessing.get_context("spawn").Pool(workers) if workers > 1 else None
        offsets = np.zeros(len(items) + 1, dtype=np.int64)
        try:
            with open(tmp / "samples.raw", "wb") as raw:
                index = 0
                for chunk in pool.imap(_decode_chunk, tasks) if pool else map(_decode_chunk, tasks):
                    for samples in chunk:
                        raw.write(samples.tobytes())
                        offsets[index + 1] = offsets[index] + samples.size
                        index += 1
        finally:
            if pool is not None:
                pool.terminate()
                pool.join()
        # .npy = a header + the raw bytes: write the header, then append the samples without a copy in memory.
        with open(tmp / "samples.npy", "wb") as out, open(tmp / "samples.raw", "rb") as raw:
            np.lib.format.write_array_header_1_0(
                out, {"descr": "<i2", "fortran_order": False, "shape": (int(offsets[-1]),)}
            )
            shutil.copyfileobj(raw, out, 1 << 22)
        (tmp / "samples.raw").unlink()
        np.save(tmp / "offsets.npy", offsets)
        meta = {
            "format": FORMAT,
            "version": VERSION,
            "keys": keys,
            "wavs": [str(item["wav"]) for item in items],
            "sample_rate": 16000,
            "num_samples": int(offsets[-1]),
            "data_list": str(data_list),
            "data_list_sha256": file_digest(data_list) if data_list.is_file() else None,
        }
        with open(tmp / "meta.json", "w", encoding="utf-8") as handle:
            json.dump(meta, handle)
        os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp makes it private; a store is an ordinary output folder
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return len(items)


class AudioStore:
    """A store folder opened read-only: `samples(i)` -> int16 array view of utterance i (by store row),
    `row[key]` the row of a key, `lengths` the sample counts. The big array is memory-mapped lazily in
    each process."""

    def __init__(self, path, data_list=None, items=None):
        self.path = Path(path)
        meta_path = self.path / "meta.json"
        if not self.path.is_dir():
            raise KwsError(f"{self.path}: audio store folder not found (build it with scripts/pack_audio.py)")
        try:
            with open(meta_path, encoding="utf-8") as handle:
                meta = json.load(handle)
        except FileNotFoundError:
            raise KwsError(f"{meta_path}: audio store is incomplete (meta.json missing); rebuild it") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise KwsError(f"{meta_path}: audio store is corrupt (unreadable meta.json: {err}); rebuild it") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise KwsError(f"{meta_path}: not a kwsflow audio store of version {VERSION}; rebuild it")
        self.meta = meta
        self.keys = list(meta.get("keys") or [])
        try:
            self.offsets = np.load(self.path / "offsets.npy", allow_pickle=False)
            samples = np.load(self.path / "samples.npy", mmap_mode="r", allow_pickle=False)
        except FileNotFoundError as err:
            raise KwsError(
                f"{self.path}: audio store is incomplete ({Path(err.filename).name} missing); rebuild it"
            ) from None
        except (ValueError, OSError, EOFError) as err:
            raise KwsError(f"{self.path}: audio store is corrupt ({err}); rebuild it") from None
        offsets = self.offsets
        problem = None
        if offsets.dtype != np.int64 or offsets.ndim != 1 or offsets.size != len(self.keys) + 1:
            problem = f"offsets.npy has shape {offsets.shape}, expected ({len(self.keys) + 1},)"
        elif offsets[0] != 0 or np.any(np.diff(offsets) < 0):
            problem = "offsets.npy is not an increasing index starting at 0"
        elif (
            samples.dtype != np.int16 or samples.shape != (int(offsets[-1]),) or offsets[-1] != meta.get("num_samples")
        ):
            problem = f"samples.npy is {samples.dtype} {samples.shape}, the index says int16 ({int(offsets[-1])},)"
        elif len(set(self.keys)) != len(self.keys):
            problem = "duplicate keys in meta.json"
        if problem:
            raise KwsError(f"{self.path}: audio store is corrupt ({problem}); rebuild it")
        del samples
        self._samples = None
        self.row = {key: i for i, key in enumerate(self.keys)}
        self.lengths = np.diff(offsets)
        self._check_current(data_list, items)

    def _check_current(self, data_list, items):
        """The store holds the audio of `data_list` (by digest) or at least of every item (by wav)."""
        meta = self.meta
        stale = (
            data_list is not None
            and meta.get("data_list_sha256") is not None
            and Path(data_list).is_file()
            and file_digest(data_list) != meta["data_list_sha256"]
        )
        if stale and items is None:
            raise KwsError(
                f"{self.path}: audio store is stale: {data_list} changed since it was built "
                f"(from {meta.get('data_list')}); rebuild it"
            )
        if items is None:
            return
        wavs = meta.get("wavs") or []
        for item in items:
            i = self.row.get(item["key"])
            if i is None:
                raise KwsError(f"{self.path}: audio store has no audio for {item['key']} of the data list; rebuild it")
            if stale and (i >= len(wavs) or wavs[i] != str(item["wav"])):
                # Another list (e.g. a subset) is fine when every utterance maps to the same wav as when packed.
                raise KwsError(
                    f"{self.path}: audio store is stale: {data_list} changed since it was built "
                    f"(from {meta.get('data_list')}; {item['key']} now reads {item['wav']}); "
                    f"rebuild it"
                )

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_samples"] = None  # never pickle the mapped array: each process maps the file itself
        return state

    @property
    def all_samples(self):
        if self._samples is None:
            self._samples = np.load(self.path / "samples.npy", mmap_mode="r", allow_pickle=False)
        return self._samples

    def __len__(self):
        return len(self.keys)

    def samples(self, row):
        return self.all_samples[self.offsets[row] : self.offsets[row + 1]]


class MemoryStore:
    """The audio of a list's items decoded into memory: an AudioStore for lists small enough (tests,
    a quick look) that packing them first is not worth it."""

    def __init__(self, items):
        self.keys = [item["key"] for item in items]
        arrays = _decode_chunk([str(item["wav"]) for item in items])
        self.row = {key: i for i, key in enumerate(self.keys)}
        self.lengths = np.array([a.size for a in arrays], dtype=np.int64)
        # One array and its offsets, as a packed store: batches gather from it the same way
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)
        self.all_samples = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int16)

    def __len__(self):
        return len(self.keys)

    def samples(self, row):
        return self.all_samples[self.offsets[row] : self.offsets[row + 1]]


def samples_on_device(store, device, max_share=0.25, chunk=1 << 26):
    """The store's samples as one int16 tensor on `device` (a GPU), so that a batch is gathered there
    (kws.dataset.gather_padded) instead of being assembled, pinned and copied by the host every step.
    None when they would take more than `max_share` of the device's free memory: such a corpus keeps the
    host path. Copied in chunks, so the host never holds a second copy of a big store."""
    import torch

    flat = store.all_samples
    device = torch.device(device)
    free, _total = torch.cuda.mem_get_info(device)
    if flat.nbytes > max_share * free:
        return None
    on_device = torch.empty(flat.size, dtype=torch.int16, device=device)
    for start in range(0, flat.size, chunk):
        part = np.array(flat[start : start + chunk])  # a writable copy of the mapped pages
        on_device[start : start + part.size].copy_(torch.from_numpy(part))
    return on_device


def open_or_build(path, data_list, items, build=False, is_builder=True, wait=lambda: None, threads=1):
    """The AudioStore at `path` for `data_list`. With `build`, the builder (rank 0) first packs it when it
    is missing or stale, and every caller then waits (`wait`: a barrier) before opening it."""
    path = Path(path)
    store = None
    if build and is_builder:
        try:
            store = AudioStore(path, data_list=data_list, items=items)
        except KwsError:
            build_store(data_list, path, threads=threads, items=items)
    if build:
        wait()
    return store or AudioStore(path, data_list=data_list, items=items)
