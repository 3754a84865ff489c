"""The training data path: sharding by rank, batch plans known in advance, determinism, epochs, filters,
batches featurised on the batch equal to per-utterance features."""

import collections
import json
import time

import numpy as np
import pytest
import soundfile
import torch

from helpers_train import TINY_CONFIG, make_split
from kws.audio import read_wav, write_wav
from kws.dataset import (
    Featurizer,
    KwsDataset,
    cv_dataset_conf,
    gather_padded,
    prefetched,
    shard_order,
    spec_augment_masks,
)
from kws.errors import KwsError
from kws.features import compute_fbank


@pytest.fixture(scope="module")
def train_list(tmp_path_factory):
    data_list, items = make_split(tmp_path_factory.mktemp("corpus") / "train", 11, seed=3)
    return data_list, items


def conf(**changes):
    result = dict(TINY_CONFIG["dataset_conf"])
    result.update(changes)
    return result


def epoch_batches(data_list, dataset_conf, world_size, epoch=0, seed=666):
    """{rank: [featurised batch, ...]} as each rank's training loop receives them."""
    result = {}
    for rank in range(world_size):
        dataset = KwsDataset(data_list, dataset_conf, seed=seed, rank=rank, world_size=world_size)
        result[rank] = list(Featurizer(dataset_conf, seed, rank).batches(dataset, epoch))
        assert dataset.batch_counts() == [len(dataset.plan(r)) for r in range(world_size)]
        assert dataset.batch_counts()[rank] == len(result[rank])
    return result


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_shard_order_covers_every_item_once(world_size):
    for num_items in (0, 1, 7, 11, 12):
        for epoch in (0, 1):
            seen = []
            for rank in range(world_size):
                seen += shard_order(num_items, 666, epoch, True, rank, world_size)
            assert sorted(seen) == list(range(num_items))
            sizes = [len(shard_order(num_items, 666, epoch, True, r, world_size)) for r in range(world_size)]
            assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("sort", [False, True, "stratify"])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_every_utterance_exactly_once_across_ranks(train_list, world_size, sort):
    data_list, items = train_list
    sorting = {"sort": True, "sort_conf": {"sort_size": 5}, "stratify": sort == "stratify"} if sort else {}
    batches = epoch_batches(data_list, conf(**sorting), world_size, epoch=1)
    keys = collections.Counter(key for rank in batches.values() for batch in rank for key in batch[0])
    assert keys == collections.Counter(item["key"] for item in items)
    for rank_batches in batches.values():
        for keys_, feats, lengths, targets, warped in rank_batches:
            assert not warped.any()  # no mel_warp configured
            assert feats.dtype == torch.float32 and feats.dim() == 3 and feats.shape[2] == 16
            assert feats.shape[0] == len(keys_) == lengths.numel() == targets.numel() <= 4
            assert feats.shape[1] % 32 == 0 and 0 <= feats.shape[1] - int(lengths.max()) < 32
            for row, length in enumerate(lengths.tolist()):  # padding is zeros
                assert torch.all(feats[row, length:] == 0)


def test_batch_features_equal_per_utterance_features(train_list):
    """fbank on the padded batch is the features of each utterance alone (dither 0), zero-padded."""
    data_list, items = train_list
    by_key = {item["key"]: item for item in items}
    cv = cv_dataset_conf(conf())
    for keys, feats, lengths, _, _ in epoch_batches(data_list, cv, 1)[0]:
        for row, key in enumerate(keys):
            alone = compute_fbank(read_wav(by_key[key]["wav"]), cv["fbank_conf"], dither=0.0)
            assert int(lengths[row]) == alone.shape[0]
            assert torch.allclose(feats[row, : alone.shape[0]], alone, atol=1e-4)


def test_deterministic_and_epoch_dependent(train_list):
    data_list, _ = train_list
    first = epoch_batches(data_list, conf(), 2, epoch=0)
    again = epoch_batches(data_list, conf(), 2, epoch=0)
    later = epoch_batches(data_list, conf(), 2, epoch=1)

    def flat(result):
        return [(tuple(b[0]), b[1]) for rank in sorted(result) for b in result[rank]]

    for (keys_a, feats_a), (keys_b, feats_b) in zip(flat(first), flat(again), strict=True):
        assert keys_a == keys_b and torch.equal(feats_a, feats_b)
    assert [k for k, _ in flat(first)] != [k for k, _ in flat(later)]
    other_seed = epoch_batches(data_list, conf(), 2, epoch=0, seed=1)
    assert [k for k, _ in flat(first)] != [k for k, _ in flat(other_seed)]


def test_sorting_batches_similar_lengths_in_random_order(train_list):
    data_list, items = train_list
    sorting = conf(sort=True, sort_conf={"sort_size": 8}, batch_conf={"batch_size": 2})

    def padded_and_real(dataset_conf, epoch=0):
        batches = epoch_batches(data_list, dataset_conf, 1, epoch=epoch)[0]
        padded = sum(b[1].shape[0] * b[1].shape[1] for b in batches)
        return padded, sum(int(b[2].sum()) for b in batches), batches

    padded, real, batches = padded_and_real(sorting)
    unsorted_padded, unsorted_real, _ = padded_and_real(conf(batch_conf={"batch_size": 2}))
    assert real == unsorted_real and padded < unsorted_padded
    # within each buffer of 8 utterances (4 batches), every batch is a run of the buffer sorted by length
    for start in range(0, len(batches), 4):
        group = batches[start : start + 4]
        runs = sorted((sorted(b[2].tolist()) for b in group), key=lambda run: run[0])
        flat = [n for run in runs for n in run]
        assert flat == sorted(flat)
    assert [b[0] for b in batches] == [b[0] for b in padded_and_real(sorting)[2]]  # deterministic
    assert [b[0] for b in batches] != [b[0] for b in padded_and_real(sorting, epoch=1)[2]]
    cv = cv_dataset_conf(sorting)
    assert cv["sort"] is False


@pytest.fixture(scope="module")
def length_gives_class_away(tmp_path_factory):
    """30 utterances whose length gives their class away, as on the synthetic corpus: fillers long (1.0-1.4
    s), keyword 0 short (0.3-0.5 s), keyword 1 in between (0.6-0.8 s); 10 of each, in mixed order."""
    folder = tmp_path_factory.mktemp("lengths")
    rng = np.random.default_rng(5)
    items = []
    for i in range(30):
        label = (i % 3) - 1
        low = {-1: 1.0, 0: 0.3, 1: 0.6}[label]
        path = folder / f"u{i:02d}.wav"
        write_wav(path, (0.1 * rng.standard_normal(int(16000 * rng.uniform(low, low + 0.4)))).astype(np.float32))
        items.append({"key": f"u{i:02d}", "txt": label, "duration": 1.0, "wav": str(path)})
    data_list = folder / "data.list"
    data_list.write_text("".join(json.dumps(item) + "\n" for item in items))
    return data_list


def test_stratified_sorting_keeps_every_batch_mixed(length_gives_class_away):
    """Plain sorting makes one-class batches where length gives the class away; stratify gives every batch
    one utterance of each class at the same length quantile of its class."""
    batching = {"sort_conf": {"sort_size": 30}, "batch_conf": {"batch_size": 3}}
    plain = KwsDataset(length_gives_class_away, conf(sort=True, **batching), world_size=1)
    mixed = KwsDataset(length_gives_class_away, conf(sort=True, stratify=True, **batching), world_size=1)

    def classes(dataset):
        return [sorted(dataset.labels[i] for i in batch) for batch in dataset.plan()]

    assert sum(len(set(labels)) == 1 for labels in classes(plain)) >= 8  # nearly all one class
    assert classes(mixed) == [[-1, 0, 1]] * 10
    assert sorted(i for batch in mixed.plan() for i in batch) == list(range(30))

    # each class's lengths rise with the batch's place in the sorted order: batch k holds every class's
    # k-th shortest; the batches themselves come in random order
    def total(batch):
        return sum(mixed.frames[i] for i in batch)

    by_rank = sorted(mixed.plan(), key=total)
    for label in (-1, 0, 1):
        frames = [mixed.frames[i] for batch in by_rank for i in batch if mixed.labels[i] == label]
        assert frames == sorted(frames)
    assert mixed.plan() != by_rank
    assert 1 <= plain.padding() < mixed.padding()  # what the trainer logs
    mixed.set_epoch(1)
    assert classes(mixed) == [[-1, 0, 1]] * 10
    assert "stratify" not in cv_dataset_conf(conf(sort=True, stratify=True))


@pytest.mark.parametrize(
    "changes", [{"stratify": True}, {"sort": True, "stratify": True, "batch_conf": {"batch_type": "dynamic"}}]
)
def test_stratify_needs_sorted_static_batches(length_gives_class_away, changes):
    with pytest.raises(KwsError, match=r"dataset_conf.stratify needs sort: true and batch_conf.batch_type: static"):
        KwsDataset(length_gives_class_away, conf(**changes), world_size=1)


def test_cv_conf_is_plain_and_in_file_order(train_list):
    data_list, items = train_list
    cv = cv_dataset_conf(conf())
    assert cv["spec_aug"] is False and cv["shuffle"] is False and cv["fbank_conf"]["dither"] == 0.0
    assert cv["fbank_conf"]["dither_floor"] == conf()["fbank_conf"]["dither"]  # its expected power instead
    batches = epoch_batches(data_list, cv, 1)
    assert [k for b in batches[0] for k in b[0]] == [item["key"] for item in items]
    again = epoch_batches(data_list, cv, 1, epoch=5)
    assert all(torch.equal(a[1], b[1]) for a, b in zip(batches[0], again[0], strict=True))


def test_length_filter_drops_long_and_short(train_list):
    data_list, items = train_list
    cv = cv_dataset_conf(conf(filter_conf={"min_length": 40, "max_length": 55}))
    batches = epoch_batches(data_list, cv, 1)
    lengths = [n for b in batches[0] for n in b[2].tolist()]
    assert lengths and all(40 <= n <= 55 for n in lengths)
    assert len(lengths) < len(items)


def test_dynamic_batches_respect_frame_budget(train_list):
    data_list, items = train_list
    cv = cv_dataset_conf(conf(batch_conf={"batch_type": "dynamic", "max_frames_in_batch": 150}))
    batches = epoch_batches(data_list, cv, 1)
    assert sum(len(b[0]) for b in batches[0]) == len(items)
    assert all(b[1].shape[0] * b[1].shape[1] <= 150 or b[1].shape[0] == 1 for b in batches[0])


def test_spec_augment_masks_bands_inside_each_rows_frames():
    rng = np.random.default_rng(0)
    frames = [50, 30, 0]
    time_mask, mel_mask = spec_augment_masks(frames, 64, 16, rng, num_t_mask=2, num_f_mask=1, max_t=5, max_f=3)
    assert time_mask.shape == (3, 64) and mel_mask.shape == (3, 16)
    for row, count in enumerate(frames[:2]):
        assert 1 <= time_mask[row].sum() <= 10 and not time_mask[row, count:].any()
        assert 1 <= mel_mask[row].sum() <= 3
    assert not time_mask[2].any()  # no valid frame, no time band


def test_batch_gathered_from_the_store_equals_the_host_batch(train_list):
    """The GPU's way to a batch (kws.dataset.gather_padded from the store's samples as one tensor)
    gives the very samples of the host's, long negatives' crop windows included."""
    data_list, _ = train_list
    dataset = KwsDataset(data_list, conf(crop_negatives=40, batch_conf={"batch_size": 4}), seed=666)
    flat = torch.from_numpy(dataset.store.all_samples)
    for epoch in (1, 2):
        dataset.set_epoch(epoch)
        for indices in dataset.plan():
            host, gathered = dataset.batch(indices), dataset.gathered_batch(indices, flat)
            assert host[0] == gathered[0] and torch.equal(host[2], gathered[2]) and torch.equal(host[3], gathered[3])
            assert gathered[1].dtype == torch.int16 and torch.equal(host[1], gathered[1])
    edge = gather_padded(torch.arange(1, 6, dtype=torch.int16), [3, 0], [2, 1])  # a row ending at the last sample
    assert edge.tolist() == [[4, 5], [1, 0]]


def test_prefetched_keeps_order_raises_in_place_and_stops_when_closed():
    assert list(prefetched(iter(range(50)), depth=2)) == list(range(50))

    def failing():
        yield 1
        raise KwsError("bad batch")

    got = []
    with pytest.raises(KwsError, match="bad batch"):
        for item in prefetched(failing()):
            got.append(item)
    assert got == [1]
    pulled = []

    def endless():
        while True:
            pulled.append(1)
            yield len(pulled)

    stream = prefetched(endless(), depth=2)
    assert next(stream) == 1
    stream.close()  # the thread stops instead of running on
    count = len(pulled)
    time.sleep(0.3)
    assert count <= 5 and len(pulled) == count


def test_long_negatives_train_on_a_window_that_moves_each_epoch(train_list):
    """crop_negatives: a filler longer than N frames is cut to a random N-frame window of its own audio,
    a new one each epoch (the same on a rerun); keywords stay whole; evaluation sees every utterance whole."""
    data_list, items = train_list
    crop = conf(crop_negatives=40)
    whole = {item["key"]: torch.from_numpy(soundfile.read(item["wav"], dtype="int16")[0]) for item in items}
    starts = collections.defaultdict(set)
    for epoch in (0, 1, 2):
        dataset = KwsDataset(data_list, crop, seed=666)
        dataset.set_epoch(epoch)
        for indices in dataset.plan():
            keys, samples, lengths, targets = dataset.batch(indices)
            for row, key in enumerate(keys):
                audio = whole[key]
                got = samples[row, : lengths[row]]
                frames = 1 + (len(audio) - 400) // 160
                if targets[row] == -1 and frames > 40:
                    assert len(got) == 400 + 39 * 160
                    start = next(
                        s for s in range(len(audio) - len(got) + 1) if torch.equal(audio[s : s + len(got)], got)
                    )
                    starts[key].add(start)
                else:
                    assert torch.equal(got, audio)
    assert starts and any(len(s) > 1 for s in starts.values())
    again = KwsDataset(data_list, crop, seed=666)
    again.set_epoch(2)
    first = KwsDataset(data_list, crop, seed=666)
    first.set_epoch(2)
    assert all(torch.equal(a[1], b[1]) for a, b in zip(again, first, strict=True))
    assert "crop_negatives" not in cv_dataset_conf(crop)
