"""Augmentation of a training batch on the training device (`dataset_conf.batch_augment`; issue 15, item 3).

A new room, noise and level for every utterance in every epoch, computed on the padded batch of samples
(int16 scale) before fbank, on the device the model trains on; the corpus on disk stays as it is. In
order: reverberation, by FFT convolution with a generated room impulse response (a direct path, then
exponentially decaying Gaussian noise whose decay reaches -60 dB at the drawn RT60; the direct path's
energy over the tail's is the drawn direct-to-reverberant ratio: 0 dB a tail as loud, -6 dB one four
times as loud, a talker across the room), keeping the speech's level; additive noise at a random SNR
over the utterance's speech power, drawn from a noise bank (16 kHz mono wavs listed in a file, one path
per line or `key path`) or generated (coloured noise, power falling as 1 / f^c with c drawn from
`colour`: 0 white, 1 pink, 2 brown); a gain in dB. Samples past an utterance's length stay zero; the
result is clipped to the int16 range, as a recording would be.

Babble (off unless set) mixes other talkers into an utterance: 1 to 4 of the batch's own negatives, each
from a random point of itself (wrapping around its end) at a random weight in [0.5, 1], their sum at a
random SNR over the utterance's speech. It comes after the room and before the noise; a keyword is never a
babble talker, so no negative hears one. The batch is a fresh draw of talkers every step, where a corpus
rendered once has the same few mixed into each utterance for good.

    batch_augment:
      gain_db: [-6, 6]
      noise: {p: 0.5, snr_db: [5, 30], colour: [0, 2], bank: null}
      reverb: {p: 0.3, rt60_s: [0.2, 0.8], drr_db: [0, 0]}
      babble: {p: 0.3, snr_db: [0, 20], talkers: [1, 4]}   # absent or null: off

Every draw comes from generators seeded by (seed, epoch, rank, batch) like dither and SpecAugment, so CPU
runs stay bit-identical and a resumed epoch repeats itself. Speed and tempo changes are not here: they
change an utterance's length and so the frames its labels point at (the synthetic corpus varies rate
when it speaks).
"""

import math
from pathlib import Path

import numpy as np
import torch

from kws.audio import SAMPLE_RATE, read_wav
from kws.device import to_device
from kws.errors import KwsError

DEFAULTS = {
    "gain_db": [-6.0, 6.0],
    "noise": {"p": 0.5, "snr_db": [5.0, 30.0], "colour": [0.0, 2.0], "bank": None},
    "reverb": {"p": 0.3, "rt60_s": [0.2, 0.8], "drr_db": [0.0, 0.0]},
    "babble": {"p": 0.3, "snr_db": [0.0, 20.0], "talkers": [1, 4]},
}
OFF_UNLESS_SET = ("babble",)  # added after the others: configs written before it mean it off
MAX_TALKERS = 8
MAX_RIR_S = 1.0  # impulse responses are cut here: past it the tail of an RT60 <= 1 s is below -60 dB
WHERE = "dataset_conf.batch_augment"


def _range(value, where, low=-math.inf, high=math.inf):
    if (
        not isinstance(value, (list, tuple))
        or len(value) != 2
        or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
        or not low <= value[0] <= value[1] <= high
    ):
        raise KwsError(f"{where}: expected [low, high] with {low:g} <= low <= high <= {high:g}, got {value!r}")
    return [float(value[0]), float(value[1])]


def _probability(value, where):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise KwsError(f"{where}: expected a probability in [0, 1], got {value!r}")
    return float(value)


def _section(conf, name):
    given = conf.get(name, None if name in OFF_UNLESS_SET else DEFAULTS[name])
    if given is None or given is False:
        return None
    if not isinstance(given, dict):
        raise KwsError(f"{WHERE}.{name}: expected a mapping (or null to turn it off), got {given!r}")
    unknown = sorted(set(given) - set(DEFAULTS[name]))
    if unknown:
        raise KwsError(f"{WHERE}.{name}.{unknown[0]}: unknown key (allowed: {', '.join(DEFAULTS[name])})")
    return {**DEFAULTS[name], **given}


def parse_conf(conf):
    """dataset_conf.batch_augment -> the checked settings with defaults filled in, or None when off."""
    if conf is None or conf is False:
        return None
    if conf is True:
        conf = {}
    if not isinstance(conf, dict):
        raise KwsError(f"{WHERE}: expected a mapping, true or null, got {conf!r}")
    unknown = sorted(set(conf) - set(DEFAULTS))
    if unknown:
        raise KwsError(f"{WHERE}.{unknown[0]}: unknown key (allowed: {', '.join(DEFAULTS)})")
    gain = conf.get("gain_db", DEFAULTS["gain_db"])
    settings = {"gain_db": None if gain is None else _range(gain, f"{WHERE}.gain_db", -60, 60)}
    noise = _section(conf, "noise")
    if noise is not None:
        noise["p"] = _probability(noise["p"], f"{WHERE}.noise.p")
        noise["snr_db"] = _range(noise["snr_db"], f"{WHERE}.noise.snr_db", -20, 100)
        noise["colour"] = _range(noise["colour"], f"{WHERE}.noise.colour", 0, 3)
    reverb = _section(conf, "reverb")
    if reverb is not None:
        reverb["p"] = _probability(reverb["p"], f"{WHERE}.reverb.p")
        reverb["rt60_s"] = _range(reverb["rt60_s"], f"{WHERE}.reverb.rt60_s", 0.05, MAX_RIR_S)
        reverb["drr_db"] = _range(reverb["drr_db"], f"{WHERE}.reverb.drr_db", -30, 30)
    babble = _section(conf, "babble")
    if babble is not None:
        babble["p"] = _probability(babble["p"], f"{WHERE}.babble.p")
        babble["snr_db"] = _range(babble["snr_db"], f"{WHERE}.babble.snr_db", -20, 100)
        talkers = babble["talkers"]
        _range(talkers, f"{WHERE}.babble.talkers", 1, MAX_TALKERS)  # a pair in order, else its own error
        if not all(isinstance(n, int) for n in talkers):
            raise KwsError(f"{WHERE}.babble.talkers: expected [low, high] whole numbers, got {talkers!r}")
        babble["talkers"] = [int(n) for n in talkers]
    settings.update(noise=noise, reverb=reverb, babble=babble)
    return settings


def read_noise_bank(path):
    """The wavs a bank file lists (one path per line, or `key path`; relative to the file; # comments),
    concatenated as one float32 tensor on the int16 scale."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise KwsError(f"{WHERE}.noise.bank: cannot read {path} ({err.strerror or err})") from None
    parts = []
    for number, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        wav = Path(line.split()[-1])
        wav = wav if wav.is_absolute() else path.parent / wav
        try:
            parts.append(read_wav(wav))
        except KwsError as err:
            raise KwsError(f"{path}:{number}: {err}") from None
    if not parts:
        raise KwsError(f"{path}: the noise bank lists no wav files")
    return torch.from_numpy(np.concatenate(parts) * 32768.0)


def room_impulse_responses(rt60, drr_db, generator, device, rate=SAMPLE_RATE):
    """[B, L] impulse responses, L the longest RT60 (at most MAX_RIR_S): Gaussian noise decaying by 60 dB
    over each row's own RT60 (a numpy array: its longest is read on the host), its energy 10^(-drr/10)
    (`drr_db`, a numpy array), and a direct path of 1 at t = 0."""
    length = int(min(float(np.float32(np.max(rt60))), MAX_RIR_S) * rate)  # float32, as the decay below
    rt60 = to_device(rt60, device, torch.float32)
    t = torch.arange(length, device=device) / rate
    decay = torch.exp(-3.0 * math.log(10.0) * t.unsqueeze(0) / rt60.unsqueeze(1))  # 10^(-3 t / rt60)
    rir = torch.randn(len(rt60), length, generator=generator, device=generator.device).to(device) * decay
    rir = rir / rir.square().sum(1, keepdim=True).sqrt().clamp_min(1e-12)
    rir = rir * to_device(10.0 ** (-np.asarray(drr_db) / 20.0), device, torch.float32).unsqueeze(1)
    rir[:, 0] = 1.0  # the direct path; the tail's energy relative to it is the DRR
    return rir


def fast_fft_size(n):
    """The smallest 2^a 3^b 5^c >= n: an FFT of that size takes 0.4-0.9x the time of the next power of
    two's at the lengths of a batch (4 s of speech and a 0.8 s impulse response: 76,800 against 131,072)."""
    best = 1 << max(n - 1, 0).bit_length()
    power5 = 1
    while power5 < best:
        power35 = power5
        while power35 < best:
            size = power35
            while size < n:
                size *= 2
            best = min(best, size)
            power35 *= 3
        power5 *= 5
    return best


def _coloured_noise(rows, samples, colour, generator, device):
    white = torch.randn(rows, samples, generator=generator, device=generator.device).to(device)
    spectrum = torch.fft.rfft(white)
    freqs = torch.fft.rfftfreq(samples, device=device).clamp_min(1.0 / samples)
    spectrum = spectrum * freqs.unsqueeze(0).pow(-colour.unsqueeze(1) / 2.0)
    return torch.fft.irfft(spectrum, n=samples)


def _talkers_mix(samples, sources, starts, weights, lengths, host_lengths, width, dtype, by_slices=None):
    """[rows, width]: the sum over talkers t of weights[:, t] x row sources[:, t] of `samples` from sample
    starts[:, t] on, wrapping around that row's length (numpy arrays on the host, [rows, talkers]). On a
    CPU a slice, roll and tile per talker (by_slices; 8x faster there), elsewhere one gather per talker
    column (few kernels); the same numbers either way."""
    mix = torch.zeros(len(sources), width, dtype=dtype, device=samples.device)
    if by_slices if by_slices is not None else samples.device.type == "cpu":
        for i, j in zip(*np.nonzero(weights)):
            source, start, length = int(sources[i, j]), int(starts[i, j]), max(int(host_lengths[sources[i, j]]), 1)
            voice = samples[source, :length].to(dtype)
            voice = torch.cat([voice[start:], voice[:start]]).repeat(-(-width // length))[:width]
            mix[i] += voice * float(weights[i, j])
        return mix
    positions = torch.arange(width, device=samples.device)
    sources, starts = to_device(sources, samples.device), to_device(starts, samples.device)
    weights, source_lengths = to_device(weights, samples.device, dtype), lengths[sources].clamp_min(1)
    for talker in range(sources.shape[1]):  # [rows, width] in memory at a time, not x talkers
        index = (starts[:, talker : talker + 1] + positions) % source_lengths[:, talker : talker + 1]
        mix += samples[sources[:, talker : talker + 1], index].to(dtype) * weights[:, talker : talker + 1]
    return mix


def _power(x, mask, lengths):
    return (x.square() * mask).sum(1) / lengths.clamp_min(1)


class BatchAugment:
    """Callable (samples [B, S] on the int16 scale, lengths [B], rng: a numpy Generator) -> augmented
    float32 samples, same shape; `settings` from parse_conf. The noise and impulse responses are drawn
    on the samples' device from torch generators seeded from `rng`."""

    def __init__(self, settings, device="cpu"):
        self.settings = settings
        self.device = torch.device(device)
        noise = settings.get("noise") or {}
        self.bank = read_noise_bank(noise["bank"]).to(self.device) if noise.get("bank") else None

    def __call__(self, samples, lengths, rng, talkers=None):
        """`samples` zero past each row's length, as KwsDataset.batch and kws.dataset.gather_padded make them;
        `talkers`: a boolean per row, whether it may be mixed into the others as babble (its negatives)."""
        batch, width = samples.shape
        if batch == 0 or width == 0:
            return samples.to(torch.float32, copy=True)
        reverb, noise, gain = self.settings["reverb"], self.settings["noise"], self.settings["gain_db"]
        babble = self.settings.get("babble")
        # Every draw is made whether or not it is used, so one setting's change does not shift the others.
        seeds = {name: int(rng.integers(2**62)) for name in ("reverb", "noise")}
        draws = {
            "reverb": rng.random(batch),
            "rt60": rng.uniform(*(reverb or DEFAULTS["reverb"])["rt60_s"], batch),
            "noise": rng.random(batch),
            "snr": rng.uniform(*(noise or DEFAULTS["noise"])["snr_db"], batch),
            "colour": rng.uniform(*(noise or DEFAULTS["noise"])["colour"], batch),
            "offset": rng.random(batch),
            "gain": rng.uniform(*(gain or [0.0, 0.0]), batch),
            # drawn last: the draws above stay those of the code before reverb.drr_db
            "drr": rng.uniform(*(reverb or DEFAULTS["reverb"])["drr_db"], batch),
        }
        if babble is not None:  # drawn after all the others, which stay what they were without it
            draws["babble"] = {
                "p": rng.random(batch),
                "snr": rng.uniform(*babble["snr_db"], batch),
                "count": rng.integers(babble["talkers"][0], babble["talkers"][1] + 1, batch),
                "who": rng.random((batch, babble["talkers"][1])),
                "start": rng.random((batch, babble["talkers"][1])),
                "weight": rng.uniform(0.5, 1.0, (batch, babble["talkers"][1])),
            }
        gains = to_device(10.0 ** (draws["gain"] / 20.0), samples.device, torch.float32).unsqueeze(1)
        if reverb is None and noise is None and babble is None:
            # a gain alone keeps the zero padding zero: no mask to build and apply (the default model's
            # case; on a CPU a third of the time the full path takes, the same numbers)
            return (samples.to(torch.float32) * gains).clamp(-32768.0, 32767.0)
        x = samples.to(torch.float32, copy=True)  # rows are replaced in place below
        host_lengths = lengths.cpu().numpy() if torch.is_tensor(lengths) else np.asarray(lengths)
        lengths = to_device(lengths, x.device)
        mask = (torch.arange(width, device=x.device).unsqueeze(0) < lengths.unsqueeze(1)).to(x.dtype)
        generators = {}
        for name, seed in seeds.items():
            generators[name] = torch.Generator(device=x.device)
            generators[name].manual_seed(seed)
        if reverb is not None:
            rows = np.flatnonzero(draws["reverb"] < reverb["p"])
            if len(rows):
                at = to_device(rows, x.device)  # a numpy index would be copied to a GPU with a host sync
                rooms = draws["rt60"][rows], draws["drr"][rows]
                x[at] = self._reverberate(x[at], mask[at], lengths[at], *rooms, generators["reverb"])
        if babble is not None and talkers is not None:
            talkers = np.asarray(talkers, bool)
            x = self._add_babble(x, samples, mask, lengths, host_lengths, draws["babble"], babble["p"], talkers)
        if noise is not None:
            rows = np.flatnonzero(draws["noise"] < noise["p"])
            if len(rows):
                at = to_device(rows, x.device)
                x[at] = self._add_noise(x[at], mask[at], lengths[at], draws, rows, generators["noise"])
        return (x * gains * mask).clamp(-32768.0, 32767.0)

    def _reverberate(self, x, mask, lengths, rt60, drr_db, generator):
        rir = room_impulse_responses(rt60, drr_db, generator, x.device)
        n = fast_fft_size(x.shape[1] + rir.shape[1] - 1)
        wet = torch.fft.irfft(torch.fft.rfft(x, n=n) * torch.fft.rfft(rir, n=n), n=n)[:, : x.shape[1]] * mask
        scale = (_power(x, mask, lengths) / _power(wet, mask, lengths).clamp_min(1e-12)).sqrt()
        return wet * scale.unsqueeze(1)

    def _add_babble(self, x, samples, mask, lengths, host_lengths, draws, p, talkers):
        """Rows drawn (p) get their drawn number of the batch's talkers other than themselves, each from a
        drawn point of its own speech on, weighted, summed and scaled to the drawn SNR over the row's speech."""
        pool = np.flatnonzero(talkers & (host_lengths > 0))
        rows = [row for row in np.flatnonzero(draws["p"] < p) if np.any(pool != row)]
        if not rows:
            return x
        sources = np.zeros((len(rows), draws["who"].shape[1]), np.int64)
        weights = np.zeros(sources.shape, np.float64)  # a talker past the row's count weighs 0
        for i, row in enumerate(rows):
            others, count = pool[pool != row], int(draws["count"][row])
            sources[i, :count] = others[(draws["who"][row, :count] * len(others)).astype(np.int64)]
            weights[i, :count] = draws["weight"][row, :count]
        starts = (draws["start"][rows] * host_lengths[sources]).astype(np.int64)
        at = to_device(np.array(rows), x.device)
        mix = _talkers_mix(samples, sources, starts, weights, lengths, host_lengths, x.shape[1], x.dtype)
        snr = to_device(np.asarray(draws["snr"])[rows], x.device, x.dtype)
        speech, mix_power = _power(x[at], mask[at], lengths[at]), _power(mix, mask[at], lengths[at]).clamp_min(1e-12)
        scale = (speech / (mix_power * 10.0 ** (snr / 10.0))).sqrt()
        x[at] = x[at] + mix * scale.unsqueeze(1) * mask[at]
        return x

    def _add_noise(self, x, mask, lengths, draws, rows, generator):
        count, width = x.shape
        if self.bank is None:
            colour = to_device(draws["colour"][rows], x.device, x.dtype)
            noise = _coloured_noise(count, width, colour, generator, x.device)
        else:  # a random stretch of the bank, wrapping around its end
            starts = to_device((draws["offset"][rows] * len(self.bank)).astype(np.int64), x.device)
            index = (starts.unsqueeze(1) + torch.arange(width, device=x.device).unsqueeze(0)) % len(self.bank)
            noise = self.bank[index]
        snr = to_device(draws["snr"][rows], x.device, x.dtype)
        speech, noise_power = _power(x, mask, lengths), _power(noise, mask, lengths).clamp_min(1e-12)
        scale = (speech / (noise_power * 10.0 ** (snr / 10.0))).sqrt()
        return x + noise * scale.unsqueeze(1) * mask
