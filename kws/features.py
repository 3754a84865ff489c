"""Kaldi-compatible fbank features: the one implementation used by CMVN, training, scoring and detection."""

DEFAULT_FBANK = {"num_mel_bins": 40, "frame_length": 25, "frame_shift": 10, "dither": 0.0}


def fbank_settings(fbank_conf):
    """The fbank settings with defaults filled in (dither included)."""
    settings = dict(DEFAULT_FBANK)
    settings.update(fbank_conf or {})
    return settings


def compute_fbank(samples, fbank_conf, dither=None, generator=None):
    """fbank of float samples in [-1, 1] (a 1-D array or tensor) -> Tensor [frames, num_mel_bins].

    Like WeKws, the waveform is scaled to the int16 range first. `dither` overrides the
    configured dither (0 for CMVN statistics and scoring).
    """
    # Imported here, not at the top: the workflow reads fbank_settings at start-up, and importing
    # torch costs every `snakemake` invocation 1.5 s.
    import torch
    import torchaudio.compliance.kaldi as kaldi

    conf = fbank_settings(fbank_conf)
    waveform = torch.as_tensor(samples, dtype=torch.float32).reshape(1, -1) * (1 << 15)
    if waveform.shape[1] < int(16000 * conf["frame_length"] / 1000):
        # Shorter than one window: no frames (Kaldi's fbank would fail an assertion).
        return torch.zeros(0, int(conf["num_mel_bins"]))
    amount = conf["dither"] if dither is None else dither
    if amount > 0 and generator is not None:
        # kaldi.fbank draws dither from the global RNG; add it here instead so it is seeded per worker.
        waveform = waveform + amount * torch.randn(waveform.shape, generator=generator)
        amount = 0.0
    return kaldi.fbank(
        waveform,
        num_mel_bins=int(conf["num_mel_bins"]),
        frame_length=float(conf["frame_length"]),
        frame_shift=float(conf["frame_shift"]),
        dither=float(amount),
        energy_floor=0.0,
        sample_frequency=16000,
    )
