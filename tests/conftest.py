"""Shared pytest fixtures. Keep each fixture small, documented and deterministic."""

from pathlib import Path

import numpy as np
import pytest
import soundfile

TINY_KEYWORDS = ("<HI_XIAOWEN>", "<NIHAO_WENWEN>")


def synth_samples(seconds=0.3, rate=16000, kind="sine", freq=440.0, seed=0, channels=1):
    """Deterministic test audio in [-1, 1]: a sine tone or white noise, shape [n] or [n, channels]."""
    n = int(round(seconds * rate))
    if kind == "sine":
        t = np.arange(n) / rate
        mono = 0.5 * np.sin(2 * np.pi * freq * t)
    elif kind == "noise":
        mono = 0.1 * np.random.default_rng(seed).standard_normal(n)
    else:
        raise ValueError(f"unknown kind {kind!r}")
    mono = np.clip(mono, -1.0, 1.0).astype(np.float32)
    return mono if channels == 1 else np.stack([mono] * channels, axis=1)


def write_test_wav(path, seconds=0.3, rate=16000, kind="sine", freq=440.0, seed=0, channels=1):
    """Write a 16-bit PCM wav (any rate/channel count, for bad-input tests too); returns its Path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    samples = synth_samples(seconds, rate, kind, freq, seed, channels)
    soundfile.write(str(path), samples, rate, subtype="PCM_16", format="WAV")
    return path


@pytest.fixture
def make_wav():
    """The `write_test_wav(path, seconds=, rate=, kind="sine"|"noise", freq=, seed=, channels=)` helper."""
    return write_test_wav


def write_tiny_corpus(root, per_class=(2, 1, 1)):
    """The DESIGN.md corpus layout (no wav.dur/data.list) under `root`; wavs in root/wavs.

    Keyword 0 is a 500 Hz tone, keyword 1 a 1200 Hz tone, fillers are white noise;
    `per_class` gives utterances per class for train, dev and test. Returns root.
    """
    root = Path(root)
    (root / "dict").mkdir(parents=True, exist_ok=True)
    (root / "dict" / "words.txt").write_text(
        "<FILLER> -1\n" + "".join(f"{token} {i}\n" for i, token in enumerate(TINY_KEYWORDS))
    )
    classes = [("<FILLER>", "noise", 0.0), (TINY_KEYWORDS[0], "sine", 500.0), (TINY_KEYWORDS[1], "sine", 1200.0)]
    for split, count in zip(("train", "dev", "test"), per_class):
        (root / split).mkdir(parents=True, exist_ok=True)
        scp, text = [], []
        for label, (token, kind, freq) in enumerate(classes):
            for n in range(count):
                key = f"{split}_c{label}_{n:02d}"
                wav = write_test_wav(
                    root / "wavs" / split / f"{key}.wav",
                    seconds=0.25 + 0.05 * n,
                    kind=kind,
                    freq=freq,
                    seed=1000 * len(split) + 100 * label + n,
                )
                scp.append(f"{key} {wav}\n")
                text.append(f"{key} {token}\n")
        (root / split / "wav.scp").write_text("".join(scp))
        (root / split / "text").write_text("".join(text))
    return root


@pytest.fixture
def tiny_corpus(tmp_path):
    """A tiny 3-class corpus in the DESIGN.md layout (dict/, train/, dev/, test/ with wav.scp and text)."""
    return write_tiny_corpus(tmp_path / "data")
