import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from kws.average import average_checkpoints, average_state_dicts, find_epochs, select_epochs
from kws.errors import KwsError

ROOT = Path(__file__).resolve().parents[1]


def _state(w, b, n):
    return {
        "w": torch.tensor(w, dtype=torch.float32),
        "bn.num_batches_tracked": torch.tensor(n, dtype=torch.long),
        "b": torch.tensor(b, dtype=torch.float64),
    }


def _write_epoch(model_dir, epoch, cv_loss, state):
    payload = {
        "model": state,
        "optimizer": {},
        "epoch": epoch,
        "cv_loss": cv_loss,
        "config": {"model": {"hidden_dim": 4}},
        "num_keywords": 2,
        "input_dim": 3,
    }
    torch.save(payload, model_dir / f"epoch_{epoch:03d}.pt")
    (model_dir / f"epoch_{epoch:03d}.yaml").write_text(
        yaml.safe_dump({"epoch": epoch, "cv_loss": cv_loss, "lr": 0.001, "checkpoint": f"epoch_{epoch:03d}.pt"})
    )


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "exp"
    d.mkdir()
    # epoch: cv_loss
    losses = {1: 0.9, 2: 0.5, 3: 0.3, 4: 0.5, 5: 0.4}
    for epoch, loss in losses.items():
        _write_epoch(d, epoch, loss, _state([epoch, 10.0 * epoch], [0.1 * epoch], 100 * epoch))
    # Files that must be ignored: not a strict epoch_<digits>.yaml name.
    (d / "epoch_007.yaml.bak").write_text("epoch: 7\ncv_loss: 0.0\n")
    (d / "epoch_x8.yaml").write_text("epoch: 8\ncv_loss: 0.0\n")
    (d / "config.yaml").write_text("model: {}\n")
    return d


def test_average_state_dicts_exact():
    a = _state([1.0, 2.0], [1.0], 3)
    b = _state([3.0, 6.0], [2.0], 7)
    avg = average_state_dicts([a, b])
    assert avg["w"].dtype == torch.float32 and avg["b"].dtype == torch.float64
    assert torch.equal(avg["w"], torch.tensor([2.0, 4.0]))
    assert torch.equal(avg["b"], torch.tensor([1.5], dtype=torch.float64))
    assert avg["bn.num_batches_tracked"].item() == 7  # integers: the maximum, not a mean
    assert avg["bn.num_batches_tracked"].dtype == torch.long


def test_average_float64_accumulation():
    # float32 values whose float32 running sum would lose the small parts.
    states = [{"w": torch.tensor([1e8 if i == 0 else 1.0], dtype=torch.float32)} for i in range(4)]
    avg = average_state_dicts(states)
    assert avg["w"].item() == pytest.approx((1e8 + 3.0) / 4, abs=8)
    expected = torch.tensor([(1e8 + 3.0) / 4], dtype=torch.float64).to(torch.float32)
    assert torch.equal(avg["w"], expected)


def test_mismatched_layouts_are_errors():
    with pytest.raises(KwsError, match="parameters differ"):
        average_state_dicts([{"w": torch.zeros(2)}, {"v": torch.zeros(2)}])
    with pytest.raises(KwsError, match="float32"):
        average_state_dicts([{"w": torch.zeros(2)}, {"w": torch.zeros(3)}])


def test_select_best_ties_by_epoch(model_dir):
    epochs = find_epochs(model_dir)
    assert [e["epoch"] for e in epochs] == [1, 2, 3, 4, 5]
    # best 3: 0.3 (3), 0.4 (5), 0.5 (2 beats 4 on the tie)
    assert [e["epoch"] for e in select_epochs(epochs, 3, "best")] == [2, 3, 5]
    assert [e["epoch"] for e in select_epochs(epochs, 2, "last")] == [4, 5]


def test_too_few_checkpoints(model_dir):
    with pytest.raises(KwsError, match="only 5"):
        select_epochs(find_epochs(model_dir), 6, "best")
    with pytest.raises(KwsError, match="positive"):
        select_epochs(find_epochs(model_dir), 0, "best")


def test_nonfinite_cv_loss_ranks_last(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    _write_epoch(d, 1, float("nan"), _state([1.0, 1.0], [1.0], 1))
    _write_epoch(d, 2, 2.0, _state([1.0, 1.0], [1.0], 1))
    assert [e["epoch"] for e in select_epochs(find_epochs(d), 1, "best")] == [2]


def test_average_checkpoints_writes_layout(model_dir, tmp_path):
    out = tmp_path / "out" / "avg.pt"
    result = average_checkpoints(model_dir, 3, "best", out=out)
    assert result["averaged_epochs"] == [2, 3, 5]
    payload = torch.load(out, weights_only=False)
    assert payload["epoch"] == "avg"
    assert payload["averaged_epochs"] == [2, 3, 5]
    assert payload["num_keywords"] == 2 and payload["input_dim"] == 3
    assert payload["config"] == {"model": {"hidden_dim": 4}}
    assert torch.equal(payload["model"]["w"], torch.tensor([10 / 3, 100 / 3], dtype=torch.float32))
    assert torch.equal(payload["model"]["b"], torch.tensor([(0.2 + 0.3 + 0.5) / 3], dtype=torch.float64))
    assert payload["model"]["bn.num_batches_tracked"].item() == 500
    side = yaml.safe_load((tmp_path / "out" / "avg.yaml").read_text())
    assert side["averaged_epochs"] == [2, 3, 5] and side["mode"] == "best"
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temporaries left


def test_sidecar_epoch_mismatch(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    _write_epoch(d, 1, 1.0, _state([1.0, 1.0], [1.0], 1))
    (d / "epoch_001.yaml").write_text("epoch: 2\ncv_loss: 1.0\n")
    with pytest.raises(KwsError, match="file name says 1"):
        find_epochs(d)


def test_cli_error_is_one_line(model_dir, tmp_path):
    out = tmp_path / "avg.pt"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "average_model.py"),
            "--model-dir",
            str(model_dir),
            "--num",
            "9",
            "--mode",
            "last",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1
    assert not out.exists()
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "average_model.py"),
            "--model-dir",
            str(model_dir),
            "--num",
            "2",
            "--mode",
            "last",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert torch.load(out, weights_only=False)["averaged_epochs"] == [4, 5]


def test_average_real_model_loads(tmp_path):
    from helpers_train import TINY_CONFIG
    from kws.checkpoint import load_model, save_checkpoint
    from kws.model import build_model

    states = []
    for epoch in (1, 2, 3):
        torch.manual_seed(epoch)
        model = build_model(TINY_CONFIG["model"], 16, 2, None)
        states.append(model.state_dict())
        save_checkpoint(
            tmp_path,
            {
                "model": model.state_dict(),
                "epoch": epoch,
                "cv_loss": 1.0 / epoch,
                "config": TINY_CONFIG,
                "num_keywords": 2,
                "input_dim": 16,
            },
            {"cv_loss": 1.0 / epoch, "lr": 0.01},
        )
    out = tmp_path / "avg.pt"
    average_checkpoints(tmp_path, 2, "best", out=out)
    model, payload = load_model(out)
    assert payload["epoch"] == "avg" and payload["averaged_epochs"] == [2, 3]
    for key, value in model.state_dict().items():
        if value.is_floating_point():
            expected = ((states[1][key].double() + states[2][key].double()) / 2).to(value.dtype)
            assert torch.equal(value, expected), key


def test_epochs_beyond_the_finished_run_are_not_averaged(model_dir):
    """A run retrained with a lower max_epoch leaves an earlier run's later epochs beside its own."""
    (model_dir / "final.yaml").write_text(yaml.safe_dump({"max_epoch": 3, "epochs": [1, 2, 3]}))
    result = average_checkpoints(model_dir, 2, "best")
    assert result["averaged_epochs"] == [2, 3]  # epoch 5 (cv 0.4) would beat epoch 2 (cv 0.5) otherwise
    with pytest.raises(KwsError):
        average_checkpoints(model_dir, 4, "best")
