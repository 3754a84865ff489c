"""Speaker augmentation on the feature batch: a new formant warp for every training utterance in every
epoch (`dataset_conf.mel_warp`; issue 16).

The synthetic corpus already varies who speaks when it synthesises (kws.synth.augment: vocal-tract length,
formants, pitch, ...), but once per utterance: eight epochs see one speaker per utterance. Here each log-mel
frame of a drawn utterance is re-read along frequency through a piecewise-linear warp of the spectral
envelope with independent factors around the first, second and third formant regions (the same warp as
the synthesiser's, kws.formants.formant_warp: a voice whose first formant sits 20 % higher while its second does not
move), as a linear interpolation between neighbouring mel bins: one [bins x bins] matrix per utterance,
so it costs one small matrix product and works on any corpus, real recordings included.

    mel_warp: {p: 0.6, low: 0.85, high: 1.2, kind: formants}   # `mel_warp: {}` takes these; absent or null: off

`kind: vtl` draws one factor for the whole envelope below 4.8 kHz instead (a vocal-tract length, as VTLP
in ASR): the formants move together, so the vowels keep their relations. `phone_ctc: false` keeps the
warped utterances out of the phoneme CTC loss (training_config.phone_ctc): the phoneme head then learns
the vowels as they are spoken, while the keyword loss still sees every warp.

Draws come from the batch's generator (seed, epoch, rank, batch), so CPU runs stay bit-identical and a
resumed epoch repeats itself. Dev, scoring and the exports see the features as they are.
"""

import math

import numpy as np
import torch

from kws.device import to_device
from kws.errors import KwsError
from kws.formants import formant_warp, vtl_warp

DEFAULTS = {"p": 0.6, "low": 0.85, "high": 1.2}
KINDS = ("formants", "vtl")
WHERE = "dataset_conf.mel_warp"
# Kaldi's mel banks as kws.features builds them: 20 Hz to the Nyquist frequency of 16 kHz audio
LOW_HZ, HIGH_HZ = 20.0, 8000.0


def parse_conf(conf):
    """The validated settings ({p, low, high, kind, phone_ctc}), or None when `conf` is None (off)."""
    if conf is None:
        return None
    if not isinstance(conf, dict):
        raise KwsError(f"{WHERE}: expected a mapping such as {{p: 0.6, low: 0.85, high: 1.2}}, got {conf!r}")
    unknown = sorted(set(conf) - set(DEFAULTS) - {"kind", "phone_ctc"})
    if unknown:
        allowed = ", ".join([*DEFAULTS, "kind", "phone_ctc"])
        raise KwsError(f"{WHERE}.{unknown[0]}: unknown key (allowed: {allowed})")
    conf = dict(conf)
    kind = conf.pop("kind", KINDS[0])
    if kind not in KINDS:
        raise KwsError(f"{WHERE}.kind: expected one of {', '.join(KINDS)}, got {kind!r}")
    phone_ctc = conf.pop("phone_ctc", True)
    if not isinstance(phone_ctc, bool):
        raise KwsError(f"{WHERE}.phone_ctc: expected true or false, got {phone_ctc!r}")
    settings = numeric_settings(conf, DEFAULTS, WHERE)
    if not 0.5 <= settings["low"] <= settings["high"] <= 2:
        raise KwsError(
            f"{WHERE}: expected 0.5 <= low <= high <= 2, got low {settings['low']!r}, high {settings['high']!r}"
        )
    return {**{key: float(value) for key, value in settings.items()}, "kind": kind, "phone_ctc": phone_ctc}


def numeric_settings(conf, defaults, where):
    """`defaults` updated by `conf`, every value a finite number and `p` a probability; else a KwsError
    that names the key under `where` (the feature warps' settings: here and kws.time_warp)."""
    settings = {**defaults, **conf}
    for key, value in settings.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise KwsError(f"{where}.{key}: expected a number, got {value!r}")
    if not 0 <= settings["p"] <= 1:
        raise KwsError(f"{where}.p: expected a probability in [0, 1], got {settings['p']!r}")
    return settings


def _mel(hz):
    return 1127.0 * np.log1p(np.asarray(hz, dtype=np.float64) / 700.0)


def warp_matrix(warp, num_bins):
    """[num_bins, num_bins] matrix M with warped = feats @ M.T: output bin j takes the log-mel value of the
    frequency that the warp (knots Hz, factors) moves onto bin j's centre, interpolated linearly between
    the two nearest bins (clamped at the band's ends). Each row sums to 1."""
    knots, factors = warp
    grid = np.linspace(0.0, HIGH_HZ, 4001)
    moved = grid * np.interp(grid, knots, factors)  # increasing for factors in [0.5, 2] (formant_warp's shape)
    mel_low, mel_high = _mel(LOW_HZ), _mel(HIGH_HZ)
    step = (mel_high - mel_low) / (num_bins + 1)
    centres_mel = mel_low + step * np.arange(1, num_bins + 1)
    centres_hz = 700.0 * np.expm1(centres_mel / 1127.0)
    source_hz = np.interp(centres_hz, moved, grid)  # the frequency whose envelope lands on each centre
    position = np.clip((_mel(source_hz) - mel_low) / step - 1.0, 0.0, num_bins - 1.0)
    left = np.minimum(np.floor(position).astype(np.int64), num_bins - 2)
    weight = position - left
    matrix = np.zeros((num_bins, num_bins))
    rows = np.arange(num_bins)
    matrix[rows, left] = 1.0 - weight
    matrix[rows, left + 1] += weight
    return matrix


class MelWarp:
    """feats [B, T, bins] -> feats with each utterance's frames warped with probability p (one warp an
    utterance, the same for all its frames). Padding stays zero (each output is a mix of input bins)."""

    def __init__(self, settings):
        self.p, self.low, self.high = settings["p"], settings["low"], settings["high"]
        self.draw = vtl_warp if settings["kind"] == "vtl" else formant_warp

    def __call__(self, feats, rng):
        """(feats, warped: host bool tensor [B], which rows were warped). `rng`: a numpy Generator; its
        draws are the same whatever the device."""
        batch, _, bins = feats.shape
        hits = rng.random(batch) < self.p
        warps = [self.draw(rng, self.low, self.high) for _ in range(batch)]
        rows = np.flatnonzero(hits)
        if len(rows) == 0:
            return feats, torch.from_numpy(hits)
        matrices = np.stack([warp_matrix(warps[row], bins) for row in rows]).transpose(0, 2, 1)
        index = to_device(rows, feats.device)
        warped = torch.bmm(feats[index], to_device(matrices, feats.device, feats.dtype))
        feats = feats.clone()
        feats[index] = warped
        return feats, torch.from_numpy(hits)
