"""Streaming detection: incremental fbank, chunked detector == offline scoring, the kws-detect CLI."""

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

from kws.config import load_model_config
from kws.detect import Detector, main, resolve_thresholds
from kws.errors import KwsError
from kws.export import build_metadata, export_artifacts
from kws.features import compute_fbank, inference_fbank, num_frames
from kws.model import StreamingWrapper, build_model
from kws.runners import load_exported
from kws.streaming_fbank import StreamingFbank

ROOT = Path(__file__).resolve().parents[1]
KEYWORDS = ["<HI_XIAOWEN>", "<NIHAO_WENWEN>"]
FBANK = {"num_mel_bins": 40, "frame_shift": 10, "frame_length": 25, "dither": 1.0}
RATE = 16000
# the synthesised test recording: keyword 0 = 500 Hz tone bursts, keyword 1 = a 1200 Hz tone
KW0_BURSTS = [(1.0, 1.3), (1.6, 1.9)]
KW1_BURST = (3.5, 3.9)
SECONDS = 5.0


def tone(freq, start, end, amplitude=0.3):
    t = np.arange(int(start * RATE), int(end * RATE)) / RATE
    return int(start * RATE), amplitude * np.sin(2 * np.pi * freq * t)


def recording(seed=0):
    x = 0.01 * np.random.default_rng(seed).standard_normal(int(SECONDS * RATE))
    for start, end in KW0_BURSTS:
        i, y = tone(500.0, start, end)
        x[i : i + y.size] += y
    i, y = tone(1200.0, *KW1_BURST)
    x[i : i + y.size] += y
    return x.astype(np.float32)


def tone_detector_model():
    """A tiny DS-TCN set by hand (no training) so that keyword k fires on its tone.

    The convolutions are zero, so each residual block passes its input through; the linear
    preprocessing picks, for keyword k, the mel bin where its tone stands out most, minus the
    midpoint between background and tone level; the classifier maps the steady tone to logit +2
    (posterior 0.88) and background to logit -2 (0.12).
    """
    conf = load_model_config(ROOT / "config" / "models" / "tiny.yaml")
    model = build_model(conf["model"], 40, 2, None).eval()
    noise = compute_fbank(0.01 * np.random.default_rng(9).standard_normal(RATE).astype(np.float32), FBANK, dither=0.0)
    with torch.no_grad():
        for name, tensor in model.backbone.state_dict().items():
            if name.endswith("running_var") or name.endswith(".weight") and tensor.dim() == 1:
                tensor.fill_(1.0)
            elif tensor.is_floating_point():
                tensor.zero_()
        pre = model.preprocessing[0]
        pre.weight.zero_()
        pre.bias.zero_()
        cls = model.classifier.linear
        cls.weight.zero_()
        cls.bias.fill_(-2.0)
        for k, freq in enumerate((500.0, 1200.0)):
            _, y = tone(freq, 0.0, 1.0)
            level = compute_fbank(y.astype(np.float32) + noise_samples(), FBANK, dither=0.0).median(0).values
            background = noise.median(0).values
            b = int(torch.argmax(level - background))
            mid = float(level[b] + background[b]) / 2
            pre.weight[k, b] = 1.0
            pre.bias[k] = -mid
            cls.weight[k, k] = 4.0 / (float(level[b]) - mid)
    return model, conf


def noise_samples():
    return (0.01 * np.random.default_rng(9).standard_normal(RATE)).astype(np.float32)


def offline_posteriors(model, samples):
    """Offline scoring: fbank of the whole signal, one forward over the whole sequence."""
    feats = compute_fbank(samples, FBANK, dither=0.0).unsqueeze(0)
    with torch.no_grad():
        logits, _ = model(feats)
    return torch.sigmoid(logits)[0].numpy()


@pytest.fixture(scope="module")
def tone_export(tmp_path_factory):
    root = tmp_path_factory.mktemp("detect")
    model, conf = tone_detector_model()
    # keyword 1's recommended threshold is above what its tone reaches: silent unless overridden
    meta = build_metadata(model, conf, KEYWORDS, {"<HI_XIAOWEN>": 0.5, "<NIHAO_WENWEN>": 0.95})
    audio = recording()
    feats = compute_fbank(audio, FBANK, dither=0.0)
    export_artifacts(model, meta, root / "export", [("rec", feats)], chunks=(10,))
    wav = root / "rec.wav"
    soundfile.write(str(wav), audio, RATE, subtype="PCM_16")
    return root, model, wav


# --------------------------------------------------------------------------- streaming fbank


@pytest.mark.parametrize("conf", [FBANK, inference_fbank(FBANK)], ids=["plain", "dither_floor"])
def test_streaming_fbank_equals_whole(conf):
    x = (0.2 * np.random.default_rng(1).standard_normal(RATE * 2 + 123)).astype(np.float32)
    x[RATE // 2 : RATE] = 0  # digital silence, where the floor is all there is
    whole = compute_fbank(x, conf, dither=0.0)
    for chunk in (1, 159, 160, 401, 1600, 7777, x.size):
        stream = StreamingFbank(conf)
        parts = [stream.accept(x[i : i + chunk]) for i in range(0, x.size, chunk)] if chunk > 1 else None
        if chunk == 1:  # one sample at a time for the first 1000 samples, then the rest at once
            parts = [stream.accept(x[i : i + 1]) for i in range(1000)] + [stream.accept(x[1000:])]
        got = torch.cat(parts)
        assert got.shape == whole.shape, chunk
        assert torch.allclose(got, whole, atol=1e-4, rtol=0), (chunk, (got - whole).abs().max())


def test_frame_count_depends_only_on_samples():
    for n in (0, 1, 399, 400, 401, 559, 560, 16000):
        assert num_frames(n, FBANK) == (compute_fbank(np.zeros(n, np.float32), FBANK).shape[0] if n >= 400 else 0)


# --------------------------------------------------------------------------- detector == offline


@pytest.mark.parametrize("suffix", ["pt", "onnx"])
def test_chunked_detector_equals_offline(tone_export, suffix):
    root, model, wav = tone_export
    audio = recording()
    offline = offline_posteriors(model, audio)
    runner = load_exported(root / "export" / f"model.{suffix}")
    results = []
    for chunk in (37, 160, 1600, 7777, audio.size):
        detector = Detector(runner, keep_posteriors=True)
        dets = []
        for i in range(0, audio.size, chunk):
            dets += detector.accept(audio[i : i + chunk])
        got = detector.posteriors()
        assert got.shape == offline.shape
        assert np.abs(got - offline).max() <= 1e-5, chunk
        results.append([(d["keyword"], d["frame"]) for d in dets])
    assert all(r == results[0] for r in results)
    # the same decisions as thresholding the offline posteriors
    offline_detector = Detector(runner)
    assert [(d["keyword"], d["frame"]) for d in offline_detector.decide(offline, 0)] == results[0]


def test_detector_equals_kws_score(tone_export):
    """The wav file through the streaming detector == kws.score's offline posteriors of it."""
    from kws.detect import wav_chunks
    from kws.score import posteriors, utterance_features

    root, model, wav = tone_export
    feats = utterance_features({"key": "rec", "wav": str(wav)}, FBANK).unsqueeze(0)
    offline = posteriors(StreamingWrapper(model), feats, "cpu")[0]
    for suffix in ("pt", "onnx"):
        detector = Detector(load_exported(root / "export" / f"model.{suffix}"), keep_posteriors=True)
        for chunk in wav_chunks(wav, 1600):
            detector.accept(chunk)
        assert np.abs(detector.posteriors() - offline.numpy()).max() <= 1e-5


def test_random_model_streaming_equals_offline(tmp_path):
    """A model with random weights (non-trivial convolutions and cache) streamed through the detector."""
    conf = load_model_config(ROOT / "config" / "models" / "tiny.yaml")
    torch.manual_seed(0)
    model = build_model(conf["model"], 40, 2, None).eval()
    meta = build_metadata(model, conf, KEYWORDS, {k: 0.5 for k in KEYWORDS})
    audio = recording(seed=3)
    export_artifacts(model, meta, tmp_path, [("a", compute_fbank(audio[:8000], FBANK, dither=0.0))], chunks=(7,))
    offline = offline_posteriors(model, audio)
    for suffix in ("pt", "onnx"):
        detector = Detector(load_exported(tmp_path / f"model.{suffix}"), keep_posteriors=True)
        for i in range(0, audio.size, 1234):
            detector.accept(audio[i : i + 1234])
        assert np.abs(detector.posteriors() - offline).max() <= 1e-5


# --------------------------------------------------------------------------- CLI


def run_cli(capsys, *argv):
    assert main([str(a) for a in argv]) == 0
    return capsys.readouterr().out.splitlines()


def parse(lines):
    return [(kw, float(t), float(s)) for kw, t, s in (line.split() for line in lines)]


def test_cli_detects_the_keyword_once(tone_export, capsys):
    root, _, wav = tone_export
    dets = parse(run_cli(capsys, root / "export" / "model.pt", wav))
    # two bursts 0.6 s apart, refractory 1 s: one detection; keyword 1 stays under its 0.95 threshold
    assert [kw for kw, _, _ in dets] == ["<HI_XIAOWEN>"]
    assert KW0_BURSTS[0][0] < dets[0][1] < KW0_BURSTS[0][0] + 0.1
    assert 0.5 <= dets[0][2] <= 1.0


def test_cli_refractory_and_threshold_overrides(tone_export, capsys):
    root, _, wav = tone_export
    model = root / "export" / "model.onnx"
    dets = parse(run_cli(capsys, model, wav, "--refractory", "0.5", "--threshold", "nihao_wenwen=0.5"))
    times = {kw: [t for k, t, _ in dets if k == kw] for kw in KEYWORDS}
    assert len(times["<HI_XIAOWEN>"]) == 2  # each burst once
    assert KW0_BURSTS[1][0] < times["<HI_XIAOWEN>"][1] < KW0_BURSTS[1][0] + 0.1
    assert len(times["<NIHAO_WENWEN>"]) == 1 and KW1_BURST[0] < times["<NIHAO_WENWEN>"][0] < KW1_BURST[0] + 0.1
    # a refractory shorter than a burst fires again inside it, every 0.1 s
    short = parse(run_cli(capsys, model, wav, "--refractory", "0.1"))
    assert len(short) >= 5 and all(b[1] - a[1] >= 0.1 - 1e-9 for a, b in zip(short, short[1:]))
    # a global threshold above every posterior: nothing
    assert run_cli(capsys, model, wav, "--threshold", "0.99") == []


def test_cli_json_and_chunk_size(tone_export, capsys):
    root, _, wav = tone_export
    lines = run_cli(capsys, root / "export" / "model.pt", wav, "--json", "--chunk-ms", "30")
    records = [json.loads(line) for line in lines]
    assert [r["keyword"] for r in records] == ["<HI_XIAOWEN>"]
    assert set(records[0]) == {"keyword", "time", "score", "frame"}
    again = [json.loads(line) for line in run_cli(capsys, root / "export" / "model.pt", wav, "--json")]
    assert again == records


def test_cli_stdin_pcm(tone_export, capsys, monkeypatch):
    root, _, wav = tone_export
    expected = run_cli(capsys, root / "export" / "model.pt", wav, "--threshold", "<NIHAO_WENWEN>=0.5")
    pcm = soundfile.read(str(wav), dtype="int16")[0].astype("<i2").tobytes()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(pcm)))
    assert run_cli(capsys, root / "export" / "model.pt", "-", "--threshold", "<NIHAO_WENWEN>=0.5") == expected
    assert len(expected) == 2


def test_cli_subprocess_stdin(tone_export):
    """`python -m kws.detect MODEL -` reading a real pipe."""
    root, _, wav = tone_export
    pcm = soundfile.read(str(wav), dtype="int16")[0].astype("<i2").tobytes()
    proc = subprocess.run(
        [sys.executable, "-m", "kws.detect", str(root / "export" / "model.onnx"), "-"],
        input=pcm,
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    lines = proc.stdout.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith("<HI_XIAOWEN> 1.0")


def recording_at(rate, channels):
    """The test recording made at another sample rate (its tones and noise drawn there), in `channels`
    channels: the second channel silent, as a phone's spare microphone may be."""
    seconds = np.arange(int(SECONDS * rate)) / rate
    x = 0.01 * np.random.default_rng(5).standard_normal(seconds.size)
    for freq, (start, end) in [(500.0, KW0_BURSTS[0]), (500.0, KW0_BURSTS[1]), (1200.0, KW1_BURST)]:
        inside = (seconds >= start) & (seconds < end)
        x[inside] += 0.3 * np.sin(2 * np.pi * freq * seconds[inside])
    return np.stack([x] + [np.zeros_like(x)] * (channels - 1), axis=1).astype(np.float32)


@pytest.mark.parametrize("rate,channels", [(44100, 2), (48000, 1), (8000, 1)])
def test_cli_converts_a_recording_of_another_rate_or_channels(tone_export, capsys, tmp_path, rate, channels):
    """A recording at 44.1, 48 or 8 kHz, or in stereo, is averaged to mono and resampled to 16 kHz: the
    detector fires as on the 16 kHz recording (same keyword, same moment), and stderr says what it converted."""
    root, _, wav = tone_export
    model = root / "export" / "model.onnx"
    other = tmp_path / "phone.wav"
    # a stereo channel halves the level when averaged: the tones are played twice as loud to match
    soundfile.write(str(other), recording_at(rate, channels) * channels, rate, subtype="PCM_16")
    expected = parse(run_cli(capsys, model, wav, "--threshold", "nihao_wenwen=0.5"))
    assert main([str(model), str(other), "--threshold", "nihao_wenwen=0.5"]) == 0
    printed = capsys.readouterr()
    converted = parse(printed.out.splitlines())
    assert [kw for kw, _, _ in converted] == [kw for kw, _, _ in expected] == ["<HI_XIAOWEN>", "<NIHAO_WENWEN>"]
    assert all(abs(a[1] - b[1]) <= 0.05 for a, b in zip(converted, expected))
    note = f"{rate} Hz resampled to 16000 Hz" + (f", {channels} channels averaged" if channels > 1 else "")
    assert printed.err.startswith(f"note: {other}: ") and all(part in printed.err for part in note.split(", "))
    # the 16 kHz mono recording is read as it is, without a note
    assert main([str(model), str(wav)]) == 0
    assert capsys.readouterr().err == ""


def test_cli_errors(tone_export, capsys, monkeypatch):
    root, _, wav = tone_export
    model = root / "export" / "model.pt"
    for argv, message in [
        ([model, wav, "--threshold", "hey_snips=0.5"], "unknown keyword"),
        ([model, wav, "--threshold", "1.5"], "between 0 and 1"),
        ([model, root / "missing.wav"], "not found"),
        ([root / "missing.pt", wav], "not found"),
    ]:
        with pytest.raises(SystemExit) as info:
            main([str(a) for a in argv])
        assert info.value.code == 1
        assert message in capsys.readouterr().err
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(wav.read_bytes())))
    with pytest.raises(SystemExit):
        main([str(model), "-"])
    assert "WAV file" in capsys.readouterr().err


def test_resolve_thresholds():
    meta = {"keywords": KEYWORDS, "thresholds": {"<HI_XIAOWEN>": 0.63, "<NIHAO_WENWEN>": 0.5}}
    assert resolve_thresholds(meta, []) == [0.63, 0.5]
    assert resolve_thresholds(meta, ["0.7"]) == [0.7, 0.7]
    assert resolve_thresholds(meta, ["hi_xiaowen=0.9", "0.2"]) == [0.9, 0.2]
    assert resolve_thresholds(meta, ["<NIHAO_WENWEN>=0.3"]) == [0.63, 0.3]
    with pytest.raises(KwsError):
        resolve_thresholds(meta, ["x=abc"])
