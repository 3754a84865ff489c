"""make_list: wav.dur + data.list, every bad input a one-line error; fuzzing of the list/audio readers."""

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kws.audio import read_wav, wav_info
from kws.datalist import read_data_list, read_dictionary, read_kaldi_map
from kws.errors import KwsError
from kws.lists import check_split, make_list

REPO = Path(__file__).resolve().parents[1]


def run_make_list(data_dir, dict_path, *extra):
    return subprocess.run(
        [sys.executable, "scripts/make_list.py", "--data-dir", str(data_dir), "--dict", str(dict_path), *extra],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def assert_one_line_error(result, *fragments):
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, (fragment, result.stderr)


def leftovers(split_dir):
    return sorted(p.name for p in Path(split_dir).iterdir() if p.name not in ("wav.scp", "text"))


def test_make_list(tiny_corpus):
    words = tiny_corpus / "dict" / "words.txt"
    summary = make_list(tiny_corpus / "train", words, threads=2)
    assert summary["utterances"] == 6 and summary["keyword_utterances"] == 4
    dictionary = read_dictionary(words)
    items = read_data_list(tiny_corpus / "train" / "data.list", dictionary=dictionary)
    scp = read_kaldi_map(tiny_corpus / "train" / "wav.scp")
    text = read_kaldi_map(tiny_corpus / "train" / "text")
    assert [item["key"] for item in items] == list(scp)
    written = [json.loads(line) for line in (tiny_corpus / "train" / "data.list").read_text().splitlines()]
    for item, record in zip(items, written):
        assert list(record) == ["key", "txt", "duration", "wav"]  # WeKws's fields, in its order
        assert item["wav"] == scp[item["key"]]
        assert record["txt"] == text[item["key"]]  # the token, as WeKws HEAD writes it
        assert item["label"] == dictionary[text[item["key"]]]
        assert item["duration"] == pytest.approx(soundfile.info(item["wav"]).duration)
    durations = read_kaldi_map(tiny_corpus / "train" / "wav.dur")
    assert {k: float(v) for k, v in durations.items()} == {i["key"]: i["duration"] for i in items}
    # thread count does not change the result
    assert check_split(tiny_corpus / "train", words, threads=1) == items
    assert leftovers(tiny_corpus / "train") == ["data.list", "wav.dur"]


def test_make_list_cli_outputs(tiny_corpus, tmp_path):
    result = run_make_list(
        tiny_corpus / "dev",
        tiny_corpus / "dict" / "words.txt",
        "--threads",
        "3",
        "--wav-dur",
        tmp_path / "o" / "dur",
        "--data-list",
        tmp_path / "o" / "list",
    )
    assert result.returncode == 0, result.stderr
    assert "3 utterances" in result.stdout
    assert len(read_data_list(tmp_path / "o" / "list")) == 3
    assert len(read_kaldi_map(tmp_path / "o" / "dur")) == 3


# ---------------------------------------------------------------------------- bad input, through the CLI


def replace_wav(split_dir, line, writer):
    """Point wav.scp line `line` (1-based) at a new file made by writer(path); returns (key, path)."""
    scp = split_dir / "wav.scp"
    lines = scp.read_text().splitlines()
    key, _ = lines[line - 1].split(maxsplit=1)
    path = split_dir.parent / "bad" / f"{key}.wav"
    path.parent.mkdir(exist_ok=True)
    writer(path)
    lines[line - 1] = f"{key} {path}"
    scp.write_text("\n".join(lines) + "\n")
    return path


def _corrupt(path):
    path.write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt garbage that is not a header" * 3)


def _random_bytes(path):
    path.write_bytes(np.random.default_rng(1).integers(0, 256, 4000, dtype=np.uint8).tobytes())


def _zero_bytes(path):
    path.write_bytes(b"")


def _zero_samples(path):
    soundfile.write(str(path), np.zeros(0, dtype=np.float32), 16000, subtype="PCM_16", format="WAV")


BAD_WAVS = {
    "missing": (lambda p: None, "audio file not found"),
    "corrupt": (_corrupt, "not a readable audio file"),
    "random_bytes": (_random_bytes, "not a readable audio file"),
    "zero_bytes": (_zero_bytes, "not a readable audio file"),
    "zero_samples": (_zero_samples, "audio file is empty"),
    "8khz": (None, "sample rate 8000 Hz, expected 16000 Hz"),
    "stereo": (None, "2 channels, expected mono"),
}


@pytest.mark.parametrize("case", sorted(BAD_WAVS))
def test_bad_wav(tiny_corpus, make_wav, case):
    writer, message = BAD_WAVS[case]
    if case == "8khz":
        writer = lambda p: make_wav(p, rate=8000)  # noqa: E731
    elif case == "stereo":
        writer = lambda p: make_wav(p, channels=2)  # noqa: E731
    split = tiny_corpus / "train"
    path = replace_wav(split, 5, writer)
    result = run_make_list(split, tiny_corpus / "dict" / "words.txt", "--threads", "2")
    assert_one_line_error(result, f"{split / 'wav.scp'}:5: {path}: {message}")
    assert leftovers(split) == []


TABLE_CASES = {
    "duplicate_key": ("wav.scp", lambda s: s + s.splitlines()[1] + "\n", "wav.scp:7: duplicate key 'train_c0_01'"),
    "label_not_in_dict": (
        "text",
        lambda s: s.replace("train_c2_00 <NIHAO_WENWEN>", "train_c2_00 <HELLO>"),
        "text:5: label '<HELLO>' of 'train_c2_00' is not in",
    ),
    "text_key_missing_in_scp": ("text", lambda s: s + "ghost <FILLER>\n", "text:7: utterance 'ghost' has no entry in"),
    "scp_key_missing_in_text": (
        "text",
        lambda s: "\n".join(s.splitlines()[1:]) + "\n",
        "wav.scp:1: utterance 'train_c0_00' has no label in",
    ),
    "malformed_line": ("text", lambda s: s + "lonely_key\n", "text:7: expected `<key> <value>`"),
    "piped_command": (
        "wav.scp",
        lambda s: s.replace(s.splitlines()[0], "train_c0_00 sox x.wav -t wav - |"),
        "wav.scp:1: train_c0_00: piped commands are not supported",
    ),
    "keyword_end_not_a_number": ("utt2keyword_end", lambda s: "train_c1_00 soon\n", "utt2keyword_end:1: expected"),
    "keyword_end_of_a_filler": (
        "utt2keyword_end",
        lambda s: "train_c0_00 0.2\n",
        "utt2keyword_end:1: train_c0_00 is not a keyword utterance",
    ),
    "empty_list": ("wav.scp", lambda s: "", "wav.scp: no utterances"),
    "missing_list": ("wav.scp", None, "wav.scp: file not found"),
    "missing_text": ("text", None, "text: file not found"),
}


@pytest.mark.parametrize("case", sorted(TABLE_CASES))
def test_bad_tables(tiny_corpus, case):
    name, edit, message = TABLE_CASES[case]
    split = tiny_corpus / "train"
    if edit is None:
        (split / name).unlink()
    else:
        (split / name).write_text(edit((split / name).read_text() if (split / name).exists() else ""))
    with pytest.raises(KwsError, match=r"^[^\n]*$") as info:
        make_list(split, tiny_corpus / "dict" / "words.txt")
    assert message in str(info.value)
    assert str(split) in str(info.value)
    assert [p for p in leftovers(split) if p not in ("wav.scp", "text", name)] == []


def test_keyword_ends_reach_data_list(tiny_corpus):
    """utt2keyword_end (the synthetic corpus writes it) becomes data.list's keyword_end, read back as is."""
    split, words = tiny_corpus / "train", tiny_corpus / "dict" / "words.txt"
    (split / "utt2keyword_end").write_text("train_c1_00 0.2000\ntrain_c2_01 9.5\n")
    make_list(split, words)
    items = {item["key"]: item for item in read_data_list(split / "data.list", dictionary=read_dictionary(words))}
    assert items["train_c1_00"]["keyword_end"] == 0.2
    assert items["train_c2_01"]["keyword_end"] == items["train_c2_01"]["duration"]  # clipped to the audio
    assert all("keyword_end" not in item for key, item in items.items() if key not in ("train_c1_00", "train_c2_01"))
    line = json.dumps({"key": "x", "txt": "<FILLER>", "duration": 1.0, "wav": "x.wav", "keyword_end": 2.0})
    (split / "bad.list").write_text(line + "\n")
    with pytest.raises(KwsError, match="bad.list:1: keyword_end must be"):
        read_data_list(split / "bad.list")


def test_bad_tables_cli(tiny_corpus, tmp_path):
    split = tiny_corpus / "train"
    (split / "text").write_text((split / "text").read_text().replace("<HI_XIAOWEN>", "<HELLO>", 1))
    assert_one_line_error(
        run_make_list(split, tiny_corpus / "dict" / "words.txt"), f"{split / 'text'}:3: label '<HELLO>'"
    )
    assert_one_line_error(
        run_make_list(tmp_path / "nowhere", tiny_corpus / "dict" / "words.txt"),
        f"{tmp_path / 'nowhere' / 'wav.scp'}: file not found",
    )
    assert_one_line_error(run_make_list(split, tmp_path / "words.txt"), f"{tmp_path / 'words.txt'}: file not found")
    assert leftovers(split) == []
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("split", ["train", "dev", "test"])
def test_split_without_a_keyword_stops_at_the_lists(tiny_corpus, split):
    # e.g. Speech Commands' `no` missing from a small corpus's test split: its DET would fail after training
    folder = tiny_corpus / split
    for name in ("wav.scp", "text"):
        lines = (folder / name).read_text().splitlines(keepends=True)
        (folder / name).write_text("".join(line for line in lines if "_c2_" not in line))
    assert_one_line_error(
        run_make_list(folder, tiny_corpus / "dict" / "words.txt"),
        f"{folder / 'text'}: the {split} split has no utterance of keyword <NIHAO_WENWEN>",
    )
    assert leftovers(folder) == []


def test_existing_outputs_untouched_on_error(tiny_corpus):
    split = tiny_corpus / "dev"
    make_list(split, tiny_corpus / "dict" / "words.txt")
    before = (split / "data.list").read_bytes()
    (split / "wav.scp").write_text((split / "wav.scp").read_text() + "x /no/such.wav\n")
    (split / "text").write_text((split / "text").read_text() + "x <FILLER>\n")
    with pytest.raises(KwsError, match="wav.scp:4: /no/such.wav: audio file not found"):
        make_list(split, tiny_corpus / "dict" / "words.txt")
    assert (split / "data.list").read_bytes() == before
    assert sorted(leftovers(split)) == ["data.list", "wav.dur"]


# ---------------------------------------------------------------------------- fuzzing: never anything but KwsError

FUZZ = settings(max_examples=150, deadline=2000, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _only_kws_error(function, path):
    try:
        function(path)
    except KwsError as err:
        assert "\n" not in str(err)


@FUZZ
@given(data=st.binary(max_size=2000))
def test_fuzz_data_list_bytes(tmp_path, data):
    (tmp_path / "data.list").write_bytes(data)
    _only_kws_error(read_data_list, tmp_path / "data.list")


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=True) | st.text(max_size=5),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children, max_size=3),
    max_leaves=6,
)


@FUZZ
@given(
    records=st.lists(st.dictionaries(st.sampled_from(["key", "txt", "duration", "wav", "x"]), JSON_VALUES), max_size=4)
)
def test_fuzz_data_list_json(tmp_path, records):
    (tmp_path / "data.list").write_text("".join(json.dumps(r) + "\n" for r in records))
    dictionary = {"<F>": -1, "a": 0, "b": 1}  # short tokens, so that the fuzzer finds them
    try:
        items = read_data_list(tmp_path / "data.list", dictionary=dictionary)
    except KwsError:
        return
    for item in items:
        assert isinstance(item["key"], str) and isinstance(item["wav"], str)
        assert type(item["label"]) is int and -1 <= item["label"] < 2
        assert item["label"] == (dictionary[item["txt"]] if isinstance(item["txt"], str) else item["txt"])
        assert 0 < item["duration"] < float("inf")


def test_deeply_nested_json(tmp_path):
    (tmp_path / "data.list").write_text("[" * 100000 + "\n")
    with pytest.raises(KwsError, match=r"data\.list:1: malformed JSON"):
        read_data_list(tmp_path / "data.list")


@FUZZ
@given(data=st.binary(max_size=2000))
def test_fuzz_kaldi_bytes(tmp_path, data):
    (tmp_path / "wav.scp").write_bytes(data)
    _only_kws_error(read_kaldi_map, tmp_path / "wav.scp")
    _only_kws_error(read_dictionary, tmp_path / "wav.scp")


@FUZZ
@given(data=st.binary(max_size=3000))
def test_fuzz_wav_bytes(tmp_path, data):
    (tmp_path / "x.wav").write_bytes(data)
    _only_kws_error(wav_info, tmp_path / "x.wav")
    _only_kws_error(read_wav, tmp_path / "x.wav")


def _valid_wav_bytes():
    buffer = io.BytesIO()
    samples = (0.3 * np.sin(np.arange(800) * 0.1)).astype(np.float32)
    soundfile.write(buffer, samples, 16000, subtype="PCM_16", format="WAV")
    return buffer.getvalue()


VALID_WAV = _valid_wav_bytes()


@FUZZ
@given(
    cut=st.integers(0, len(VALID_WAV)), flips=st.lists(st.tuples(st.integers(0, 59), st.integers(0, 255)), max_size=6)
)
def test_fuzz_damaged_wav(tmp_path, cut, flips):
    """A real wav with its header bytes overwritten and/or truncated."""
    data = bytearray(VALID_WAV[:cut])
    for position, value in flips:
        if position < len(data):
            data[position] = value
    (tmp_path / "x.wav").write_bytes(bytes(data))
    _only_kws_error(wav_info, tmp_path / "x.wav")
    _only_kws_error(read_wav, tmp_path / "x.wav")
