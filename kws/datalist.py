"""Readers for Kaldi-style files, WeKws `data.list` JSON lines and the keyword dictionary.

Every reader reports bad input as a KwsError naming the file and line.
"""

import json
from pathlib import Path

from kws.errors import KwsError

FILLER = -1
REQUIRED_FIELDS = ("key", "txt", "duration", "wav")


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


def read_data_list(path, num_keywords=None):
    """Read a WeKws `data.list`: a list of dicts with key, txt (int label), duration, wav."""
    items = []
    seen = set()
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
        label = item["txt"]
        if not isinstance(label, int) or isinstance(label, bool):
            raise KwsError(f"{path}:{number}: txt must be an integer keyword id, got {label!r}")
        if label < FILLER or (num_keywords is not None and label >= num_keywords):
            raise KwsError(f"{path}:{number}: label {label} is not a keyword id (-1..{(num_keywords or 1) - 1})")
        duration = item["duration"]
        if (isinstance(duration, bool) or not isinstance(duration, (int, float))
                or not 0 < duration < float("inf")):
            raise KwsError(f"{path}:{number}: duration must be a positive number, got {item['duration']!r}")
        items.append(item)
    if not items:
        raise KwsError(f"{path}: no utterances")
    return items


def write_data_list(path, items):
    """Write a `data.list` atomically, one JSON object per line, keys in WeKws order."""
    from kws.fileio import atomic_open

    with atomic_open(path) as out:
        for item in items:
            record = {name: item[name] for name in REQUIRED_FIELDS}
            out.write(json.dumps(record, ensure_ascii=False) + "\n")


def evenly_spaced(items, count):
    """At most `count` items spread evenly over the list (a slice that keeps its mix of labels)."""
    if count >= len(items):
        return list(items)
    return [items[(i * len(items)) // count] for i in range(count)]
