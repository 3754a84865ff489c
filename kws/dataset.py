"""The training data pipeline: data.list -> wav -> fbank -> filter -> SpecAugment -> shuffle -> [sort] -> batches.

`KwsDataset` is a `torch.utils.data.IterableDataset` used with `DataLoader(batch_size=None)`; it yields
`(keys, feats [B, T, D] float32, lengths [B] int64, targets [B] int64)`, feats zero-padded.

Sharding (the guarantee the tests check)
----------------------------------------
Every epoch, the utterance indices are put in one global order (a permutation drawn from
`(seed, epoch)` when shuffling, file order otherwise). Rank r of W takes `order[r::W]`, and DataLoader
worker w of N on that rank takes `rank_shard[w::N]`. So **each utterance of the list is used exactly
once per epoch across all ranks and workers** (before the length filter), nothing is dropped and
nothing is repeated. Rank shard sizes differ by at most one utterance, but the number of *batches* a
rank produces can still differ (uneven division, the length filter, per-worker partial batches), so
the trainer does not rely on equal batch counts: it all-reduces a "this rank still has a batch" flag
every step and lets a rank that has run out take part with a zero-gradient step (see kws.trainer).

Feature cache: with `feature_cache` (a kws.feature_cache folder or FeatureCache) the fbank features
are read from the memory-mapped cache instead of decoding and extracting them; the cache holds dither-0
features, so the configured fbank dither is not applied; the length filter, SpecAugment, shuffling,
sharding and batching are unchanged, so the same utterances reach the same ranks and workers.

Sorting (`sort: true`, `sort_conf: {sort_size: 500}`, WeKws's keys): the shuffled stream is cut into
buffers of sort_size utterances, each buffer is sorted by length and batched, and its batches are handed
out in random order. Batches then hold utterances of similar length, so far fewer padded frames are
computed (on the default corpus, batch 16: 2.29x the real frames without sorting, 1.11x with it).

Randomness: every random choice (global order, shuffle and sort buffers, SpecAugment masks, fbank dither) comes
from generators seeded by `(seed, epoch, rank, worker)`, never from global state, so an epoch's batches
are identical whatever happened before (resume) and `set_epoch` changes the order.
"""

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import IterableDataset, get_worker_info

from kws.audio import read_wav
from kws.config import (DEFAULT_BATCH_SIZE, DEFAULT_FILTER, DEFAULT_SHUFFLE_SIZE, DEFAULT_SORT_SIZE,
                        DEFAULT_SPEC_AUG, fbank_conf_of)
from kws.datalist import read_data_list, require_labels
from kws.distributed import die_with_parent
from kws.errors import KwsError
from kws.features import compute_fbank

# Separate streams so that changing one kind of randomness does not shift the others.
_STREAM_ORDER, _STREAM_BUFFER, _STREAM_SPECAUG, _STREAM_DITHER, _STREAM_SORT = 0, 1, 2, 3, 4
# Batches are padded to a multiple of this many frames. With every batch a new length, CPU training
# grew by ~1 GB per process over a run (glibc heap fragmentation and oneDNN's per-shape primitive
# cache); with a few dozen lengths memory stays flat and steps are no slower (bench/bench_memory.py).
PAD_MULTIPLE = 32


def input_dim_of(dataset_conf):
    return int(fbank_conf_of(dataset_conf)["num_mel_bins"])


def cv_dataset_conf(train_conf):
    """The evaluation variant of a training dataset_conf: no shuffle, no SpecAugment, no dither."""
    conf = dict(train_conf)
    conf["shuffle"] = False
    conf["spec_aug"] = False
    conf["sort"] = False
    conf["speed_perturb"] = False
    fbank = dict(fbank_conf_of(train_conf))
    fbank["dither"] = 0.0
    conf["fbank_conf"] = fbank
    conf.pop("feature_extraction_conf", None)
    return conf


def _rng(*entropy):
    return np.random.default_rng([int(x) for x in entropy])


def shard_order(num_items, seed, epoch, shuffle, rank=0, world_size=1, worker=0, num_workers=1):
    """The item indices rank `rank` / worker `worker` reads in an epoch (see the module docstring)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
    if not 0 <= worker < num_workers:
        raise ValueError(f"worker {worker} is not in 0..{num_workers - 1}")
    if shuffle:
        order = _rng(seed, epoch, _STREAM_ORDER).permutation(num_items)
    else:
        order = np.arange(num_items)
    return order[rank::world_size][worker::num_workers].tolist()


def num_frames(num_samples, fbank_conf, sample_rate=16000):
    """Frames Kaldi fbank (snip_edges) gives for `num_samples` samples."""
    window = int(sample_rate * float(fbank_conf["frame_length"]) / 1000)
    shift = int(sample_rate * float(fbank_conf["frame_shift"]) / 1000)
    if num_samples < window:
        return 0
    return 1 + (num_samples - window) // shift


def spec_augment(feats, rng, num_t_mask=1, num_f_mask=1, max_t=20, max_f=10):
    """WeKws SpecAugment: zero `num_t_mask` time bands (1..max_t frames) and `num_f_mask` mel bands."""
    feats = feats.clone()
    frames, dims = feats.shape
    for _ in range(int(num_t_mask)):
        if frames < 1 or max_t < 1:
            break
        start = int(rng.integers(0, frames))
        length = int(rng.integers(1, int(max_t) + 1))
        feats[start:min(frames, start + length), :] = 0
    for _ in range(int(num_f_mask)):
        if dims < 1 or max_f < 1:
            break
        start = int(rng.integers(0, dims))
        length = int(rng.integers(1, int(max_f) + 1))
        feats[:, start:min(dims, start + length)] = 0
    return feats


def _buffers(stream, size):
    """The stream in lists of `size` items; the last list holds the rest (it may be empty)."""
    buffer = []
    for sample in stream:
        buffer.append(sample)
        if len(buffer) >= size:
            yield buffer
            buffer = []
    yield buffer


def padded_length(frames):
    """Batch length for a longest utterance of `frames`: rounded up to a multiple of PAD_MULTIPLE."""
    return -(-int(frames) // PAD_MULTIPLE) * PAD_MULTIPLE


def collate(samples):
    """[(key, feats [T, D], label)] -> (keys, feats [B, T, D] zero-padded, lengths [B], targets [B]),
    T = padded_length(longest)."""
    keys = [s[0] for s in samples]
    lengths = torch.tensor([s[1].shape[0] for s in samples], dtype=torch.int64)
    feats = pad_sequence([s[1] for s in samples], batch_first=True, padding_value=0.0)
    extra = padded_length(feats.shape[1]) - feats.shape[1]
    if extra:
        feats = torch.nn.functional.pad(feats, (0, 0, 0, extra))
    targets = torch.tensor([s[2] for s in samples], dtype=torch.int64)
    return keys, feats, lengths, targets


class KwsDataset(IterableDataset):
    """Batches of fbank features from a WeKws data.list, sharded by rank and DataLoader worker.

    `rank`/`world_size` default to the initialised torch.distributed group (else 0/1). Use with
    `DataLoader(dataset, batch_size=None, num_workers=N)` and call `set_epoch(e)` before each epoch.
    """

    def __init__(self, data_list, dataset_conf, seed=666, rank=None, world_size=None, num_keywords=None,
                 items=None, feature_cache=None, dictionary=None):
        self.data_list = str(data_list)
        self.items = items if items is not None else read_data_list(data_list, num_keywords, dictionary)
        require_labels(self.items, data_list)
        self.conf = dict(dataset_conf or {})
        self.fbank_conf = fbank_conf_of(self.conf)
        if feature_cache is not None and not hasattr(feature_cache, "features"):
            from kws.feature_cache import FeatureCache

            feature_cache = FeatureCache(feature_cache, fbank_conf=self.fbank_conf, data_list=data_list,
                                         items=self.items)
        self.feature_cache = feature_cache
        self.filter_conf = {**DEFAULT_FILTER, **(self.conf.get("filter_conf") or {})}
        self.spec_aug = bool(self.conf.get("spec_aug", False))
        self.spec_aug_conf = {**DEFAULT_SPEC_AUG, **(self.conf.get("spec_aug_conf") or {})}
        self.shuffle = bool(self.conf.get("shuffle", False))
        self.shuffle_size = int((self.conf.get("shuffle_conf") or {}).get("shuffle_size", DEFAULT_SHUFFLE_SIZE))
        self.sort = bool(self.conf.get("sort", False))
        self.sort_size = int((self.conf.get("sort_conf") or {}).get("sort_size", DEFAULT_SORT_SIZE))
        if self.sort and self.sort_size < 1:
            raise KwsError(f"dataset_conf.sort_conf.sort_size must be >= 1, got {self.sort_size}")
        batch_conf = self.conf.get("batch_conf") or {}
        self.batch_type = batch_conf.get("batch_type", "static")
        self.batch_size = int(batch_conf.get("batch_size", DEFAULT_BATCH_SIZE))
        self.max_frames_in_batch = int(batch_conf.get("max_frames_in_batch", 12000))
        if self.batch_type not in ("static", "dynamic"):
            raise KwsError(f"dataset_conf.batch_conf.batch_type: expected static or dynamic, got {self.batch_type!r}")
        if self.batch_size < 1:
            raise KwsError(f"dataset_conf.batch_conf.batch_size must be >= 1, got {self.batch_size}")
        if self.conf.get("speed_perturb"):
            raise KwsError("dataset_conf.speed_perturb is not supported by kwsflow (augment the corpus instead)")
        self.seed = int(seed)
        self.epoch = 0
        if rank is None or world_size is None:
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                rank, world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
            else:
                rank, world_size = 0, 1
        self.rank, self.world_size = int(rank), int(world_size)

    def set_epoch(self, epoch):
        self.epoch = int(epoch)

    def __len__(self):
        raise TypeError("KwsDataset has no length (iterable, filtered on the fly)")

    # -- the stages -------------------------------------------------------------------------------

    def _worker(self):
        info = get_worker_info()
        return (info.id, info.num_workers) if info is not None else (0, 1)

    def indices(self, worker=None, num_workers=None):
        if worker is None:
            worker, num_workers = self._worker()
        return shard_order(len(self.items), self.seed, self.epoch, self.shuffle, self.rank, self.world_size,
                           worker, num_workers)

    def samples(self):
        """(key, feats [T, D], label) for this rank's and worker's utterances that pass the filter."""
        worker, num_workers = self._worker()
        entropy = (self.seed, self.epoch, self.rank, worker)
        aug_rng = _rng(*entropy, _STREAM_SPECAUG)
        dither_gen = torch.Generator().manual_seed(int(_rng(*entropy, _STREAM_DITHER).integers(2**62)))
        dither = float(self.fbank_conf.get("dither", 0.0))
        max_len, min_len = int(self.filter_conf["max_length"]), int(self.filter_conf["min_length"])
        cache = self.feature_cache
        for index in self.indices(worker, num_workers):
            item = self.items[index]
            if cache is not None:
                frames = cache.num_frames(item["key"])
                if frames < max(min_len, 1) or frames > max_len:
                    continue
                feats = cache.features(item["key"])  # dither 0 (see the module docstring)
                if self.spec_aug:
                    feats = spec_augment(feats, aug_rng, **{k: self.spec_aug_conf[k] for k in DEFAULT_SPEC_AUG})
                yield item["key"], feats, item["label"]
                continue
            samples = read_wav(item["wav"])
            frames = num_frames(len(samples), self.fbank_conf)
            if frames < max(min_len, 1) or frames > max_len:
                continue
            feats = compute_fbank(samples, self.fbank_conf, dither=dither,
                                  generator=dither_gen if dither > 0 else None)
            if self.spec_aug:
                feats = spec_augment(feats, aug_rng, **{k: self.spec_aug_conf[k] for k in DEFAULT_SPEC_AUG})
            yield item["key"], feats, item["label"]

    def _shuffled(self, stream):
        if not self.shuffle or self.shuffle_size <= 1:
            yield from stream
            return
        worker, _ = self._worker()
        rng = _rng(self.seed, self.epoch, self.rank, worker, _STREAM_BUFFER)
        for buffer in _buffers(stream, self.shuffle_size):
            for i in rng.permutation(len(buffer)):
                yield buffer[i]

    def _batched(self, stream):
        batch, longest = [], 0
        for sample in stream:
            if self.batch_type == "dynamic":
                new_longest = max(longest, padded_length(sample[1].shape[0]))
                if batch and new_longest * (len(batch) + 1) > self.max_frames_in_batch:
                    yield collate(batch)
                    batch, new_longest = [], padded_length(sample[1].shape[0])
                longest = new_longest
                batch.append(sample)
            else:
                batch.append(sample)
                if len(batch) >= self.batch_size:
                    yield collate(batch)
                    batch = []
        if batch:
            yield collate(batch)

    def _sorted_batches(self, stream):
        worker, _ = self._worker()
        rng = _rng(self.seed, self.epoch, self.rank, worker, _STREAM_SORT)
        for buffer in _buffers(stream, self.sort_size):
            yield from self._batches_of_sorted(buffer, rng)

    def _batches_of_sorted(self, buffer, rng):
        buffer.sort(key=lambda sample: sample[1].shape[0])  # stable: equal lengths keep stream order
        batches = list(self._batched(buffer))
        for i in rng.permutation(len(batches)) if self.shuffle else range(len(batches)):
            yield batches[i]

    def __iter__(self):
        stream = self._shuffled(self.samples())
        return self._sorted_batches(stream) if self.sort else self._batched(stream)


def _worker_context():
    import multiprocessing

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "kws.dataset", "kws.forkserver_guard"])
    return context


def _worker_dies_with_its_parent(worker_id):
    from kws import forkserver_guard  # already imported: the forkserver preloads it

    # The pid the worker was forked by: when the forkserver died before this line, the worker stops.
    die_with_parent(parent=forkserver_guard.FORKSERVER_PID)


def make_loader(dataset, num_workers=0, pin_memory=False, prefetch=None):
    """A DataLoader over a KwsDataset (batches come from the dataset; workers are not persistent so
    `set_epoch` reaches them)."""
    from torch.utils.data import DataLoader

    kwargs = {}
    if num_workers > 0:
        # Workers come from a forkserver, not a fork of this process: training runs gloo/NCCL, TensorBoard
        # and intra-op threads, and forking a threaded process can deadlock the child on a lock one of
        # those threads held (seen here: a CV worker hung for good in the fork).
        kwargs["multiprocessing_context"] = _worker_context()
        kwargs["worker_init_fn"] = _worker_dies_with_its_parent
        if prefetch:
            kwargs["prefetch_factor"] = int(prefetch)
    return DataLoader(dataset, batch_size=None, num_workers=int(num_workers), pin_memory=pin_memory,
                      persistent_workers=False, **kwargs)
