"""The training data path: audio store -> shuffled, sharded batches of samples -> fbank and augmentation
on the batch, on the training device.

`KwsDataset` plans an epoch from the data.list and the sample counts of an audio store
(kws.audio_store; an in-memory one when none is given): it yields host batches
`(keys, samples int16 [B, S] zero-padded, sample_lengths [B], targets [B])`, which `Featurizer` turns
into `(keys, feats [B, T, D] float32, frame_lengths [B], targets [B], warped [B])` on the device where the
model runs: dither, Kaldi fbank (kws.features.batch_fbank), the speaker warp (kws.mel_warp; `warped` says,
on the host, which rows it changed), the rhythm warp (kws.time_warp) and SpecAugment, all on the batch. An epoch costs
index arithmetic and slicing of a memory-mapped array, not file opens and decodes.

Sharding (the guarantee the tests check)
----------------------------------------
Every epoch, the utterance indices are put in one global order (a permutation drawn from
`(seed, epoch)` when shuffling, file order otherwise). Rank r of W takes `order[r::W]`: **each
utterance of the list is used exactly once per epoch across all ranks** (before the length filter).
Every rank can compute every rank's plan, so the trainer knows in advance how many batches each rank
has (`batch_counts`) and needs no per-step collective to find out who still has one.

Batching: `batch_conf.batch_type: static` (`batch_size` utterances) or `dynamic` (at most
`max_frames_in_batch` padded frames). `sort: true` (`sort_conf.sort_size`, WeKws's keys) sorts buffers
of sort_size utterances by length before batching and hands their batches out in random order: far
fewer padded frames (on the default corpus, batch 16: 2.29x the real frames without sorting, 1.11x
with it), but where length goes with the class the batches become nearly one class each; with
`stratify: true` (kwsflow's) each class is sorted on its own and every batch takes the same length
quantile of every class, so batches keep the buffer's class mix. WeKws's
shuffle buffer (`shuffle_conf.shuffle_size`) then permutes each run of that many utterances of a rank's
order, as kwsflow's loader did, so the batches are those of the wav-reading loader.

Randomness: every random choice (global order, shuffle and sort buffers, dither, SpecAugment masks) comes from
generators seeded by `(seed, epoch, rank, batch)`, never from global state, so an epoch's batches are
identical whatever happened before (resume) and on CPU runs are bit-identical.
"""

import os
import queue
import threading

import numpy as np
import torch

from kws.audio_store import AudioStore, MemoryStore, samples_on_device
from kws.batch_augment import BatchAugment, parse_conf
from kws.config import DEFAULT_BATCH_SIZE, DEFAULT_FILTER, DEFAULT_SHUFFLE_SIZE, DEFAULT_SORT_SIZE, DEFAULT_SPEC_AUG
from kws.datalist import FILLER, read_data_list, require_labels
from kws.device import to_device
from kws.errors import KwsError
from kws.features import batch_fbank, fbank_conf_of, frame_geometry, inference_fbank, num_frames
from kws.mel_warp import MelWarp
from kws.mel_warp import parse_conf as parse_mel_warp
from kws.time_warp import TimeWarp
from kws.time_warp import parse_conf as parse_time_warp

# Separate streams so that changing one kind of randomness does not shift the others.
_STREAM_ORDER, _STREAM_BUFFER, _STREAM_SPECAUG, _STREAM_DITHER, _STREAM_SORT, _STREAM_CROP = 0, 1, 2, 3, 4, 5
_STREAM_AUGMENT, _STREAM_MEL_WARP, _STREAM_TIME_WARP = 6, 7, 8
# Batches are padded to a multiple of this many frames. With every batch a new length, CPU training
# grew by ~1 GB per process over a run (glibc heap fragmentation and oneDNN's per-shape primitive
# cache); with a few dozen lengths memory stays flat and steps are no slower (bench/bench_memory.py).
PAD_MULTIPLE = 32


def input_dim_of(dataset_conf):
    return int(fbank_conf_of(dataset_conf)["num_mel_bins"])


def cv_dataset_conf(train_conf):
    """The evaluation variant of a training dataset_conf: no shuffle, no SpecAugment, no random dither
    (its expected power instead: kws.features.inference_fbank)."""
    conf = dict(train_conf)
    conf["shuffle"] = False
    conf["spec_aug"] = False
    conf["sort"] = False
    conf.pop("stratify", None)
    conf["speed_perturb"] = False
    conf.pop("crop_negatives", None)  # whole utterances
    conf.pop("batch_augment", None)  # the utterances as they are
    conf.pop("mel_warp", None)  # and their speakers
    conf.pop("time_warp", None)  # and rhythm
    conf["fbank_conf"] = inference_fbank(fbank_conf_of(train_conf))
    conf.pop("feature_extraction_conf", None)
    return conf


def _rng(*entropy):
    return np.random.default_rng([int(x) for x in entropy])


def shard_order(num_items, seed, epoch, shuffle, rank=0, world_size=1):
    """The item indices rank `rank` reads in an epoch (see the module docstring)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
    order = _rng(seed, epoch, _STREAM_ORDER).permutation(num_items) if shuffle else np.arange(num_items)
    return order[rank::world_size].tolist()


def keyword_end_frames(items, fbank_conf, sample_rate=16000):
    """{key: frame} for the items with a keyword_end (seconds; the synthetic corpus records it): the
    first frame whose analysis window reaches the end of the keyword."""
    window, shift = frame_geometry(fbank_conf, sample_rate)
    ends = {}
    for item in items:
        if item.get("keyword_end") is not None:
            end = int(round(float(item["keyword_end"]) * sample_rate))
            ends[item["key"]] = max(0, -(-(end - window) // shift))
    return ends


def padded_length(frames):
    """Batch length for a longest utterance of `frames`: rounded up to a multiple of PAD_MULTIPLE."""
    return -(-int(frames) // PAD_MULTIPLE) * PAD_MULTIPLE


def spec_augment_masks(frames, length, dims, rng, num_t_mask=1, num_f_mask=1, max_t=20, max_f=10):
    """WeKws SpecAugment's masks for a batch, drawn on the host: (time [B, length], mel [B, dims]) bool
    arrays, True where the features are zeroed. Row b gets `num_t_mask` time bands (1..max_t frames)
    inside its `frames[b]` valid frames and `num_f_mask` mel bands (1..max_f), drawn from `rng` in that
    order, row after row. Applied by one masked fill on the device (a loop of slices there is two
    kernel launches per utterance); the padded frames it also covers are zeros already."""
    time_mask = np.zeros((len(frames), length), dtype=bool)
    mel_mask = np.zeros((len(frames), dims), dtype=bool)
    for row, count in enumerate(frames):
        for _ in range(int(num_t_mask)):
            if count < 1 or max_t < 1:
                break
            start = int(rng.integers(0, count))
            time_mask[row, start : min(count, start + int(rng.integers(1, int(max_t) + 1)))] = True
        for _ in range(int(num_f_mask)):
            if dims < 1 or max_f < 1:
                break
            start = int(rng.integers(0, dims))
            mel_mask[row, start : min(dims, start + int(rng.integers(1, int(max_f) + 1)))] = True
    return time_mask, mel_mask


def gather_padded(samples, starts, lengths):
    """[B, longest] zero-padded rows of `samples` (one flat tensor, e.g. a store on the GPU): row b is
    samples[starts[b] : starts[b] + lengths[b]]. `starts` and `lengths` are host arrays; a few kernels
    on the samples' device, no host sync."""
    lengths = np.asarray(lengths, dtype=np.int64)
    longest = int(lengths.max()) if lengths.size else 0
    positions = torch.arange(longest, device=samples.device)
    index = to_device(np.asarray(starts, dtype=np.int64), samples.device)[:, None] + positions
    valid = positions < to_device(lengths, samples.device)[:, None]
    picked = samples[index.clamp_(max=max(samples.numel() - 1, 0))]
    return picked.masked_fill_(~valid, 0)


def prefetched(batches, depth=4):
    """`batches` iterated by a background thread up to `depth` ahead: the host assembles the next
    batches while the device computes (numpy's copies release the GIL). Errors are raised here, in
    order; closing the generator stops the thread."""
    ready = queue.Queue(depth)
    stop = threading.Event()
    done = object()

    def put(item):
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False

    def work():
        try:
            for batch in batches:
                if not put(batch):
                    return
            put(done)
        except BaseException as err:  # noqa: BLE001 - re-raised in the consumer
            put(_Failure(err))

    thread = threading.Thread(target=work, name="kws-prefetch", daemon=True)
    thread.start()
    try:
        while (item := ready.get()) is not done:
            if isinstance(item, _Failure):
                raise item.error
            yield item
    finally:
        stop.set()
        thread.join()


class _Failure:
    def __init__(self, error):
        self.error = error


def pinned(batch):
    """A host batch with its samples in pinned memory, so their copy to a GPU is queued, not waited on."""
    keys, samples, lengths, targets = batch
    return keys, samples.pin_memory(), lengths, targets


class KwsDataset:
    """An epoch's batches of one rank's shard of a data.list (see the module docstring).

    `store`: an AudioStore (or its folder) holding the list's audio; None decodes the list into memory.
    `rank`/`world_size` default to the initialised torch.distributed group (else 0/1). Call
    `set_epoch(e)` before each epoch.
    """

    def __init__(
        self,
        data_list,
        dataset_conf,
        seed=666,
        rank=None,
        world_size=None,
        num_keywords=None,
        items=None,
        store=None,
        dictionary=None,
    ):
        self.data_list = str(data_list)
        self.items = items if items is not None else read_data_list(data_list, num_keywords, dictionary)
        require_labels(self.items, data_list)
        self.conf = dict(dataset_conf or {})
        self.fbank_conf = fbank_conf_of(self.conf)
        if store is None:
            store = MemoryStore(self.items)
        elif isinstance(store, (str, os.PathLike)):
            store = AudioStore(store, data_list=data_list, items=self.items)
        self.store = store
        self.rows = np.array([store.row[item["key"]] for item in self.items], dtype=np.int64)
        self.frames = num_frames(store.lengths[self.rows], self.fbank_conf)
        self.labels = [item["label"] for item in self.items]
        # crop_negatives: a filler longer than this many frames trains on a random window of that many
        # (a new one each epoch). Any part of a negative is a negative; a batch's length is its longest
        # utterance's, so one long filler made 15 others pad to it.
        self.crop_frames = int(self.conf.get("crop_negatives") or 0)
        if self.crop_frames < 0:
            raise KwsError(f"dataset_conf.crop_negatives must be >= 0 frames, got {self.crop_frames}")
        self.cropped = np.array(
            [
                bool(self.crop_frames) and label == FILLER and frames > self.crop_frames
                for label, frames in zip(self.labels, self.frames)
            ],
            dtype=bool,
        )
        self.batch_frames = np.where(self.cropped, self.crop_frames, self.frames)
        self.filter_conf = {**DEFAULT_FILTER, **(self.conf.get("filter_conf") or {})}
        self.shuffle = bool(self.conf.get("shuffle", False))
        self.shuffle_size = int((self.conf.get("shuffle_conf") or {}).get("shuffle_size", DEFAULT_SHUFFLE_SIZE))
        self.sort = bool(self.conf.get("sort", False))
        self.sort_size = int((self.conf.get("sort_conf") or {}).get("sort_size", DEFAULT_SORT_SIZE))
        if self.sort and self.sort_size < 1:
            raise KwsError(f"dataset_conf.sort_conf.sort_size must be >= 1, got {self.sort_size}")
        # stratify (kwsflow's, with sort): plain sorting makes batches of one class where length goes
        # with the class (short near-misses, long keyword + command utterances, 4 s filler crops).
        self.stratify = bool(self.conf.get("stratify", False))
        batch_conf = self.conf.get("batch_conf") or {}
        self.batch_type = batch_conf.get("batch_type", "static")
        self.batch_size = int(batch_conf.get("batch_size", DEFAULT_BATCH_SIZE))
        self.max_frames_in_batch = int(batch_conf.get("max_frames_in_batch", 12000))
        if self.batch_type not in ("static", "dynamic"):
            raise KwsError(f"dataset_conf.batch_conf.batch_type: expected static or dynamic, got {self.batch_type!r}")
        if self.batch_size < 1:
            raise KwsError(f"dataset_conf.batch_conf.batch_size must be >= 1, got {self.batch_size}")
        if self.stratify and not (self.sort and self.batch_type == "static"):
            raise KwsError("dataset_conf.stratify needs sort: true and batch_conf.batch_type: static")
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
        return len(self.plan())

    # -- the plan ---------------------------------------------------------------------------------

    def plan(self, rank=None):
        """This epoch's batches of `rank` (default: this one) as lists of item indices."""
        rank = self.rank if rank is None else rank
        max_len, min_len = int(self.filter_conf["max_length"]), int(self.filter_conf["min_length"])
        order = [
            i
            for i in shard_order(len(self.items), self.seed, self.epoch, self.shuffle, rank, self.world_size)
            if max(min_len, 1) <= self.frames[i] <= max_len
        ]
        if self.shuffle and self.shuffle_size > 1:
            # WeKws's shuffle buffer, drawn as kwsflow's loader drew it (worker 0 of 1): the same batches
            # in the same order as before the audio store.
            rng = _rng(self.seed, self.epoch, rank, 0, _STREAM_BUFFER)
            order = [
                buffer[j]
                for start in range(0, len(order), self.shuffle_size)
                for buffer in [order[start : start + self.shuffle_size]]
                for j in rng.permutation(len(buffer))
            ]
        if not self.sort:
            return self._batched(order)
        rng = _rng(self.seed, self.epoch, rank, _STREAM_SORT)
        batches = []
        for start in range(0, len(order), self.sort_size):
            buffer = order[start : start + self.sort_size]
            if self.stratify:
                sorted_batches = self._stratified(buffer)
            else:
                sorted_batches = self._batched(sorted(buffer, key=lambda i: self.batch_frames[i]))  # stable
            batches += [
                sorted_batches[j]
                for j in (rng.permutation(len(sorted_batches)) if self.shuffle else range(len(sorted_batches)))
            ]
        return batches

    def batch_counts(self):
        """Batches each rank has this epoch: [count of rank 0, ..., count of rank W-1]."""
        return [len(self.plan(rank)) for rank in range(self.world_size)]

    def padding(self, rank=None):
        """Padded frames over real frames of this epoch's batches of `rank` (what sorting saves)."""
        plan = self.plan(rank)
        padded = sum(padded_length(max(self.batch_frames[i] for i in batch)) * len(batch) for batch in plan)
        real = sum(int(self.batch_frames[i]) for batch in plan for i in batch)
        return padded / real if real else float("nan")

    def _batched(self, indices):
        if self.batch_type == "static":
            return [indices[i : i + self.batch_size] for i in range(0, len(indices), self.batch_size)]
        batches, batch, longest = [], [], 0
        for i in indices:
            new_longest = max(longest, padded_length(self.batch_frames[i]))
            if batch and new_longest * (len(batch) + 1) > self.max_frames_in_batch:
                batches.append(batch)
                batch, new_longest = [], padded_length(self.batch_frames[i])
            longest = new_longest
            batch.append(i)
        return batches + ([batch] if batch else [])

    def _stratified(self, buffer):
        """The buffer in batch_size batches of similar lengths that keep its class mix: each class (label)
        sorted by length on its own, its item at rank j of m going to batch floor(j * n / m) of n, so
        every batch holds the same length quantile of every class and about its share of each."""
        count = -(-len(buffer) // self.batch_size)
        batches = [[] for _ in range(count)]
        for label in sorted(set(self.labels[i] for i in buffer)):
            members = sorted((i for i in buffer if self.labels[i] == label), key=lambda i: self.batch_frames[i])
            for rank, i in enumerate(members):
                batches[rank * count // len(members)].append(i)
        return [batch for batch in batches if batch]

    def crop_window(self, index):
        """(first sample, samples) of item `index` this epoch: a random window for a cropped filler
        (seeded by seed, epoch and the item), the whole utterance otherwise."""
        length = int(self.store.lengths[self.rows[index]])
        if not self.cropped[index]:
            return 0, length
        window, shift = frame_geometry(self.fbank_conf)
        keep = window + (self.crop_frames - 1) * shift
        start = int(_rng(self.seed, self.epoch, index, _STREAM_CROP).integers(0, length - keep + 1))
        return start, keep

    def batch(self, indices):
        """Host batch (keys, samples int16 [B, S], sample_lengths [B], targets [B]) of item indices."""
        windows = [self.crop_window(i) for i in indices]
        lengths = np.array([keep for _, keep in windows], dtype=np.int64)
        samples = np.zeros((len(indices), int(lengths.max())), dtype=np.int16)
        for row, (i, (start, keep)) in enumerate(zip(indices, windows)):
            samples[row, :keep] = self.store.samples(self.rows[i])[start : start + keep]
        return self._labelled(indices, torch.from_numpy(samples), lengths)

    def gathered_batch(self, indices, samples):
        """batch(), its samples gathered from `samples`: the store's samples as one tensor (on a GPU:
        kws.audio_store.samples_on_device), so the host only computes where each utterance starts."""
        windows = [self.crop_window(i) for i in indices]
        starts = np.array([self.store.offsets[self.rows[i]] + start for i, (start, _) in zip(indices, windows)])
        lengths = np.array([keep for _, keep in windows], dtype=np.int64)
        return self._labelled(indices, gather_padded(samples, starts, lengths), lengths)

    def _labelled(self, indices, samples, lengths):
        return (
            [self.items[i]["key"] for i in indices],
            samples,
            torch.from_numpy(lengths),
            torch.tensor([self.labels[i] for i in indices]),
        )

    def __iter__(self):
        for indices in self.plan():
            yield self.batch(indices)


class Featurizer:
    """Host batches -> feature batches on `device`: dither, fbank and SpecAugment of the dataset_conf,
    seeded by (seed, epoch, rank, batch index). Frames are zero-padded to a multiple of PAD_MULTIPLE.
    Each utterance's frame count stays on the host (what the trainer reads there costs no sync)."""

    def __init__(self, dataset_conf, seed=666, rank=0, device="cpu", store_on_device=True, anchors=None):
        self.conf = dict(dataset_conf or {})
        self.fbank_conf = fbank_conf_of(self.conf)
        self.dither = float(self.fbank_conf.get("dither", 0.0))
        self.spec_aug = bool(self.conf.get("spec_aug", False))
        self.spec_aug_conf = {**DEFAULT_SPEC_AUG, **(self.conf.get("spec_aug_conf") or {})}
        self.seed, self.rank = int(seed), int(rank)
        self.device = torch.device(device)
        augment = parse_conf(self.conf.get("batch_augment"))
        self.augment = BatchAugment(augment, self.device) if augment else None
        mel_warp = parse_mel_warp(self.conf.get("mel_warp"))
        self.mel_warp = MelWarp(mel_warp) if mel_warp else None
        # anchors: {key: frame} that time_warp keeps in place (a positive's keyword end)
        time_warp = parse_time_warp(self.conf.get("time_warp"))
        self.time_warp = TimeWarp(time_warp, anchors) if time_warp else None
        # On a GPU, batches are gathered from a copy of the store there (False: always the host path)
        self.store_on_device = bool(store_on_device)
        self._device_copy = None  # (store, its samples on the GPU, or None where they do not fit)

    def __call__(self, batch, epoch, index):
        keys, samples, lengths, targets = batch
        entropy = (self.seed, epoch, self.rank, index)
        samples = to_device(samples, self.device)  # int16; fbank reads them on that scale
        if self.augment is not None:
            # negatives are the babble talkers: a keyword mixed into another utterance would be a keyword there
            talkers = (targets == FILLER).numpy()
            samples = self.augment(samples, lengths, _rng(*entropy, _STREAM_AUGMENT), talkers)
        generator = None
        if self.dither > 0:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(int(_rng(*entropy, _STREAM_DITHER).integers(2**62)))
        if self.device.type == "cpu":
            feats = self._one_by_one(samples, lengths, generator)
        else:  # one batched call: what a GPU is fast at
            feats, _ = batch_fbank(samples, lengths, self.fbank_conf, self.dither, generator, int16_scale=True)
        frames = num_frames(lengths, self.fbank_conf)  # on the host, as the lengths: read without a sync
        warped = torch.zeros(len(keys), dtype=torch.bool)
        if self.mel_warp is not None:
            feats, warped = self.mel_warp(feats, _rng(*entropy, _STREAM_MEL_WARP))
        if self.time_warp is not None:
            feats = self.time_warp(feats, keys, frames.tolist(), _rng(*entropy, _STREAM_TIME_WARP))
        if self.spec_aug:
            rng = _rng(*entropy, _STREAM_SPECAUG)
            conf = {k: self.spec_aug_conf[k] for k in DEFAULT_SPEC_AUG}
            time_mask, mel_mask = spec_augment_masks(frames.tolist(), feats.shape[1], feats.shape[2], rng, **conf)
            time_mask, mel_mask = to_device(time_mask, self.device), to_device(mel_mask, self.device)
            feats.masked_fill_(time_mask[:, :, None] | mel_mask[:, None, :], 0)
        extra = padded_length(feats.shape[1]) - feats.shape[1]
        if extra:
            feats = torch.nn.functional.pad(feats, (0, 0, 0, extra))
        return keys, feats, frames, to_device(targets, self.device), warped

    def _one_by_one(self, samples, lengths, generator):
        """batch_fbank of each utterance on its own valid samples: on a CPU the padding (2x the real
        frames on the default corpus) would cost as much fbank and dither as the speech."""
        frames = num_frames(lengths, self.fbank_conf)
        feats = torch.zeros(samples.shape[0], int(frames.max()), int(self.fbank_conf["num_mel_bins"]))
        for row, length in enumerate(lengths.tolist()):
            one, _ = batch_fbank(
                samples[row : row + 1, :length], [length], self.fbank_conf, self.dither, generator, int16_scale=True
            )
            feats[row, : one.shape[1]] = one[0]
        return feats

    def batches(self, dataset, epoch):
        """The dataset's batches of `epoch`, featurised. On a GPU the samples come from the store's copy
        there (uploaded at the first epoch) when it fits, else from host batches assembled and pinned
        by a background thread; on a CPU from host batches, in this thread."""
        dataset.set_epoch(epoch)
        if self.device.type != "cuda":
            host = iter(dataset)
        elif self.store_on_device and (on_device := self._device_samples(dataset.store)) is not None:
            host = (dataset.gathered_batch(indices, on_device) for indices in dataset.plan())
        else:
            host = prefetched(map(pinned, dataset))
        for index, batch in enumerate(host):
            yield self(batch, epoch, index)

    def _device_samples(self, store):
        if self._device_copy is None or self._device_copy[0] is not store:
            self._device_copy = None  # one store at a time: free the last one's copy first
            self._device_copy = (store, samples_on_device(store, self.device))
        return self._device_copy[1]
