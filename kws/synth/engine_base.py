"""What every synthesis engine shares (kws.synth.engines and the engines in modules of their own)."""

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
