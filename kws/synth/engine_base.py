"""What every synthesis engine shares (kws.synth.engines and the engines in modules of their own)."""

import contextlib
import ctypes
import os

NORMAL_RATE = 175  # words per minute: eSpeak's default, and the 1x speed of the others
PITCH_SEMITONES = 8.0  # pitch 0..100 maps to -4..+4 semitones around the voice's own (engines without eSpeak's)


def semitones(request):
    """The pitch shift a request's pitch (0-100, 50 = the voice's own) asks of an engine, in semitones."""
    return (float(request.get("pitch", 50)) - 50.0) / 100.0 * PITCH_SEMITONES


def read_engine_wav(path):
    """(float32 samples of the first channel, native rate) of an engine's output wav, or None when the
    file is missing, unreadable or empty."""
    import soundfile

    try:
        samples, rate = soundfile.read(path, dtype="float32", always_2d=True)
    except (OSError, RuntimeError):  # soundfile raises LibsndfileError (a RuntimeError) on a bad file
        return None
    return (samples[:, 0].copy(), rate) if len(samples) else None


ADDR_NO_RANDOMIZE = 0x0040000  # linux/personality.h
_PERSONALITY_QUERY = 0xFFFFFFFF


@contextlib.contextmanager
def fixed_memory_layout():
    """Programs started inside the block run with address-space randomisation off (Linux `personality`,
    as `setarch -R` does), so that an engine whose output depends on where its memory lies gives the same
    bytes every run: Festival's kal diphone voice after two HTS utterances in one batch gave four different
    waveforms in eight runs, and one waveform in ten with randomisation off. Yields whether it could
    (a sandbox may refuse the call, e.g. Docker's default seccomp profile); restores the old setting."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        personality = libc.personality
    except (OSError, AttributeError):  # not Linux
        yield False
        return
    personality.argtypes, personality.restype = [ctypes.c_ulong], ctypes.c_int
    old = personality(_PERSONALITY_QUERY)
    if old == -1 or old & ADDR_NO_RANDOMIZE:
        yield old != -1
        return
    personality(old | ADDR_NO_RANDOMIZE)
    try:
        yield bool(personality(_PERSONALITY_QUERY) & ADDR_NO_RANDOMIZE)
    finally:
        personality(old)


@contextlib.contextmanager
def environment(**values):
    """Within the block, os.environ holds `values` (what a process started inside it inherits); the old
    values, or their absence, come back after."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            os.environ.pop(name) if value is None else os.environ.__setitem__(name, value)
