"""Data-preparation recipes, each against a tiny corpus built here in that corpus's real layout."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kws.datalist import read_dictionary, read_kaldi_map
from kws.errors import KwsError
from kws.lists import make_list
from kws.recipes import keyword_token, prepare_corpus

REPO = Path(__file__).resolve().parents[1]
SPLITS = ("train", "dev", "test")


def outputs(out):
    return sorted(p.relative_to(out).as_posix() for p in Path(out).rglob("*") if p.is_file()) if out.exists() else []


def check_layout(out, dictionary):
    assert read_dictionary(out / "dict" / "words.txt") == dictionary
    result = {}
    for split in SPLITS:
        scp = read_kaldi_map(out / split / "wav.scp")
        text = read_kaldi_map(out / split / "text")
        assert list(scp) == list(text) == sorted(scp)
        for wav in scp.values():
            assert Path(wav).is_absolute() and Path(wav).is_file()
        assert set(text.values()) <= set(dictionary)
        result[split] = text
    return result


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "scripts/prepare_corpus.py", *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


# ----------------------------------------------------------------------------- Mobvoi


def build_mobvoi(root, make_wav):
    wav_dir = root / "mobvoi_hotword_dataset"
    res = root / "mobvoi_hotword_dataset_resources"
    res.mkdir(parents=True)
    layout = {
        "train": {"p": [("tr_p0", 0), ("tr_p1", 1)], "n": [("tr_n0", -1), ("tr_n1", -1)]},
        "dev": {"p": [("dv_p0", 0)], "n": [("dv_n0", -1)]},
        "test": {"p": [("te_p1", 1)], "n": [("te_n0", -1)]},
    }
    for split, parts in layout.items():
        for prefix, records in parts.items():
            entries = []
            for utt, kw in records:
                make_wav(wav_dir / f"{utt}.wav", kind="noise" if kw < 0 else "sine", freq=300 + 200 * kw)
                entries.append({"utt_id": utt, "keyword_id": kw, "speaker_id": f"spk_{utt[:2]}"})
            (res / f"{prefix}_{split}.json").write_text(json.dumps(entries, indent=1))
    return root


def test_mobvoi(tmp_path, make_wav):
    root = build_mobvoi(tmp_path / "mobvoi", make_wav)
    out = tmp_path / "out"
    summary = prepare_corpus("mobvoi", root, out)
    texts = check_layout(out, {"<FILLER>": -1, "<HI_XIAOWEN>": 0, "<NIHAO_WENWEN>": 1})
    assert texts["train"] == {
        "tr_n0": "<FILLER>",
        "tr_n1": "<FILLER>",
        "tr_p0": "<HI_XIAOWEN>",
        "tr_p1": "<NIHAO_WENWEN>",
    }
    assert texts["test"] == {"te_n0": "<FILLER>", "te_p1": "<NIHAO_WENWEN>"}
    assert summary["splits"]["dev"]["utterances"] == 2
    # the output feeds make_list directly
    assert make_list(out / "train", out / "dict" / "words.txt", threads=2)["utterances"] == 4


def test_mobvoi_missing_resources(tmp_path, make_wav):
    root = build_mobvoi(tmp_path / "mobvoi", make_wav)
    (root / "mobvoi_hotword_dataset_resources" / "n_dev.json").unlink()
    with pytest.raises(KwsError, match=r"n_dev\.json: file not found"):
        prepare_corpus("mobvoi", root, tmp_path / "out")
    assert outputs(tmp_path / "out") == []
    with pytest.raises(KwsError, match=r"nowhere/mobvoi_hotword_dataset: folder not found"):
        prepare_corpus("mobvoi", tmp_path / "nowhere", tmp_path / "out")


def test_mobvoi_bad_records(tmp_path, make_wav):
    root = build_mobvoi(tmp_path / "mobvoi", make_wav)
    (root / "mobvoi_hotword_dataset" / "dv_p0.wav").unlink()
    with pytest.raises(KwsError, match=r"p_dev\.json: entry 1: utt_id 'dv_p0': .*dv_p0\.wav: audio file not found"):
        prepare_corpus("mobvoi", root, tmp_path / "out")
    res = root / "mobvoi_hotword_dataset_resources"
    (res / "p_dev.json").write_text(json.dumps([{"utt_id": "dv_n0", "keyword_id": 7}]))
    with pytest.raises(KwsError, match=r"p_dev\.json: entry 1: .*keyword_id must be -1, 0 or 1"):
        prepare_corpus("mobvoi", root, tmp_path / "out")
    (res / "p_dev.json").write_text(json.dumps([{"utt_id": "dv_n0", "keyword_id": 0}]))
    with pytest.raises(KwsError, match=r"n_dev\.json: entry 1: duplicate utt_id 'dv_n0'"):
        prepare_corpus("mobvoi", root, tmp_path / "out")
    (res / "p_dev.json").write_text('[{"utt_id": "x",\n "keyword_id": }]')
    with pytest.raises(KwsError, match=r"p_dev\.json:2: malformed JSON"):
        prepare_corpus("mobvoi", root, tmp_path / "out")
    assert outputs(tmp_path / "out") == []


# ----------------------------------------------------------------------------- Speech Commands v2


def build_speech_commands(root, make_wav):
    files = {
        "yes": ["aaaa1111_nohash_0", "bbbb2222_nohash_0", "cccc3333_nohash_1"],
        "no": ["aaaa1111_nohash_0", "dddd4444_nohash_0", "eeee5555_nohash_0"],
        "up": ["aaaa1111_nohash_0", "bbbb2222_nohash_0", "ffff6666_nohash_0"],
    }
    for word, stems in files.items():
        for i, stem in enumerate(stems):
            make_wav(root / word / f"{stem}.wav", seconds=0.2, freq=200 + 100 * i)
    make_wav(root / "_background_noise_" / "white_noise.wav", seconds=0.5, kind="noise")
    (root / "validation_list.txt").write_text(
        "yes/bbbb2222_nohash_0.wav\nno/dddd4444_nohash_0.wav\nup/bbbb2222_nohash_0.wav\n"
    )
    (root / "testing_list.txt").write_text(
        "yes/cccc3333_nohash_1.wav\nno/eeee5555_nohash_0.wav\nup/ffff6666_nohash_0.wav\n"
    )
    (root / "LICENSE").write_text("cc-by-4.0\n")
    return root


def test_speech_commands_default_keywords(tmp_path, make_wav):
    root = build_speech_commands(tmp_path / "sc", make_wav)
    out = tmp_path / "out"
    summary = prepare_corpus("speech_commands", root, out)
    texts = check_layout(out, {"<FILLER>": -1, "<YES>": 0, "<NO>": 1})
    assert texts["train"] == {
        "no_aaaa1111_nohash_0": "<NO>",
        "up_aaaa1111_nohash_0": "<FILLER>",
        "yes_aaaa1111_nohash_0": "<YES>",
    }
    assert texts["dev"] == {
        "no_dddd4444_nohash_0": "<NO>",
        "up_bbbb2222_nohash_0": "<FILLER>",
        "yes_bbbb2222_nohash_0": "<YES>",
    }
    assert set(texts["test"]) == {"no_eeee5555_nohash_0", "up_ffff6666_nohash_0", "yes_cccc3333_nohash_1"}
    scp = read_kaldi_map(out / "dev" / "wav.scp")
    assert scp["up_bbbb2222_nohash_0"] == str((root / "up" / "bbbb2222_nohash_0.wav").resolve())
    assert not any("_background_noise_" in wav for s in SPLITS for wav in read_kaldi_map(out / s / "wav.scp").values())
    assert any("_background_noise_" in note for note in summary["notes"])


def test_speech_commands_keywords(tmp_path, make_wav):
    root = build_speech_commands(tmp_path / "sc", make_wav)
    prepare_corpus("speech_commands", root, tmp_path / "a", ["up"])
    assert read_dictionary(tmp_path / "a" / "dict" / "words.txt") == {"<FILLER>": -1, "<UP>": 0}
    prepare_corpus("speech_commands", root, tmp_path / "b", ["all"])
    assert read_dictionary(tmp_path / "b" / "dict" / "words.txt") == {"<FILLER>": -1, "<NO>": 0, "<UP>": 1, "<YES>": 2}
    with pytest.raises(KwsError, match=r"keyword 'marvin' has no folder"):
        prepare_corpus("speech_commands", root, tmp_path / "c", ["yes", "marvin"])
    assert outputs(tmp_path / "c") == []


def test_speech_commands_bad_lists(tmp_path, make_wav):
    root = build_speech_commands(tmp_path / "sc", make_wav)
    (root / "testing_list.txt").write_text("yes/cccc3333_nohash_1.wav\nno/missing_nohash_0.wav\n")
    with pytest.raises(KwsError, match=r"testing_list\.txt:2: .*missing_nohash_0\.wav: audio file not found"):
        prepare_corpus("speech_commands", root, tmp_path / "out")
    (root / "testing_list.txt").write_text("yes/bbbb2222_nohash_0.wav\n")
    twice = r"testing_list\.txt:1: yes/bbbb2222_nohash_0\.wav is also in .*validation_list\.txt:1"
    with pytest.raises(KwsError, match=twice):
        prepare_corpus("speech_commands", root, tmp_path / "out")
    (root / "validation_list.txt").unlink()
    with pytest.raises(KwsError, match=r"validation_list\.txt: file not found"):
        prepare_corpus("speech_commands", root, tmp_path / "out")
    assert outputs(tmp_path / "out") == []


def test_keyword_token():
    assert keyword_token("yes") == "<YES>"
    assert keyword_token("hey snips") == "<HEY_SNIPS>"
    assert keyword_token("<HI_XIAOWEN>") == "<HI_XIAOWEN>"
    with pytest.raises(KwsError):
        keyword_token("!!")


# ----------------------------------------------------------------------------- Hey Snips


def build_snips(root, make_wav):
    records = {
        "train": [("t0", 1, 0.3), ("t1", 0, 0.3), ("t2", 0, 0.0), ("t3", 1, -1)],
        "dev": [("d0", 1, 0.3), ("d1", 0, 0.3)],
        "test": [("e0", 1, 0.3), ("e1", 0, 0.3)],
    }
    for split, entries in records.items():
        data = []
        for uid, hot, dur in entries:
            make_wav(root / "audio_files" / f"{uid}.wav", kind="sine" if hot else "noise")
            data.append(
                {
                    "id": uid,
                    "is_hotword": hot,
                    "worker_id": "w1",
                    "duration": dur,
                    "audio_file_path": f"audio_files/{uid}.wav",
                }
            )
        (root / f"{split}.json").write_text(json.dumps(data))
    return root


def test_snips(tmp_path, make_wav):
    root = build_snips(tmp_path / "snips", make_wav)
    out = tmp_path / "out"
    summary = prepare_corpus("snips", root, out)
    texts = check_layout(out, {"<FILLER>": -1, "<HEY_SNIPS>": 0})
    assert texts["train"] == {"t0": "<HEY_SNIPS>", "t1": "<FILLER>"}  # duration <= 0 dropped
    assert texts["test"] == {"e0": "<HEY_SNIPS>", "e1": "<FILLER>"}
    assert any("dropped 2" in note for note in summary["notes"])


def test_snips_bad_input(tmp_path, make_wav):
    root = build_snips(tmp_path / "snips", make_wav)
    (root / "audio_files" / "d1.wav").unlink()
    with pytest.raises(KwsError, match=r"dev\.json: entry 2: id 'd1': .*d1\.wav: audio file not found"):
        prepare_corpus("snips", root, tmp_path / "out")
    (root / "dev.json").write_text(json.dumps({"id": "d0"}))
    with pytest.raises(KwsError, match=r"dev\.json: expected a JSON list"):
        prepare_corpus("snips", root, tmp_path / "out")
    (root / "dev.json").write_text(json.dumps([{"id": "d0", "is_hotword": 1, "duration": 1}]))
    with pytest.raises(KwsError, match=r"dev\.json: entry 1: missing field\(s\) audio_file_path"):
        prepare_corpus("snips", root, tmp_path / "out")
    (root / "test.json").unlink()
    with pytest.raises(KwsError, match=r"test\.json: file not found"):
        prepare_corpus("snips", root, tmp_path / "out")
    with pytest.raises(KwsError, match=r"--keywords"):
        prepare_corpus("snips", root, tmp_path / "out", ["hey"])
    assert outputs(tmp_path / "out") == []


# ----------------------------------------------------------------------------- plain Kaldi folder


def test_kaldi_copy(tiny_corpus, tmp_path, monkeypatch):
    # make one path relative to the split folder: it must be found and written absolute
    scp = tiny_corpus / "dev" / "wav.scp"
    lines = scp.read_text().splitlines()
    key, wav = lines[0].split(maxsplit=1)
    lines[0] = f"{key} ../wavs/dev/{Path(wav).name}"
    scp.write_text("\n".join(lines) + "\n")
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    prepare_corpus("kaldi", tiny_corpus, out)
    texts = check_layout(out, {"<FILLER>": -1, "<HI_XIAOWEN>": 0, "<NIHAO_WENWEN>": 1})
    for split in SPLITS:
        assert texts[split] == read_kaldi_map(tiny_corpus / split / "text")
    assert read_kaldi_map(out / "dev" / "wav.scp")[key] == wav


def test_kaldi_keywords_instead_of_dict(tiny_corpus, tmp_path):
    (tiny_corpus / "dict" / "words.txt").unlink()
    with pytest.raises(KwsError, match=r"dict/words\.txt: file not found"):
        prepare_corpus("kaldi", tiny_corpus, tmp_path / "out")
    prepare_corpus("kaldi", tiny_corpus, tmp_path / "out", ["<NIHAO_WENWEN>", "hi_xiaowen"])
    assert read_dictionary(tmp_path / "out" / "dict" / "words.txt") == {
        "<FILLER>": -1,
        "<NIHAO_WENWEN>": 0,
        "<HI_XIAOWEN>": 1,
    }


@pytest.mark.parametrize(
    "edit, pattern",
    [
        (
            lambda d: (d / "test" / "text").write_text((d / "test" / "text").read_text() + "test_c0_00x <FILLER>\n"),
            r"test/text:4: utterance 'test_c0_00x' has no entry in .*test/wav\.scp",
        ),
        (
            lambda d: (d / "dev" / "text").write_text(
                (d / "dev" / "text").read_text().replace("<NIHAO_WENWEN>", "<HELLO>")
            ),
            r"dev/text:3: label '<HELLO>' is not a token of .*words\.txt",
        ),
        (
            lambda d: (d / "dev" / "wav.scp").write_text((d / "dev" / "wav.scp").read_text() + "extra /no/such.wav\n"),
            r"dev/wav\.scp:4: utterance 'extra' has no label",
        ),
        (
            lambda d: (d / "train" / "wav.scp").write_text("k1 /no/such.wav\nk1 /no/such.wav\n"),
            r"train/wav\.scp:2: duplicate key 'k1'",
        ),
        (
            lambda d: (d / "wavs" / "train" / "train_c1_01.wav").unlink(),
            r"train/wav\.scp:4: .*train_c1_01\.wav: audio file not found",
        ),
        (lambda d: (d / "dev" / "wav.scp").unlink(), r"dev/wav\.scp: file not found"),
    ],
)
def test_kaldi_bad_input(tiny_corpus, tmp_path, edit, pattern):
    edit(tiny_corpus)
    with pytest.raises(KwsError, match=pattern):
        prepare_corpus("kaldi", tiny_corpus, tmp_path / "out")
    assert outputs(tmp_path / "out") == []


# ----------------------------------------------------------------------------- CLI


def test_cli(tmp_path, make_wav):
    root = build_snips(tmp_path / "snips", make_wav)
    result = run_cli("--corpus", "snips", "--root", root, "--out-dir", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    assert "train: 2 utterances" in result.stdout
    assert (tmp_path / "out" / "test" / "text").is_file()

    result = run_cli("--corpus", "mobvoi", "--root", tmp_path / "missing", "--out-dir", tmp_path / "out2")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: ")
    assert "missing/mobvoi_hotword_dataset: folder not found" in result.stderr
    assert not (tmp_path / "out2").exists()


def test_corpus_keywords_are_the_names_det_writes():
    from kws.keywords import keyword_slug
    from kws.recipes import corpus_keywords

    assert corpus_keywords({"name": "mobvoi", "keywords": []}) == ["hi_xiaowen", "nihao_wenwen"]
    assert corpus_keywords({"name": "speech_commands", "keywords": ["yes", "Up"]}) == ["yes", "up"]
    assert corpus_keywords({"name": "kaldi", "keywords": ["<HEY_KWS>", "hey snips"]}) == ["hey_kws", "hey_snips"]
    assert corpus_keywords({"name": "synthetic", "language": "cmn", "keywords": []}) == ["hi_xiaowen", "nihao_wenwen"]
    assert keyword_slug(keyword_token("hey snips")) == "hey_snips"
    with pytest.raises(KwsError, match="corpus.keywords"):
        corpus_keywords({"name": "kaldi", "keywords": []})
