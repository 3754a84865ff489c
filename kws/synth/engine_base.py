"""What every synthesis engine shares (kws.synth.engines and the engines in modules of their own)."""

NORMAL_RATE = 175  # words per minute: eSpeak's default, and the 1x speed of the others


def read_engine_wav(path):
    """(float32 samples of the first channel, native rate) of an engine's output wav, or None when the
    file is missing, unreadable or empty."""
    import soundfile

    try:
        samples, rate = soundfile.read(path, dtype="float32", always_2d=True)
    except (OSError, RuntimeError):  # soundfile raises LibsndfileError (a RuntimeError) on a bad file
        return None
    return (samples[:, 0].copy(), rate) if len(samples) else None
