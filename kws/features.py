"""Kaldi-compatible fbank features: the one implementation used by CMVN, training, scoring and detection."""

# `dither_floor` (set by inference_fbank; absent = 0) is not among the defaults: model configs keep
# WeKws's keys, which WeKws's fbank takes as keyword arguments
DEFAULT_FBANK = {"num_mel_bins": 40, "frame_length": 25, "frame_shift": 10, "dither": 0.0}


def fbank_settings(fbank_conf):
    """The fbank settings with defaults filled in (dither included)."""
    settings = dict(DEFAULT_FBANK)
    settings.update(fbank_conf or {})
    return settings


def fbank_conf_of(dataset_conf, where="dataset_conf"):
    """The fbank settings of a dataset_conf, defaults filled, from either WeKws layout.

    WeKws HEAD: `feats_type: fbank` (the default) and `fbank_conf`; WeKws's older configs (still its
    tcn/gru/mdtc.yaml): `feature_extraction_conf: {feature_type: fbank, ...}`. kwsflow computes fbank
    only, so MFCC is refused rather than silently replaced.
    """
    from kws.errors import KwsError

    feats_type = dataset_conf.get("feats_type", "fbank")
    if feats_type != "fbank":
        raise KwsError(f"{where}.feats_type: {feats_type!r} is not supported (kwsflow computes fbank)")
    conf = dataset_conf.get("fbank_conf")
    if conf is None and dataset_conf.get("feature_extraction_conf") is not None:
        conf = dict(dataset_conf["feature_extraction_conf"])
        kind = conf.pop("feature_type", "fbank")
        if kind != "fbank":
            raise KwsError(
                f"{where}.feature_extraction_conf.feature_type: {kind!r} is not supported (kwsflow "
                f"computes fbank; set feature_type: fbank, num_mel_bins the feature dimension)"
            )
        conf.pop("num_ceps", None)
    if conf is not None and not isinstance(conf, dict):
        raise KwsError(f"{where}.fbank_conf: expected a mapping, got {conf!r}")
    return fbank_settings(conf)


def inference_fbank(fbank_conf):
    """The fbank settings that evaluate a model trained with `fbank_conf`: no random dither, but its
    expected power added to every frame (`dither_floor`, see batch_fbank).

    Why: a model trained with dither never saw a frame quieter than the dither. Digital silence (exact
    zeros, as synthesisers and some pipelines pad speech with) gives log(float eps) = -15.9 without
    dither, far outside everything the model learned: on the default corpus, held-out positives padded
    with digital silence were missed 58 % of the time at t = 0.5 (1.8 % with the floor), the rest 7 %.
    With no training dither this is plain Kaldi fbank (WeKws's scoring)."""
    import math

    settings = fbank_settings(fbank_conf)
    floor = math.hypot(float(settings["dither"]), float(settings.get("dither_floor", 0.0)))
    settings.update(dither=0.0, dither_floor=floor)
    return settings


def cmvn_fbank(dataset_conf):
    """The fbank settings CMVN depends on: the inference ones (random dither is a training-time setting;
    its expected power is part of the features)."""
    settings = inference_fbank(fbank_conf_of(dataset_conf))
    settings.pop("dither")
    return settings


def feature_tag(settings):
    """A readable folder name for fbank settings (cmvn_fbank's), so experiments with equal features share CMVN."""
    tag = f"fbank{settings['num_mel_bins']}_{settings['frame_length']:g}ms_{settings['frame_shift']:g}ms"
    floor = float(settings.get("dither_floor", 0.0))
    return f"{tag}_dither{floor:g}" if floor else tag


def frame_geometry(fbank_conf, sample_rate=16000):
    """(frame_length, frame_shift) in samples, rounded as Kaldi/torchaudio round them."""
    from kws.errors import KwsError

    conf = fbank_settings(fbank_conf)
    length = int(sample_rate * float(conf["frame_length"]) * 0.001)
    shift = int(sample_rate * float(conf["frame_shift"]) * 0.001)
    if length < 1 or shift < 1:
        raise KwsError(
            f"fbank: frame_length {conf['frame_length']} ms / frame_shift {conf['frame_shift']} ms "
            f"are too short at {sample_rate} Hz"
        )
    return length, shift


def num_frames(num_samples, fbank_conf, sample_rate=16000):
    """Frames Kaldi fbank (snip_edges) gives for `num_samples` samples (an int, or an integer tensor/array)."""
    window, shift = frame_geometry(fbank_conf, sample_rate)
    if isinstance(num_samples, int):
        return 0 if num_samples < window else 1 + (num_samples - window) // shift
    return ((num_samples - window) // shift + 1).clip(min=0)


_MEL_BANKS = {}
_POVEY = {}
_DITHER_POWER = {}


def _mel_banks(num_bins, padded, device):
    """Kaldi's triangular mel banks [padded // 2 + 1, num_bins] (zero for the Nyquist bin), per device."""
    key = (num_bins, padded, str(device))
    if key not in _MEL_BANKS:
        import torch
        import torchaudio.compliance.kaldi as kaldi

        banks, _ = kaldi.get_mel_banks(num_bins, padded, 16000.0, 20.0, 0.0, 100.0, -500.0, 1.0)
        banks = torch.nn.functional.pad(banks, (0, 1)).t().contiguous()
        _MEL_BANKS[key] = banks.to(device)
    return _MEL_BANKS[key]


def _povey_window(window, device):
    key = (window, str(device))
    if key not in _POVEY:
        import torch

        _POVEY[key] = torch.hann_window(window, periodic=False, device=device).pow(0.85)
    return _POVEY[key]


def _frame_spectrum(x, window, device):
    """Power spectra [..., padded/2 + 1] of frames x [..., window]: DC removal, pre-emphasis 0.97, povey
    window, zero padding to a power of two (Kaldi's order)."""
    import torch

    x = x - x.mean(dim=-1, keepdim=True)
    x = torch.cat((x[..., :1] * (1 - 0.97), x[..., 1:] - 0.97 * x[..., :-1]), dim=-1)
    spectrum = torch.fft.rfft(x * _povey_window(window, device), n=1 << (window - 1).bit_length())
    return spectrum.real.square() + spectrum.imag.square()  # 4x faster than abs().square()


def _dither_power(window, num_bins, device):
    """Expected mel energies [num_bins] of unit-variance white noise in a frame (dither of amplitude 1):
    the chain is linear, so it is the summed power of its responses to each of the frame's impulses."""
    key = (window, num_bins, str(device))
    if key not in _DITHER_POWER:
        import torch

        impulses = torch.eye(window, dtype=torch.float64, device=device)
        power = _frame_spectrum(impulses, window, device).sum(dim=0)
        banks = _mel_banks(num_bins, 1 << (window - 1).bit_length(), device).to(torch.float64)
        _DITHER_POWER[key] = (power @ banks).to(torch.float32)
    return _DITHER_POWER[key]


def batch_fbank(waveforms, lengths, fbank_conf, dither=0.0, generator=None, int16_scale=False):
    """Kaldi fbank (torchaudio.compliance.kaldi.fbank's defaults as WeKws uses them) of a padded batch.

    `waveforms` [B, S] float samples in [-1, 1] (zero-padded), `lengths` [B] valid samples. Returns
    (feats [B, T, D], frames [B]): T frames of the longest utterance, frames past an utterance's own
    count set to 0 (as a padded batch of per-utterance features). Runs on the waveforms' device.
    Per frame: dither (Gaussian, `dither` on the int16 scale, drawn from `generator` for the whole
    batch), DC removal, pre-emphasis 0.97, povey window, power spectrum of the frame zero-padded to a
    power of two, mel banks (20 Hz to Nyquist), plus the expected mel energies of dither of amplitude
    `fbank_conf["dither_floor"]` (0 by default, as Kaldi; inference_fbank sets it), natural log floored at
    float epsilon.
    `int16_scale`: the waveforms are already on the int16 scale (int16 samples as floats), which skips a
    division and the multiplication that undoes it (exact either way: powers of two).
    """
    import torch

    from kws.device import to_device

    conf = fbank_settings(fbank_conf)
    window, shift = frame_geometry(conf)
    num_bins = int(conf["num_mel_bins"])
    waveforms = torch.as_tensor(waveforms)
    device = waveforms.device
    # Frames are counted where the lengths are: given on the host (kws.dataset.Featurizer does), reading
    # the longest costs no host sync on a GPU
    host_frames = num_frames(torch.as_tensor(lengths).long(), conf)
    batch = waveforms.shape[0]
    longest = int(host_frames.max()) if batch else 0
    frames = to_device(host_frames, device)
    if longest == 0:
        return waveforms.new_zeros(batch, 0, num_bins, dtype=torch.float32), frames
    x = waveforms.to(torch.float32)
    if not int16_scale:
        x = x * (1 << 15)
    if dither > 0:
        noise = torch.randn(x.shape, generator=generator, device=generator.device if generator else device)
        x = x + float(dither) * noise.to(device)
    x = x[:, : (longest - 1) * shift + window].unfold(1, window, shift)  # [B, T, window]
    power = _frame_spectrum(x, window, device)  # [B, T, padded/2 + 1]
    mel = power @ _mel_banks(num_bins, (power.shape[-1] - 1) * 2, device)
    floor = float(conf.get("dither_floor", 0.0))
    if floor > 0:
        mel = mel + floor**2 * _dither_power(window, num_bins, device)
    feats = mel.clamp_min(torch.finfo(torch.float32).eps).log()
    if batch == 1:  # its one utterance fills every frame
        return feats, frames
    valid = torch.arange(longest, device=device).unsqueeze(0) < frames.unsqueeze(1)
    return feats.masked_fill(~valid.unsqueeze(2), 0.0), frames


def compute_fbank(samples, fbank_conf, dither=None, generator=None):
    """fbank of float samples in [-1, 1] (a 1-D array or tensor) -> Tensor [frames, num_mel_bins].

    `batch_fbank` on a batch of one: the same numbers wherever features are computed (CMVN, training,
    scoring, detection). Like WeKws, the waveform is scaled to the int16 range first. `dither` overrides
    the configured dither (0 for CMVN statistics and scoring).
    """
    # Imported here, not at the top: the workflow reads fbank_settings at start-up, and importing
    # torch costs every `snakemake` invocation 1.5 s.
    import torch

    conf = fbank_settings(fbank_conf)
    waveform = torch.as_tensor(samples, dtype=torch.float32).reshape(1, -1)
    amount = conf["dither"] if dither is None else dither
    feats, _ = batch_fbank(waveform, [waveform.shape[1]], conf, dither=amount, generator=generator)
    return feats[0]
