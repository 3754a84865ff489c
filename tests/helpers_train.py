"""Helpers for the training tests: a tiny corpus of generated wavs in the DESIGN.md layout and a tiny config."""

import json
import sys
from pathlib import Path

import numpy as np
import yaml

from kws.audio import write_wav
from kws.launch import torchrun_command

TINY_CONFIG = {
    "dataset_conf": {
        "filter_conf": {"max_length": 2048, "min_length": 0},
        "fbank_conf": {"num_mel_bins": 16, "frame_shift": 10, "frame_length": 25, "dither": 1.0},
        "spec_aug": True,
        "spec_aug_conf": {"num_t_mask": 1, "num_f_mask": 1, "max_t": 5, "max_f": 3},
        "shuffle": True,
        "shuffle_conf": {"shuffle_size": 8},
        "batch_conf": {"batch_size": 4},
    },
    "model": {
        "hidden_dim": 12,
        "preprocessing": {"type": "linear"},
        "backbone": {"type": "tcn", "ds": True, "num_layers": 2, "kernel_size": 3, "dropout": 0.1},
        "classifier_dropout": 0.1,
    },
    "optim": "adam",
    "optim_conf": {"lr": 0.01, "weight_decay": 0.0001},
    "training_config": {"grad_clip": 5, "max_epoch": 2, "log_interval": 2, "criterion": "max_pooling"},
}


# The dictionary of these corpora: label -> token (WeKws HEAD writes the token into data.list's `txt`).
TOKENS = {-1: "<FILLER>", 0: "<HI_XIAOWEN>", 1: "<NIHAO_WENWEN>"}


def make_split(folder, num, seed, start=0, tokens=False):
    """`num` short utterances: keyword 0 = 440 Hz tone, keyword 1 = 880 Hz tone, filler = noise.

    data.list `txt` is the integer label (WeKws's older lists), or with `tokens` the token (WeKws HEAD's).
    """
    rng = np.random.default_rng(seed)
    folder = Path(folder)
    (folder / "wav").mkdir(parents=True, exist_ok=True)
    items = []
    for i in range(num):
        label = (i % 3) - 1  # -1, 0, 1
        seconds = float(rng.uniform(0.3, 0.7))
        n = int(16000 * seconds)
        t = np.arange(n) / 16000.0
        noise = 0.05 * rng.standard_normal(n)
        if label >= 0:
            samples = 0.3 * np.sin(2 * np.pi * (440.0 * (label + 1)) * t) + noise
        else:
            samples = noise
        key = f"utt{start + i:04d}"
        path = folder / "wav" / f"{key}.wav"
        write_wav(path, samples.astype(np.float32))
        items.append(
            {"key": key, "txt": TOKENS[label] if tokens else label, "duration": round(n / 16000.0, 4), "wav": str(path)}
        )
    with open(folder / "data.list", "w", encoding="utf-8") as out:
        for item in items:
            out.write(json.dumps(item) + "\n")
    return folder / "data.list", items


def make_corpus(root, num_train=14, num_dev=6, seed=0, tokens=False):
    """<root>/{train,dev}/data.list, <root>/dict/words.txt, <root>/train/global_cmvn (identity-ish stats)."""
    root = Path(root)
    train_list, _ = make_split(root / "train", num_train, seed, tokens=tokens)
    dev_list, _ = make_split(root / "dev", num_dev, seed + 1, start=1000, tokens=tokens)
    (root / "dict").mkdir(parents=True, exist_ok=True)
    (root / "dict" / "words.txt").write_text("".join(f"{token} {label}\n" for label, token in TOKENS.items()))
    dim = TINY_CONFIG["dataset_conf"]["fbank_conf"]["num_mel_bins"]
    cmvn = {"mean_stat": [10.0 * 100] * dim, "var_stat": [(100.0 + 4.0) * 100] * dim, "frame_num": 100}
    (root / "train" / "global_cmvn").write_text(json.dumps(cmvn))
    return {"train": train_list, "dev": dev_list, "cmvn": root / "train" / "global_cmvn"}


def write_config(path, overrides=None):
    import copy

    from kws.config import apply_overrides

    conf = apply_overrides(copy.deepcopy(TINY_CONFIG), overrides or {})
    Path(path).write_text(yaml.safe_dump(conf, sort_keys=False))
    return Path(path)


def torchrun_argv(processes=2):
    """torchrun on one machine, as the workflow starts it, run with this interpreter."""
    return torchrun_command(processes, python=sys.executable)


def train_argv(corpus, config, model_dir, *extra):
    return [
        "--config",
        str(config),
        "--train_data",
        str(corpus["train"]),
        "--cv_data",
        str(corpus["dev"]),
        "--model_dir",
        str(model_dir),
        "--num_keywords",
        "2",
        "--min_duration",
        "5",
        "--seed",
        "666",
        "--cmvn_file",
        str(corpus["cmvn"]),
        "--norm_var",
        *map(str, extra),
    ]


def assert_training_head_shaped_the_model_and_resumes(train, corpus, config, root, on, head):
    """A run with a training-only head (`on`: its --override arguments) against one without, both 2
    epochs in root/off and root/on: the head is checkpointed apart (`head`), it changed the model, the
    checkpoint loads as a plain model, and a run resumed from epoch 1 ends bit-identical, head and all."""
    import torch

    from kws import checkpoint as ckpt

    assert train(corpus, config, root / "off", "--max_epoch", "2") == 0
    assert train(corpus, config, root / "on", "--max_epoch", "2", *on) == 0
    payload = torch.load(root / "on" / "epoch_002.pt", weights_only=True)
    off = torch.load(root / "off" / "epoch_002.pt", weights_only=True)
    assert head in payload and head not in off
    assert payload["model"].keys() == off["model"].keys()
    assert not all(torch.equal(payload["model"][k], off["model"][k]) for k in off["model"])  # it shaped the model
    model, _ = ckpt.load_model(root / "on" / "epoch_002.pt")  # the plain model, as scoring loads it
    assert model(torch.zeros(1, 20, TINY_CONFIG["dataset_conf"]["fbank_conf"]["num_mel_bins"]))[0].shape == (1, 20, 2)

    (root / "on" / "epoch_002.pt").rename(root / "full_002.pt")
    for name in ("epoch_002.yaml", "final.yaml"):
        (root / "on" / name).unlink()
    assert train(corpus, config, root / "on", "--max_epoch", "2", *on) == 0
    again = torch.load(root / "on" / "epoch_002.pt", weights_only=True)
    full = torch.load(root / "full_002.pt", weights_only=True)
    for part in ("model", head):
        assert all(torch.equal(again[part][k], full[part][k]) for k in full[part]), part
    return payload


def head_test_corpus(root, extra_fields):
    """(root, corpus, config, plain corpus) for a training-only head's tests: a tiny corpus whose list
    items get `extra_fields(item, index)` added (phones, engine, ...), a batch-3 config, and the same
    corpus without them."""
    root = Path(root)
    corpus = make_corpus(root / "corpus", num_train=13, num_dev=5)
    for split in ("train", "dev"):
        items = [json.loads(line) for line in Path(corpus[split]).read_text().splitlines()]
        (root / f"{split}.list").write_text(
            "".join(json.dumps({**item, **extra_fields(item, n)}) + "\n" for n, item in enumerate(items))
        )
        corpus[split] = root / f"{split}.list"
    config = write_config(root / "conf.yaml", {"dataset_conf.batch_conf.batch_size": 3})
    return root, corpus, config, make_corpus(root / "plain", num_train=13, num_dev=5)


def train_one_thread(corpus, config, model_dir, *extra):
    from kws import trainer

    return trainer.main(train_argv(corpus, config, model_dir, "--threads", "1", *extra))
