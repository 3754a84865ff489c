"""kws.audio.write_wav: the synthetic corpus keeps its bytes (the same as soundfile writing a file, which
the corpora of earlier versions were written with), reads back as written, and leaves nothing half-written."""

import numpy as np
import pytest
import soundfile

from kws.audio import read_wav, write_wav


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_write_wav_writes_the_bytes_soundfile_writes(tmp_path, dtype):
    rng = np.random.default_rng(7)
    samples = (rng.standard_normal(48_000) * 0.4).astype(dtype)
    # over-range samples (clipped), exact full scale, and values a hair under an integer step of 1/32768
    samples[:6] = [1.7, -1.3, 1.0, -1.0, 20 / 32768 - 1e-9, -82 / 32768 - 1e-9]
    write_wav(tmp_path / "ours.wav", samples)
    soundfile.write(str(tmp_path / "soundfile.wav"), np.clip(samples, -1.0, 1.0), 16000, subtype="PCM_16")
    assert (tmp_path / "ours.wav").read_bytes() == (tmp_path / "soundfile.wav").read_bytes()
    back = read_wav(tmp_path / "ours.wav")
    assert back.shape == samples.shape
    assert np.max(np.abs(back - np.clip(samples, -1.0, 1.0))) <= 1 / 32768 + 1e-7
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ours.wav", "soundfile.wav"]  # no temporary left


def test_write_wav_that_fails_leaves_the_old_file(tmp_path):
    target = tmp_path / "kept.wav"
    write_wav(target, np.zeros(160, dtype=np.float32))
    before = target.read_bytes()
    with pytest.raises(ValueError):
        write_wav(target, np.zeros((2, 2, 2), dtype=np.float32))  # not a signal: the encoder refuses it
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["kept.wav"]
