"""Global CMVN: stats against a direct computation, determinism across workers, loading, bad input."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kws.audio import read_wav
from kws.cmvn import cmvn_tensors, compute_cmvn, compute_cmvn_file, load_cmvn, read_cmvn
from kws.datalist import read_data_list, write_data_list
from kws.errors import KwsError
from kws.features import compute_fbank
from kws.lists import make_list

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def train_list(tiny_corpus):
    make_list(tiny_corpus / "train", tiny_corpus / "dict" / "words.txt", threads=1)
    return tiny_corpus / "train" / "data.list"


def direct_stats(items, conf):
    feats = torch.cat([compute_fbank(read_wav(item["wav"]), conf, dither=0.0) for item in items]).double()
    return feats


def test_matches_direct_computation(train_list, tmp_path):
    conf = {"num_mel_bins": 40, "frame_length": 25, "frame_shift": 10, "dither": 1.0}  # dither ignored
    stats = compute_cmvn_file(train_list, tmp_path / "global_cmvn", conf)
    feats = direct_stats(read_data_list(train_list), conf)
    assert json.loads((tmp_path / "global_cmvn").read_text()) == stats
    assert list(stats) == ["mean_stat", "var_stat", "frame_num"]
    assert stats["frame_num"] == feats.shape[0]
    np.testing.assert_allclose(stats["mean_stat"], feats.sum(0).numpy(), rtol=1e-9)
    np.testing.assert_allclose(stats["var_stat"], (feats**2).sum(0).numpy(), rtol=1e-9)
    mean, istd = load_cmvn(tmp_path / "global_cmvn")
    assert mean.dtype == istd.dtype == torch.float32 and mean.shape == istd.shape == (40,)
    np.testing.assert_allclose(mean.numpy(), feats.mean(0).numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(istd.numpy(), 1.0 / feats.std(0, unbiased=False).numpy(), rtol=1e-4)


def test_deterministic_across_workers(train_list):
    items = read_data_list(train_list)
    conf = {"num_mel_bins": 23}
    serial = compute_cmvn(items, conf, threads=1, chunk_size=2)
    parallel = compute_cmvn(items, conf, threads=2, chunk_size=2)
    assert serial == parallel  # bit-identical, not just close
    assert len(serial["mean_stat"]) == 23


def test_short_utterances_are_skipped(tmp_path, make_wav):
    short = make_wav(tmp_path / "short.wav", seconds=0.01)  # 160 samples < one 400-sample window
    long = make_wav(tmp_path / "long.wav", seconds=0.2)
    items = [
        {"key": "s", "txt": -1, "duration": 0.01, "wav": str(short)},
        {"key": "l", "txt": 0, "duration": 0.2, "wav": str(long)},
    ]
    stats = compute_cmvn(items, {})
    assert stats["frame_num"] == compute_fbank(read_wav(long), {}).shape[0]
    with pytest.raises(KwsError, match="no feature frames"):
        compute_cmvn(items[:1], {})


def test_var_floor():
    stats = {"mean_stat": [2.0, 4.0], "var_stat": [4.0, 20.0], "frame_num": 2}
    mean, istd = cmvn_tensors(stats)
    assert mean.tolist() == [1.0, 2.0]
    assert istd[0].item() == pytest.approx(1.0)  # var 2 - 1 = 1
    assert istd[1].item() == pytest.approx(1 / np.sqrt(6.0))
    _, istd = cmvn_tensors({"mean_stat": [3.0], "var_stat": [3.0], "frame_num": 3})  # var 0
    assert istd.item() == pytest.approx(1e10)


@pytest.mark.parametrize(
    "text, message",
    [
        ("{", "malformed JSON"),
        ("[]", "expected a JSON object"),
        ('{"mean_stat": [1], "var_stat": [1]}', "missing field(s) frame_num"),
        ('{"mean_stat": [1], "var_stat": [1, 2], "frame_num": 3}', "mean_stat has 1 values, var_stat 2"),
        ('{"mean_stat": [1], "var_stat": [1], "frame_num": 0}', "frame_num must be a positive number"),
        ('{"mean_stat": ["a"], "var_stat": [1], "frame_num": 1}', "mean_stat must be a non-empty list"),
    ],
)
def test_read_cmvn_errors(tmp_path, text, message):
    (tmp_path / "global_cmvn").write_text(text)
    with pytest.raises(KwsError, match="global_cmvn") as info:
        read_cmvn(tmp_path / "global_cmvn")
    assert message in str(info.value)
    with pytest.raises(KwsError, match="CMVN file not found"):
        load_cmvn(tmp_path / "absent")


@settings(max_examples=100, deadline=2000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=500))
def test_fuzz_read_cmvn(tmp_path, data):
    (tmp_path / "global_cmvn").write_bytes(data)
    try:
        read_cmvn(tmp_path / "global_cmvn")
    except KwsError:
        pass


# ---------------------------------------------------------------------------- CLI


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "scripts/compute_cmvn.py", *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


MODEL_YAML = """\
dataset_conf:
  fbank_conf: {num_mel_bins: 24, frame_shift: 10, frame_length: 25, dither: 1.0}
model: {hidden_dim: 8}
training_config: {max_epoch: 1}
"""


def test_cli(train_list, tmp_path):
    (tmp_path / "model.yaml").write_text(MODEL_YAML)
    result = run_cli(
        "--data-list",
        train_list,
        "--model-config",
        tmp_path / "model.yaml",
        "--override",
        "dataset_conf.fbank_conf.num_mel_bins=16",
        "--out",
        tmp_path / "a",
    )
    assert result.returncode == 0, result.stderr
    assert len(read_cmvn(tmp_path / "a")["mean_stat"]) == 16
    result = run_cli("--data-list", train_list, "--fbank-json", '{"num_mel_bins": 24}', "--out", tmp_path / "b")
    assert result.returncode == 0, result.stderr
    expected = compute_cmvn(read_data_list(train_list), {"num_mel_bins": 24})
    assert read_cmvn(tmp_path / "b") == expected


def assert_cli_fails(result, out, *fragments):
    assert result.returncode == 1
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr
    assert not Path(out).exists()
    assert not [p for p in Path(out).parent.iterdir() if p.name.startswith(f".{Path(out).name}.")]


def test_cli_errors(train_list, tmp_path):
    out = tmp_path / "global_cmvn"
    assert_cli_fails(run_cli("--data-list", tmp_path / "none.list", "--out", out), out, "none.list: file not found")
    items = read_data_list(train_list)
    items[3]["wav"] = str(tmp_path / "gone.wav")
    write_data_list(tmp_path / "bad.list", items)
    assert_cli_fails(
        run_cli("--data-list", tmp_path / "bad.list", "--out", out),
        out,
        f"bad.list: utterance '{items[3]['key']}': {tmp_path / 'gone.wav'}: audio file not found",
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--fbank-json", "{num"], "--fbank-json: malformed JSON"),
        (["--fbank-json", "[1]"], "--fbank-json: expected a JSON object"),
        (["--model-config", "no.yaml"], "no.yaml: config file not found"),
        (["--override", "a.b=1"], "--override: needs --model-config"),
        (["--threads", "0"], "--threads: must be at least 1"),
    ],
)
def test_cli_argument_errors(train_list, tmp_path, capsys, monkeypatch, args, message):
    """Same CLI, called in-process (no interpreter start-up per case)."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import compute_cmvn as script
    finally:
        sys.path.pop(0)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        script.main(["--data-list", str(train_list), *args, "--out", "global_cmvn"])
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
    assert list(tmp_path.iterdir()) == [tmp_path / "data"]
