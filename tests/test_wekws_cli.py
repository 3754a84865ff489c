"""WeKws's hi_xiaowen training command line, pointed at kwsflow's files, runs kwsflow's train.py."""

import subprocess
import sys
from pathlib import Path

import pytest

from helpers_train import make_corpus, write_config

REPO = Path(__file__).resolve().parents[1]


def wekws_command(corpus, config, model_dir, gpus):
    """examples/hi_xiaowen/s0/run.sh stage 2, word for word but for the paths and the GPU ids."""
    nproc = len(gpus.split(","))
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", f"--nproc_per_node={nproc}",
        str(REPO / "scripts" / "train.py"),
        "--gpus", gpus,
        "--config", str(config),
        "--train_data", str(corpus["train"]),
        "--cv_data", str(corpus["dev"]),
        "--model_dir", str(model_dir),
        "--num_workers", "1",
        "--num_keywords", "2",
        "--min_duration", "5",
        "--seed", "666",
        "--cmvn_file", str(corpus["cmvn"]),
        "--norm_var",
        "--ddp.dist_backend", "gloo",
    ]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("wekws")
    corpus = make_corpus(root / "corpus", num_train=8, num_dev=4)
    config = write_config(root / "ds_tcn.yaml", {"training_config.max_epoch": 1})
    return root, corpus, config


def test_wekws_command_line_trains_with_kwsflow(setup):
    root, corpus, config = setup
    model_dir = root / "exp" / "ds_tcn"
    # WeKws's CPU convention: --gpus -1 (its run.sh lists GPU ids; with no GPU there is none to list).
    result = subprocess.run(wekws_command(corpus, config, model_dir, "-1"), capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (model_dir / "epoch_001.pt").exists() and (model_dir / "final.yaml").exists()


def test_wekws_gpu_line_fails_in_preflight_with_what_to_change(setup):
    """`--gpus 0,1` on a machine where CUDA sees no GPU: one line that says what to change, not a hang."""
    root, corpus, config = setup
    result = subprocess.run(wekws_command(corpus, config, root / "exp" / "gpu", "0,1"), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors, result.stderr[-3000:]
    assert "GPU" in errors[0] or "gpu" in errors[0]
