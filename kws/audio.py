"""Reading audio. soundfile, not torchaudio.load (which needs torchcodec)."""

import numpy as np
import soundfile

from kws.errors import KwsError

SAMPLE_RATE = 16000


def wav_info(path, expected_rate=SAMPLE_RATE):
    """Check a wav's header and return its duration in seconds.

    kwsflow refuses (rather than silently resamples or down-mixes) audio that is not
    16 kHz mono: a corpus with mixed formats is usually a preparation mistake.
    """
    try:
        info = soundfile.info(str(path))
    except FileNotFoundError:
        raise KwsError(f"{path}: audio file not found") from None
    except (soundfile.LibsndfileError, RuntimeError, OSError) as err:
        raise KwsError(f"{path}: not a readable audio file ({_reason(err)})") from None
    if info.samplerate != expected_rate:
        raise KwsError(
            f"{path}: sample rate {info.samplerate} Hz, expected {expected_rate} Hz "
            f"(convert it, e.g. `sox in.wav -r {expected_rate} out.wav`)"
        )
    if info.channels != 1:
        raise KwsError(
            f"{path}: {info.channels} channels, expected mono (down-mix it, e.g. `sox in.wav -c 1 out.wav`)"
        )
    if info.frames == 0:
        raise KwsError(f"{path}: audio file is empty (0 samples)")
    return info.frames / info.samplerate


def read_wav(path, expected_rate=SAMPLE_RATE):
    """Read a 16 kHz mono wav as float32 samples in [-1, 1]."""
    try:
        samples, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    except FileNotFoundError:
        raise KwsError(f"{path}: audio file not found") from None
    except (soundfile.LibsndfileError, RuntimeError, OSError) as err:
        raise KwsError(f"{path}: not a readable audio file ({_reason(err)})") from None
    if rate != expected_rate:
        raise KwsError(f"{path}: sample rate {rate} Hz, expected {expected_rate} Hz")
    if samples.shape[1] != 1:
        raise KwsError(f"{path}: {samples.shape[1]} channels, expected mono")
    if samples.shape[0] == 0:
        raise KwsError(f"{path}: audio file is empty (0 samples)")
    return np.ascontiguousarray(samples[:, 0])


def write_wav(path, samples, rate=SAMPLE_RATE):
    """Write float samples in [-1, 1] as 16-bit PCM wav, atomically."""
    from kws.fileio import atomic_path

    with atomic_path(path) as tmp:
        soundfile.write(str(tmp), np.clip(samples, -1.0, 1.0), rate, subtype="PCM_16", format="WAV")


def _reason(err):
    return str(err).splitlines()[0].strip() if str(err) else type(err).__name__
