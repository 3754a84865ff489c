"""Readers for Kaldi-style files, WeKws `data.list` JSON lines and the keyword dictionary.

`data.list` comes in WeKws's two generations: until its 2025-02 data-pipeline change `txt` was the
integer keyword id (0, 1, -1); since then it is the token (`"<HI_XIAOWEN>"`, `"<FILLER>"`). kwsflow
writes tokens (what WeKws HEAD's compute_det.py reads) and reads both; a token becomes a keyword id
through the dictionary.

Every reader reports bad input as a KwsError naming the file and line.
"""

import json
from pathlib import Path

from kws.errors import KwsError

FILLER = -1
REQUIRED_FIELDS = ("key", "txt", "duration", "wav")
# who spoke a synthetic utterance, what it is (keyword, partial, near_miss, speech, ...; see
# kws.synth.phrases.UTTERANCE_KINDS) and, for a positive, the second its keyword ends (training may
# anchor on it: train.end_anchor), and what it says as phonemes (training_config.phone_ctc); WeKws ignores
# fields it does not read
EXTRA_FIELDS = ("engine", "voice", "kind", "keyword_end", "phones")
# the kinds made to be hard (partial phrases, phonetic neighbours): the DET's ordinary view leaves them out,
# training_config.confusable_weight weighs them
CONFUSABLE_KINDS = ("near_miss", "partial")


def read_text(path, what="file"):
    """A UTF-8 text file's content; a one-line KwsError naming it when missing or unreadable."""
    path = Path(path)
    try:
        return path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise KwsError(f"{path}: {what} not found") from None
    except UnicodeDecodeError as err:
        raise KwsError(f"{path}: not UTF-8 text (byte {err.start})") from None
    except OSError as err:
        raise KwsError(f"{path}: cannot read ({err.strerror})") from None


def _open_lines(path):
    return read_text(path).splitlines()


def read_numbered_map(path):
    """A Kaldi two-column file as key -> (line number, value), in file order."""
    table = {}
    for number, line in enumerate(_open_lines(path), start=1):
        if not line.strip():
            continue
        parts = line.strip().split(maxsplit=1)
        if len(parts) != 2:
            raise KwsError(f"{path}:{number}: expected `<key> <value>`, got {line.strip()[:60]!r}")
        key, value = parts
        if key in table:
            raise KwsError(f"{path}:{number}: duplicate key {key!r} (first on line {table[key][0]})")
        table[key] = (number, value.strip())
    return table


def read_kaldi_map(path):
    """Read a Kaldi two-column file (`wav.scp`, `text`, `wav.dur`): key -> rest of line, in file order."""
    return {key: value for key, (_, value) in read_numbered_map(path).items()}


def read_dictionary(path):
    """Read `dict/words.txt` (`<TOKEN> id`, fillers -1): token -> id."""
    table = read_kaldi_map(path)
    result = {}
    for token, value in table.items():
        try:
            result[token] = int(value)
        except ValueError:
            raise KwsError(f"{path}: keyword {token!r} has a non-integer id {value!r}") from None
    ids = sorted(i for i in result.values() if i != FILLER)
    if ids != list(range(len(ids))):
        raise KwsError(f"{path}: keyword ids must be 0..N-1 (fillers -1), got {ids}")
    return result


def keyword_names(dictionary):
    """Keyword tokens ordered by id, fillers left out: index i is keyword i."""
    return [token for token, i in sorted(dictionary.items(), key=lambda item: item[1]) if i != FILLER]


def write_dictionary(path, keywords, filler="<FILLER>"):
    """Write `dict/words.txt`: the filler token as -1, then keyword i as i."""
    from kws.fileio import atomic_open

    with atomic_open(path) as out:
        out.write(f"{filler} {FILLER}\n")
        for index, token in enumerate(keywords):
            out.write(f"{token} {index}\n")


def dictionary_arg(path, num_keywords=None):
    """The dictionary of a `--dict` argument (None when not given), checked against `num_keywords`.

    `path` is a words.txt-style file or WeKws's dict folder: WeKws's holds `dict.txt` (`<TOKEN> id`) and
    `words.txt` (tokens only), kwsflow's `words.txt` with ids; a folder is read through its dict.txt
    when it has one, else its words.txt.
    """
    if path is None:
        return None
    path = Path(path)
    if path.is_dir():
        path = path / "dict.txt" if (path / "dict.txt").is_file() else path / "words.txt"
    dictionary = read_dictionary(path)
    count = len(keyword_names(dictionary))
    if num_keywords is not None and count != num_keywords:
        # Labels and model outputs would disagree.
        raise KwsError(f"--dict {path}: lists {count} keyword(s) but --num_keywords is {num_keywords}")
    return dictionary


_KIND = {"integer": "an integer keyword id", "token": "a token"}


def read_data_list(path, num_keywords=None, dictionary=None):
    """Read a WeKws `data.list`: a list of dicts with key, txt, duration, wav and `label`.

    `txt` is kept as written (an integer id or a token, see the module docstring); `label` is the
    keyword id (-1 for fillers), or None for tokens when no `dictionary` is given (a list that is
    only copied, sliced or featurised needs no labels; `require_labels` says so where it does).
    """
    tokens = dictionary if dictionary is not None else {}
    if num_keywords is None and dictionary is not None:
        num_keywords = len(keyword_names(dictionary))
    items = []
    seen = set()
    kinds = {}  # txt kind -> its first line: a list mixing the two generations is refused
    for number, line in enumerate(_open_lines(path), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as err:
            raise KwsError(f"{path}:{number}: malformed JSON ({err.msg})") from None
        except RecursionError:
            raise KwsError(f"{path}:{number}: malformed JSON (nested too deeply)") from None
        if not isinstance(item, dict):
            raise KwsError(f"{path}:{number}: expected a JSON object")
        missing = [name for name in REQUIRED_FIELDS if name not in item]
        if missing:
            raise KwsError(f"{path}:{number}: missing field(s) {', '.join(missing)}")
        for name in ("key", "wav"):
            if not isinstance(item[name], str) or not item[name]:
                raise KwsError(f"{path}:{number}: {name} must be a non-empty string, got {repr(item[name])[:60]}")
        if item["key"] in seen:
            raise KwsError(f"{path}:{number}: duplicate key {item['key']!r}")
        seen.add(item["key"])
        txt = item["txt"]
        if isinstance(txt, int) and not isinstance(txt, bool):
            kind, label = "integer", txt
            if label < FILLER or (num_keywords is not None and label >= num_keywords):
                raise KwsError(f"{path}:{number}: label {label} is not a keyword id (-1..{(num_keywords or 1) - 1})")
        elif isinstance(txt, str) and txt.strip():
            kind, label = "token", None
            if dictionary is not None:
                if txt not in tokens:
                    raise KwsError(f"{path}:{number}: txt {txt[:60]!r} is not a token of the dictionary")
                label = tokens[txt]
        else:
            raise KwsError(
                f'{path}:{number}: txt must be a keyword token ("<HI_XIAOWEN>") or an integer '
                f"keyword id, got {repr(txt)[:60]}"
            )
        kinds.setdefault(kind, number)
        if len(kinds) > 1:
            other = "integer" if kind == "token" else "token"
            raise KwsError(
                f"{path}:{number}: txt is {_KIND[kind]} but line {kinds[other]} has {_KIND[other]} "
                f"(WeKws's old and new formats mixed); write one format"
            )
        duration = item["duration"]
        if isinstance(duration, bool) or not isinstance(duration, (int, float)) or not 0 < duration < float("inf"):
            raise KwsError(f"{path}:{number}: duration must be a positive number, got {item['duration']!r}")
        end = item.get("keyword_end")
        if end is not None and (isinstance(end, bool) or not isinstance(end, (int, float)) or not 0 <= end <= duration):
            raise KwsError(f"{path}:{number}: keyword_end must be a number of seconds within the duration, got {end!r}")
        phones = item.get("phones")
        if phones is not None and not isinstance(phones, str):
            raise KwsError(f"{path}:{number}: phones must be a string of space-separated phonemes, got {phones!r}")
        item["label"] = label
        items.append(item)
    if not items:
        raise KwsError(f"{path}: no utterances")
    return items


def require_labels(items, path):
    """Every item's keyword id is known; else say that the token list needs its dictionary."""
    for item in items:
        if item.get("label") is None:
            raise KwsError(
                f"{path}: utterance {item['key']!r} is labelled with the token {item['txt']!r}; "
                f"give the dictionary (train.py --dict) to map tokens to keyword ids"
            )


def write_data_list(path, items):
    """Write a `data.list` atomically, one JSON object per line, keys in WeKws order (`label` not written),
    then engine, voice, kind, keyword_end and phones where an item has them."""
    from kws.fileio import atomic_open

    with atomic_open(path) as out:
        for item in items:
            record = {name: item[name] for name in REQUIRED_FIELDS + EXTRA_FIELDS if name in item}
            out.write(json.dumps(record, ensure_ascii=False) + "\n")


def evenly_spaced(items, count):
    """At most `count` items spread evenly over the list (a slice that keeps its mix of labels)."""
    if count >= len(items):
        return list(items)
    return [items[(i * len(items)) // count] for i in range(count)]
