"""Random frequency warps of a voice's spectral envelope, as (knot frequencies Hz, factors): the envelope at
f moves to f x factor(f), the factor interpolated linearly between knots. Shared by the synthesiser's
speaker augmentation (kws.synth.augment, on the waveform) and by training's (kws.mel_warp, on log-mel
features); numpy only, so that neither side's code pulls in the other's."""

import numpy as np


def formant_warp(rng, low=0.85, high=1.2):
    """A random piecewise-linear frequency warp of the envelope: independent factors around the first
    (500 Hz), second (1.5 kHz) and third (3 kHz) formant regions, back to 1 at the top of the band.
    Speakers differ in more than vocal-tract length: one voice's first formant sits 20 % higher while its
    second does not move (piecewise-linear VTLN in ASR models the same). Returns (knots Hz, factors)."""
    f1, f2, f3 = rng.uniform(low, high, 3)
    return np.array([0.0, 500.0, 1500.0, 3000.0, 6000.0, 8000.0]), np.array([f1, f1, f2, f3, 1.0, 1.0])


def vtl_warp(rng, low=0.85, high=1.2):
    """One factor for the envelope below 4.8 kHz (a vocal-tract length, as VTLP in ASR), back to 1 at
    8 kHz so that the band's top stays in the band. Returns (knots Hz, factors)."""
    factor = rng.uniform(low, high)
    return np.array([0.0, 4800.0, 8000.0]), np.array([factor, factor, 1.0])
