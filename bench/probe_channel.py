"""A test split heard through another channel: the same utterances made quieter or through a fixed
microphone response, written as a new data.list to score with scripts/score.py and compute_det.py.

Recordings differ from the synthetic corpus in level and in the microphone's frequency response; the
corpus varies both in training (levels -34 to -16 dBFS, random smooth EQ of +-3 dB an octave and two
+-6 dB bumps), so this asks what a model does just outside those ranges. Deterministic: no random draw.

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


def through_channel(samples, channel):
    x = np.asarray(samples, np.float64)
    if channel == "quiet":  # 20 dB down: a distant or soft-spoken talker
        return x * 0.1
    spectrum = np.fft.rfft(x)
    gain = 10 ** (mic_gain_db(np.fft.rfftfreq(len(x), 1 / SAMPLE_RATE)) / 20)
    y = np.fft.irfft(spectrum * gain, len(x))
    before, after = np.sqrt(np.mean(x**2)), np.sqrt(np.mean(y**2))
    y = y * (before / after) if after > 0 else y  # the shape changes, not the level
    return np.clip(y, -1.0, 32767 / 32768)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="data.list of the split")
    parser.add_argument("--channel", choices=["quiet", "mic"], required=True)
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
