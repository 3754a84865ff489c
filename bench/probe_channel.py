"""A test split heard through another channel: the same utterances made quieter, through a fixed
microphone response or from across a room, written as a new data.list to score with scripts/score.py and
compute_det.py.

Recordings differ from the synthetic corpus in level, in the microphone's frequency response and in the
room; the corpus varies all three in training (levels -34 to -16 dBFS, random smooth EQ of +-3 dB an
octave and two +-6 dB bumps, rooms of RT60 0.15-0.8 s whose tail carries 0.3-1.0 of the direct path's
energy), so this asks what a model does just outside those ranges. Deterministic: one fixed impulse response.

    python bench/probe_channel.py --data results/data/synthetic/test/data.list --channel mic --out /tmp/mic
    python scripts/score.py --checkpoint results/ds_tcn_small/avg.pt --test-data /tmp/mic/data.list ...
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kws.audio import SAMPLE_RATE, read_wav, write_wav  # noqa: E402
from kws.fileio import atomic_open  # noqa: E402


def mic_gain_db(freqs):
    """A small microphone: bass rolled off below 500 Hz (6 dB an octave, first order) and a presence
    peak of 8 dB around 3 kHz (an octave wide): 20 dB between 125 Hz and 3 kHz, where the corpus's EQ
    tilt (3 dB an octave at most) reaches 14 dB."""
    freqs = np.maximum(freqs, 1.0)
    highpass = 10 * np.log10((freqs / 500.0) ** 2 / (1 + (freqs / 500.0) ** 2))
    peak = 8.0 * np.exp(-0.5 * (np.log2(freqs / 3000.0) / 0.5) ** 2)
    return highpass + peak


ROOM_RT60_S = 0.6  # a living room
ROOM_DRR_DB = -6.0  # the reverberant tail 4x the direct path's energy: a talker a few metres away
ROOM_PREDELAY_S = 0.005


def room_response():
    """The room channel's impulse response at SAMPLE_RATE: a direct path of 1, then after the predelay an
    exponentially decaying noise tail (-60 dB at ROOM_RT60_S; noise of a fixed seed) of ROOM_DRR_DB."""
    length = int(1.2 * ROOM_RT60_S * SAMPLE_RATE)
    t = np.arange(length) / SAMPLE_RATE
    tail = np.random.default_rng(0).standard_normal(length) * np.exp(-6.9078 * t / ROOM_RT60_S)
    tail[: int(ROOM_PREDELAY_S * SAMPLE_RATE)] = 0.0
    tail *= 10 ** (-ROOM_DRR_DB / 20) / np.sqrt(np.sum(tail**2))
    tail[0] = 1.0
    return tail


def through_channel(samples, channel):
    x = np.asarray(samples, np.float64)
    if channel == "quiet":  # 20 dB down: a distant or soft-spoken talker
        return x * 0.1
    if channel == "room":
        response = room_response()
        size = 1 << (len(x) + len(response) - 2).bit_length()
        y = np.fft.irfft(np.fft.rfft(x, size) * np.fft.rfft(response, size), size)[: len(x)]
    else:
        spectrum = np.fft.rfft(x)
        gain = 10 ** (mic_gain_db(np.fft.rfftfreq(len(x), 1 / SAMPLE_RATE)) / 20)
        y = np.fft.irfft(spectrum * gain, len(x))
    before, after = np.sqrt(np.mean(x**2)), np.sqrt(np.mean(y**2))
    y = y * (before / after) if after > 0 else y  # the shape changes, not the level
    return np.clip(y, -1.0, 32767 / 32768)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="data.list of the split")
    parser.add_argument("--channel", choices=["quiet", "mic", "room"], required=True)
    parser.add_argument("--out", required=True, help="folder for the wavs and data.list")
    args = parser.parse_args(argv)
    out = Path(args.out)
    (out / "wav").mkdir(parents=True, exist_ok=True)
    lines = Path(args.data).read_text().splitlines()
    with atomic_open(out / "data.list") as handle:
        for line in lines:
            item = json.loads(line)
            wav = out / "wav" / f"{item['key']}.wav"
            write_wav(wav, through_channel(read_wav(item["wav"]), args.channel).astype(np.float32))
            handle.write(json.dumps(item | {"wav": str(wav)}, ensure_ascii=False) + "\n")
    print(f"{len(lines)} utterances through '{args.channel}' -> {out / 'data.list'}")


if __name__ == "__main__":
    main()
