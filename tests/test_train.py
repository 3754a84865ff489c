"""Training: DDP under torchrun, reproducibility, non-finite gradients, checkpoints and resume."""

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

from helpers_train import make_corpus, torchrun_argv, train_argv, write_config
from kws import checkpoint as ckpt
from kws import trainer, trainlog
from kws.errors import KwsError

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    corpus = make_corpus(root / "corpus", num_train=13, num_dev=5)
    config = write_config(root / "conf.yaml", {"dataset_conf.batch_conf.batch_size": 3})
    return root, corpus, config


def run_inprocess(setup, model_dir, *extra):
    """trainer.main in this process (world size 1), leaving torch threads and logging as they were."""
    import logging

    _, corpus, config = setup
    threads, logger = torch.get_num_threads(), logging.getLogger("kws")
    level, handlers = logger.level, list(logger.handlers)
    try:
        return trainer.main(train_argv(corpus, config, model_dir, "--threads", "1", *extra))
    finally:
        torch.set_num_threads(threads)
        logger.setLevel(level)
        for handler in logger.handlers[:]:
            if handler not in handlers:
                logger.removeHandler(handler)


def state(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def assert_same_tensors(a, b):
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
        elif isinstance(a[key], dict):
            assert_same_tensors(a[key], b[key])
        else:
            assert a[key] == b[key], key


def assert_same_checkpoint(path_a, path_b):
    a, b = state(path_a), state(path_b)
    assert_same_tensors(a["model"], b["model"])
    assert_same_tensors(a["optimizer"]["state"], b["optimizer"]["state"])
    assert a["scheduler"] == b["scheduler"]
    assert a["cv_loss"] == b["cv_loss"] and a["epoch"] == b["epoch"] and a["step"] == b["step"]


@pytest.fixture(scope="module")
def reference(setup):
    """An uninterrupted 3-epoch run (one process, one DataLoader worker)."""
    model_dir = setup[0] / "reference"
    assert run_inprocess(setup, model_dir, "--max_epoch", "3", "--num_workers", "1") == 0
    return model_dir


def test_outputs_and_load_model(setup, reference):
    names = {p.name for p in reference.iterdir()}
    for epoch in (1, 2, 3):
        assert f"epoch_{epoch:03d}.pt" in names and f"epoch_{epoch:03d}.yaml" in names
    assert {"config.yaml", "run_info.yaml", "train_log.tsv", "final.yaml", "tensorboard"} <= names
    assert not [n for n in names if n.endswith(".tmp")]
    final = yaml.safe_load((reference / "final.yaml").read_text())
    assert final["epochs"] == [1, 2, 3] and final["last_checkpoint"] == "epoch_003.pt"
    sidecar = yaml.safe_load((reference / "epoch_002.yaml").read_text())
    assert sidecar["epoch"] == 2 and sidecar["checkpoint"] == "epoch_002.pt"
    assert sidecar["train_utterances"] == 13  # every training utterance, once
    for key in ("cv_loss", "train_loss", "lr", "grad_norm", "skipped_steps"):
        assert key in sidecar
    rows = (reference / "train_log.tsv").read_text().splitlines()
    assert rows[0].split("\t") == trainlog.TSV_COLUMNS and len(rows) == 4
    info = yaml.safe_load((reference / "run_info.yaml").read_text())
    assert info["seed"] == 666 and info["world_size"] == 1 and info["torch"] == str(torch.__version__)
    assert list((reference / "tensorboard").glob("events.out.tfevents.*"))

    model, payload = ckpt.load_model(reference / "epoch_003.pt")
    assert payload["epoch"] == 3 and payload["num_keywords"] == 2 and payload["input_dim"] == 16
    assert not model.training
    logits, _ = model(torch.zeros(1, 20, 16))
    assert logits.shape == (1, 20, 2)
    # CMVN statistics are in the checkpoint: mean 10, var 4 -> istd 0.5
    assert torch.allclose(model.global_cmvn.mean, torch.full((16,), 10.0))
    assert torch.allclose(model.global_cmvn.istd, torch.full((16,), 0.5))
    # Checkpoints are plain data: they load with weights_only, and they name the code that trained them
    assert isinstance(payload["fingerprint"]["code"], str)


def test_same_seed_same_checkpoints(setup, reference):
    again = setup[0] / "again"
    assert run_inprocess(setup, again, "--max_epoch", "3", "--num_workers", "1") == 0
    for epoch in (1, 2, 3):
        assert_same_checkpoint(reference / f"epoch_{epoch:03d}.pt", again / f"epoch_{epoch:03d}.pt")
    other = setup[0] / "other_seed"
    _, corpus, config = setup
    argv = train_argv(corpus, config, other, "--threads", "1", "--max_epoch", "1")
    argv[argv.index("--seed") + 1] = "7"
    trainer.main(argv)
    a, b = state(other / "epoch_001.pt")["model"], state(reference / "epoch_001.pt")["model"]
    assert not torch.equal(a["classifier.linear.weight"], b["classifier.linear.weight"])


def test_negative_streams_in_the_dev_list_leave_the_cv_loss_alone(setup, reference, tmp_path):
    """A synthetic dev split's long negative streams (kind `stream`) are for scoring choices, not the cv
    loss that ranks checkpoints: a dev list with one trains the same checkpoints, cv loss and all."""
    import json

    import numpy as np
    import soundfile

    _, corpus, config = setup
    items = [json.loads(line) for line in Path(corpus["dev"]).read_text().splitlines()]
    audio = np.concatenate([soundfile.read(item["wav"], dtype="int16")[0] for item in items] * 4)
    soundfile.write(tmp_path / "stream.wav", audio, 16000, subtype="PCM_16")
    stream = {"key": "zz_stream", "txt": -1, "duration": len(audio) / 16000, "wav": str(tmp_path / "stream.wav")}
    dev = tmp_path / "dev.list"
    dev.write_text("".join(json.dumps(item) + "\n" for item in items + [{**stream, "kind": "stream"}]))
    with_stream = tmp_path / "with_stream"
    assert (
        trainer.main(train_argv({**corpus, "dev": dev}, config, with_stream, "--threads", "1", "--max_epoch", "3")) == 0
    )
    for epoch in (1, 2, 3):
        assert_same_checkpoint(reference / f"epoch_{epoch:03d}.pt", with_stream / f"epoch_{epoch:03d}.pt")
    # the same utterance as an ordinary negative does count
    dev.write_text("".join(json.dumps(item) + "\n" for item in items + [stream]))
    assert (
        trainer.main(
            train_argv({**corpus, "dev": dev}, config, tmp_path / "counted", "--threads", "1", "--max_epoch", "1")
        )
        == 0
    )
    assert state(tmp_path / "counted" / "epoch_001.pt")["cv_loss"] != state(reference / "epoch_001.pt")["cv_loss"]


def test_resume_skips_corrupt_checkpoint_and_ends_identical(setup, reference, caplog):
    model_dir = setup[0] / "resumed"
    assert run_inprocess(setup, model_dir, "--max_epoch", "2", "--num_workers", "1") == 0
    assert (model_dir / "final.yaml").exists()
    corrupt = model_dir / "epoch_002.pt"
    corrupt.write_bytes(corrupt.read_bytes()[:200])  # a truncated file
    caplog.set_level("WARNING", logger="kws")
    assert run_inprocess(setup, model_dir, "--max_epoch", "3", "--num_workers", "1") == 0
    assert "epoch_002.pt" in caplog.text and "epoch_001.pt" in caplog.text
    for epoch in (2, 3):
        assert_same_checkpoint(reference / f"epoch_{epoch:03d}.pt", model_dir / f"epoch_{epoch:03d}.pt")
    info = yaml.safe_load((model_dir / "run_info.yaml").read_text())
    assert info["resumed_from"].endswith("epoch_001.pt") and info["start_epoch"] == 2
    assert [line.split("\t")[0] for line in (model_dir / "train_log.tsv").read_text().splitlines()] == [
        "epoch",
        "1",
        "2",
        "3",
    ]


def test_killed_run_resumes_bit_identical(setup, reference):
    _, corpus, config = setup
    model_dir = setup[0] / "killed"
    argv = train_argv(corpus, config, model_dir, "--threads", "1", "--max_epoch", "3", "--num_workers", "1")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "scripts" / "train.py"), *argv],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (model_dir / "epoch_001.yaml").exists():
            assert proc.poll() is None, "training exited before its first checkpoint"
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not (model_dir / "final.yaml").exists()  # killed mid-run
    assert run_inprocess(setup, model_dir, "--max_epoch", "3", "--num_workers", "1") == 0
    assert_same_checkpoint(reference / "epoch_003.pt", model_dir / "epoch_003.pt")


def test_changed_config_refuses_to_resume(setup, reference, tmp_path):
    model_dir = tmp_path / "copy"
    shutil.copytree(reference, model_dir)
    (model_dir / "final.yaml").unlink()
    with pytest.raises(KwsError, match="different run .*optim_conf.lr"):
        run_inprocess(setup, model_dir, "--max_epoch", "4", "--override", "optim_conf.lr=0.5")


def test_changed_seed_refuses_to_resume_and_restart_on_change_starts_over(setup, reference, tmp_path):
    model_dir = tmp_path / "copy"
    shutil.copytree(reference, model_dir)
    (model_dir / "final.yaml").unlink()
    with pytest.raises(KwsError, match="different run .*seed"):
        run_inprocess(setup, model_dir, "--max_epoch", "3", "--num_workers", "1", "--seed", "667")
    # The workflow's way: a changed run discards the old checkpoints and trains from epoch 1.
    assert run_inprocess(setup, model_dir, "--max_epoch", "1", "--seed", "667", "--restart_on_change") == 0
    assert sorted(p.name for p in model_dir.glob("epoch_*.pt")) == ["epoch_001.pt"]
    assert torch.load(model_dir / "epoch_001.pt", weights_only=True)["seed"] == 667


@pytest.mark.parametrize("fused", [True, False])
def test_nonfinite_gradient_skips_the_step(fused):
    """A non-finite gradient norm leaves parameters and Adam's moments and step count as they were, with
    fused Adam (the default: the skip stays on the device, as found_inf) and with the per-tensor one."""
    from kws.model import build_model

    model = build_model({"hidden_dim": 8, "backbone": {"type": "tcn", "num_layers": 1, "kernel_size": 3}}, 4, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1, fused=fused)

    def backward(poison=None):
        logits, _ = model(torch.randn(2, 10, 4))
        logits.sum().backward()
        if poison is not None:
            next(p for p in model.parameters() if p.grad is not None).grad.view(-1)[0] = poison

    def adam_state():
        return {(k, name): v.clone() for k, s in optimizer.state_dict()["state"].items() for name, v in s.items()}

    backward(float("nan"))
    grad_norm, stepped = trainer.optimizer_step(model, optimizer, 5.0)
    assert not stepped and not torch.isfinite(grad_norm)
    assert all(float(s["step"]) == 0 for s in optimizer.state.values())  # Adam did not count a step
    assert all(p.grad is None for p in model.parameters())
    backward()
    assert trainer.optimizer_step(model, optimizer, 5.0)[1]
    for poison in (float("inf"), float("nan")):
        backward(poison)  # (moves BatchNorm's running statistics: a forward in training mode)
        before, moments = {k: v.clone() for k, v in model.state_dict().items()}, adam_state()
        assert not trainer.optimizer_step(model, optimizer, 5.0)[1]
        assert_same_tensors(before, model.state_dict())
        assert_same_tensors(moments, adam_state())
    backward()
    assert trainer.optimizer_step(model, optimizer, 5.0)[1]
    assert all(float(s["step"]) == 2 for s in optimizer.state.values())
    assert not torch.equal(before["classifier.linear.weight"], model.state_dict()["classifier.linear.weight"])


def test_nan_loss_in_training_is_counted_and_too_many_stop(setup, monkeypatch):
    import kws.loss

    real = kws.loss.criterion("max_pooling")
    calls = {"n": 0}

    def nan_on_second(logits, lengths, targets, min_duration=0, window_end=None, weights=None):
        calls["n"] += 1
        loss, acc = real(logits, lengths, targets, min_duration, window_end, weights)
        return (loss * float("nan") if calls["n"] == 2 else loss), acc

    monkeypatch.setattr(kws.loss, "criterion", lambda name: nan_on_second)
    model_dir = setup[0] / "nan_once"
    assert run_inprocess(setup, model_dir, "--max_epoch", "1") == 0
    sidecar = yaml.safe_load((model_dir / "epoch_001.yaml").read_text())
    assert sidecar["skipped_steps"] == 1

    def always_inf(*args, **kwargs):
        loss, acc = real(*args, **kwargs)
        return loss * float("inf"), acc

    monkeypatch.setattr(kws.loss, "criterion", lambda name: always_inf)
    with pytest.raises(KwsError, match="3 steps in a row with a non-finite gradient"):
        run_inprocess(
            setup, setup[0] / "nan_always", "--max_epoch", "1", "--override", "training_config.max_nonfinite_steps=2"
        )


def test_ddp_two_gloo_processes(tmp_path):
    """torchrun, 2 gloo processes, uneven shards (13 utterances, batches of 2: 4 and 3 batches)."""
    corpus = make_corpus(tmp_path / "corpus", num_train=13, num_dev=5)
    config = write_config(tmp_path / "conf.yaml", {"dataset_conf.batch_conf.batch_size": 2})
    model_dir = tmp_path / "ddp"
    argv = train_argv(
        corpus,
        config,
        model_dir,
        "--threads",
        "2",
        "--max_epoch",
        "2",
        "--num_workers",
        "1",
        "--ddp.dist_backend",
        "gloo",
        "--timeout",
        "120",
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    result = subprocess.run(
        [*torchrun_argv(2), str(REPO / "scripts" / "train.py"), *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    info = yaml.safe_load((model_dir / "run_info.yaml").read_text())
    assert info["world_size"] == 2 and info["backend"] == "gloo" and info["threads_per_process"] == 1
    for epoch in (1, 2):
        sidecar = yaml.safe_load((model_dir / f"epoch_{epoch:03d}.yaml").read_text())
        assert sidecar["train_utterances"] == 13 and sidecar["batches"] == 4
    assert (model_dir / "final.yaml").exists()
    model, payload = ckpt.load_model(model_dir / "epoch_002.pt")
    assert payload["world_size"] == 2
    assert not any(k.startswith("module.") for k in payload["model"])


def test_edited_training_code_trains_from_epoch_1(setup, tmp_path):
    """The fingerprint covers the code: a finished run trained by other code (here kws/loss.py halved)
    is never resumed. The edited package is a copy put first on PYTHONPATH, as the workflow does."""
    _, corpus, config = setup
    code = tmp_path / "code"
    shutil.copytree(REPO / "kws", code / "kws", ignore=shutil.ignore_patterns("__pycache__"))
    model_dir = tmp_path / "model"
    argv = [
        sys.executable,
        str(REPO / "scripts" / "train.py"),
        *train_argv(corpus, config, model_dir, "--threads", "1", "--max_epoch", "2"),
    ]
    env = dict(os.environ, PYTHONPATH=str(code))

    def train(*extra):
        return subprocess.run([*argv, *extra], env=env, capture_output=True, text=True, timeout=300)

    assert train().returncode == 0
    before = state(model_dir / "epoch_002.pt")
    assert train().returncode == 0 and "resuming from" in train().stdout  # unchanged code: nothing to redo
    loss = code / "kws" / "loss.py"
    loss.write_text(
        loss.read_text() + "\n_halved = max_pooling_loss\n"
        "CRITERIA['max_pooling'] = lambda *a, **k: (lambda r: (r[0] / 2, r[1]))(_halved(*a, **k))\n"
    )
    refused = train()
    assert refused.returncode == 1 and "different run (code differs)" in refused.stderr
    retrained = train("--restart_on_change")
    assert retrained.returncode == 0, retrained.stderr[-2000:]
    assert "resuming" not in retrained.stdout and "epoch 1:" in retrained.stdout
    after = state(model_dir / "epoch_002.pt")
    assert after["fingerprint"]["code"] != before["fingerprint"]["code"]
    assert after["cv_loss"] != before["cv_loss"]


def test_the_configured_clip_bounds_every_step(setup, monkeypatch, tmp_path):
    """The gradient Adam steps on has norm <= training_config.grad_clip, and it is that value (not a
    constant, not infinity) that reaches the step: with a tiny clip every step's norm is the clip."""
    seen = []
    real_step = torch.optim.Adam.step

    def recording_step(self, *args, **kwargs):
        grads = [p.grad for group in self.param_groups for p in group["params"] if p.grad is not None]
        seen.append(float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))))
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Adam, "step", recording_step)
    assert (
        run_inprocess(setup, tmp_path / "clip", "--max_epoch", "1", "--override", "training_config.grad_clip=0.001")
        == 0
    )
    assert seen and max(seen) <= 0.001 * (1 + 1e-4)
    assert min(seen) >= 0.001 * (1 - 1e-4)  # every raw norm here is far above 0.001: all were clipped

    seen.clear()
    assert (
        run_inprocess(setup, tmp_path / "loose", "--max_epoch", "1", "--override", "training_config.grad_clip=1000")
        == 0
    )
    assert seen and max(seen) > 1  # norms below the clip pass through as they are


def test_one_grad_clip_default_for_trainer_and_preflight(setup, tmp_path):
    from kws import preflight

    _, corpus, _ = setup
    config = write_config(tmp_path / "no_clip.yaml")
    conf = yaml.safe_load(config.read_text())
    del conf["training_config"]["grad_clip"]
    config.write_text(yaml.safe_dump(conf))
    args = trainer.build_parser().parse_args(train_argv(corpus, config, tmp_path / "m"))
    assert trainer.resolve_config(args)["training_config"]["grad_clip"] == preflight.DEFAULT_GRAD_CLIP == 50
    assert f"default {preflight.DEFAULT_GRAD_CLIP:g}" in preflight.check_grad_clip(conf)


def test_resume_rests_on_the_per_epoch_seed(setup, reference, tmp_path, monkeypatch):
    """Checkpoints hold no RNG state: a resumed epoch is reproduced by seeding every epoch from
    (seed, epoch, rank). Without that seeding the resumed run's dropout masks differ."""
    model_dir = tmp_path / "resumed"
    assert run_inprocess(setup, model_dir, "--max_epoch", "2", "--num_workers", "1") == 0
    assert "rng" not in state(model_dir / "epoch_002.pt")
    (model_dir / "final.yaml").unlink()
    for name in ("epoch_002.pt", "epoch_002.yaml"):
        (model_dir / name).unlink()
    resumed = tmp_path / "resumed_unseeded"
    shutil.copytree(model_dir, resumed)
    assert run_inprocess(setup, model_dir, "--max_epoch", "2", "--num_workers", "1") == 0
    assert_same_checkpoint(reference / "epoch_002.pt", model_dir / "epoch_002.pt")
    monkeypatch.setattr(trainer, "seed_everything", lambda seed: None)  # the per-epoch seeding gone
    assert run_inprocess(setup, resumed, "--max_epoch", "2", "--num_workers", "1") == 0
    with pytest.raises(AssertionError):
        assert_same_checkpoint(reference / "epoch_002.pt", resumed / "epoch_002.pt")


def test_a_lowered_max_epoch_keeps_only_its_epochs_in_the_records(setup, reference, tmp_path):
    model_dir = tmp_path / "lowered"
    shutil.copytree(reference, model_dir)  # a finished 3-epoch run
    assert run_inprocess(setup, model_dir, "--max_epoch", "2", "--num_workers", "1") == 0
    rows = (model_dir / "train_log.tsv").read_text().splitlines()
    assert [row.split("\t")[0] for row in rows] == ["epoch", "1", "2"]
    assert yaml.safe_load((model_dir / "final.yaml").read_text())["epochs"] == [1, 2]


def list_with_keyword_ends(corpus, tmp_path):
    """The training list with a keyword_end (0.1 s before its end) on its first three positives:
    (path, items, {key: end in seconds})."""
    import json

    items = [json.loads(line) for line in Path(corpus["train"]).read_text().splitlines()]
    ends = {}
    for item in items:
        if item["txt"] != -1 and len(ends) < 3:
            item["keyword_end"] = ends[item["key"]] = round(item["duration"] - 0.1, 4)
    path = tmp_path / "train.list"
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    return path, items, ends


def end_frame(seconds):
    """25 ms window, 10 ms shift: the first frame whose window reaches `seconds`."""
    return -(-(round(seconds * 16000) - 400) // 160)


def test_end_anchor_counts_positives_around_their_keyword_end(setup, monkeypatch, tmp_path):
    """training_config.end_anchor N: a positive with a keyword_end in the list counts within N frames of
    that end (never before min_duration); one without keeps min_duration to its end; a bad N is refused."""
    _, corpus, config = setup
    anchored, items, ends = list_with_keyword_ends(corpus, tmp_path)
    seen = {}
    real_window = trainer.target_window

    def recording_window(state, keys):
        start, stop = real_window(state, keys)
        stops = [None] * len(keys) if stop is None else torch.as_tensor(stop).tolist()
        seen.update(zip(keys, zip(torch.as_tensor(start).expand(len(keys)).tolist(), stops)))
        return start, stop

    monkeypatch.setattr(trainer, "target_window", recording_window)
    argv = train_argv(
        {**corpus, "train": anchored}, config, tmp_path / "anchored", "--threads", "1", "--max_epoch", "1"
    )
    assert trainer.main([*argv, "--override", "training_config.end_anchor=3"]) == 0
    for key, end in ends.items():
        assert seen[key] == (max(5, end_frame(end) - 3), end_frame(end) + 4)
    assert ends and all(seen[item["key"]][0] == 5 for item in items if item["key"] not in ends)
    assert all(seen[item["key"]][1] > 10_000 for item in items if item["key"] not in ends)

    with pytest.raises(KwsError, match="training_config.end_anchor must be"):
        trainer.main([*argv, "--override", "training_config.end_anchor=-1"])


def test_prefix_negatives_make_each_positives_prefix_a_negative_in_training_and_cv(setup, monkeypatch, tmp_path):
    """training_config.prefix_negatives M: a positive with a keyword_end in the list is also a negative of
    its own keyword on its frames more than M before that end, in the training and the CV loss alike; one
    without an end adds nothing; the model differs from one trained without it; a bad M is refused."""
    import json

    _, corpus, config = setup
    ended, items, ends = list_with_keyword_ends(corpus, tmp_path)
    seen, batch_keys = {}, []
    real_term, real_loss = trainer.prefix_negative_loss, trainer.keyword_loss

    def recording_term(logits, targets, prefix_end):
        seen.update(zip(batch_keys[-1], prefix_end))
        return real_term(logits, targets, prefix_end)

    def recording_loss(state, logits, lengths, targets, keys, weights=None):
        batch_keys.append(keys)
        return real_loss(state, logits, lengths, targets, keys, weights)

    monkeypatch.setattr(trainer, "prefix_negative_loss", recording_term)
    monkeypatch.setattr(trainer, "keyword_loss", recording_loss)
    argv = train_argv({**corpus, "train": ended}, config, tmp_path / "plain", "--threads", "1", "--max_epoch", "1")
    assert trainer.main(argv) == 0 and batch_keys and not seen  # off unless set
    batch_keys.clear()
    argv = train_argv({**corpus, "train": ended}, config, tmp_path / "prefix", "--threads", "1", "--max_epoch", "1")
    assert trainer.main([*argv, "--override", "training_config.prefix_negatives=4"]) == 0
    for key, end in ends.items():
        assert seen[key] == end_frame(end) - 4
    assert all(seen[item["key"]] == 0 for item in items if item["key"] not in ends)
    cv_keys = {json.loads(line)["key"] for line in Path(corpus["dev"]).read_text().splitlines()}
    assert cv_keys <= set(seen)  # the CV loss has the term too
    with pytest.raises(AssertionError):
        assert_same_checkpoint(tmp_path / "plain" / "epoch_001.pt", tmp_path / "prefix" / "epoch_001.pt")

    with pytest.raises(KwsError, match="training_config.prefix_negatives must be"):
        trainer.main([*argv, "--override", "training_config.prefix_negatives=-2"])


def test_confusable_weight_weighs_near_misses_and_partials_in_training_only(setup, monkeypatch, tmp_path):
    """training_config.confusable_weight W: the training loss weighs each utterance whose list `kind` is a
    near-miss or a partial keyword by W and every other by 1; the CV loss weighs none; the model differs
    from one trained without it; a list without kinds (real corpora) and W = 1 train unweighted; a negative
    W is refused."""
    import json

    _, corpus, config = setup
    items = [json.loads(line) for line in Path(corpus["train"]).read_text().splitlines()]
    fillers = [item for item in items if item["txt"] == -1]
    for item, kind in zip(fillers, ("near_miss", "partial", "speech")):
        item["kind"] = kind
    confusable = {item["key"] for item in fillers[:2]}
    listed = tmp_path / "train.list"
    listed.write_text("".join(json.dumps(item) + "\n" for item in items))
    train_keys = {item["key"] for item in items}
    seen, real_loss = {}, trainer.keyword_loss

    def recording_loss(state, logits, lengths, targets, keys, weights=None):
        values = [None] * len(keys) if weights is None else weights.tolist()
        seen.update(zip(keys, values))
        return real_loss(state, logits, lengths, targets, keys, weights)

    monkeypatch.setattr(trainer, "keyword_loss", recording_loss)
    argv = train_argv({**corpus, "train": listed}, config, tmp_path / "plain", "--threads", "1", "--max_epoch", "1")
    assert trainer.main(argv) == 0 and seen and set(seen.values()) == {None}  # off unless set
    seen.clear()
    argv = train_argv({**corpus, "train": listed}, config, tmp_path / "weighted", "--threads", "1", "--max_epoch", "1")
    assert trainer.main([*argv, "--override", "training_config.confusable_weight=0.25"]) == 0
    assert len(fillers) >= 3 and train_keys <= set(seen)
    assert {key: seen[key] for key in confusable} == dict.fromkeys(confusable, 0.25)
    assert all(seen[key] == 1.0 for key in train_keys - confusable)
    assert all(value is None for key, value in seen.items() if key not in train_keys)  # CV: unweighted
    with pytest.raises(AssertionError):
        assert_same_checkpoint(tmp_path / "plain" / "epoch_001.pt", tmp_path / "weighted" / "epoch_001.pt")

    seen.clear()
    argv = train_argv(corpus, config, tmp_path / "no_kinds", "--threads", "1", "--max_epoch", "1")
    assert trainer.main([*argv, "--override", "training_config.confusable_weight=0.25"]) == 0
    assert seen and set(seen.values()) == {None}
    with pytest.raises(KwsError, match="training_config.confusable_weight must be a weight >= 0"):
        trainer.main([*argv, "--override", "training_config.confusable_weight=-1"])


def test_bn_real_frames_counts_each_batchs_real_frames_in_training(setup, monkeypatch, tmp_path):
    """training_config.bn_real_frames: every training batch runs with the mask of its utterances' frames
    (padded batches included) on all the model's BatchNorms, phoneme head or not; the model differs from one
    trained without it, its checkpoint holds the same tensors by the same names, and a value other than
    true or false is refused. Off unless set."""
    from kws.model.batch_norm import RealFramesBatchNorm1d

    _, corpus, config = setup
    batches, real_masking = [], trainer.real_frames

    def recording(norms, lengths, frames):
        batches.append((list(norms), lengths.tolist(), frames))
        return real_masking(norms, lengths, frames)

    monkeypatch.setattr(trainer, "real_frames", recording)
    assert run_inprocess(setup, tmp_path / "plain", "--max_epoch", "1") == 0
    assert batches and all(norms == [] for norms, _, _ in batches)  # off unless set
    batches.clear()
    real = ("--override", "training_config.bn_real_frames=true")
    assert run_inprocess(setup, tmp_path / "real", "--max_epoch", "1", *real) == 0
    norms = batches[0][0]
    assert len(norms) == 4 and all(isinstance(norm, RealFramesBatchNorm1d) for norm in norms)  # 2 DS blocks
    assert all(found == norms for found, _, _ in batches)
    assert all(max(lengths) <= frames for _, lengths, frames in batches)
    assert any(frames > min(lengths) for _, lengths, frames in batches)  # padding to leave out
    plain, masked = state(tmp_path / "plain" / "epoch_001.pt"), state(tmp_path / "real" / "epoch_001.pt")
    assert plain["model"].keys() == masked["model"].keys()
    assert not torch.equal(
        plain["model"]["backbone.network.0.cnn.1.running_var"], masked["model"]["backbone.network.0.cnn.1.running_var"]
    )
    with pytest.raises(KwsError, match="training_config.bn_real_frames must be true or false, got 'sometimes'"):
        run_inprocess(setup, tmp_path / "bad", "--override", "training_config.bn_real_frames=sometimes")


def test_weight_average_follows_the_weights_with_a_warm_up():
    """kws.ema.WeightAverage: each update moves every parameter and floating buffer of the copy by
    (1 - d) towards the module's, d = min(decay, (1 + n) / (10 + n)) at the n-th update; integer buffers
    (BatchNorm's count) are copied; the module itself is left alone."""
    from kws.ema import WeightAverage

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    average = WeightAverage(module, 0.5)
    start = {key: value.clone() for key, value in module.state_dict().items()}
    expected = {key: value.clone() for key, value in start.items()}
    for n in (1, 2, 3):
        with torch.no_grad():
            for parameter in module.parameters():
                parameter.add_(torch.randn_like(parameter))
        module.train()(torch.randn(5, 3))  # moves the running statistics and the count
        average.update()
        decay = min(0.5, (1 + n) / (10 + n))
        for key, value in module.state_dict().items():
            if value.is_floating_point():
                expected[key] = decay * expected[key] + (1 - decay) * value
            else:
                expected[key] = value.clone()
        got = average.module.state_dict()
        for key in expected:
            assert torch.allclose(got[key], expected[key], atol=1e-6), (n, key)
    assert average.updates == 3 and int(average.module[1].num_batches_tracked) == 3
    assert not torch.equal(module[0].weight, start["0.weight"])  # the module trained on, untouched by the average
    assert not any(parameter.requires_grad for parameter in average.module.parameters())
    # the warm-up, not the decay, sets the default's average: its 10 epochs of 300 steps stay under 0.998
    average.decay, average.updates = 0.998, 3000
    assert average.current_decay == pytest.approx(3001 / 3010)
    average.updates = 4490
    assert average.current_decay == pytest.approx(0.998)


def test_weight_average_warmup_two_is_the_mean_of_every_step():
    """training_config.ema_warmup 2: under the warm-up the average is the plain mean of the weights after
    every update (the initial weights counted twice), not a recent window."""
    from kws.ema import WeightAverage

    torch.manual_seed(0)
    module = torch.nn.Linear(3, 2)
    average = WeightAverage(module, 0.999, warmup=2)
    initial = module.weight.detach().clone()
    seen = []
    for _ in range(6):
        with torch.no_grad():
            module.weight.add_(torch.randn_like(module.weight))
        seen.append(module.weight.detach().clone())
        average.update()
    expected = (2 * initial + sum(seen)) / (len(seen) + 2)
    assert torch.allclose(average.module.weight, expected, atol=1e-6)
    assert average.current_decay == pytest.approx(7 / 8)


def test_ema_decay_saves_the_average_and_resumes_exactly(setup, monkeypatch, tmp_path):
    """training_config.ema_decay: each checkpoint's model is the moving average of the weights after every
    optimizer step (the weights that train travel beside it), a run resumed from epoch 2 ends with the same
    checkpoint as the uninterrupted run, a run without it saves no second set of weights, and a decay
    outside (0, 1) is refused."""
    from kws.ema import WeightAverage

    steps, created = [], []

    class Recorded(WeightAverage):
        def __init__(self, module, decay, warmup):
            super().__init__(module, decay, warmup)
            created.append({key: value.clone() for key, value in self.module.state_dict().items()})

    real_step = trainer.optimizer_step

    def recording_step(model, optimizer, grad_clip):
        result = real_step(model, optimizer, grad_clip)
        steps.append({key: value.clone() for key, value in model.state_dict().items()})
        return result

    monkeypatch.setattr(trainer, "WeightAverage", Recorded)
    monkeypatch.setattr(trainer, "optimizer_step", recording_step)
    ema = ("--override", "training_config.ema_decay=0.8")
    reference = tmp_path / "reference"
    assert run_inprocess(setup, reference, "--max_epoch", "3", *ema) == 0
    saved = state(reference / "epoch_003.pt")
    assert len(created) == 1 and len(steps) == 15 and saved["ema_updates"] == 15
    expected = dict(created[0])
    for n, weights in enumerate(steps, start=1):
        decay = min(0.8, (1 + n) / (10 + n))
        expected = {
            key: decay * expected[key] + (1 - decay) * value if value.is_floating_point() else value
            for key, value in weights.items()
        }
    assert saved["model"].keys() == expected.keys()
    for key, value in saved["model"].items():
        assert torch.allclose(value, expected[key], atol=1e-6), key
    assert_same_tensors(saved["training_weights"], steps[-1])
    # the sidecar says which decay the average had reached: the warm-up's 16 / 25, under the 0.8 asked for
    assert yaml.safe_load((reference / "epoch_003.yaml").read_text())["ema_decay"] == pytest.approx(16 / 25)
    assert not torch.allclose(saved["model"]["classifier.linear.weight"], steps[-1]["classifier.linear.weight"])

    resumed = tmp_path / "resumed"
    shutil.copytree(reference, resumed)
    for name in ("final.yaml", "epoch_003.pt", "epoch_003.yaml"):
        (resumed / name).unlink()
    assert run_inprocess(setup, resumed, "--max_epoch", "3", *ema) == 0
    again = state(resumed / "epoch_003.pt")
    assert_same_checkpoint(reference / "epoch_003.pt", resumed / "epoch_003.pt")
    assert_same_tensors(saved["training_weights"], again["training_weights"])
    assert again["ema_updates"] == 15

    plain = tmp_path / "plain"
    assert run_inprocess(setup, plain, "--max_epoch", "1") == 0
    assert "training_weights" not in state(plain / "epoch_001.pt")
    with pytest.raises(KwsError, match=r"training_config.ema_decay must be a number in \(0, 1\)"):
        run_inprocess(setup, tmp_path / "bad", "--override", "training_config.ema_decay=1.5")
    # a longer warm-up window: the decay the sidecar records is (1 + n) / (warmup + n) after n = 15 updates
    longer = ("--override", "training_config.ema_decay=0.99", "--override", "training_config.ema_warmup=3")
    assert run_inprocess(setup, tmp_path / "warmup3", "--max_epoch", "3", *longer) == 0
    assert yaml.safe_load((tmp_path / "warmup3" / "epoch_003.yaml").read_text())["ema_decay"] == pytest.approx(16 / 18)
    with pytest.raises(KwsError, match=r"training_config.ema_warmup must be a number >= 2, got 1"):
        run_inprocess(setup, tmp_path / "bad_warmup", "--override", "training_config.ema_warmup=1", *ema)


def test_cosine_lr_schedule_decays_every_step_and_resumes_exactly(setup, monkeypatch, tmp_path):
    """training_config.lr_schedule cosine: every step's learning rate follows half a cosine from
    optim_conf.lr to COSINE_FLOOR of it over the run, a resumed run takes the very same steps, a changed
    max_epoch (which shapes the schedule) refuses to resume, and an unknown schedule is refused."""
    assert trainer.cosine_lr(0.01, 0.0) == pytest.approx(0.01)
    assert trainer.cosine_lr(0.01, 0.5) == pytest.approx(0.01 * (1 + trainer.COSINE_FLOOR) / 2)
    assert trainer.cosine_lr(0.01, 1.0) == pytest.approx(0.01 * trainer.COSINE_FLOOR)
    cosine = ("--override", "training_config.lr_schedule=cosine")
    rates = []
    real_step = trainer.optimizer_step

    def recording_step(model, optimizer, grad_clip):
        rates.append(optimizer.param_groups[0]["lr"])
        return real_step(model, optimizer, grad_clip)

    monkeypatch.setattr(trainer, "optimizer_step", recording_step)
    reference = tmp_path / "reference"
    assert run_inprocess(setup, reference, "--max_epoch", "3", *cosine) == 0
    per_epoch = len(rates) // 3  # 13 utterances in batches of 3: 5 steps an epoch
    assert len(rates) == 15 and per_epoch == 5
    want = [trainer.cosine_lr(0.01, (step / per_epoch) / 3) for step in range(15)]
    assert rates == pytest.approx(want) and rates == sorted(rates, reverse=True)
    logged = [float(row.split("\t")[4]) for row in (reference / "train_log.tsv").read_text().splitlines()[1:]]
    assert logged == pytest.approx([want[0], want[5], want[10]])

    resumed = tmp_path / "resumed"
    shutil.copytree(reference, resumed)
    for name in ("final.yaml", "epoch_003.pt", "epoch_003.yaml"):
        (resumed / name).unlink()
    rates.clear()
    assert run_inprocess(setup, resumed, "--max_epoch", "3", *cosine) == 0
    assert rates == pytest.approx(want[10:])
    assert_same_checkpoint(reference / "epoch_003.pt", resumed / "epoch_003.pt")

    (resumed / "final.yaml").unlink()
    with pytest.raises(KwsError, match="different run .*max_epoch"):
        run_inprocess(setup, resumed, "--max_epoch", "4", *cosine)
    with pytest.raises(KwsError, match="training_config.lr_schedule must be one of plateau, cosine"):
        run_inprocess(setup, tmp_path / "bad", "--override", "training_config.lr_schedule=linear")


def test_bf16_precision_trains_reproducibly_with_fp32_state(setup, reference, tmp_path):
    """training_config.precision bf16: the forward runs under bf16 autocast, the model, Adam state and
    checkpoints stay fp32, the same seed gives the same checkpoint, and the result differs from fp32's."""
    root, corpus, _ = setup
    config = write_config(
        tmp_path / "bf16.yaml", {"dataset_conf.batch_conf.batch_size": 3, "training_config.precision": "bf16"}
    )
    runs = []
    for name in ("a", "b"):
        model_dir = tmp_path / name
        assert run_inprocess((root, corpus, config), model_dir, "--max_epoch", "1", "--num_workers", "1") == 0
        runs.append(model_dir / "epoch_001.pt")
    assert_same_checkpoint(*runs)
    weights = state(runs[0])["model"]
    assert all(t.dtype in (torch.float32, torch.int64) for t in weights.values())
    assert not torch.equal(
        weights["classifier.linear.weight"], state(reference / "epoch_001.pt")["model"]["classifier.linear.weight"]
    )
    assert yaml.safe_load((tmp_path / "a" / "config.yaml").read_text())["training_config"]["precision"] == "bf16"


def test_unknown_precision_is_a_config_error(setup, tmp_path):
    from kws.errors import KwsError

    root, corpus, _ = setup
    config = write_config(tmp_path / "bad.yaml", {"training_config.precision": "fp16"})
    with pytest.raises(KwsError, match="training_config.precision must be one of fp32, bf16, auto, got 'fp16'"):
        run_inprocess((root, corpus, config), tmp_path / "m")
    assert not (tmp_path / "m" / "epoch_001.pt").exists()


def test_adam_is_fused_unless_optim_conf_chooses():
    model = torch.nn.Linear(3, 2)
    assert trainer.make_optimizer(model, {"lr": 0.01}, "conf.yaml").defaults["fused"] is True
    chosen = trainer.make_optimizer(model, {"lr": 0.01, "foreach": True}, "conf.yaml").defaults
    assert chosen["foreach"] is True and not chosen["fused"]


def test_batch_augment_trains_and_changes_the_model(setup, reference, tmp_path):
    root, corpus, _ = setup
    config = write_config(
        tmp_path / "augment.yaml",
        {
            "dataset_conf.batch_conf.batch_size": 3,
            "dataset_conf.batch_augment": {"noise": {"p": 1.0}, "babble": {"p": 1.0}},
        },
    )
    assert run_inprocess((root, corpus, config), tmp_path / "m", "--max_epoch", "1", "--num_workers", "1") == 0
    weights = state(tmp_path / "m" / "epoch_001.pt")["model"]["classifier.linear.weight"]
    assert not torch.equal(weights, state(reference / "epoch_001.pt")["model"]["classifier.linear.weight"])


@pytest.mark.parametrize(
    "native, device, want", [(True, "cpu", "bf16"), (False, "cpu", "fp32"), (False, "cuda", "fp32")]
)
def test_auto_precision_is_bf16_only_on_a_cpu_with_native_bf16(monkeypatch, native, device, want):
    monkeypatch.setattr(trainer, "native_bf16", lambda d: native and d.type == "cpu")
    assert trainer.resolve_precision("auto", torch.device(device), "conf.yaml") == want
    assert trainer.resolve_precision("fp32", torch.device(device), "conf.yaml") == "fp32"
