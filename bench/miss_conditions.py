"""Which positives does a model miss, by the conditions the synthetic corpus drew for them?

The corpus's data.list records engine and voice, not the noise, SNR, room, speed or rate an utterance was
rendered with. Those are seeded draws, so this replays them: for every positive of a split it re-plans
the corpus from its synth_info.json and runs the renderer over stand-in audio of the wav's own length,
with the augmentation functions wrapped to record their arguments (no synthesis, seconds for a split).
Each run's threshold comes from its metrics.json: at the FA/h target with every negative counted (the
default), with ordinary negatives only (`--negatives ordinary`, the confusables left out as in the
metrics' second table), or the exported threshold a held-out split was scored at (`--negatives exported`).
A positive is missed when its highest frame score in score.txt is under it.

    python bench/miss_conditions.py --corpus results/data/synthetic --split test \\
        --runs results/ds_tcn_small results/ds_tcn_small-seed1 results/ds_tcn_small-seed2
"""

import argparse
import collections
import json
import sys
from pathlib import Path

import numpy as np
import soundfile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kws.synth import augment as aug  # noqa: E402
from kws.synth import corpus  # noqa: E402

FACTORS = ("noise", "snr_db", "room", "speed", "clean", "rate", "pitch", "alone", "keyword_s", "voice", "text")


def replay_conditions(item, wav_samples):
    """The draws _render_utterance made for `item` whose wav has `wav_samples` samples."""
    seen = {}
    wrapped = {name: getattr(aug, name) for name in ("reverberate", "make_noise", "add_noise")}

    def reverberate(x, rng, rate, rt60):
        seen["rt60"] = rt60
        return wrapped["reverberate"](x, rng, rate, rt60)

    def make_noise(rng, kind, n, rate, babble_sources=()):
        seen["noise"] = kind
        return wrapped["make_noise"](rng, kind, n, rate, babble_sources)

    def add_noise(x, noise, snr_db, speech_rms):
        seen["snr_db"] = snr_db
        return wrapped["add_noise"](x, noise, snr_db, speech_rms)

    rng = np.random.default_rng(item["seed"])  # the first draws, as the renderer makes them
    clean, speed = corpus._clean_and_speed(rng, True)
    rng.uniform(-34, -16)
    lead, trail = rng.uniform(0.05, 1.0), rng.uniform(0.05, 0.8)
    speech = wav_samples - int(lead * corpus.SAMPLE_RATE) - int(trail * corpus.SAMPLE_RATE)
    to_16k = corpus._to_16k
    babble = [np.ones(100, np.float32)] * corpus.BABBLE_SOURCES  # only their number shapes the draws
    try:
        corpus._to_16k = lambda audio, speed=1.0, speaker=None: np.ones(speech, np.float32)
        aug.reverberate, aug.make_noise, aug.add_noise = reverberate, make_noise, add_noise
        corpus._render_utterance(item, None, True, babble)
    finally:
        corpus._to_16k = to_16k
        aug.reverberate, aug.make_noise, aug.add_noise = (
            wrapped[n] for n in ("reverberate", "make_noise", "add_noise")
        )
    request = item["requests"][0]
    return {
        "clean": clean,
        "speed": speed,
        "noise": "none" if clean else seen.get("noise", "none"),
        "snr_db": None if clean or "noise" not in seen else seen["snr_db"],
        "room": "reverberant" if "rt60" in seen else "dry",
        "rate": request["rate"],
        "pitch": request["pitch"],
        "text": request["text"],
        "lead_s": lead,
    }


def bucket(factor, value):
    if value is None:
        return "-"
    if factor == "snr_db":
        return f"{int(value // 5 * 5):02d}-{int(value // 5 * 5 + 5):02d} dB"
    if factor in ("rate", "pitch"):
        return f"{value // 25 * 25}-{value // 25 * 25 + 24}"
    if factor == "keyword_s":
        return f"{value // 0.25 * 0.25:.2f}-{value // 0.25 * 0.25 + 0.25:.2f} s"
    return str(value)


def max_scores(path):
    scores = {}
    with open(path) as handle:
        for line in handle:
            key, token, *frames = line.split()
            scores[key, token] = max(map(float, frames), default=0.0)
    return scores


def run_threshold(keyword, negatives, fa_per_hour, where):
    """The keyword's threshold in one run's metrics.json (None: no threshold meets the target)."""
    if negatives == "exported":
        if "at_reference_threshold" not in keyword:
            raise SystemExit(f"{where}: no exported threshold (only a held-out split is scored at one)")
        return keyword["at_reference_threshold"]["threshold"]
    table = keyword["ordinary"] if negatives == "ordinary" else keyword
    points = [p for p in table["operating_points"] if p["fa_per_hour_target"] == fa_per_hour]
    if not points:
        raise SystemExit(f"{where}: no operating point at {fa_per_hour:g} FA/h")
    return points[0]["threshold"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", required=True, help="the synthetic corpus's data folder (synth_info.json)")
    parser.add_argument("--split", default="test", help="test | test_engine (default: test)")
    parser.add_argument("--runs", nargs="+", required=True, help="experiment folders (results/<exp>)")
    parser.add_argument("--fa-per-hour", type=float, default=1.0, help="the operating point (default: 1)")
    parser.add_argument(
        "--negatives",
        choices=("every", "ordinary", "exported"),
        default="every",
        help="whose threshold: every negative (default), ordinary negatives, or the exported one",
    )
    parser.add_argument("--min-count", type=int, default=20, help="hide buckets with fewer positives")
    args = parser.parse_args(argv)

    root = Path(args.corpus)
    info = json.loads((root / "synth_info.json").read_text())
    spec = corpus.CorpusSpec(**{k: info[k] for k in corpus.CorpusSpec() if k in info})
    plan, _ = corpus.plan_corpus(info["size"], info["seed"], info["augment"], spec=spec)
    items = {item["key"]: item for item in plan[args.split]}
    positives = {}
    with open(root / args.split / "data.list") as handle:
        for line in handle:
            entry = json.loads(line)
            if entry["txt"] == "<FILLER>":
                continue
            conditions = replay_conditions(items[entry["key"]], soundfile.info(entry["wav"]).frames)
            conditions["voice"] = entry["voice"]
            conditions["alone"] = "keyword_end" in entry
            conditions["keyword_s"] = entry["keyword_end"] - conditions["lead_s"] if "keyword_end" in entry else None
            positives[entry["key"]] = (entry["txt"], conditions)

    tables = collections.defaultdict(lambda: collections.defaultdict(lambda: [0, 0]))
    for run in map(Path, args.runs):
        folder = run / args.split if args.split != "test" else run
        metrics = json.loads((folder / "metrics.json").read_text())
        scores = max_scores(folder / "score.txt")
        for name, keyword in metrics["keywords"].items():
            threshold = run_threshold(keyword, args.negatives, args.fa_per_hour, folder / "metrics.json")
            for key, (token, conditions) in positives.items():
                if token != keyword["token"]:
                    continue
                missed = threshold is None or scores.get((key, token), 0.0) < threshold
                for factor in ("all", *FACTORS):
                    value = "" if factor == "all" else bucket(factor, conditions[factor])
                    counts = tables[name][factor, value]
                    counts[0] += missed
                    counts[1] += 1
    point = "exported threshold" if args.negatives == "exported" else f"{args.fa_per_hour:g} FA/h threshold"
    counted = " (ordinary negatives)" if args.negatives == "ordinary" else ""
    print(f"FRR at each run's {point}{counted}, {args.split}, {len(args.runs)} run(s)")
    for name, table in tables.items():
        print(f"\n{name}\n| factor | value | missed | FRR |\n|---|---|---|---|")
        for (factor, value), (missed, total) in sorted(table.items(), key=lambda kv: (kv[0][0] != "all", kv[0])):
            if total >= args.min_count or factor == "all":
                print(f"| {factor} | {value} | {missed} / {total} | {100 * missed / total:.1f} % |")


if __name__ == "__main__":
    main()
