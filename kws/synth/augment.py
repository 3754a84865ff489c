"""Signal processing for the synthetic corpus: resampling, noise, reverberation, levels.

numpy only; every random choice comes from the `numpy.random.Generator` passed in.
"""

import functools
from fractions import Fraction

import numpy as np

NOISE_TYPES = ("white", "pink", "brown", "hum", "babble")


@functools.lru_cache(maxsize=16)
def _polyphase_table(up, down, zero_crossings=8, beta=8.0, rolloff=0.94):
    """Kaiser-windowed sinc taps: table[p, j] weights input sample i + j - half + 1 for phase p/up."""
    fc = min(1.0, up / down) * rolloff  # cut-off relative to the input Nyquist frequency
    half = int(np.ceil(zero_crossings / fc))
    offsets = np.arange(-half + 1, half + 1)
    t = np.arange(up)[:, None] / up - offsets[None, :]
    width = half
    window = np.i0(beta * np.sqrt(np.clip(1.0 - (t / width) ** 2, 0.0, None))) / np.i0(beta)
    table = fc * np.sinc(fc * t) * window
    return table.astype(np.float64), half


def resample(samples, orig_rate, new_rate, block=1 << 16):
    """Band-limited rational resampling (polyphase windowed sinc). Rates may be Fractions."""
    ratio = Fraction(new_rate) / Fraction(orig_rate)
    if ratio == 1:
        return np.asarray(samples, dtype=np.float32)
    up, down = ratio.numerator, ratio.denominator
    table, half = _polyphase_table(up, down)
    x = np.asarray(samples, dtype=np.float64)
    n_out = -(-len(x) * up // down)
    padded = np.concatenate([np.zeros(half), x, np.zeros(half + 1)])
    offsets = np.arange(-half + 1, half + 1) + half
    out = np.empty(n_out, dtype=np.float64)
    for start in range(0, n_out, block):
        n = np.arange(start, min(start + block, n_out), dtype=np.int64) * down
        base, phase = n // up, n % up
        out[start:start + len(n)] = np.einsum("nk,nk->n", padded[base[:, None] + offsets[None, :]], table[phase])
    return out.astype(np.float32)


def pcm16_to_float(pcm):
    return np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0


def trim_silence(x, rate, threshold=0.01, margin=0.02):
    """Cut leading/trailing samples below `threshold` x peak, keeping a `margin` (seconds)."""
    if len(x) == 0:
        return x
    loud = np.flatnonzero(np.abs(x) > threshold * max(float(np.abs(x).max()), 1e-9))
    if len(loud) == 0:
        return x[:0]
    pad = int(margin * rate)
    return x[max(0, loud[0] - pad):loud[-1] + pad + 1]


def rms(x):
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64)))) if len(x) else 0.0


def set_level(x, dbfs):
    """Scale to an RMS level in dB full scale."""
    level = rms(x)
    return x if level == 0 else (x * (10 ** (dbfs / 20) / level)).astype(np.float32)


def limit_peak(x, peak=0.95):
    top = float(np.abs(x).max()) if len(x) else 0.0
    return x if top <= peak else (x * (peak / top)).astype(np.float32)


def _shaped_noise(rng, n, exponent):
    """Noise with power spectral density ~ 1/f**exponent (0 white, 1 pink, 2 brown), unit RMS."""
    spectrum = np.fft.rfft(rng.standard_normal(n))
    freqs = np.fft.rfftfreq(n)
    freqs[0] = freqs[1] if n > 1 else 1.0
    noise = np.fft.irfft(spectrum / freqs ** (exponent / 2), n)
    noise -= noise.mean()
    level = rms(noise)
    return (noise / level if level > 0 else noise).astype(np.float32)


def make_noise(rng, kind, n, rate, babble_sources=()):
    """Unit-RMS noise of `n` samples: white, pink, brown, hum (mains + harmonics) or babble."""
    if kind == "white":
        return rng.standard_normal(n).astype(np.float32)
    if kind == "pink":
        return _shaped_noise(rng, n, 1.0)
    if kind == "brown":
        return _shaped_noise(rng, n, 2.0)
    if kind == "hum":
        t = np.arange(n) / rate
        base = rng.choice([50.0, 60.0]) * rng.uniform(0.98, 1.02)
        hum = sum(rng.uniform(0.1, 1.0) / h * np.sin(2 * np.pi * base * h * t + rng.uniform(0, 2 * np.pi))
                  for h in range(1, 8))
        hum = hum + 0.05 * rng.standard_normal(n)
        return (hum / rms(hum)).astype(np.float32)
    if kind == "babble":
        sources = [s for s in babble_sources if len(s)]
        if not sources:
            return _shaped_noise(rng, n, 1.0)
        mix = np.zeros(n, dtype=np.float32)
        for _ in range(min(len(sources), int(rng.integers(3, 6)))):
            src = set_level(sources[int(rng.integers(len(sources)))], -25)
            reps = -(-(n + len(src)) // len(src))
            tiled = np.tile(src, reps)
            start = int(rng.integers(len(src)))
            mix += tiled[start:start + n] * rng.uniform(0.5, 1.0)
        level = rms(mix)
        return mix / level if level > 0 else mix
    raise ValueError(f"unknown noise type {kind!r}")


def add_noise(x, noise, snr_db, speech_rms):
    """Add unit-RMS `noise` at `snr_db` relative to `speech_rms` (the level of the speech itself)."""
    scale = speech_rms / (10 ** (snr_db / 20)) if speech_rms > 0 else 1e-3
    return (x + scale * noise[:len(x)]).astype(np.float32)


def reverberate(x, rng, rate, rt60):
    """Convolve with a synthetic room response: a direct path plus exponentially decaying noise."""
    length = max(int(min(1.2 * rt60, 1.0) * rate), 16)
    t = np.arange(length) / rate
    ir = rng.standard_normal(length) * np.exp(-6.9078 * t / rt60)  # -60 dB at rt60
    predelay = int(rng.uniform(0.002, 0.02) * rate)
    ir[:predelay] = 0.0
    ir *= rng.uniform(0.3, 1.0) / max(np.sqrt(np.sum(ir ** 2)), 1e-9)
    ir[0] = 1.0
    n = len(x) + length - 1
    size = 1 << (n - 1).bit_length()
    wet = np.fft.irfft(np.fft.rfft(x, size) * np.fft.rfft(ir, size), size)[:len(x)]
    before, after = rms(x), rms(wet)
    return (wet * (before / after) if after > 0 else wet).astype(np.float32)
