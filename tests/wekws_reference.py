"""What WeKws HEAD (wenet-e2e/wekws 1a8ee65) does when it reads kwsflow's files, written out for the tests.

Not WeKws's code: small re-statements of the field accesses its scripts make, so that a file WeKws would
choke on (a missing key, an int where it calls .upper(), an unknown classifier) fails here the same way.

- `wekws_compute_det`: wekws/bin/compute_det.py (data.list `txt` upper-cased and compared with the
  keyword token; score.txt's second column compared with it too; thresholds 0, step, ... while <= 1.0).
- `wekws_reads_config`: wekws/bin/train.py + score.py + wekws/model/kws_model.py init_model + wenet's
  data pipeline defaults (shuffle, sort and SpecAugment on unless switched off).
"""

import json
from pathlib import Path


def _score_table(score_file, keyword):
    table = {}
    for line in Path(score_file).read_text(encoding="utf8").splitlines():
        fields = line.strip().split()
        if fields[1] == keyword and fields[0] not in table:
            table[fields[0]] = [float(x) for x in fields[2:]]
    return table


def wekws_compute_det(keyword, data_list, score_file, step=0.01, window_shift=50):
    """The stats file text WeKws HEAD's compute_det.py writes for `keyword` (a token such as <HI_XIAOWEN>)."""
    scores = _score_table(score_file, keyword)
    positives, fillers, filler_seconds = [], [], 0.0
    for line in Path(data_list).read_text(encoding="utf8").splitlines():
        record = json.loads(line.strip())
        assert "key" in record and "txt" in record and "duration" in record
        label = record["txt"].upper()  # what fails on the older integer labels
        assert record["key"] in scores, f"key: {record['key']} not found"
        if label == keyword:
            positives.append(scores[record["key"]])
        else:
            fillers.append(scores[record["key"]])
            filler_seconds += record["duration"]
    lines = []
    threshold = 0.0
    while threshold <= 1.0:  # float accumulation, as WeKws: 100 thresholds for step 0.01
        rejected = sum(1 for s in positives if max(s) < threshold)
        alarms = 0
        for s in fillers:
            i = 0
            while i < len(s):
                if s[i] >= threshold:
                    alarms += 1
                    i += window_shift
                else:
                    i += 1
        frr = rejected / len(positives)
        fa_per_hour = max(alarms, 1e-6) / (filler_seconds / 3600.0)
        lines.append(f"{threshold:.6f} {fa_per_hour:.6f} {frr:.6f}\n")
        threshold += step
    return "".join(lines)


PREPROCESSING = ("linear", "cnn1d_s1", "none")
BACKBONE_KEYS = {  # keys init_model indexes (required) and the ones it reads with a default
    "gru": ({"num_layers"}, {}),
    "tcn": ({"num_layers"}, {"ds": False, "kernel_size": 8, "dropout": 0.1}),
    "mdtc": ({"stack_size", "num_stack", "kernel_size", "hidden_dim", "causal"}, {}),
}
CLASSIFIERS = ("global", "last", "identity")


def wekws_reads_config(config, base=".", written_by_train=False):
    """What WeKws HEAD makes of a config; AssertionError/KeyError where WeKws would fail.

    `written_by_train`: a model_dir/config.yaml, which WeKws's score.py and export scripts read as it is
    (WeKws's train.py adds input_dim/output_dim/cmvn to the config it writes); otherwise a --config for
    train.py, which adds them itself. `base`: the folder relative cmvn paths are read from.
    """
    dataset = config["dataset_conf"]
    feats_type = dataset.get("feats_type", "fbank")
    seen = {"num_mel_bins": dataset[f"{feats_type}_conf"]["num_mel_bins"]}
    assert isinstance(dataset["filter_conf"], dict)  # score.py sets max/min_length in it
    seen["shuffle"] = dataset.get("shuffle", True)
    if seen["shuffle"]:
        seen["shuffle_size"] = dataset.get("shuffle_conf", {})["shuffle_size"]
    seen["sort"] = dataset.get("sort", True)
    if seen["sort"]:
        seen["sort_size"] = dataset.get("sort_conf", {})["sort_size"]
    seen["spec_aug"] = dataset.get("spec_aug", True)
    if seen["spec_aug"]:
        seen["spec_aug_conf"] = dict(dataset.get("spec_aug_conf", {}))
    assert not dataset.get("speed_perturb", False)
    batch = dataset["batch_conf"]
    assert batch.get("batch_type", "static") in ("static", "dynamic")
    if batch.get("batch_type", "static") == "static":
        seen["batch_size"] = batch["batch_size"]

    model = dict(config["model"])
    if not written_by_train:
        model.setdefault("input_dim", seen["num_mel_bins"])
        model["output_dim"] = 2
    seen["cmvn"] = model.get("cmvn", {})
    if seen["cmvn"].get("cmvn_file") is not None:
        assert (Path(base) / seen["cmvn"]["cmvn_file"]).is_file()
        assert isinstance(seen["cmvn"]["norm_var"], bool)
    for key in ("input_dim", "output_dim", "hidden_dim"):
        seen[key] = model[key]
    seen["preprocessing"] = model["preprocessing"]["type"]
    assert seen["preprocessing"] in PREPROCESSING, seen["preprocessing"]
    kind = model["backbone"]["type"]
    required, defaults = BACKBONE_KEYS[kind]
    seen["backbone"] = {"type": kind, **defaults, **{k: model["backbone"][k] for k in required}}
    seen["backbone"].update({k: model["backbone"][k] for k in defaults if k in model["backbone"]})
    if "classifier" in model:
        assert model["classifier"]["type"] in CLASSIFIERS, model["classifier"]["type"]
        seen["classifier"] = (model["classifier"]["type"], model["classifier"]["dropout"])
    else:
        seen["classifier"] = "linear + sigmoid"
    if "activation" in model:
        assert model["activation"]["type"] == "identity"
    seen["lr"] = config["optim_conf"]["lr"]
    seen["max_epoch"] = config["training_config"].get("max_epoch", 100)
    return seen
