"""The text tables of a synthesised corpus (the corpus layout of docs/DESIGN.md): dict/words.txt and, per
split, `text` (key token), `wav.scp` (key wav path), `utt2voice` (key engine voice) and `utt2kind` (key
kind: keyword, partial, near_miss, speech, ...), the last two of which make_list copies into data.list.
Removed before the audio is replaced and written after it, so that a reader sees a whole corpus or none."""

import os

from kws.datalist import write_dictionary
from kws.fileio import atomic_open

# every list a split of the corpus may hold (wav.dur and data.list come from make_list)
SPLIT_TABLES = ("wav.scp", "text", "wav.dur", "data.list", "utt2voice", "utt2kind", "utt2keyword_end", "utt2phones")


def remove_tables(out, splits):
    """Delete the lists of `splits` and the dictionary under `out` (stale once the audio changes)."""
    for split in splits:
        for name in SPLIT_TABLES:
            (out / split / name).unlink(missing_ok=True)
    (out / "dict" / "words.txt").unlink(missing_ok=True)


def write_tables(out, out_text, tokens, filler, by_split, kinds):
    """words.txt of `tokens` (and `filler`), then each split's utt2voice, utt2kind, text and wav.scp of its
    records (wav paths under `out_text`, the output folder as given); kinds: key -> utterance kind."""
    write_dictionary(out / "dict" / "words.txt", tokens, filler=filler)
    for split, records in by_split.items():
        # who spoke each utterance: make_list copies it into data.list (engine, voice fields)
        with atomic_open(out / split / "utt2voice") as handle:
            handle.writelines(f"{r['key']} {r['engine']} {r['voice']}\n" for r in records)
        # what each negative is: metrics count false alarms by it
        with atomic_open(out / split / "utt2kind") as handle:
            handle.writelines(f"{r['key']} {kinds[r['key']]}\n" for r in records)
        # where each positive said alone ends its keyword (seconds): training can anchor on it
        with atomic_open(out / split / "utt2keyword_end") as handle:
            handle.writelines(
                f"{r['key']} {r['keyword_end']:.4f}\n" for r in records if r.get("keyword_end") is not None
            )
        # what each utterance says, as phonemes: training_config.phone_ctc supervises with them
        with atomic_open(out / split / "utt2phones") as handle:
            handle.writelines(f"{r['key']} {r['phones']}\n" for r in records if r.get("phones"))
        with atomic_open(out / split / "text") as handle:
            handle.writelines(f"{r['key']} {r['token']}\n" for r in records)
        with atomic_open(out / split / "wav.scp") as handle:
            handle.writelines(
                f"{r['key']} {os.path.join(out_text, 'wav', split, r['key'] + '.wav')}\n" for r in records
            )
