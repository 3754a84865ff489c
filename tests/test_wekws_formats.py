"""kwsflow's files in WeKws HEAD's formats, and both WeKws generations read back.

- data.list / score.txt: kwsflow writes tokens (`"txt": "<HI_XIAOWEN>"`, score.txt `key <HI_XIAOWEN> ...`), which
  WeKws HEAD's compute_det.py reads to byte-identical stats; the older integer labels and keyword ids read too.
- model configs: kwsflow loads WeKws's conf/*.yaml layouts, and every config it writes or ships is one
  WeKws HEAD reads the way kwsflow does.
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from conftest import write_tiny_corpus
from helpers_train import TINY_CONFIG
from kws.config import load_model_config
from kws.datalist import read_data_list, read_dictionary
from kws.dataset import Featurizer, KwsDataset, input_dim_of
from kws.det import compute_det, stats_name
from kws.errors import KwsError
from kws.lists import make_list
from kws.model import build_model, count_parameters
from kws.score import score
from wekws_reference import wekws_compute_det, wekws_reads_config

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[1]
CONFIG_DIR = REPO / "config" / "models"
SHIPPED = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


# ---------------------------------------------------------------------------- data.list and score.txt


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    """A test split listed by make_list and scored by score() with a random tiny model."""
    root = write_tiny_corpus(tmp_path_factory.mktemp("formats") / "data", per_class=(1, 1, 4))
    words = root / "dict" / "words.txt"
    make_list(root / "test", words, threads=1)
    dim = TINY_CONFIG["dataset_conf"]["fbank_conf"]["num_mel_bins"]
    torch.manual_seed(0)
    model = build_model(TINY_CONFIG["model"], dim, 2, None)
    torch.save(
        {"model": model.state_dict(), "config": TINY_CONFIG, "num_keywords": 2, "input_dim": dim, "epoch": "avg"},
        root / "avg.pt",
    )
    score(root / "avg.pt", root / "test" / "data.list", words, root / "score.txt", device="cpu")
    compute_det(root / "score.txt", root / "test" / "data.list", words, root / "det", window_shift=5)
    return root


def test_wekws_head_compute_det_reads_kwsflow_files_to_the_same_stats(scored):
    for token in ("<HI_XIAOWEN>", "<NIHAO_WENWEN>"):
        theirs = wekws_compute_det(token, scored / "test" / "data.list", scored / "score.txt", window_shift=5)
        assert (scored / "det" / "det" / stats_name(token)).read_text() == theirs


def test_data_list_txt_is_the_token(scored):
    text = dict(line.split() for line in (scored / "test" / "text").read_text().splitlines())
    for line in (scored / "test" / "data.list").read_text().splitlines():
        record = json.loads(line)
        assert record["txt"] == text[record["key"]]  # "<HI_XIAOWEN>", "<FILLER>"


def _to_old_generation(scored, out):
    """The same test set as WeKws wrote it before 2025-02: integer labels, keyword ids in score.txt."""
    dictionary = read_dictionary(scored / "dict" / "words.txt")
    out.mkdir()
    with open(out / "data.list", "w") as handle:
        for line in (scored / "test" / "data.list").read_text().splitlines():
            record = json.loads(line)
            handle.write(json.dumps(dict(record, txt=dictionary[record["txt"]])) + "\n")
    lines = []
    for line in (scored / "score.txt").read_text().splitlines():
        key, token, rest = line.split(" ", 2)
        lines.append(f"{key} {dictionary[token]} {rest}\n")
    (out / "score.txt").write_text("".join(lines))


def test_older_integer_lists_and_scores_give_the_same_results(scored, tmp_path):
    _to_old_generation(scored, tmp_path / "old")
    assert '"txt": 0' in (tmp_path / "old" / "data.list").read_text()
    compute_det(
        tmp_path / "old" / "score.txt",
        tmp_path / "old" / "data.list",
        scored / "dict" / "words.txt",
        tmp_path / "det",
        window_shift=5,
    )
    for token in ("<HI_XIAOWEN>", "<NIHAO_WENWEN>"):
        assert (tmp_path / "det" / "det" / stats_name(token)).read_text() == (
            scored / "det" / "det" / stats_name(token)
        ).read_text()


def test_training_reads_both_generations_to_the_same_labels(scored, tmp_path):
    _to_old_generation(scored, tmp_path / "old")
    dictionary = read_dictionary(scored / "dict" / "words.txt")
    conf = {"fbank_conf": {"num_mel_bins": 16}, "batch_conf": {"batch_size": 64}}

    def labels(data_list, dictionary):
        return [
            (k, t)
            for keys, _, _, targets in KwsDataset(data_list, conf, rank=0, world_size=1, dictionary=dictionary)
            for k, t in zip(keys, targets.tolist())
        ]

    new = labels(scored / "test" / "data.list", dictionary)
    assert sorted(t for _, t in new) == [-1, -1, -1, -1, 0, 0, 0, 0, 1, 1, 1, 1]
    assert labels(tmp_path / "old" / "data.list", None) == new


@pytest.mark.parametrize(
    "lines, message",
    [
        (
            ['{"key": "a", "txt": "<HELLO>", "duration": 1, "wav": "a.wav"}'],
            r"data\.list:1: txt '<HELLO>' is not a token of the dictionary$",
        ),
        (
            [
                '{"key": "a", "txt": 0, "duration": 1, "wav": "a.wav"}',
                '{"key": "b", "txt": "<YO>", "duration": 1, "wav": "b"}',
            ],
            r"data\.list:2: txt is a token but line 1 has an integer keyword id",
        ),
        (['{"key": "a", "txt": "", "duration": 1, "wav": "a.wav"}'], r"data\.list:1: txt must be a keyword token"),
        (['{"key": "a", "txt": 2, "duration": 1, "wav": "a.wav"}'], r"data\.list:1: label 2 is not a keyword id"),
    ],
)
def test_bad_labels_name_the_line(tmp_path, lines, message):
    (tmp_path / "data.list").write_text("\n".join(lines) + "\n")
    with pytest.raises(KwsError, match=message):
        read_data_list(tmp_path / "data.list", dictionary={"<FILLER>": -1, "<YO>": 0, "<HI>": 1})


# ---------------------------------------------------------------------------- model configs

# The key structure of WeKws HEAD's examples/hi_xiaowen/s0/conf/*.yaml (HEAD's fbank_conf in ds_tcn.yaml,
# the older feature_extraction_conf in the others, mfcc for mdtc).
_WEKWS_DATA = {
    "filter_conf": {"max_length": 2048, "min_length": 0},
    "resample_conf": {"resample_rate": 16000},
    "speed_perturb": False,
    "spec_aug": True,
    "spec_aug_conf": {"num_t_mask": 1, "num_f_mask": 1, "max_t": 20, "max_f": 10},
    "shuffle": True,
    "shuffle_conf": {"shuffle_size": 1500},
    "batch_conf": {"batch_size": 256},
}
_OLD_FEATURES = {
    "feature_extraction_conf": {
        "feature_type": "fbank",
        "num_mel_bins": 40,
        "frame_shift": 10,
        "frame_length": 25,
        "dither": 1.0,
    }
}
WEKWS_CONFS = {
    "ds_tcn": {
        "dataset_conf": {
            **_WEKWS_DATA,
            "feats_type": "fbank",
            "sort": False,
            "fbank_conf": {"num_mel_bins": 40, "frame_shift": 10, "frame_length": 25, "dither": 1.0},
        },
        "model": {
            "hidden_dim": 256,
            "preprocessing": {"type": "linear"},
            "backbone": {"type": "tcn", "ds": True, "num_layers": 4, "kernel_size": 8, "dropout": 0.1},
        },
        "optim": "adam",
        "optim_conf": {"lr": 0.001, "weight_decay": 0.0001},
        "training_config": {"grad_clip": 5, "max_epoch": 80, "log_interval": 10},
    },
    "tcn": {
        "dataset_conf": {**_WEKWS_DATA, **_OLD_FEATURES, "spec_aug": False},
        "model": {
            "hidden_dim": 64,
            "preprocessing": {"type": "linear"},
            "backbone": {"type": "tcn", "ds": False, "num_layers": 4, "kernel_size": 8, "dropout": 0.1},
        },
        "optim": "adam",
        "optim_conf": {"lr": 0.001, "weight_decay": 0.0001},
        "training_config": {"grad_clip": 5, "max_epoch": 80, "log_interval": 10},
    },
    "gru": {
        "dataset_conf": {**_WEKWS_DATA, **_OLD_FEATURES, "spec_aug": False},
        "model": {"hidden_dim": 128, "preprocessing": {"type": "linear"}, "backbone": {"type": "gru", "num_layers": 2}},
        "optim": "adam",
        "optim_conf": {"lr": 0.001},
        "training_config": {"grad_clip": 5, "max_epoch": 80, "log_interval": 10},
    },
    "mdtc": {
        "dataset_conf": {
            **_WEKWS_DATA,
            "feature_dither": 0.0,
            "feature_extraction_conf": {
                "feature_type": "mfcc",
                "num_ceps": 80,
                "num_mel_bins": 80,
                "frame_shift": 10,
                "frame_length": 25,
                "dither": 1.0,
            },
        },
        "model": {
            "hidden_dim": 64,
            "preprocessing": {"type": "linear"},
            "backbone": {
                "type": "mdtc",
                "num_stack": 4,
                "stack_size": 4,
                "kernel_size": 5,
                "hidden_dim": 64,
                "causal": True,
            },
        },
        "optim": "adam",
        "optim_conf": {"lr": 0.001},
        "training_config": {"grad_clip": 5, "max_epoch": 100, "log_interval": 10},
    },
}


def _write(path, conf):
    path.write_text(yaml.safe_dump(conf, sort_keys=False))
    return path


@pytest.mark.parametrize("name", sorted(WEKWS_CONFS))
def test_kwsflow_loads_wekws_confs(name, tmp_path):
    conf = json.loads(json.dumps(WEKWS_CONFS[name]))
    if name == "mdtc":
        # kwsflow computes fbank only: said, not replaced silently; with fbank features it loads.
        with pytest.raises(KwsError, match=r"feature_extraction_conf\.feature_type: 'mfcc' is not supported"):
            load_model_config(_write(tmp_path / "mdtc.yaml", conf))
        conf["dataset_conf"]["feature_extraction_conf"]["feature_type"] = "fbank"
    loaded = load_model_config(_write(tmp_path / f"{name}.yaml", conf))
    dim = input_dim_of(loaded["dataset_conf"])
    assert (
        dim
        == conf["dataset_conf"].get("fbank_conf", conf["dataset_conf"].get("feature_extraction_conf"))["num_mel_bins"]
    )
    assert loaded["dataset_conf"]["fbank_conf"]["dither"] == 1.0
    model = build_model(loaded["model"], dim, 2, None)
    assert model.num_keywords == 2
    assert type(model.backbone).__name__ == conf["model"]["backbone"]["type"].upper()
    if name == "ds_tcn":
        assert count_parameters(model) == 287490  # WeKws reports 287 K for this model
    _assert_same_reading(loaded)
    if "fbank_conf" in conf["dataset_conf"]:
        assert wekws_reads_config(loaded) == wekws_reads_config(conf)  # the settings of WeKws's own file
    else:
        # WeKws HEAD's train.py reads `<feats_type>_conf` (fbank_conf), which its older-layout files lack;
        # the config kwsflow writes from them has it.
        with pytest.raises(KeyError, match="fbank_conf"):
            wekws_reads_config(conf)


def _kwsflow_reads(conf):
    """kwsflow's reading of the same settings as wekws_reads_config."""

    class NoAudio:  # the settings are read without any audio
        row, lengths = {"k": 0}, np.array([16000])

    data = KwsDataset(
        "unused", conf["dataset_conf"], items=[{"key": "k", "label": 0}], rank=0, world_size=1, store=NoAudio()
    )
    features = Featurizer(conf["dataset_conf"])
    seen = {
        "shuffle": data.shuffle,
        "sort": data.sort,
        "spec_aug": features.spec_aug,
        "batch_size": data.batch_size,
        "num_mel_bins": data.fbank_conf["num_mel_bins"],
    }
    if data.sort:
        seen["sort_size"] = data.sort_size
    if features.spec_aug:
        seen["spec_aug_conf"] = features.spec_aug_conf
    return seen


def _assert_same_reading(conf):
    wekws = wekws_reads_config(conf)
    kwsflow = _kwsflow_reads(conf)
    assert {key: wekws[key] for key in kwsflow} == kwsflow
    assert wekws["classifier"] == "linear + sigmoid"  # the per-frame linear layer kwsflow builds
    assert wekws["backbone"] == {k: conf["model"]["backbone"][k] for k in wekws["backbone"]}


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_and_loaded_configs_read_alike_in_wekws(name):
    raw = yaml.safe_load((CONFIG_DIR / f"{name}.yaml").read_text())
    loaded = load_model_config(CONFIG_DIR / f"{name}.yaml")
    _assert_same_reading(loaded)
    assert wekws_reads_config(raw) == wekws_reads_config(loaded)  # the file as shipped, too


def test_older_kwsflow_classifier_loads_as_the_same_model(tmp_path):
    old = json.loads(json.dumps(TINY_CONFIG))
    old["model"].pop("classifier_dropout")
    old["model"]["classifier"] = {"type": "linear", "dropout": 0.1}
    loaded = load_model_config(_write(tmp_path / "old.yaml", old))
    assert "classifier" not in loaded["model"] and loaded["model"]["classifier_dropout"] == 0.1
    torch.manual_seed(0)
    a = build_model(old["model"], 16, 2, None)
    torch.manual_seed(0)
    b = build_model(loaded["model"], 16, 2, None)
    assert repr(a) == repr(b)
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)
    with pytest.raises(KwsError, match=r"model\.classifier\.type: WeKws's 'global' classifier"):
        build_model(dict(old["model"], classifier={"type": "global", "dropout": 0.1}), 16, 2, None)


def test_experiment_config_the_workflow_writes_is_a_wekws_config(tmp_path):
    experiment = {"model": "config/models/ds_tcn_small.yaml", "overrides": {"training_config.max_epoch": 3}}
    out = tmp_path / "config.yaml"
    result = subprocess.run(
        [
            sys.executable,
            "scripts/resolve_config.py",
            "--model-config",
            experiment["model"],
            "--experiment",
            json.dumps(experiment),
            "--pipeline",
            json.dumps({"train": {"seed": 1}}),
            "--out",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(out.read_text())
    assert wekws_reads_config(resolved)["max_epoch"] == 3
    _assert_same_reading(resolved)
    assert resolved["kwsflow"] == {"experiment": experiment, "pipeline": {"train": {"seed": 1}}}
