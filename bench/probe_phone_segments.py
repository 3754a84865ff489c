#!/usr/bin/env python3
"""Probe (issue 16): does a stricter phoneme check reject near-misses one phoneme from the keyword?

score.phone_check multiplies each keyword posterior by exp(alpha * s / phonemes), s the best CTC path
through the keyword's phonemes: one wrong phoneme costs a few nats spread over all of them, so a near-miss
passes. This probe adds the path's worst segment (a phoneme and the blank after it): along the same best
path it tracks each segment's cost, and the score becomes p * exp(alpha * s / phonemes + beta * worst).
Network outputs are computed once per utterance (kws.phones.PhoneOutputs) and every (alpha, beta) writes
a score.txt for scripts/compute_det.py.

    python bench/probe_phone_segments.py --checkpoint results/ds_tcn_small/avg.pt \
        --test-data results/data/synthetic/dev/data.list --dict results/data/synthetic/dict/words.txt \
        --variants 0.25:0 0.25:0.1 0.25:0.25 --out-dir /tmp/segments
"""

import argparse
import contextlib
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kws.checkpoint import load_model  # noqa: E402
from kws.datalist import keyword_names, read_data_list, read_dictionary  # noqa: E402
from kws.features import fbank_conf_of, inference_fbank  # noqa: E402
from kws.fileio import atomic_open  # noqa: E402
from kws.phone_check import PhoneCheck, inference_network  # noqa: E402
from kws.score import format_line, utterance_features  # noqa: E402


class SegmentCheck(PhoneCheck):
    """PhoneCheck that also carries, along each state's best path, the cost of the current segment and the
    worst finished one; returns (s, worst segment) per checked keyword."""

    def __init__(self, labels):
        super().__init__(labels, 1.0)
        position = np.arange(len(self.states))
        first = np.zeros(len(self.states), dtype=np.int64)  # each state's keyword's first state
        for start in np.nonzero(~self.from_prev)[0]:
            first[start:] = start
        self.segment = np.maximum(1, (position - first + 1) // 2)  # phoneme i and the blank after it

    def segment_scores(self, relative_log):
        emit = np.asarray(relative_log, dtype=np.float64)[:, self.states]
        n = len(self.states)
        delta, seg, worst = np.full(n, -np.inf), np.zeros(n), np.zeros(n)
        sums, worsts = np.empty((emit.shape[0], len(self.last))), np.empty((emit.shape[0], len(self.last)))
        index = np.arange(n)
        for t in range(emit.shape[0]):
            best, source = delta.copy(), index.copy()
            for shift, allowed in ((1, self.from_prev), (2, self.skip)):
                candidate = np.full(n, -np.inf)
                candidate[shift:] = delta[:-shift]
                take = allowed & (candidate > best)
                best, source = np.where(take, candidate, best), np.where(take, index - shift, source)
            fresh = self.start & (best < 0.0)  # a path may start here: nothing before it
            best = np.where(fresh, 0.0, best)
            new_segment = self.segment[source] != self.segment
            seg_before = np.where(fresh, 0.0, np.where(new_segment, 0.0, seg[source]))
            finished = np.where(new_segment, np.minimum(worst[source], seg[source]), worst[source])
            worst_before = np.where(fresh, 0.0, finished)
            delta, seg, worst = best + emit[t], seg_before + emit[t], worst_before
            end = np.where(delta[self.last] >= delta[self.last - 1], self.last, self.last - 1)
            sums[t], worsts[t] = delta[end], np.minimum(worst[end], seg[end])
        return sums, worsts


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--test-data", required=True)
    p.add_argument("--dict", required=True)
    p.add_argument("--variants", nargs="+", default=["0.25:0"], help="alpha:beta pairs")
    p.add_argument("--out-dir", type=Path, required=True)
    args = p.parse_args()
    torch.set_num_threads(2)
    model, payload = load_model(args.checkpoint)
    network, check, meta = inference_network(model, payload, 1.0, args.checkpoint)
    segments = SegmentCheck(meta["labels"])
    tokens = keyword_names(read_dictionary(args.dict))
    fbank_conf = inference_fbank(fbank_conf_of(payload["config"]["dataset_conf"]))
    variants = [tuple(float(x) for x in v.split(":")) for v in args.variants]
    lengths = np.array(segments.lengths)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as files, torch.no_grad():
        outs = {v: files.enter_context(atomic_open(args.out_dir / f"score_a{v[0]:g}_b{v[1]:g}.txt")) for v in variants}
        for item in read_data_list(args.test_data, dictionary=read_dictionary(args.dict)):
            outputs = network(utterance_features(item, fbank_conf)[None])[0][0].double().numpy()
            posteriors = outputs[:, : len(tokens)]
            sums, worsts = segments.segment_scores(np.log(np.maximum(outputs[:, len(tokens) :], PhoneCheck.FLOOR)))
            for (alpha, beta), out in outs.items():
                checked = posteriors.copy()
                checked[:, segments.checked] *= np.exp(alpha * sums / lengths + beta * worsts)
                for k, token in enumerate(tokens):
                    out.write(format_line(item["key"], token, checked[:, k]))
    print(f"scores in {args.out_dir}")


if __name__ == "__main__":
    main()
