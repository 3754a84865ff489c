import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kws.errors import KwsError
from kws.plots import (
    experiment_from_stats,
    group_stats_by_experiment,
    keyword_from_stats,
    plot_det,
    plot_det_compare,
    plot_training,
)

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _is_png(path):
    data = Path(path).read_bytes()
    return data[:8] == PNG_MAGIC and len(data) > 1000


def _stats(path, shift=0.0):
    path.parent.mkdir(parents=True, exist_ok=True)
    t = np.round(np.arange(100) * 0.01, 2)
    fa = np.where(t < 0.8 - shift, 20 * (1 - t) ** 3, 1e-6 / 0.5)
    frr = np.clip(t - 0.3 + shift, 0, 1)
    path.write_text("".join(f"{a:.6f} {b:.6f} {c:.6f}\n" for a, b, c in zip(t, fa, frr)))
    return path


def test_det_plot(tmp_path):
    a = _stats(tmp_path / "exp1" / "det" / "stats.hi_xiaowen.txt")
    b = _stats(tmp_path / "exp1" / "det" / "stats.nihao_wenwen.txt", shift=0.1)
    out = plot_det([a, b], tmp_path / "p" / "det.png", title="exp1")
    assert _is_png(out)
    assert keyword_from_stats(a) == "hi_xiaowen" and experiment_from_stats(a) == "exp1"
    with pytest.raises(KwsError, match="labels"):
        plot_det([a, b], tmp_path / "x.png", labels=["one"])
    assert not (tmp_path / "x.png").exists()


def test_compare_plot(tmp_path):
    paths = [
        _stats(tmp_path / e / "det" / f"stats.{k}.txt", shift=s)
        for e, s in (("exp1", 0.0), ("exp2", 0.05))
        for k in ("a", "b")
    ]
    groups = group_stats_by_experiment(paths)
    assert [name for name, _ in groups] == ["exp1", "exp2"]
    assert _is_png(plot_det_compare(groups, tmp_path / "cmp.png"))


def test_training_plot(tmp_path):
    log = tmp_path / "train_log.tsv"
    rows = ["epoch\ttrain_loss\tcv_loss\tcv_acc\tlr\tgrad_norm\tskipped_steps\tseconds\tutts_per_s"]
    for e in range(1, 6):
        rows.append(
            f"{e}\t{1 / e:.4f}\t{1.2 / e:.4f}\t{0.5 + e / 20:.3f}\t{1e-3 / 2 ** (e // 3):g}\t{3 - e * 0.3:.2f}"
            f"\t{1 if e == 4 else 0}\t12.5\t80.1"
        )
    log.write_text("\n".join(rows) + "\n")
    assert _is_png(plot_training(log, tmp_path / "training.png", title="exp1"))
    (tmp_path / "bad.tsv").write_text("epoch\tfoo\n1\t2\n")
    with pytest.raises(KwsError, match="missing column"):
        plot_training(tmp_path / "bad.tsv", tmp_path / "bad.png")


def test_scripts(tmp_path):
    paths = [_stats(tmp_path / e / "det" / f"stats.{k}.txt") for e in ("e1", "e2") for k in ("a", "b")]
    run = [sys.executable, str(ROOT / "scripts" / "plot_det.py")]
    proc = subprocess.run(
        run
        + [
            "--stats",
            str(paths[0]),
            str(paths[1]),
            "--labels",
            "a",
            "b",
            "--title",
            "e1",
            "--out",
            str(tmp_path / "det.png"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert _is_png(tmp_path / "det.png")
    proc = subprocess.run(
        run + ["--compare", "--stats", *map(str, paths), "--out", str(tmp_path / "cmp.png")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert _is_png(tmp_path / "cmp.png")
    proc = subprocess.run(
        run
        + [
            "--dirs",
            str(tmp_path / "e1"),
            str(tmp_path / "e2"),
            "--labels",
            "x",
            "y",
            "--out",
            str(tmp_path / "dirs.png"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert _is_png(tmp_path / "dirs.png")
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "plot_training.py"),
            "--log",
            str(tmp_path / "missing.tsv"),
            "--out",
            str(tmp_path / "t.png"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 1 and proc.stderr.startswith("error: ") and "not found" in proc.stderr
