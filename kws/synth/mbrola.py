"""MBROLA's diphone voices, built from recordings: Mandarin by cn1, and every other language eSpeak NG
drives an installed MBROLA voice for (English: us1, us2, us3, en1).

eSpeak NG is formant synthesis; cn1 (Debian non-free `mbrola-cn1`, recorded from two native speakers)
concatenates recorded diphones, so a model trained on eSpeak alone and tested on cn1 is tested on a kind
of speech it never heard. Text goes Hanzi -> tone-numbered pinyin (pypinyin, with third-tone sandhi) ->
cn1's pinyin units (an initial, carrying the medial of a compound final, then a one-vowel final; its
README, "Phonotactics") -> a .pho file of durations and tone contours -> the `mbrola` binary. cn1 holds
silence-initial, initial-final and final-silence diphones only, so syllables are joined by short gaps.

Rate scales the durations, pitch sets the base F0, range scales the tone contours, and the request's seed
jitters each syllable's duration and pitch, so one voice still gives varied, reproducible speech.

The other languages go through the `espeak-ng` program (Debian `espeak-ng`; the in-process library of
kws.synth.espeak ships no MBROLA voices): its `mb-*` voices turn text into MBROLA's phonemes and prosody
and run the `mbrola` binary, so the prosody is eSpeak's and the sound is recorded diphones. A voice is
there when its MBROLA database is installed (Debian non-free `mbrola-us1` ...). Rate and pitch are
eSpeak's own controls.
"""

import functools
import random
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from kws.errors import KwsError
from kws.synth.engine_base import NORMAL_RATE, read_engine_wav

VOICE_DIR = Path("/usr/share/mbrola")
CN1 = {"cn1": "cn1"}  # voice -> speaker
PACKAGES = "mbrola mbrola-cn1, English: mbrola-us1 mbrola-us2 mbrola-us3 mbrola-en1 espeak-ng"
CN1_LANGUAGES = ("cmn", "cmn-latn-pinyin")
TIMEOUT_S = 60

INITIALS = ("zh", "ch", "sh", "b", "p", "m", "f", "d", "t", "n", "l", "g", "k", "h", "j", "q", "x", "r", "z", "c", "s")
FINALS = frozenset(
    "a ai an ang ao e ei en eng er o ou i ie ll u v ong in ing ii ui iu ue un".split()
)  # cn1's finals (README)
# compound finals whose first vowel cn1 records with the initial (xiao = xi + ao, huan = hu + an)
I_MEDIAL = {"ia": "a", "ian": "an", "iang": "ang", "iao": "ao", "iong": "ong"}
U_MEDIAL = {"ua": "a", "uai": "ai", "uan": "an", "uang": "ang", "uo": "o"}
# tone contours: (position in the final, semitones from the base F0) at a range factor of 1
TONES = {
    1: ((0, 4.0), (100, 4.0)),
    2: ((0, 0.0), (60, 1.5), (100, 5.0)),
    3: ((0, -1.0), (50, -4.5), (100, -3.0)),
    4: ((0, 5.5), (100, -3.0)),
    5: ((0, 0.0), (100, -1.5)),
}
_SYLLABLE = re.compile(r"^([a-zv]+?)([1-5]?)$")
_PAUSE = re.compile(r"[,，、;；:：]")


def check():
    if shutil.which("mbrola") is None or not voices():
        raise KwsError(
            f"corpus.engines: engine mbrola is not installed (Debian contrib/non-free: apt-get install {PACKAGES}; "
            "or bash scripts/install_nonfree_voices.sh)"
        )


def _cn1():
    return dict(CN1) if (VOICE_DIR / "cn1" / "cn1").is_file() else {}


def _base(language):
    return language.lower().replace("_", "-").split("-")[0]


@functools.lru_cache(maxsize=1)
def espeak_voices():
    """{eSpeak NG voice (mb-us1): (speaker, base language codes)} of the `espeak-ng` program's MBROLA voices
    whose database is installed; {} without the program."""
    if shutil.which("espeak-ng") is None:
        return {}
    run = subprocess.run(["espeak-ng", "--version"], capture_output=True, text=True, timeout=TIMEOUT_S)
    match = re.search(r"Data at:\s*(\S+)", run.stdout)
    folder = Path(match.group(1)) / "voices" / "mb" if match else None
    table = {}
    for path in sorted(folder.glob("mb-*")) if folder and folder.is_dir() else []:
        lines = [line.split() for line in path.read_text(encoding="utf-8", errors="replace").splitlines()]
        database = next((words[1] for words in lines if len(words) > 1 and words[0] == "mbrola"), None)
        languages = {_base(words[1]) for words in lines if len(words) > 1 and words[0] == "language"}
        if database and database != "cn1" and (VOICE_DIR / database / database).is_file():
            table[path.name] = (f"mbrola_{database}", frozenset(languages))
    return table


def voice_speaks(voice, language):
    """Whether `voice` speaks `language`."""
    if voice in CN1:
        return language in CN1_LANGUAGES
    entry = espeak_voices().get(voice)
    return entry is not None and _base(language) in entry[1]


def voices(language=None):
    """voice -> speaker, of `language` (an eSpeak NG code; its base language counts: en-us takes en1 too) or
    of every language. Mandarin is cn1 alone: eSpeak's Mandarin MBROLA voice would be cn1 a second time."""
    table = {**_cn1(), **{voice: speaker for voice, (speaker, _) in espeak_voices().items()}}
    if language is None:
        return table
    return {voice: speaker for voice, speaker in table.items() if voice_speaks(voice, language)}


def to_pinyin(text):
    """Tone-numbered pinyin syllables and pauses ("_") of `text` (Hanzi, or pinyin with tone digits)."""
    try:
        from pypinyin import Style, lazy_pinyin
    except ImportError:
        raise KwsError("the mbrola engine needs pypinyin (pip install pypinyin==0.55.0)") from None
    out = []
    for chunk in _PAUSE.split(text):
        words = chunk.split()
        if words and all(_SYLLABLE.match(w.lower()) and w[-1].isdigit() for w in words):
            out.extend(w.lower() for w in words)  # already pinyin (the corpus's cmn-latn-pinyin texts)
        else:
            out.extend(
                lazy_pinyin(chunk, style=Style.TONE3, neutral_tone_with_five=True, errors="ignore", tone_sandhi=True)
            )
        out.append("_")
    while out and out[-1] == "_":
        out.pop()
    return out


def cn1_units(syllable):
    """(initial unit or None, final unit, tone) of one tone-numbered pinyin syllable; None if cn1 cannot say it."""
    match = _SYLLABLE.match(syllable.replace("ü", "v").replace("u:", "v"))
    if not match:
        return None
    body, tone = match.group(1), int(match.group(2) or 5)
    initial = next((i for i in INITIALS if body.startswith(i) and len(body) > len(i)), "")
    final = body[len(initial) :]
    if not initial and body[0] in "yw":
        initial, final = body[0], body[1:]
        if final == "":
            final = "i" if initial == "y" else "u"  # yi, wu
        elif initial == "y" and final.startswith("i") and final not in ("i", "in", "ing"):
            final = final[1:]  # (y stands for the medial; yu, yue, yuan are read as ü below)
    if initial in ("zh", "ch", "sh", "r") and final == "i":
        return initial, "ll", tone
    if initial in ("z", "c", "s") and final == "i":
        return initial, "ii", tone
    if initial in ("j", "q", "x", "y") and final.startswith("u"):
        final = "v" + final[1:]  # ju, quan, xue: the u is ü
    if final in ("ve", "ue"):
        final = "ue"
    elif final == "vn":
        final = "un"
    elif final == "van":
        return initial + "u", "an", tone  # juan = ju + an, yuan = yu + an
    if final in I_MEDIAL and initial and initial != "y":
        return initial + "i", I_MEDIAL[final], tone
    if final in U_MEDIAL and initial and initial != "w":
        return initial + "u", U_MEDIAL[final], tone
    if final == "iong":
        final = "ong"
    if final not in FINALS:
        return None
    return (initial or None), final, tone


def pho(text, rate=NORMAL_RATE, pitch=50, pitch_range=50, seed=1):
    """The .pho text that makes cn1 say `text`, or None when no syllable of it is sayable."""
    rng = random.Random(seed)
    stretch = NORMAL_RATE / float(rate)
    base = 170.0 * 2 ** ((float(pitch) / 100.0) * 0.75)  # 170-286 Hz
    depth = 0.5 + float(pitch_range) / 100.0  # 0.5-1.5 x the tone contours
    units = [u if u == "_" else cn1_units(u) for u in to_pinyin(text)]
    syllables = [u for u in units if u not in (None, "_")]
    if not syllables:
        return None
    lines, said = ["_ 120"], 0
    for unit in units:
        if unit is None:
            continue
        if unit == "_":
            lines.append(f"_ {round(rng.uniform(120, 260) * stretch)}")
            continue
        if lines[-1][0] != "_":
            # cn1 has no diphone from a final into the next syllable, only into silence: a short gap
            lines.append(f"_ {round(rng.uniform(8, 35) * stretch)}")
        initial, final, tone = unit
        said += 1
        last = said == len(syllables)
        scale = stretch * rng.uniform(0.85, 1.15) * (1.25 if last else 1.0) * (0.6 if tone == 5 else 1.0)
        drift = rng.uniform(-1.0, 1.0) - 1.5 * said / len(syllables)  # jitter and declination, semitones
        contour = TONES[tone] if not (tone == 3 and last) else ((0, -1.0), (60, -5.0), (100, 0.5))

        def hz(semitones, drift=drift):
            return round(base * 2 ** ((semitones * depth + drift) / 12.0))

        if initial:
            length = 110 if len(initial) > 2 or initial[-1] in "iu" and initial not in ("zh", "ch", "sh") else 70
            lines.append(f"{initial} {round(length * scale)} 50 {hz(contour[0][1])}")
        points = " ".join(f"{pos} {hz(st)}" for pos, st in contour)
        lines.append(f"{final} {round(rng.uniform(190, 240) * scale)} {points}")
    lines.append("_ 150")
    return "\n".join(lines) + "\n"


def _espeak_command(request, wav_path):
    rate = min(max(round(float(request.get("rate", NORMAL_RATE))), 80), 450)
    pitch = min(max(round(float(request.get("pitch", 50))), 0), 99)
    voice, text = request["voice"], request["text"]
    return ["espeak-ng", "-v", voice, "-s", str(rate), "-p", str(pitch), "-w", str(wav_path), "--", text]


def synthesize(requests, log=None):
    """Per request (float32 samples, rate) or None; a request names a voice of `voices()` and gives text,
    rate, pitch (and for cn1 range and seed)."""
    check()
    out = []
    table = voices()
    with tempfile.TemporaryDirectory(prefix="kws-mbrola-") as tmp:
        for index, request in enumerate(requests):
            if request.get("voice") not in table:
                raise KwsError(f"MBROLA has no voice {request.get('voice')!r} here (voices: {', '.join(table)})")
            wav_path = Path(tmp) / f"{index}.wav"
            if request["voice"] not in CN1:
                run = subprocess.run(_espeak_command(request, wav_path), capture_output=True, timeout=TIMEOUT_S)
                audio = read_engine_wav(wav_path) if run.returncode == 0 else None
                if audio is None and log:
                    log(f"MBROLA could not say {request['text']!r} with {request['voice']}; skipped")
                out.append(audio)
                continue
            script = pho(
                request["text"],
                request.get("rate", NORMAL_RATE),
                request.get("pitch", 50),
                request.get("range", 50),
                request.get("seed", 1),
            )
            audio = None
            if script is not None:
                pho_path = Path(tmp) / f"{index}.pho"
                pho_path.write_text(script, encoding="utf-8")
                command = ["mbrola", "-e", str(VOICE_DIR / request["voice"] / request["voice"]), str(pho_path)]
                run = subprocess.run([*command, str(wav_path)], capture_output=True, timeout=TIMEOUT_S)
                audio = read_engine_wav(wav_path) if run.returncode == 0 else None
            if audio is None and log:
                log(f"MBROLA could not say {request['text']!r} with {request['voice']}; skipped")
            out.append(audio)
    return out
