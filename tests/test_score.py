import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers_train import TINY_CONFIG, make_split
from kws.audio import read_wav
from kws.errors import KwsError
from kws.features import compute_fbank, inference_fbank
from kws.model import build_model
from kws.score import format_line, score

ROOT = Path(__file__).resolve().parents[1]
TOKENS = ["<HI_XIAOWEN>", "<NIHAO_WENWEN>"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("score")
    data_list, items = make_split(root / "test", 7, seed=3)
    (root / "words.txt").write_text("<FILLER> -1\n<HI_XIAOWEN> 0\n<NIHAO_WENWEN> 1\n")
    dim = TINY_CONFIG["dataset_conf"]["fbank_conf"]["num_mel_bins"]
    torch.manual_seed(0)
    model = build_model(TINY_CONFIG["model"], dim, 2, None)
    model.eval()
    payload = {
        "model": model.state_dict(),
        "config": TINY_CONFIG,
        "num_keywords": 2,
        "input_dim": dim,
        "epoch": "avg",
        "cv_loss": None,
    }
    torch.save(payload, root / "avg.pt")
    return root, data_list, items, model


def _parse(path):
    rows = []
    for line in Path(path).read_text().splitlines():
        parts = line.split()
        rows.append((parts[0], parts[1], np.array(parts[2:], dtype=float)))
    return rows


def test_score_file_layout_and_values(setup):
    root, data_list, items, model = setup
    out = root / "score.txt"
    assert score(root / "avg.pt", data_list, root / "words.txt", out, batch_size=3, device="cpu") == len(items)
    rows = _parse(out)
    assert [(k, t) for k, t, _ in rows] == [(item["key"], tok) for item in items for tok in TOKENS]
    conf = TINY_CONFIG["dataset_conf"]["fbank_conf"]
    for i, item in enumerate(items):
        feats = compute_fbank(read_wav(item["wav"]), inference_fbank(conf))
        with torch.no_grad():
            expected = torch.sigmoid(model(feats[None])[0])[0].numpy()
        for k in range(2):
            key, token, values = rows[2 * i + k]
            assert values.shape == (feats.shape[0],)  # only valid frames
            np.testing.assert_allclose(values, expected[:, k], atol=2e-6)
    first = out.read_text().splitlines()[0].split()
    assert all(len(v.split(".")[1]) == 6 for v in first[2:])


def test_batching_and_chunking_do_not_change_scores(setup):
    root, data_list, _, _ = setup
    score(root / "avg.pt", data_list, root / "words.txt", root / "a.txt", batch_size=1, device="cpu")
    score(
        root / "avg.pt", data_list, root / "words.txt", root / "b.txt", batch_size=64, device="cpu", max_batch_frames=17
    )  # forces cached chunked forwards
    for (ka, ta, va), (kb, tb, vb) in zip(_parse(root / "a.txt"), _parse(root / "b.txt")):
        assert (ka, ta) == (kb, tb)
        np.testing.assert_allclose(va, vb, atol=2e-5)


def test_keyword_count_mismatch(setup, tmp_path):
    root, data_list, _, _ = setup
    (tmp_path / "words.txt").write_text("<FILLER> -1\n<HI_XIAOWEN> 0\n")
    with pytest.raises(KwsError, match="2 keyword output"):
        score(root / "avg.pt", data_list, tmp_path / "words.txt", tmp_path / "s.txt", device="cpu")
    assert not (tmp_path / "s.txt").exists()


def test_format_line():
    assert format_line("u1", "<A>", [0.5, 1 / 3]) == "u1 <A> 0.500000 0.333333\n"


def _score_cli(checkpoint, data_list, words, out, *extra):
    command = [
        sys.executable,
        str(ROOT / "scripts" / "score.py"),
        "--checkpoint",
        str(checkpoint),
        "--test-data",
        str(data_list),
        "--dict",
        str(words),
        "--out",
        str(out),
        "--device",
        "cpu",
        *extra,
    ]
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT)


def test_cli(setup, tmp_path):
    root, data_list, items, _ = setup
    out = tmp_path / "score.txt"
    proc = _score_cli(root / "avg.pt", data_list, root / "words.txt", out, "--threads", "1", "--batch-size", "4")
    assert proc.returncode == 0, proc.stderr
    assert len(out.read_text().splitlines()) == 2 * len(items)
    proc = _score_cli(tmp_path / "missing.pt", data_list, root / "words.txt", out)
    assert proc.returncode == 1 and "checkpoint not found" in proc.stderr
