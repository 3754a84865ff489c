"""Faults the pipeline must survive: killed ranks and runs, corrupt checkpoints, divergence, and
run-to-run reproducibility of the whole tiny pipeline.

1. SIGKILL to one torchrun rank mid-epoch (`--max-restarts 1`): the job restarts from the last
   complete checkpoint and ends bit-identical to an uninterrupted run.
2. SIGKILL to a whole `snakemake` run (its process group) during training: no training worker
   survives it; after `snakemake --unlock` the same command resumes (the train log says
   "resuming from") and ends with the same model as an uninterrupted run.
3. Truncated / corrupt checkpoints: skipped with a warning naming them when resuming; a one-line
   error naming them when averaging or loading.
4. Divergence (optim_conf.lr = 1e30): the run stops with a clear error after
   training_config.max_nonfinite_steps non-finite steps in a row, leaving no checkpoint.
5. Two runs of the tiny pipeline in two folders: byte-identical metrics.json, identical checkpoints.
"""

import copy
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

import helpers_train
from helpers_train import make_corpus
from kws import checkpoint as ckpt
from kws.average import average_checkpoints
from kws.errors import KwsError
from workflow_utils import REPO, TINY_CONFIG, make_workdir, snakemake

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

MODEL_CONFIG = REPO / "config" / "models" / "tiny.yaml"
MAX_EPOCH = 3


# ------------------------------------------------------------------------------------ helpers


def state(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def assert_same_tensors(a, b, where=""):
    assert a.keys() == b.keys(), where
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), f"{where}{key}"
        elif isinstance(a[key], dict):
            assert_same_tensors(a[key], b[key], f"{where}{key}.")
        else:
            assert a[key] == b[key], f"{where}{key}"


def assert_same_model(path_a, path_b, optimizer=True):
    a, b = state(path_a), state(path_b)
    assert_same_tensors(a["model"], b["model"], "model.")
    if optimizer:
        assert_same_tensors(a["optimizer"]["state"], b["optimizer"]["state"], "optimizer.")
        assert a["cv_loss"] == b["cv_loss"] and a["step"] == b["step"]


def wait_for(condition, proc, what, timeout=240):
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"exited (status {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def children(pid):
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def environ_of(pid):
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def worker_pid(agent_pid, rank):
    """The pid of torchrun worker `rank`: a child of the torchrun agent with RANK=rank in its environment."""
    for pid in children(agent_pid):
        if environ_of(pid).get("RANK") == str(rank):
            return pid
    raise AssertionError(f"no worker with RANK={rank} among the children of torchrun (pid {agent_pid})")


def processes_of(folder):
    """Pids of live processes working in `folder` (their cwd) or naming it on their command line (this
    test process excluded): a run's shell, torchrun, ranks, forkservers and workers."""
    found = []
    folder = str(folder)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                status = (entry / "status").read_text()
                cwd = os.readlink(entry / "cwd")
            except OSError:
                continue
            mine = folder in cmdline or cwd == folder or cwd.startswith(folder + os.sep)
            if mine and "State:\tZ" not in status:
                found.append(int(entry.name))
    return found


def kill_group(proc):
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# ------------------------------------------------------------------------------------ torchrun runs


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """96 training utterances (24 batches of 2 per rank: an epoch lasts long enough to be interrupted)."""
    root = tmp_path_factory.mktemp("reliability")
    corpus = make_corpus(root / "corpus", num_train=96, num_dev=6)
    dim = yaml.safe_load(MODEL_CONFIG.read_text())["dataset_conf"]["fbank_conf"]["num_mel_bins"]
    corpus["cmvn"].write_text(json.dumps({"mean_stat": [1000.0] * dim, "var_stat": [10400.0] * dim, "frame_num": 100}))
    corpus["root"] = root
    return corpus


def train_argv(corpus, model_dir, *extra):
    return [
        "scripts/train.py",
        *helpers_train.train_argv(corpus, MODEL_CONFIG, model_dir),
        "--max_epoch",
        str(MAX_EPOCH),
        "--threads",
        "2",
        "--timeout",
        "120",
        "--override",
        "dataset_conf.batch_conf.batch_size=2",
        *extra,
    ]


def torchrun(corpus, model_dir, *extra):
    return [
        *helpers_train.torchrun_argv(2),
        "--max-restarts",
        "1",
        *train_argv(corpus, model_dir, *extra),
    ]


@pytest.fixture(scope="module")
def reference(corpus):
    """An uninterrupted 2-process run."""
    model_dir = corpus["root"] / "reference"
    result = subprocess.run(torchrun(corpus, model_dir), cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return model_dir


def test_killed_rank_restarts_from_last_checkpoint_and_ends_identical(corpus, reference, tmp_path):
    model_dir = tmp_path / "killed_rank"
    log = tmp_path / "torchrun.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            torchrun(corpus, model_dir), cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        # epoch 1 is checkpointed and epoch 2 has begun (rank 0 logs every batch: log_interval 1)
        wait_for(
            lambda: (model_dir / "epoch_001.yaml").exists() and "epoch 2 batch 1 " in log.read_text(), proc, "epoch 2"
        )
        victim = worker_pid(proc.pid, rank=1)
        assert not (model_dir / "epoch_002.yaml").exists()
        os.kill(victim, signal.SIGKILL)
        status = proc.wait(timeout=600)
    finally:
        kill_group(proc)
    text = log.read_text()
    assert status == 0, text[-5000:]
    assert not Path(f"/proc/{victim}").exists()
    assert f"resuming from {model_dir / 'epoch_001.pt'}: epoch 2 of {MAX_EPOCH}" in text, text[-5000:]
    assert (model_dir / "final.yaml").exists()
    assert not list(model_dir.glob("*.tmp")) and not list(model_dir.glob(".*.tmp"))
    for epoch in range(1, MAX_EPOCH + 1):
        assert_same_model(reference / f"epoch_{epoch:03d}.pt", model_dir / f"epoch_{epoch:03d}.pt")


def test_a_killed_rank_leaves_nothing_behind(corpus, tmp_path):
    """Whatever a rank started dies with it, and once torchrun is done nothing of the run is left."""
    import psutil

    model_dir = tmp_path / "model"
    command = torchrun(corpus, model_dir)
    command[command.index("scripts/train.py")] = str(REPO / "scripts" / "train.py")
    proc = subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        wait_for(lambda: (model_dir / "epoch_001.yaml").exists(), proc, "epoch 1")
        victim = worker_pid(proc.pid, rank=1)
        helpers = psutil.Process(victim).children(recursive=True)
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(h.is_running() and h.status() != psutil.STATUS_ZOMBIE for h in helpers):
            assert time.monotonic() < deadline, f"processes of the killed rank lived on: {helpers}"
            time.sleep(0.1)
        assert proc.wait(timeout=600) == 0  # torchrun restarted the rank and finished
    finally:
        kill_group(proc)
    deadline = time.monotonic() + 10
    while processes_of(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_of(tmp_path) == []


# ------------------------------------------------------------------------------------ corrupt checkpoints


@pytest.fixture
def damaged(reference, tmp_path):
    """A copy of the reference run: epoch_003.pt truncated (a full disk), epoch_002.pt random bytes."""
    model_dir = tmp_path / "damaged"
    shutil.copytree(reference, model_dir)
    last = model_dir / "epoch_003.pt"
    last.write_bytes(last.read_bytes()[:300])
    (model_dir / "epoch_002.pt").write_bytes(os.urandom(2048))
    return model_dir


def test_resume_skips_corrupt_checkpoints_naming_them(damaged, caplog):
    caplog.set_level(logging.WARNING, logger="kws")
    epoch, path, payload = ckpt.find_resume_checkpoint(damaged)
    assert epoch == 1 and path == damaged / "epoch_001.pt" and payload["epoch"] == 1
    assert str(damaged / "epoch_003.pt") in caplog.text and str(damaged / "epoch_002.pt") in caplog.text
    assert f"resuming from {damaged / 'epoch_001.pt'} instead of" in caplog.text


def test_average_and_load_of_a_corrupt_checkpoint_name_it(damaged, tmp_path):
    out = tmp_path / "avg.pt"
    with pytest.raises(KwsError) as info:
        average_checkpoints(damaged, 2, "last", out=out)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{damaged / 'epoch_002.pt'}: not a readable checkpoint")
    assert not out.exists() and not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp"))
    for name in ("epoch_003.pt", "epoch_002.pt"):
        with pytest.raises(KwsError) as info:
            ckpt.load_model(damaged / name)
        assert "\n" not in str(info.value) and str(info.value).startswith(f"{damaged / name}: not a readable")
    model, payload = ckpt.load_model(damaged / "epoch_001.pt")  # the good one still loads
    assert payload["epoch"] == 1


# ------------------------------------------------------------------------------------ divergence


def test_divergence_stops_with_a_clear_error(corpus, tmp_path):
    """lr 1e30 (as a string: PyYAML reads 1e30 so): the first step blows the weights up, every later
    gradient is NaN; the 4th skipped step in a row (limit 3) stops the run before any checkpoint."""
    from kws import trainer

    model_dir = tmp_path / "diverged"
    argv = train_argv(
        corpus, model_dir, "--override", "optim_conf.lr=1e30", "--override", "training_config.max_nonfinite_steps=3"
    )[1:]
    argv[argv.index("--threads") + 1] = "1"
    threads, logger = torch.get_num_threads(), logging.getLogger("kws")
    level, handlers = logger.level, list(logger.handlers)
    try:
        with pytest.raises(KwsError) as info:
            trainer.main(argv)
    finally:
        torch.set_num_threads(threads)
        logger.setLevel(level)
        logger.handlers[:] = handlers
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("4 steps in a row with a non-finite gradient (last at epoch 1 batch 5)"), message
    assert "training_config.max_nonfinite_steps=3" in message and "optim_conf.lr" in message
    assert not list(model_dir.glob("epoch_*")) and not (model_dir / "final.yaml").exists()


# ------------------------------------------------------------------------------------ the whole pipeline

# Ten epochs (not two) so that training lasts long enough to be killed between epochs.
PIPELINE_CONFIG = copy.deepcopy(TINY_CONFIG)
PIPELINE_CONFIG["experiments"]["tiny"]["overrides"]["training_config.max_epoch"] = 10
EXP = Path("results") / "tiny"


@pytest.fixture(scope="module")
def pipeline_a(tmp_path_factory):
    root = make_workdir(tmp_path_factory.mktemp("pipeline_a"), PIPELINE_CONFIG)
    result = snakemake(root)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    return root


@pytest.mark.slow
def test_two_folders_give_identical_results(pipeline_a, tmp_path):
    b = make_workdir(tmp_path / "pipeline_b", PIPELINE_CONFIG)
    result = snakemake(b)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    a = pipeline_a
    for name in (
        "metrics.json",
        "metrics.tsv",
        "metrics.md",
        "score.txt",
        "det/stats.hi_xiaowen.txt",
        "det/stats.nihao_wenwen.txt",
    ):
        assert (a / EXP / name).read_bytes() == (b / EXP / name).read_bytes(), name
    assert_same_model(a / EXP / "avg.pt", b / EXP / "avg.pt", optimizer=False)
    for path in sorted((a / EXP / "model").glob("epoch_*.pt")):
        assert_same_model(path, b / EXP / "model" / path.name)


@pytest.mark.slow
def test_killed_snakemake_resumes_training(pipeline_a, tmp_path):
    root = make_workdir(tmp_path / "pipeline_c", PIPELINE_CONFIG)
    target = str(EXP / "avg.pt")
    command = [
        sys.executable,
        "-m",
        "snakemake",
        "--snakefile",
        str(root / "workflow" / "Snakefile"),
        "--directory",
        str(root),
        "--cores",
        "2",
        target,
    ]
    model_dir = root / EXP / "model"
    with open(tmp_path / "first.log", "w") as out:
        proc = subprocess.Popen(command, cwd=root, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: (model_dir / "epoch_001.yaml").exists(), proc, "the first checkpoint", timeout=600)
        os.kill(proc.pid, signal.SIGKILL)  # snakemake alone: its job shell, torchrun and the ranks live on
        proc.wait()
        # kws.supervise sees Snakemake die and stops the whole tree (ranks in sessions of their own too).
        deadline = time.monotonic() + 10
        while processes_of(root) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert processes_of(root) == [], "training outlived the killed snakemake by 10 s"
    finally:
        kill_group(proc)
    assert not (model_dir / "final.yaml").exists()

    # A SIGKILLed snakemake cannot remove its lock: the same command refuses until --unlock.
    locked = snakemake(root, target)
    assert locked.returncode != 0 and "--unlock" in locked.stdout + locked.stderr
    assert snakemake(root, "--unlock").returncode == 0
    result = snakemake(root, target)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    train_log = (root / "results" / "logs" / "train.tiny.log").read_text()
    assert f"resuming from {EXP / 'model'}/epoch_0" in train_log, train_log[-3000:]
    assert "epoch 1:" not in train_log  # epoch 1 was not trained again
    # The killed attempt's log survived the rerun (Snakemake deletes the job log before each attempt).
    attempts = root / "results" / "logs" / "attempts"
    first = (attempts / "train.tiny.log.1.log").read_text()
    assert "epoch 1 batch 1 " in first, first[-3000:]
    assert "died: stopping" in first, first[-3000:]
    assert (attempts / "train.tiny.log.2.log").read_text() == train_log
    a = pipeline_a / EXP
    assert_same_model(a / "avg.pt", root / EXP / "avg.pt", optimizer=False)
    assert_same_model(a / "model" / "epoch_010.pt", model_dir / "epoch_010.pt")
