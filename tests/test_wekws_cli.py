"""WeKws's hi_xiaowen training command line, run in a WeKws-style recipe folder, trains with kwsflow's train.py.

The folder is laid out as examples/hi_xiaowen/s0/run.sh leaves it before stage 2 (data/{train,dev}/data.list
with tokens, data/train/global_cmvn, dict/dict.txt + dict/words.txt, conf/ds_tcn.yaml), and the command is
run.sh's stage-2 line word for word: only the script path and the GPU ids differ.
"""

import csv
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from helpers_train import TOKENS, make_corpus, write_config
from kws.errors import KwsError
from kws.trainer import main as train_main
from wekws_reference import wekws_reads_config

REPO = Path(__file__).resolve().parents[1]
EPOCHS = 2


def wekws_command(gpus):
    """run.sh stage 2 (`torchrun ... wekws/bin/train.py --gpus $gpus ...`), kwsflow's script in its place."""
    nproc = len(gpus.split(","))
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        f"--nproc_per_node={nproc}",
        str(REPO / "scripts" / "train.py"),
        "--gpus",
        gpus,
        "--config",
        "conf/ds_tcn.yaml",
        "--train_data",
        "data/train/data.list",
        "--cv_data",
        "data/dev/data.list",
        "--model_dir",
        "exp/ds_tcn",
        "--num_workers",
        "8",
        "--num_keywords",
        "2",
        "--min_duration",
        "50",
        "--seed",
        "666",
        "--dict",
        "./dict",
        "--cmvn_file",
        "data/train/global_cmvn",
        "--norm_var",
    ]


def write_wekws_dict(folder):
    """run.sh stage 0: dict.txt `<TOKEN> id`, words.txt its first column."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "dict.txt").write_text("".join(f"{token} {label}\n" for label, token in TOKENS.items()))
    (folder / "words.txt").write_text("".join(f"{token}\n" for token in TOKENS.values()))


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    root = tmp_path_factory.mktemp("s0")
    make_corpus(root / "data", num_train=8, num_dev=4, tokens=True)
    write_wekws_dict(root / "dict")
    (root / "conf").mkdir()
    write_config(root / "conf" / "ds_tcn.yaml", {"training_config.max_epoch": EPOCHS})
    return root


@pytest.fixture(scope="module")
def trained(recipe):
    # WeKws's CPU convention: --gpus -1 (run.sh lists GPU ids; with no GPU there is none to list).
    result = subprocess.run(wekws_command("-1"), cwd=recipe, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return recipe / "exp" / "ds_tcn"


def test_wekws_line_trains_the_model_it_asks_for(trained):
    final = yaml.safe_load((trained / "final.yaml").read_text())
    assert final["epochs"] == list(range(1, EPOCHS + 1))
    with open(trained / "train_log.tsv", newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    assert [int(row["epoch"]) for row in rows] == final["epochs"]
    for row in rows:
        assert math.isfinite(float(row["train_loss"])) and math.isfinite(float(row["cv_loss"]))
    for epoch in final["epochs"]:
        payload = torch.load(trained / f"epoch_{epoch:03d}.pt", weights_only=False)
        assert payload["num_keywords"] == 2
        assert payload["model"]["classifier.linear.weight"].shape[0] == 2  # --num_keywords outputs


def test_model_dir_config_is_one_wekws_scores_with(trained):
    """run.sh stage 3 passes exp/ds_tcn/config.yaml to WeKws's score.py and export scripts."""
    config = yaml.safe_load((trained / "config.yaml").read_text())
    seen = wekws_reads_config(config, base=trained.parents[1], written_by_train=True)
    assert seen["input_dim"] == 16 and seen["output_dim"] == 2
    assert seen["cmvn"] == {"cmvn_file": "data/train/global_cmvn", "norm_var": True}


def test_dict_is_checked_against_num_keywords(recipe, tmp_path):
    three = tmp_path / "dict"
    three.mkdir()
    (three / "dict.txt").write_text("<FILLER> -1\n<A> 0\n<B> 1\n<C> 2\n")
    argv = [
        "--config",
        str(recipe / "conf" / "ds_tcn.yaml"),
        "--train_data",
        str(recipe / "data/train/data.list"),
        "--cv_data",
        str(recipe / "data/dev/data.list"),
        "--model_dir",
        str(tmp_path / "exp"),
        "--num_keywords",
        "2",
        "--threads",
        "1",
        "--dict",
        str(three),
    ]
    with pytest.raises(KwsError, match=r"dict\.txt: lists 3 keyword\(s\) but --num_keywords is 2$"):
        train_main(argv)
    # A token list needs the dictionary that maps its tokens to keyword ids.
    with pytest.raises(KwsError, match=r"data\.list: utterance 'utt0000' is labelled with the token '<FILLER>'"):
        train_main(argv[:-2])


def test_wekws_gpu_line_fails_in_preflight_with_what_to_change(recipe):
    """`--gpus 0,1` on a machine where CUDA sees no GPU: one line that says what to change, not a hang."""
    if torch.cuda.device_count() >= 2:
        pytest.skip("two GPUs visible: the line would train")
    result = subprocess.run(wekws_command("0,1"), cwd=recipe, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors, result.stderr[-3000:]
    assert "GPU" in errors[0] or "gpu" in errors[0]
