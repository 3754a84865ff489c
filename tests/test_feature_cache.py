"""kws.feature_cache: cached fbank equals on-the-fly fbank (dither 0), the dataset from a cache yields the
same utterances and sharding, training runs from it, and a broken cache stops with a clear error."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers_train import TINY_CONFIG, make_corpus, make_split
from kws.audio import read_wav
from kws.dataset import KwsDataset, make_loader
from kws.datalist import read_data_list
from kws.errors import KwsError
from kws.feature_cache import FeatureCache, build_cache
from kws.features import compute_fbank

FBANK = TINY_CONFIG["dataset_conf"]["fbank_conf"]
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("fc")
    data_list, items = make_split(root / "train", 23, seed=3)
    cache = root / "cache"
    build_cache(data_list, cache, FBANK, threads=1)
    return data_list, items, cache


def conf(**changes):
    out = json.loads(json.dumps(TINY_CONFIG["dataset_conf"]))
    out.update(changes)
    return out


@pytest.mark.parametrize("threads", [1, 2])
def test_cached_features_equal_on_the_fly(corpus, tmp_path, threads):
    data_list, items, cache_dir = corpus
    if threads == 2:
        cache_dir = tmp_path / "cache2"
        build_cache(data_list, cache_dir, FBANK, threads=2)
    cache = FeatureCache(cache_dir, fbank_conf=FBANK, data_list=data_list, items=items)
    assert len(cache) == len(items)
    for item in items:
        expected = compute_fbank(read_wav(item["wav"]), FBANK, dither=0.0)
        got = cache.features(item["key"])
        assert got.dtype == torch.float32 and cache.num_frames(item["key"]) == expected.shape[0]
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_float16_cache_is_close(corpus, tmp_path):
    data_list, items, _ = corpus
    build_cache(data_list, tmp_path / "half", FBANK, dtype="float16")
    cache = FeatureCache(tmp_path / "half")
    item = items[0]
    expected = compute_fbank(read_wav(item["wav"]), FBANK, dither=0.0)
    torch.testing.assert_close(cache.features(item["key"]), expected, rtol=2e-3, atol=2e-2)


def _epoch(dataset, epoch, num_workers=0):
    dataset.set_epoch(epoch)
    return [(list(keys), feats.clone(), lengths.clone(), targets.clone())
            for keys, feats, lengths, targets in make_loader(dataset, num_workers)]


@pytest.mark.parametrize("world_size,num_workers", [(1, 0), (2, 2), (3, 1)])
def test_dataset_from_cache_same_utterances_and_sharding(corpus, world_size, num_workers):
    data_list, items, cache_dir = corpus
    dither_free = conf(fbank_conf={**FBANK, "dither": 0.0})
    for rank in range(world_size):
        plain = KwsDataset(data_list, dither_free, seed=5, rank=rank, world_size=world_size)
        cached = KwsDataset(data_list, dither_free, seed=5, rank=rank, world_size=world_size,
                            feature_cache=cache_dir)
        for epoch in (0, 1):
            a, b = _epoch(plain, epoch, num_workers), _epoch(cached, epoch, num_workers)
            assert [x[0] for x in a] == [x[0] for x in b]  # same keys, same batches, same order
            for (_, fa, la, ta), (_, fb, lb, tb) in zip(a, b):
                assert torch.equal(la, lb) and torch.equal(ta, tb)
                torch.testing.assert_close(fa, fb, rtol=0, atol=0)  # SpecAugment masks equal too


def test_cache_with_dither_config_keeps_keys(corpus):
    data_list, _, cache_dir = corpus
    plain = KwsDataset(data_list, conf(), seed=1)
    cached = KwsDataset(data_list, conf(), seed=1, feature_cache=cache_dir)
    assert [k for b in plain for k in b[0]] == [k for b in cached for k in b[0]]


def test_missing_and_corrupt_cache_errors(corpus, tmp_path):
    data_list, items, cache_dir = corpus
    with pytest.raises(KwsError, match="not found"):
        FeatureCache(tmp_path / "nope")
    broken = tmp_path / "broken"
    build_cache(data_list, broken, FBANK)
    # Truncated feature array.
    raw = (broken / "feats.npy").read_bytes()
    (broken / "feats.npy").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(KwsError, match="corrupt.*rebuild"):
        KwsDataset(data_list, conf(), feature_cache=broken)
    # Bad index.
    build_cache(data_list, broken, FBANK)
    offsets = np.load(broken / "offsets.npy")
    offsets[3] = offsets[-1] + 5
    np.save(broken / "offsets.npy", offsets)
    with pytest.raises(KwsError, match="corrupt"):
        FeatureCache(broken)
    # meta.json unreadable / missing.
    build_cache(data_list, broken, FBANK)
    (broken / "meta.json").write_text("{not json")
    with pytest.raises(KwsError, match="corrupt"):
        FeatureCache(broken)
    (broken / "meta.json").unlink()
    with pytest.raises(KwsError, match="incomplete"):
        FeatureCache(broken)


def test_mismatched_cache_errors(corpus, tmp_path):
    data_list, items, cache_dir = corpus
    with pytest.raises(KwsError, match="fbank settings"):
        FeatureCache(cache_dir, fbank_conf={**FBANK, "num_mel_bins": FBANK["num_mel_bins"] + 1})
    other_list, other_items = make_split(tmp_path / "other", 5, seed=9, start=500)
    with pytest.raises(KwsError, match="stale"):
        FeatureCache(cache_dir, data_list=other_list)
    with pytest.raises(KwsError, match="no features for 5"):
        FeatureCache(cache_dir, items=other_items)
    # A subset list of the same utterances is fine; the same keys on other wavs are stale.
    subset = tmp_path / "subset.list"
    subset.write_text("".join(json.dumps(item) + "\n" for item in items[:7]))
    FeatureCache(cache_dir, data_list=subset, items=items[:7])
    moved = [{**item, "wav": str(item["wav"]) + ".moved"} for item in items[:3]]
    with pytest.raises(KwsError, match="stale"):
        FeatureCache(cache_dir, data_list=subset, items=moved)
    # Dither does not matter (caches are dither 0).
    FeatureCache(cache_dir, fbank_conf={**FBANK, "dither": 1.0})


def cache_features(*args):
    return subprocess.run([sys.executable, str(REPO / "scripts" / "cache_features.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=300)


def test_cli_and_atomic_output(corpus, tmp_path):
    data_list, items, _ = corpus
    out = tmp_path / "cli"
    result = cache_features("--data-list", data_list, "--fbank-json", json.dumps(FBANK), "--out", out)
    assert result.returncode == 0, result.stderr
    assert f"{len(items)} utterances" in result.stdout
    assert sorted(p.name for p in out.iterdir()) == ["feats.npy", "meta.json", "offsets.npy"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left
    failed = cache_features("--data-list", tmp_path / "missing.list", "--out", tmp_path / "x")
    assert failed.returncode == 1 and failed.stderr.startswith("error: ") and "missing.list" in failed.stderr
    assert not (tmp_path / "x").exists()


def test_training_from_cache(tmp_path):
    from helpers_train import write_config
    from kws.trainer import main as train_main

    paths = make_corpus(tmp_path / "corpus")
    caches = {}
    for split in ("train", "dev"):
        caches[split] = tmp_path / "cache" / split
        build_cache(paths[split], caches[split], FBANK)
    config = write_config(tmp_path / "conf.yaml")
    model_dir = tmp_path / "model"
    assert train_main(["--config", str(config), "--train_data", str(paths["train"]), "--cv_data", str(paths["dev"]),
                       "--model_dir", str(model_dir), "--num_keywords", "2", "--min_duration", "2", "--gpus", "-1",
                       "--train_feature_cache", str(caches["train"]), "--cv_feature_cache", str(caches["dev"]),
                       "--max_epoch", "1", "--threads", "1"]) == 0
    assert (model_dir / "final.yaml").is_file()
    payload = torch.load(model_dir / "epoch_001.pt", weights_only=False)
    assert payload["fingerprint"]["feature_cache"] is True
    items = read_data_list(paths["train"])
    assert len(items) == 14
