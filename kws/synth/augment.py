"""Signal processing for the synthetic corpus: resampling, noise, reverberation, levels.

numpy only; every random choice comes from the `numpy.random.Generator` passed in.
"""

import functools
from fractions import Fraction

import numpy as np

from kws.formants import formant_warp

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
    """Band-limited rational resampling (polyphase windowed sinc). Rates may be Fractions.

    Output sample m * up + p (p < up) weighs the window of inputs starting at m * down + p * down // up
    with phase p's taps: the windows are rows of one strided view, gathered a period of `up` outputs at a
    time, so each output is the same sum in the same order as a per-sample gather would make it."""
    ratio = Fraction(new_rate) / Fraction(orig_rate)
    if ratio == 1:
        return np.asarray(samples, dtype=np.float32)
    up, down = ratio.numerator, ratio.denominator
    table, half = _polyphase_table(up, down)
    x = np.asarray(samples, dtype=np.float64)
    n_out = -(-len(x) * up // down)
    periods = -(-n_out // up)
    first = np.arange(up, dtype=np.int64) * down  # the first period's input positions x up
    starts, phases = first // up + 1, first % up
    tail = max(half + 1, (periods - 1) * down + int(starts[-1]) + 2 * half - half - len(x))
    padded = np.concatenate([np.zeros(half), x, np.zeros(tail)])
    windows = np.lib.stride_tricks.sliding_window_view(padded, 2 * half)
    taps = table[phases]
    out = np.empty((periods, up), dtype=np.float64)
    step = max(1, block // up)
    for m in range(0, periods, step):
        rows = np.arange(m, min(m + step, periods), dtype=np.int64)[:, None] * down + starts[None, :]
        out[m : m + len(rows)] = np.einsum("mpk,pk->mp", windows[rows], taps)
    return out.reshape(-1)[:n_out].astype(np.float32)


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
    return x[max(0, loud[0] - pad) : loud[-1] + pad + 1]


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
        hum = sum(
            rng.uniform(0.1, 1.0) / h * np.sin(2 * np.pi * base * h * t + rng.uniform(0, 2 * np.pi))
            for h in range(1, 8)
        )
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
            mix += tiled[start : start + n] * rng.uniform(0.5, 1.0)
        level = rms(mix)
        return mix / level if level > 0 else mix
    raise ValueError(f"unknown noise type {kind!r}")


def add_noise(x, noise, snr_db, speech_rms):
    """Add unit-RMS `noise` at `snr_db` relative to `speech_rms` (the level of the speech itself)."""
    scale = speech_rms / (10 ** (snr_db / 20)) if speech_rms > 0 else 1e-3
    return (x + scale * noise[: len(x)]).astype(np.float32)


def reverberate(x, rng, rate, rt60):
    """Convolve with a synthetic room response: a direct path plus exponentially decaying noise."""
    length = max(int(min(1.2 * rt60, 1.0) * rate), 16)
    t = np.arange(length) / rate
    ir = rng.standard_normal(length) * np.exp(-6.9078 * t / rt60)  # -60 dB at rt60
    predelay = int(rng.uniform(0.002, 0.02) * rate)
    ir[:predelay] = 0.0
    ir *= rng.uniform(0.3, 1.0) / max(np.sqrt(np.sum(ir**2)), 1e-9)
    ir[0] = 1.0
    n = len(x) + length - 1
    size = 1 << (n - 1).bit_length()
    wet = np.fft.irfft(np.fft.rfft(x, size) * np.fft.rfft(ir, size), size)[: len(x)]
    before, after = rms(x), rms(wet)
    return (wet * (before / after) if after > 0 else wet).astype(np.float32)


# --- speaker augmentation: changes who speaks (vocal tract, pitch, tempo, timbre, timing), not the room ----
SPEAKER_TRANSFORMS = (
    "vtl",
    "pitch",
    "rate",
    "eq",
    "gaps",
    "formants",
    "breath",
    "timing",
    "slow",
    "variants",
    "own_variants",
)


def _frames(x, size, hop):
    n = 1 + max(0, -(-(len(x) - size) // hop))
    padded = np.concatenate([x, np.zeros(n * hop + size - len(x), np.float64)])
    return np.lib.stride_tricks.sliding_window_view(padded, size)[::hop][:n]


def time_stretch(x, rate, factor, frame_s=0.03, tolerance_s=0.01, curve=None):
    """WSOLA: duration x `factor` (> 1 slower) at unchanged pitch and formants. `curve`: (positions 0..1
    in the input, log2 multipliers), a local factor that varies along the utterance (factor x 2^curve),
    so that some sounds are drawn out and others hurried, as speakers and synthesisers time them."""
    x = np.asarray(x, dtype=np.float64)
    if (abs(factor - 1.0) < 1e-6 and curve is None) or len(x) == 0:
        return x.astype(np.float32)
    size = int(frame_s * rate) & ~1
    hop_out, tol = size // 2, int(tolerance_s * rate)
    window = np.hanning(size)
    if curve is None:
        n_out = int(round(len(x) * factor))
        n_frames = n_out // hop_out + 1
        targets = [tol + int(k * hop_out / factor) for k in range(n_frames)]
        slowest = factor
    else:
        targets, position = [], 0.0
        while position < len(x):
            targets.append(tol + int(position))
            position += hop_out / (factor * 2 ** np.interp(position / len(x), *curve))
        n_frames = len(targets)
        n_out = n_frames * hop_out
        slowest = factor * 2 ** float(np.min(curve[1]))
    src = np.concatenate([np.zeros(tol), x, np.zeros(size + tol + int(hop_out / slowest) + hop_out)])
    out = np.zeros(n_frames * hop_out + size)
    norm = np.zeros_like(out)
    previous = tol  # input position (in src) of the frame placed last
    for k, target in enumerate(targets):
        if k:
            # the frame that best continues the previous one (waveform similarity), near its nominal place
            natural = src[previous + hop_out : previous + hop_out + size]
            region = src[target - tol : target + tol + size]
            best = target - tol + int(np.argmax(np.correlate(region, natural, "valid")))
        else:
            best = target
        out[k * hop_out : k * hop_out + size] += src[best : best + size] * window
        norm[k * hop_out : k * hop_out + size] += window
        previous = best
    return (out / np.maximum(norm, 1e-3))[:n_out].astype(np.float32)


def timing_curve(rng, knots=5, spread=0.35):
    """A random local tempo along an utterance: log2 multipliers at evenly spaced knots (0.78x-1.27x)."""
    return np.linspace(0.0, 1.0, knots), rng.uniform(-spread, spread, knots)


def _stft(x, size, hop):
    window = np.sqrt(np.hanning(size + 1)[:-1])  # sqrt-Hann analysis and synthesis: overlap-adds to 1 at hop size/4 x2
    return np.fft.rfft(_frames(np.asarray(x, np.float64), size, hop) * window, axis=1), window


def _istft(spec, window, hop, length):
    frames = np.fft.irfft(spec, len(window), axis=1) * window
    size = len(window)
    out = np.zeros(len(frames) * hop + size)
    norm = np.zeros_like(out)
    if size % hop == 0:
        # overlap-add as size/hop shifted block sums, the last block first: each sample adds its frames in
        # the order of the frame loop below, so the result is the same to the bit
        n, parts = len(frames), size // hop
        blocks = frames.reshape(n, parts, hop)
        squared = (window**2).reshape(parts, hop)
        for j in reversed(range(parts)):
            out[j * hop : (j + n) * hop] += blocks[:, j].reshape(-1)
            norm[j * hop : (j + n) * hop] += np.tile(squared[j], n)
        return (out / np.maximum(norm, 1e-3))[:length]
    for i, frame in enumerate(frames):
        out[i * hop : i * hop + size] += frame
        norm[i * hop : i * hop + size] += window**2
    return (out / np.maximum(norm, 1e-3))[:length]


def reshape_spectrum(x, rate, formant=1.0, gain_db=None, size=512, lifter=30, warp=None, breath=None):
    """Per STFT frame: move the spectral envelope (cepstrally smoothed) along frequency by `formant`
    (> 1: a shorter vocal tract, formants up) keeping the harmonics, then apply `gain_db(freqs)`.
    `warp` (instead of `formant`): (knot frequencies Hz, factors), a piecewise-linear factor per frequency,
    so that the first formant can move one way and the second another (see `formant_warp`).
    `breath`: (level, generator): noise of random phase shaped by each frame's envelope is added, `level`
    times the envelope at 8 kHz falling to a third of that at 0 Hz: aspiration, as a breathy voice has it
    and a synthesiser's pulse train has not (the harmonics-to-noise ratio falls, the envelope stays)."""
    x = np.asarray(x, dtype=np.float64)
    if len(x) == 0:
        return x.astype(np.float32)
    hop = size // 4
    spec, window = _stft(x, size, hop)
    freqs = np.fft.rfftfreq(size, 1 / rate)
    gain = np.ones(len(freqs))
    if formant != 1.0 or warp is not None or breath is not None:
        log_mag = np.log(np.maximum(np.abs(spec), 1e-9))
        cep = np.fft.irfft(log_mag, size, axis=1)
        cep[:, lifter : size - lifter + 1] = 0.0
        envelope = np.fft.rfft(cep, size, axis=1).real
    if breath is not None:
        level, generator = breath
        shape = level * (1.0 + 2.0 * freqs / freqs[-1]) / 3.0
        phase = np.exp(2j * np.pi * generator.random(spec.shape))
        spec = spec + np.exp(envelope) * shape * phase
    if formant != 1.0 or warp is not None:
        # the envelope at f moves to f * formant * factor(f) (factors keep that increasing): one linear
        # interpolation, the same for every frame
        moved = freqs * formant * (np.interp(freqs, *warp) if warp is not None else 1.0)
        right = np.clip(np.searchsorted(moved, freqs, side="right"), 1, len(freqs) - 1)
        left = right - 1
        weight = np.clip((freqs - moved[left]) / (moved[right] - moved[left]), 0.0, 1.0)
        warped = envelope[:, left] * (1.0 - weight) + envelope[:, right] * weight
        spec = spec * np.exp(warped - envelope)
    if gain_db is not None:
        gain = 10 ** (gain_db(freqs) / 20)
    return _istft(spec * gain, window, hop, len(x)).astype(np.float32)


def pitch_shift(x, rate, semitones, formant=1.0, tempo=1.0, warp=None, gain_db=None, breath=None, timing=None):
    """Pitch x 2^(semitones/12) at unchanged duration (x tempo, varying along the utterance by `timing`,
    time_stretch's curve) and formants (x formant; `warp`, `gain_db` and `breath` as in reshape_spectrum,
    applied in the same pass)."""
    factor = Fraction(round(2 ** (semitones / 12), 2)).limit_denominator(100)
    y = resample(x, Fraction(rate), Fraction(rate) / factor) if factor != 1 else np.asarray(x, np.float32)
    y = time_stretch(y, rate, float(factor) * tempo, curve=timing)
    relative = formant / float(factor)  # resampling moved the formants by `factor` too: undo, then apply
    if abs(relative - 1) <= 1e-3 and warp is None and gain_db is None and breath is None:
        return y
    return reshape_spectrum(y, rate, formant=relative, warp=warp, gain_db=gain_db, breath=breath)


def spectral_gain(rng):
    """A random smooth EQ curve in dB: a tilt per octave around 1 kHz plus two peaks or notches."""
    tilt = rng.uniform(-3.0, 3.0)
    bumps = [(rng.uniform(np.log2(200), np.log2(5000)), rng.uniform(-6, 6), rng.uniform(0.3, 1.0)) for _ in range(2)]

    def gain_db(freqs):
        octave = np.log2(np.maximum(freqs, 100.0))
        curve = tilt * (octave - np.log2(1000.0))
        for centre, height, width in bumps:
            curve = curve + height * np.exp(-0.5 * ((octave - centre) / width) ** 2)
        return curve

    return gain_db


def jitter_gaps(x, rate, rng, low=0.4, high=2.5, min_gap_s=0.03, floor_db=-35.0):
    """Each pause inside the speech (10 ms frames `floor_db` below the loudest) is scaled by a random
    factor: the timing between words changes, the words do not."""
    hop = rate // 100
    n = len(x) // hop
    if n < 3:
        return x
    energy = np.square(x[: n * hop].astype(np.float64)).reshape(n, hop).mean(axis=1)
    quiet = energy < energy.max() * 10 ** (floor_db / 10)
    loud = np.flatnonzero(~quiet)
    if len(loud) == 0:
        return x
    parts, position, frame = [], 0, loud[0]
    while frame <= loud[-1]:
        if quiet[frame]:
            end = frame
            while quiet[end]:
                end += 1
            if end - frame >= min_gap_s * 100:
                start, stop = frame * hop, end * hop
                parts.append(x[position:start])
                gap = x[start:stop]
                length = int(len(gap) * rng.uniform(low, high))
                parts.append(np.resize(gap, length) if length > len(gap) else gap[:length])
                position = stop
            frame = end
        else:
            frame += 1
    parts.append(x[position:])
    return np.concatenate(parts).astype(np.float32)


def change_speaker(x, rate, rng, transforms=SPEAKER_TRANSFORMS, p=0.6):
    """Speaker augmentation: each transform of `transforms` with probability `p`. The draws are the same
    whichever transforms are enabled (so enabling one leaves the others' values alone)."""
    draws = {
        "vtl": (rng.random() < p, rng.uniform(0.87, 1.15)),
        "pitch": (rng.random() < p, rng.uniform(-4.0, 4.0)),
        "rate": (rng.random() < p, rng.uniform(0.85, 1.2)),
        "eq": (rng.random() < p, spectral_gain(rng)),
        "gaps": (rng.random() < p, np.random.default_rng(rng.integers(2**63))),
        "formants": (rng.random() < p, formant_warp(rng)),
        # drawn after the others: their draws stay as they were before it existed
        "breath": (rng.random() < p, (rng.uniform(0.05, 0.4), np.random.default_rng(rng.integers(2**63)))),
        "timing": (rng.random() < p, timing_curve(rng)),
        # a slow speaker, in place of rate's draw and half as often: 1.2-1.5x the duration, where rate
        # reaches 1.2x (a synthesis method that draws its words out, as MBROLA's Mandarin does, said 1.4x
        # as long as the training voices' median keyword)
        "slow": (rng.random() < p / 2, rng.uniform(1.2, 1.5)),
    }
    on = {name: value for name, (hit, value) in draws.items() if hit and name in transforms}
    y = np.asarray(x, np.float32)
    if "gaps" in on:
        y = jitter_gaps(y, rate, on["gaps"])
    spectral = {
        "formant": on.get("vtl", 1.0),
        "warp": on.get("formants"),
        "gain_db": on.get("eq"),
        "breath": on.get("breath"),
    }
    tempo = on.get("slow", on.get("rate", 1.0))
    if on.keys() & {"pitch", "rate", "timing", "slow"}:  # one STFT pass for the envelope and the EQ
        y = pitch_shift(y, rate, on.get("pitch", 0.0), tempo=tempo, timing=on.get("timing"), **spectral)
    elif on.keys() & {"vtl", "formants", "eq", "breath"}:
        y = reshape_spectrum(y, rate, **spectral)
    return y
