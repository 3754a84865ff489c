"""bench/probe_channel.py: the channels the quiet and microphone figures (docs/HISTORY.md) were measured through."""

import importlib.util
import json
from pathlib import Path

import numpy as np

from kws.audio import read_wav, write_wav

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("probe_channel", ROOT / "bench" / "probe_channel.py")
probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe)


def test_mic_response_is_the_documented_one():
    gain = probe.mic_gain_db(np.array([125.0, 500.0, 3000.0, 8000.0]))
    assert abs(gain[0] - (10 * np.log10(1 / 16 / (1 + 1 / 16)))) < 1e-9  # 12.3 dB down, first-order high-pass
    assert abs(gain[1] + 3.01) < 0.01 and 7.5 < gain[2] < 8.0
    assert 19.5 < gain[2] - gain[0] < 21.0  # "20 dB between 125 Hz and 3 kHz"


def test_room_response_is_the_documented_one():
    response = probe.room_response()
    tail = response[1:]
    assert response[0] == 1.0 and not tail[: int(0.005 * 16000) - 1].any()  # direct path, then the predelay
    assert abs(10 * np.log10(1.0 / np.sum(tail**2)) - probe.ROOM_DRR_DB) < 1e-6  # direct-to-reverberant -6 dB
    # the tail's energy decays 60 dB in RT60: compare 0.1 s windows 0.3 s apart (-30 dB, noise aside)
    window = int(0.1 * 16000)
    early, late = (np.sum(tail[s : s + window] ** 2) for s in (int(0.05 * 16000), int(0.35 * 16000)))
    assert -33 < 10 * np.log10(late / early) < -27
    assert np.array_equal(response, probe.room_response())  # one fixed response


def test_channels_change_level_or_shape_and_write_a_list(tmp_path):
    rng = np.random.default_rng(0)
    samples = (0.05 * rng.standard_normal(16000)).astype(np.float32)
    write_wav(tmp_path / "a.wav", samples)
    original = read_wav(tmp_path / "a.wav")
    item = {"key": "a", "txt": "<FILLER>", "wav": str(tmp_path / "a.wav")}
    (tmp_path / "data.list").write_text(json.dumps(item) + "\n")
    for channel in ("quiet", "mic", "room"):
        probe.main(["--data", str(tmp_path / "data.list"), "--channel", channel, "--out", str(tmp_path / channel)])
        written = json.loads((tmp_path / channel / "data.list").read_text())
        assert written["key"] == "a" and written["wav"] == str(tmp_path / channel / "wav" / "a.wav")
        out = read_wav(written["wav"])
        level = 20 * np.log10(np.sqrt(np.mean(out**2)) / np.sqrt(np.mean(original**2)))
        if channel == "quiet":
            assert abs(level + 20) < 0.05
        else:  # the spectrum changes, the level does not
            assert abs(level) < 0.05 and np.abs(out - original).max() > 0.01
