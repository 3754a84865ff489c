"""kws.audio_store: the packed samples are the wavs' samples, the dataset reads the same batches from a
store as from the wavs, training from a store is the same run, and a broken store stops with a clear error."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers_train import TINY_CONFIG, make_corpus, make_split, train_argv, write_config
from kws.audio import read_wav
from kws.audio_store import AudioStore, MemoryStore, build_store, samples_on_device
from kws.dataset import Featurizer, KwsDataset
from kws.errors import KwsError

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    data_list, items = make_split(root / "train", 23, seed=3)
    store = root / "store"
    build_store(data_list, store, threads=1)
    return data_list, items, store


@pytest.mark.parametrize("threads", [1, 2])
def test_packed_samples_are_the_wav_samples(corpus, tmp_path, threads):
    data_list, items, store_dir = corpus
    if threads == 2:
        store_dir = tmp_path / "store2"
        build_store(data_list, store_dir, threads=2)
    store = AudioStore(store_dir, data_list=data_list, items=items)
    assert len(store) == len(items)
    for item in items:
        samples = store.samples(store.row[item["key"]])
        assert samples.dtype == np.int16
        assert np.array_equal(samples.astype(np.float32) / 32768.0, read_wav(item["wav"]))


@pytest.mark.parametrize("world_size", [1, 3])
def test_batches_from_a_store_equal_batches_from_the_wavs(corpus, world_size):
    data_list, items, store_dir = corpus
    conf = TINY_CONFIG["dataset_conf"]  # dither and SpecAugment on: their draws must match too
    for rank in range(world_size):
        featurize = Featurizer(conf, seed=5, rank=rank)
        plain = KwsDataset(data_list, conf, seed=5, rank=rank, world_size=world_size)
        packed = KwsDataset(data_list, conf, seed=5, rank=rank, world_size=world_size, store=store_dir)
        for epoch in (0, 1):
            a, b = list(featurize.batches(plain, epoch)), list(featurize.batches(packed, epoch))
            assert [x[0] for x in a] == [x[0] for x in b] and a
            for (_, fa, la, ta, _), (_, fb, lb, tb, _) in zip(a, b):
                assert torch.equal(la, lb) and torch.equal(ta, tb) and torch.equal(fa, fb)


@pytest.mark.parametrize("kind", ["packed", "memory"])
def test_store_copied_to_the_device_only_where_it_fits(corpus, monkeypatch, kind):
    """samples_on_device copies the whole store in chunks (the GPU's copy that batches are gathered from)
    and declines, leaving the host path, when it would take over a quarter of the free memory."""
    data_list, items, store_dir = corpus
    store = AudioStore(store_dir, data_list=data_list, items=items) if kind == "packed" else MemoryStore(items)
    nbytes = store.all_samples.nbytes
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (4 * nbytes, 8 * nbytes))
    copied = samples_on_device(store, "cpu", chunk=1000)  # a CPU stands in for the GPU: same code
    assert copied.dtype == torch.int16 and torch.equal(copied, torch.from_numpy(np.array(store.all_samples)))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (4 * nbytes - 1, 8 * nbytes))
    assert samples_on_device(store, "cpu") is None


def test_missing_and_corrupt_store_errors(corpus, tmp_path):
    data_list, items, _ = corpus
    with pytest.raises(KwsError, match="not found"):
        AudioStore(tmp_path / "nope")
    broken = tmp_path / "broken"
    build_store(data_list, broken)
    raw = (broken / "samples.npy").read_bytes()
    (broken / "samples.npy").write_bytes(raw[: len(raw) // 2])  # truncated
    with pytest.raises(KwsError, match="corrupt.*rebuild"):
        KwsDataset(data_list, TINY_CONFIG["dataset_conf"], store=broken)
    build_store(data_list, broken)
    offsets = np.load(broken / "offsets.npy")
    offsets[3] = offsets[-1] + 5
    np.save(broken / "offsets.npy", offsets)
    with pytest.raises(KwsError, match="corrupt"):
        AudioStore(broken)
    build_store(data_list, broken)
    (broken / "meta.json").write_text("{not json")
    with pytest.raises(KwsError, match="corrupt"):
        AudioStore(broken)
    (broken / "meta.json").unlink()
    with pytest.raises(KwsError, match="incomplete"):
        AudioStore(broken)


def test_stale_store_errors(corpus, tmp_path):
    data_list, items, store_dir = corpus
    other_list, other_items = make_split(tmp_path / "other", 5, seed=9, start=500)
    with pytest.raises(KwsError, match="stale"):
        AudioStore(store_dir, data_list=other_list)
    with pytest.raises(KwsError, match="no audio for utt0500"):
        AudioStore(store_dir, items=other_items)
    # A subset list of the same utterances (a smoke run's slice) is fine; the same keys on other wavs are stale.
    subset = tmp_path / "subset.list"
    subset.write_text("".join(json.dumps(item) + "\n" for item in items[:7]))
    AudioStore(store_dir, data_list=subset, items=items[:7])
    moved = [{**item, "wav": str(item["wav"]) + ".moved"} for item in items[:3]]
    with pytest.raises(KwsError, match="stale"):
        AudioStore(store_dir, data_list=subset, items=moved)


def pack_audio(*args):
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "pack_audio.py"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_cli_and_atomic_output(corpus, tmp_path):
    data_list, items, _ = corpus
    out = tmp_path / "cli"
    result = pack_audio("--data-list", data_list, "--out", out)
    assert result.returncode == 0, result.stderr
    assert f"{len(items)} utterances" in result.stdout
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "offsets.npy", "samples.npy"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left
    failed = pack_audio("--data-list", tmp_path / "missing.list", "--out", tmp_path / "x")
    assert failed.returncode == 1 and failed.stderr.startswith("error: ") and "missing.list" in failed.stderr
    assert not (tmp_path / "x").exists()


def test_training_from_a_store_is_the_run_without_one(tmp_path):
    """The workflow passes packed stores; WeKws's command line has none and the trainer packs its own
    into MODEL_DIR/audio: the same checkpoints either way."""
    from kws.trainer import main as train_main

    paths = make_corpus(tmp_path / "corpus")
    stores = {split: tmp_path / "store" / split for split in ("train", "dev")}
    for split, folder in stores.items():
        build_store(paths[split], folder)
    config = write_config(tmp_path / "conf.yaml")
    common = ["--threads", "1", "--max_epoch", "1"]
    assert (
        train_main(
            train_argv(
                paths,
                config,
                tmp_path / "a",
                *common,
                "--train_audio_store",
                stores["train"],
                "--cv_audio_store",
                stores["dev"],
            )
        )
        == 0
    )
    assert train_main(train_argv(paths, config, tmp_path / "b", *common)) == 0
    assert (tmp_path / "b" / "audio" / "train" / "samples.npy").is_file()
    a = torch.load(tmp_path / "a" / "epoch_001.pt", weights_only=True)
    b = torch.load(tmp_path / "b" / "epoch_001.pt", weights_only=True)
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
