"""Data-preparation recipes: turn a real corpus into the kwsflow corpus layout.

Every recipe writes
    <out>/dict/words.txt                 `<FILLER> -1`, then keyword i as `<TOKEN> i`
    <out>/{train,dev,test}/wav.scp       `key /absolute/path.wav`
    <out>/{train,dev,test}/text          `key <TOKEN>`
and returns a small summary (utterance and keyword counts per split, notes).

Everything is read and checked first and written afterwards, each file atomically, so a
corpus with a problem leaves no output behind. Problems are KwsErrors naming the file
(and line or entry) at fault.
"""

import json
import os
from collections import Counter
from pathlib import Path

from kws.datalist import FILLER, read_dictionary, read_kaldi_map
from kws.errors import KwsError
from kws.fileio import atomic_open, ensure_dir
from kws.keywords import keyword_slug, keyword_token

SPLITS = ("train", "dev", "test")
FILLER_TOKEN = "<FILLER>"
CORPORA = ("mobvoi", "speech_commands", "snips", "kaldi")

MOBVOI_KEYWORDS = ("<HI_XIAOWEN>", "<NIHAO_WENWEN>")
SNIPS_KEYWORDS = ("<HEY_SNIPS>",)
SPEECH_COMMANDS_DEFAULT = ("yes", "no")
# A corpus's keywords when the config's corpus.keywords is empty (a kaldi corpus has to name them).
DEFAULT_KEYWORDS = {
    "synthetic": MOBVOI_KEYWORDS,
    "mobvoi": MOBVOI_KEYWORDS,
    "snips": SNIPS_KEYWORDS,
    "speech_commands": SPEECH_COMMANDS_DEFAULT,
    "kaldi": (),
}
SPEECH_COMMANDS_BACKGROUND = "_background_noise_"


# --------------------------------------------------------------------------- helpers


def _require_dir(path):
    path = Path(path)
    if not path.is_dir():
        raise KwsError(f"{path}: folder not found")
    return path


def _require_file(path):
    path = Path(path)
    if not path.is_file():
        raise KwsError(f"{path}: file not found")
    return path


def _load_json(path):
    path = _require_file(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise KwsError(f"{path}: not UTF-8 text (byte {err.start})") from None
    except OSError as err:
        raise KwsError(f"{path}: cannot read ({err.strerror})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise KwsError(f"{path}:{err.lineno}: malformed JSON ({err.msg})") from None
    except RecursionError:
        raise KwsError(f"{path}: malformed JSON (nested too deeply)") from None


def _load_json_records(path, fields):
    """A JSON list of objects, each with `fields`; yields (where, record)."""
    data = _load_json(path)
    if not isinstance(data, list):
        raise KwsError(f"{path}: expected a JSON list of utterance records")
    for index, record in enumerate(data, start=1):
        where = f"{path}: entry {index}"
        if not isinstance(record, dict):
            raise KwsError(f"{where}: expected a JSON object, got {type(record).__name__}")
        missing = [name for name in fields if name not in record]
        if missing:
            raise KwsError(f"{where}: missing field(s) {', '.join(missing)}")
        yield where, record


def _check_key(key, where):
    if not isinstance(key, str) or not key or any(ch.isspace() for ch in key):
        raise KwsError(f"{where}: utterance id must be a non-empty string without spaces, got {key!r}")
    return key


def _check_wav(path, where):
    if not Path(path).is_file():
        raise KwsError(f"{where}: {path}: audio file not found")
    return os.path.abspath(path)


def _counts(utterances):
    return dict(sorted(Counter(token for _, _, token in utterances).items()))


def write_corpus(out_dir, keywords, splits, fillers=(FILLER_TOKEN,), notes=()):
    """Write dict/words.txt and {split}/{wav.scp,text} from `splits`: split -> [(key, wav, token)].

    Checks (before writing anything) that every split has utterances, keys are unique within a
    split, and every token is a keyword or a filler. Returns the summary.
    """
    tokens = set(keywords) | set(fillers)
    if len(tokens) != len(keywords) + len(fillers):
        raise KwsError(f"keywords {list(keywords)}: a token is repeated or is also a filler")
    for split, utterances in splits.items():
        if not utterances:
            raise KwsError(f"{split}: no utterances left for this split")
        seen = set()
        for key, _, token in utterances:
            if key in seen:
                raise KwsError(f"{split}: duplicate utterance id {key!r}")
            seen.add(key)
            if token not in tokens:
                raise KwsError(f"{split}: utterance {key!r}: token {token!r} is not in the dictionary")
    out_dir = ensure_dir(out_dir)
    with atomic_open(out_dir / "dict" / "words.txt") as out:
        for token in fillers:
            out.write(f"{token} {FILLER}\n")
        for index, token in enumerate(keywords):
            out.write(f"{token} {index}\n")
    for split, utterances in splits.items():
        ordered = sorted(utterances)
        with atomic_open(out_dir / split / "wav.scp") as out:
            for key, wav, _ in ordered:
                out.write(f"{key} {wav}\n")
        with atomic_open(out_dir / split / "text") as out:
            for key, _, token in ordered:
                out.write(f"{key} {token}\n")
    return {
        "out_dir": str(out_dir),
        "keywords": list(keywords),
        "splits": {split: {"utterances": len(u), "tokens": _counts(u)} for split, u in splits.items()},
        "notes": list(notes),
    }


# --------------------------------------------------------------------------- Mobvoi (OpenSLR 87)


def prepare_mobvoi(root, out_dir):
    """Mobvoi hotwords: keyword_id 0 -> <HI_XIAOWEN>, 1 -> <NIHAO_WENWEN>, -1 -> filler."""
    root = Path(root)
    wav_dir = _require_dir(root / "mobvoi_hotword_dataset")
    resources = _require_dir(root / "mobvoi_hotword_dataset_resources")
    tokens = {-1: FILLER_TOKEN, 0: MOBVOI_KEYWORDS[0], 1: MOBVOI_KEYWORDS[1]}
    paths = {
        (prefix, split): _require_file(resources / f"{prefix}_{split}.json")
        for split in SPLITS
        for prefix in ("p", "n")
    }
    splits = {}
    for split in SPLITS:
        utterances, seen = [], {}
        for prefix in ("p", "n"):
            path = paths[prefix, split]
            for where, record in _load_json_records(path, ("utt_id", "keyword_id")):
                key = _check_key(record["utt_id"], where)
                label = record["keyword_id"]
                if isinstance(label, bool) or label not in tokens:
                    raise KwsError(f"{where}: utt_id {key!r}: keyword_id must be -1, 0 or 1, got {label!r}")
                if key in seen:
                    raise KwsError(f"{where}: duplicate utt_id {key!r} (also in {seen[key]})")
                seen[key] = where
                wav = _check_wav(wav_dir / f"{key}.wav", f"{where}: utt_id {key!r}")
                utterances.append((key, wav, tokens[label]))
        splits[split] = utterances
    return write_corpus(out_dir, MOBVOI_KEYWORDS, splits)


# --------------------------------------------------------------------------- Speech Commands v2


def _read_relative_list(path, root):
    """validation_list.txt / testing_list.txt: relative wav paths -> {relpath: line}."""
    path = _require_file(path)
    try:
        lines = path.read_bytes().decode("utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise KwsError(f"{path}: not UTF-8 text (byte {err.start})") from None
    entries = {}
    for number, line in enumerate(lines, start=1):
        rel = line.strip()
        if not rel:
            continue
        parts = Path(rel).parts
        if len(parts) != 2 or not rel.endswith(".wav") or parts[0].startswith(("_", ".")):
            raise KwsError(f"{path}:{number}: expected `<word>/<file>.wav`, got {rel[:60]!r}")
        rel = Path(*parts).as_posix()
        if not (root / rel).is_file():
            raise KwsError(f"{path}:{number}: {root / rel}: audio file not found")
        if rel in entries:
            raise KwsError(f"{path}:{number}: {rel} listed twice (first on line {entries[rel]})")
        entries[rel] = number
    return entries


def prepare_speech_commands(root, out_dir, keywords=None):
    """Google Speech Commands v2: `keywords` (words, or ["all"]) become <WORD> tokens, the rest filler.

    validation_list.txt -> dev, testing_list.txt -> test, every other wav -> train.
    `_background_noise_` is not speech and is left out (noted in the summary).
    """
    root = _require_dir(root)
    validation_path = root / "validation_list.txt"
    testing_path = root / "testing_list.txt"
    dev = _read_relative_list(validation_path, root)
    test = _read_relative_list(testing_path, root)
    for rel in dev:
        if rel in test:
            raise KwsError(f"{testing_path}:{test[rel]}: {rel} is also in {validation_path}:{dev[rel]}")
    words = sorted(entry.name for entry in root.iterdir() if entry.is_dir() and not entry.name.startswith(("_", ".")))
    if not words:
        raise KwsError(f"{root}: no word folders (expected <word>/<speaker>_nohash_<n>.wav)")
    keywords = list(keywords or SPEECH_COMMANDS_DEFAULT)
    if [word.lower() for word in keywords] == ["all"]:
        keywords = words
    for word in keywords:
        if word not in words:
            raise KwsError(f"{root}: keyword {word!r} has no folder; words: {', '.join(words)}")
    if len(set(keywords)) != len(keywords):
        raise KwsError(f"keywords {keywords}: a keyword is repeated")
    token_of = {word: keyword_token(word) for word in keywords}
    splits = {split: [] for split in SPLITS}
    for word in words:
        for wav in sorted((root / word).glob("*.wav")):
            rel = f"{word}/{wav.name}"
            split = "dev" if rel in dev else "test" if rel in test else "train"
            key = _check_key(f"{word}_{wav.stem}", str(wav))
            splits[split].append((key, os.path.abspath(wav), token_of.get(word, FILLER_TOKEN)))
    notes = []
    background = root / SPEECH_COMMANDS_BACKGROUND
    if background.is_dir():
        count = len(list(background.glob("*.wav")))
        notes.append(
            f"{background}: {count} background-noise wav(s) left out of the speech lists (usable as augmentation noise)"
        )
    return write_corpus(out_dir, [token_of[word] for word in keywords], splits, notes=notes)


# --------------------------------------------------------------------------- Hey Snips


def prepare_snips(root, out_dir):
    """Hey Snips: is_hotword 1 -> <HEY_SNIPS> (0), 0 -> filler; records with duration <= 0 dropped."""
    root = _require_dir(root)
    paths = {split: _require_file(root / f"{split}.json") for split in SPLITS}
    splits, notes = {}, []
    for split in SPLITS:
        utterances, seen, dropped = [], {}, 0
        fields = ("id", "is_hotword", "duration", "audio_file_path")
        for where, record in _load_json_records(paths[split], fields):
            key = _check_key(record["id"], where)
            duration = record["duration"]
            if isinstance(duration, bool) or not isinstance(duration, (int, float)):
                raise KwsError(f"{where}: id {key!r}: duration must be a number, got {duration!r}")
            if not duration > 0:
                dropped += 1
                continue
            hotword = record["is_hotword"]
            if isinstance(hotword, bool):
                hotword = int(hotword)
            if hotword not in (0, 1):
                raise KwsError(f"{where}: id {key!r}: is_hotword must be 0 or 1, got {hotword!r}")
            if key in seen:
                raise KwsError(f"{where}: duplicate id {key!r} (also {seen[key]})")
            seen[key] = where
            rel = record["audio_file_path"]
            if not isinstance(rel, str) or not rel:
                raise KwsError(f"{where}: id {key!r}: audio_file_path must be a path, got {rel!r}")
            wav = _check_wav(root / rel, f"{where}: id {key!r}")
            utterances.append((key, wav, SNIPS_KEYWORDS[0] if hotword == 1 else FILLER_TOKEN))
        if dropped:
            notes.append(f"{paths[split]}: dropped {dropped} record(s) with duration <= 0")
        splits[split] = utterances
    return write_corpus(out_dir, SNIPS_KEYWORDS, splits, notes=notes)


# --------------------------------------------------------------------------- plain Kaldi folder


def _line_numbers(path):
    numbers = {}
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        parts = line.split(maxsplit=1)
        if parts:
            numbers.setdefault(parts[0], number)
    return numbers


def _resolve_wav(value, bases):
    candidate = Path(value)
    if candidate.is_absolute():
        return candidate if candidate.is_file() else None
    for base in bases:
        if (base / candidate).is_file():
            return base / candidate
    return None


def prepare_kaldi(root, out_dir, keywords=None):
    """A Kaldi-style folder root/{train,dev,test}/{wav.scp,text} (+ root/dict/words.txt), checked and copied.

    With `keywords` the dictionary is `<FILLER> -1` plus those tokens in order (root/dict is not
    needed). Relative wav paths are looked up from the current folder, then root/<split>, then root,
    and written as absolute paths. Every text label must be one token of the dictionary.
    """
    root = _require_dir(root)
    if keywords:
        keyword_tokens = [keyword_token(word) for word in keywords]
        fillers = [FILLER_TOKEN]
        dict_name = "--keywords"
    else:
        dict_path = _require_file(root / "dict" / "words.txt")
        dictionary = read_dictionary(dict_path)
        keyword_tokens = [t for t, i in sorted(dictionary.items(), key=lambda item: item[1]) if i != FILLER]
        fillers = [t for t, i in dictionary.items() if i == FILLER]
        if not fillers:
            raise KwsError(f"{dict_path}: no filler token (`<FILLER> -1`)")
        dict_name = str(dict_path)
    known = set(keyword_tokens) | set(fillers)
    splits = {}
    for split in SPLITS:
        split_dir = _require_dir(root / split)
        scp_path = _require_file(split_dir / "wav.scp")
        text_path = _require_file(split_dir / "text")
        scp = read_kaldi_map(scp_path)
        text = read_kaldi_map(text_path)
        scp_lines, text_lines = _line_numbers(scp_path), _line_numbers(text_path)
        utterances = []
        for key, value in scp.items():
            where = f"{scp_path}:{scp_lines[key]}"
            if value.endswith("|"):
                raise KwsError(f"{where}: {key}: piped commands are not supported, give a wav file path")
            if key not in text:
                raise KwsError(f"{where}: utterance {key!r} has no label in {text_path}")
            wav = _resolve_wav(value, (Path.cwd(), split_dir, root))
            if wav is None:
                raise KwsError(f"{where}: {value}: audio file not found")
            label = text[key]
            if len(label.split()) != 1 or label not in known:
                raise KwsError(f"{text_path}:{text_lines[key]}: label {label!r} is not a token of {dict_name}")
            utterances.append((key, os.path.abspath(wav), label))
        for key in text:
            if key not in scp:
                raise KwsError(f"{text_path}:{text_lines[key]}: utterance {key!r} has no entry in {scp_path}")
        splits[split] = utterances
    return write_corpus(out_dir, keyword_tokens, splits, fillers=fillers)


# --------------------------------------------------------------------------- dispatch


def prepare_corpus(corpus, root, out_dir, keywords=None):
    """Run the recipe for `corpus` (one of CORPORA)."""
    if corpus == "mobvoi":
        if keywords:
            raise KwsError("--keywords: the Mobvoi recipe has fixed keywords (<HI_XIAOWEN>, <NIHAO_WENWEN>)")
        return prepare_mobvoi(root, out_dir)
    if corpus == "speech_commands":
        return prepare_speech_commands(root, out_dir, keywords)
    if corpus == "snips":
        if keywords:
            raise KwsError("--keywords: the Hey Snips recipe has one fixed keyword (<HEY_SNIPS>)")
        return prepare_snips(root, out_dir)
    if corpus == "kaldi":
        return prepare_kaldi(root, out_dir, keywords)
    raise KwsError(f"--corpus: unknown corpus {corpus!r} (choose from {', '.join(CORPORA)})")


def corpus_keywords(corpus):
    """Keyword names of the config's corpus section (name, keywords, language), in dictionary order."""
    if corpus["name"] == "synthetic":  # phrases: "hey kws" -> hey_kws (the token <HEY_KWS>)
        from kws.synth.phrases import keyword_names

        return keyword_names(corpus["language"], corpus["keywords"])
    words = corpus["keywords"] or DEFAULT_KEYWORDS[corpus["name"]]
    if not words:
        raise KwsError("config: corpus.keywords must list the keywords of a kaldi corpus")
    return [keyword_slug(keyword_token(word)) for word in words]
