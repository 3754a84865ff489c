#!/usr/bin/env python3
"""Probe (issue 16): does the training-only phoneme CTC head, used as a second-stage check of each
firing, lower FRR at a fixed FA/h? Writes one score.txt per alpha for scripts/compute_det.py.

For a checkpoint with its phoneme head (an epoch checkpoint, or avg.pt with `--head-epochs`: the heads
of those epochs averaged as average_model.py averages the model), every utterance of --test-data gives
keyword posteriors p_k(t) and phoneme log-probabilities y_t(c). Keyword k's phonemes P_k are the most
common `phones` of the training positives said alone (those with a keyword_end). A free-start Viterbi
over the CTC topology of P_k scores, at every frame t, the best path that ends at t (on P_k's last
phoneme or the blank after it), each frame counting log y_t(label) - max_c log y_t(c) (0 when the label
is the head's own best). v_k(t) = exp(score / |P_k|), and the written score is p_k(t) * v_k(t)^alpha
(alpha 0: the model alone). The recursion is causal, so a streaming detector could run it.

    python bench/probe_phone_verify.py --checkpoint results/ds_tcn_small/avg.pt --head-epochs 3 4 5 6 \
        --model-dir results/ds_tcn_small/model --train-data results/data/synthetic/train/data.list \
        --test-data results/data/synthetic/test/data.list --dict results/data/synthetic/dict/words.txt \
        --alphas 0 0.5 1 2 --out-dir /tmp/probe
"""

import argparse
import collections
import contextlib
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kws.average import average_state_dicts  # noqa: E402
from kws.checkpoint import checkpoint_name, load_model, load_payload  # noqa: E402
from kws.datalist import keyword_names, read_data_list, read_dictionary  # noqa: E402
from kws.features import fbank_conf_of, inference_fbank  # noqa: E402
from kws.fileio import atomic_open  # noqa: E402
from kws.phones import PhoneCTCModel, keyword_path_scores  # noqa: E402
from kws.score import format_line, utterance_features  # noqa: E402


def keyword_phones(train_items, tokens):
    """{token: the most common phoneme list of its training positives said alone}."""
    result = {}
    for token in tokens:
        counts = collections.Counter(
            item["phones"]
            for item in train_items
            if item["txt"] == token and item.get("keyword_end") is not None and item.get("phones")
        )
        result[token] = counts.most_common(1)[0][0].split()
    return result


def load_with_head(checkpoint, model_dir, head_epochs):
    model, payload = load_model(checkpoint)
    if head_epochs:
        heads = [load_payload(Path(model_dir) / checkpoint_name(e)) for e in head_epochs]
        phones = heads[0]["phones"]
        state = average_state_dicts([h["phone_head"] for h in heads], [f"epoch {e}" for e in head_epochs])
    else:
        phones, state = payload["phones"], payload["phone_head"]
    wrapped = PhoneCTCModel(model, len(phones))
    wrapped.phone_head.load_state_dict(state)
    return wrapped.eval(), payload, {p: i + 1 for i, p in enumerate(phones)}  # kws.phones: 0 is the blank


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--model-dir", help="epoch checkpoints of --head-epochs")
    p.add_argument("--head-epochs", type=int, nargs="*", default=[])
    p.add_argument("--train-data", required=True)
    p.add_argument("--test-data", required=True)
    p.add_argument("--dict", required=True)
    p.add_argument("--alphas", type=float, nargs="+", default=[0.0, 0.5, 1.0, 2.0])
    p.add_argument("--out-dir", type=Path, required=True)
    args = p.parse_args()
    model, payload, class_of = load_with_head(args.checkpoint, args.model_dir, args.head_epochs)
    dictionary = read_dictionary(args.dict)
    tokens = keyword_names(dictionary)
    phones = keyword_phones(read_data_list(args.train_data, dictionary=dictionary), tokens)
    labels = {token: [class_of[x] for x in phones[token]] for token in tokens}
    fbank_conf = inference_fbank(fbank_conf_of((payload.get("config") or {}).get("dataset_conf") or {}))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as files, torch.no_grad():
        outs = {a: files.enter_context(atomic_open(args.out_dir / f"score_a{a:g}.txt")) for a in args.alphas}
        for item in read_data_list(args.test_data, dictionary=dictionary):
            keyword_logits, phone_logits = model(utterance_features(item, fbank_conf)[None])
            posteriors = torch.sigmoid(keyword_logits)[0].numpy()
            log_probs = torch.log_softmax(phone_logits[0].float(), -1).numpy()
            for k, token in enumerate(tokens):
                check = np.exp(keyword_path_scores(log_probs, labels[token]) / len(labels[token]))
                for alpha, out in outs.items():
                    out.write(format_line(item["key"], token, posteriors[:, k] * check**alpha))
    print(f"keyword phonemes: {phones}; scores in {args.out_dir}")


if __name__ == "__main__":
    main()
