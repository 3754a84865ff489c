"""Reading and writing audio. soundfile, not torchaudio.load (which needs torchcodec)."""

import io
import os

import numpy as np
import soundfile

from kws.errors import KwsError

SAMPLE_RATE = 16000


def wav_info(path, expected_rate=SAMPLE_RATE):
    """Check a wav's header and return its duration in seconds.

    kwsflow refuses (rather than silently resamples or down-mixes) audio that is not
    16 kHz mono: a corpus with mixed formats is usually a preparation mistake.
    """
    _check_wav_header(path)
    try:
        info = soundfile.info(str(path))
    except FileNotFoundError:
        raise KwsError(f"{path}: audio file not found") from None
    except (soundfile.LibsndfileError, RuntimeError, OSError) as err:
        _raise_unreadable(path, err)
    if info.samplerate != expected_rate:
        raise KwsError(
            f"{path}: sample rate {info.samplerate} Hz, expected {expected_rate} Hz "
            f"(convert it, e.g. `sox in.wav -r {expected_rate} out.wav`)"
        )
    if info.channels != 1:
        raise KwsError(f"{path}: {info.channels} channels, expected mono (down-mix it, e.g. `sox in.wav -c 1 out.wav`)")
    if info.frames == 0:
        raise KwsError(f"{path}: audio file is empty (0 samples)")
    return info.frames / info.samplerate


def read_wav(path, expected_rate=SAMPLE_RATE):
    """Read a 16 kHz mono wav as float32 samples in [-1, 1]."""
    _check_wav_header(path)
    try:
        samples, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    except FileNotFoundError:
        raise KwsError(f"{path}: audio file not found") from None
    except (soundfile.LibsndfileError, RuntimeError, OSError) as err:
        _raise_unreadable(path, err)
    if rate != expected_rate:
        raise KwsError(f"{path}: sample rate {rate} Hz, expected {expected_rate} Hz")
    if samples.shape[1] != 1:
        raise KwsError(f"{path}: {samples.shape[1]} channels, expected mono")
    if samples.shape[0] == 0:
        raise KwsError(f"{path}: audio file is empty (0 samples)")
    return np.ascontiguousarray(samples[:, 0])


def write_wav(path, samples, rate=SAMPLE_RATE):
    """Write float samples in [-1, 1] as 16-bit PCM wav, atomically.

    Encoded in memory and written as bytes: soundfile's close() on a file fsyncs it (1-3 ms a file). The
    same libsndfile encodes, so the bytes are the same. A caller that needs the files on disk syncs once
    (the synthesiser, before it commits its corpus).
    """
    from kws.fileio import atomic_path

    encoded = io.BytesIO()
    soundfile.write(encoded, np.clip(samples, -1.0, 1.0), rate, subtype="PCM_16", format="WAV")
    with atomic_path(path) as tmp:
        tmp.write_bytes(encoded.getvalue())


def _check_wav_header(path):
    """Refuse anything that is not a RIFF/RF64 WAVE file before libsndfile probes other formats
    (its mp3 decoder prints warnings to stderr on random bytes)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(12)
    except FileNotFoundError:
        raise KwsError(f"{path}: audio file not found") from None
    except IsADirectoryError:
        raise KwsError(f"{path}: is a folder, not an audio file") from None
    except OSError as err:
        raise KwsError(f"{path}: cannot read ({err.strerror})") from None
    if len(head) == 0:
        raise KwsError(f"{path}: not a readable audio file (0 bytes)")
    if len(head) < 12 or head[:4] not in (b"RIFF", b"RIFX", b"RF64") or head[8:12] != b"WAVE":
        raise KwsError(f"{path}: not a readable audio file (no RIFF/WAVE header; kwsflow reads wav only)")


def _raise_unreadable(path, err):
    # soundfile >= 0.13 reports a missing file as LibsndfileError("System error"), not FileNotFoundError.
    if not os.path.exists(path):
        raise KwsError(f"{path}: audio file not found") from None
    if os.path.isdir(path):
        raise KwsError(f"{path}: is a folder, not an audio file") from None
    raise KwsError(f"{path}: not a readable audio file ({_reason(err)})") from None


def _reason(err):
    return str(err).splitlines()[0].strip() if str(err) else type(err).__name__
