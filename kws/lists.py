"""Build `wav.dur` and WeKws `data.list` from a split's `wav.scp` + `text`, checking every wav header.

Every problem is a one-line KwsError naming the file and line at fault (for audio problems: the
wav.scp line and the wav). Nothing is written unless the whole split is good.
"""

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kws.audio import SAMPLE_RATE, wav_info
from kws.datalist import keyword_names, read_dictionary, read_numbered_map, write_data_list
from kws.errors import KwsError
from kws.fileio import atomic_open


def default_threads():
    return max(1, min(8, os.cpu_count() or 1))


def check_split(data_dir, dict_path, threads=None, expected_rate=SAMPLE_RATE):
    """Check a split folder; returns the data.list items in wav.scp order.

    Items hold key, txt (the token, as WeKws HEAD writes it), duration, wav, and label (the keyword id);
    with a `utt2voice` beside wav.scp (the synthetic corpus: `<key> <engine> <voice>`) also engine and voice,
    with a `utt2kind` (`<key> <kind>`: keyword, partial, near_miss, speech, ...) also kind, and with a
    `utt2keyword_end` (`<key> <seconds>`: where a positive's keyword ends) also keyword_end, and with a
    `utt2phones` (`<key> <phoneme> ...`: what it says) also phones.
    """
    data_dir = Path(data_dir)
    scp_path, text_path = data_dir / "wav.scp", data_dir / "text"
    dictionary = read_dictionary(dict_path)
    scp = read_numbered_map(scp_path)
    text = read_numbered_map(text_path)
    voice_path, kind_path = data_dir / "utt2voice", data_dir / "utt2kind"
    voices = read_numbered_map(voice_path) if voice_path.is_file() else {}
    kinds = read_numbered_map(kind_path) if kind_path.is_file() else {}
    end_path = data_dir / "utt2keyword_end"
    ends = read_numbered_map(end_path) if end_path.is_file() else {}
    phones_path = data_dir / "utt2phones"
    phones = read_numbered_map(phones_path) if phones_path.is_file() else {}
    if not scp:
        raise KwsError(f"{scp_path}: no utterances")
    for key, (number, _) in scp.items():
        if key not in text:
            raise KwsError(f"{scp_path}:{number}: utterance {key!r} has no label in {text_path}")
    for key, (number, label) in text.items():
        if key not in scp:
            raise KwsError(f"{text_path}:{number}: utterance {key!r} has no entry in {scp_path}")
        if label not in dictionary:
            raise KwsError(f"{text_path}:{number}: label {label!r} of {key!r} is not in {dict_path}")
    for key, (number, value) in voices.items():
        if key not in scp or len(value.split()) != 2:
            raise KwsError(f"{voice_path}:{number}: expected `<key> <engine> <voice>` for a key of {scp_path}")
    for key, (number, value) in kinds.items():
        if key not in scp or len(value.split()) != 1:
            raise KwsError(f"{kind_path}:{number}: expected `<key> <kind>` for a key of {scp_path}")
    for key, (number, value) in ends.items():
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if key not in scp or not seconds >= 0:
            raise KwsError(f"{end_path}:{number}: expected `<key> <seconds>` for a key of {scp_path}")
        if dictionary[text[key][1]] < 0:
            raise KwsError(f"{end_path}:{number}: {key} is not a keyword utterance in {text_path}")
    for key, (number, _) in phones.items():
        if key not in scp:
            raise KwsError(f"{phones_path}:{number}: {key!r} is not a key of {scp_path}")
    check_keyword_positives((label for _, label in text.values()), dictionary, data_dir.name, text_path)
    for key, (number, wav) in scp.items():
        if wav.endswith("|"):
            raise KwsError(f"{scp_path}:{number}: {key}: piped commands are not supported, give a wav file path")

    wavs = [wav for _, wav in scp.values()]
    threads = default_threads() if threads is None else max(1, int(threads))
    if threads > 1 and len(wavs) > 1:
        with ThreadPoolExecutor(max_workers=min(threads, len(wavs))) as pool:
            headers = list(pool.map(lambda wav: _header_at(wav, expected_rate), wavs, chunksize=64))
    else:
        headers = [_header_at(wav, expected_rate) for wav in wavs]

    items = []
    for (key, (number, wav)), (duration, err) in zip(scp.items(), headers):
        if err is not None:
            raise KwsError(f"{scp_path}:{number}: {err}")
        token = text[key][1]
        item = {"key": key, "txt": token, "duration": duration, "wav": wav, "label": dictionary[token]}
        if key in voices:
            item["engine"], item["voice"] = voices[key][1].split()
        if key in kinds:
            item["kind"] = kinds[key][1]
        if key in ends:
            item["keyword_end"] = min(float(ends[key][1]), duration)
        if key in phones:
            item["phones"] = " ".join(phones[key][1].split())
        items.append(item)
    return items


def check_keyword_positives(labels, dictionary, split, where):
    """Every keyword of `dictionary` must label at least one of `labels` (the split's text tokens).

    A keyword without positives in test has no FRR, so its DET fails, and that only after training;
    without any in train or dev it is never learned or never validated. Stop at the lists instead."""
    present = set(labels)
    missing = [token for token in keyword_names(dictionary) if token not in present]
    if missing:
        raise KwsError(
            f"{where}: the {split} split has no utterance of keyword {', '.join(missing)}: every "
            f"keyword needs positives in train, dev and test (use a larger corpus or other keywords)"
        )


def _header_at(wav, expected_rate):
    try:
        return wav_info(wav, expected_rate=expected_rate), None
    except KwsError as err:
        return None, err


def make_list(data_dir, dict_path, wav_dur=None, data_list=None, threads=None, expected_rate=SAMPLE_RATE):
    """Write `wav.dur` and `data.list` for a split (defaults: inside `data_dir`); returns a summary."""
    data_dir = Path(data_dir)
    wav_dur = Path(wav_dur) if wav_dur else data_dir / "wav.dur"
    data_list = Path(data_list) if data_list else data_dir / "data.list"
    items = check_split(data_dir, dict_path, threads=threads, expected_rate=expected_rate)
    with atomic_open(wav_dur) as out:
        for item in items:
            out.write(f"{item['key']} {item['duration']!r}\n")
        write_data_list(data_list, items)
    keywords = sum(1 for item in items if item["label"] >= 0)
    return {
        "utterances": len(items),
        "keyword_utterances": keywords,
        "filler_utterances": len(items) - keywords,
        "hours": sum(item["duration"] for item in items) / 3600.0,
        "wav_dur": str(wav_dur),
        "data_list": str(data_list),
    }
