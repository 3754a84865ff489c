"""bench/miss_conditions.py: the conditions it replays are the ones the renderer drew."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from kws.synth import augment as aug
from kws.synth import corpus

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("miss_conditions", ROOT / "bench" / "miss_conditions.py")
miss_conditions = importlib.util.module_from_spec(spec)
spec.loader.exec_module(miss_conditions)


def test_replayed_conditions_are_those_of_the_real_render(monkeypatch):
    plan, _ = corpus.plan_corpus("tiny", 666)
    items = [item for item in plan["test"] if item["kind"] != "stream"][:80]  # fillers render alike
    babble = [np.random.default_rng(s).uniform(-0.3, 0.3, 16000).astype(np.float32) for s in range(4)]
    real = {name: getattr(aug, name) for name in ("add_noise", "make_noise", "reverberate")}
    seen = {}

    def recorder(name, argument):
        def record(*args, **kwargs):
            seen.setdefault(name, kwargs.get(argument, args[argument] if isinstance(argument, int) else None))
            return real[name](*args, **kwargs)

        return record

    for name, argument in (("add_noise", 2), ("make_noise", 1), ("reverberate", "rt60")):
        monkeypatch.setattr(aug, name, recorder(name, argument))
    drawn = []
    for index, item in enumerate(items):
        seen.clear()
        speech = np.random.default_rng(index).uniform(-0.3, 0.3, 8000 + 977 * index).astype(np.float32)
        audio, _ = corpus._render_utterance(item, (speech, 16000), True, babble)
        drawn.append((dict(seen), len(audio)))
    monkeypatch.undo()
    for item, (render, length) in zip(items, drawn):
        replay = miss_conditions.replay_conditions(item, length)
        if replay["clean"]:  # a clean utterance gets a faint noise floor (40-60 dB down), not noise
            assert replay["snr_db"] is None and render["add_noise"] >= 40 and "make_noise" not in render
        else:
            assert replay["snr_db"] == render.get("add_noise") and replay["noise"] == render.get("make_noise", "none")
        assert replay["room"] == ("reverberant" if "reverberate" in render else "dry")
    replays = [miss_conditions.replay_conditions(item, n) for item, (_, n) in zip(items, drawn)]
    assert {r["clean"] for r in replays} == {True, False} and {r["room"] for r in replays} == {"dry", "reverberant"}
    assert all(getattr(aug, name) is function for name, function in real.items())  # put back after the replay


@pytest.mark.parametrize(("factor", "value", "label"), [("snr_db", 7.2, "05-10 dB"), ("rate", 130, "125-149")])
def test_buckets_name_their_ranges(factor, value, label):
    assert miss_conditions.bucket(factor, value) == label


def test_threshold_follows_the_negatives_asked_for():
    def point(target, threshold):
        return {"fa_per_hour_target": target, "threshold": threshold}

    keyword = {
        "operating_points": [point(0.5, 0.9), point(1.0, 0.8)],
        "ordinary": {"operating_points": [point(1.0, 0.4)]},
        "at_reference_threshold": {"threshold": 0.55},
    }
    assert miss_conditions.run_threshold(keyword, "every", 1.0, "m.json") == 0.8
    assert miss_conditions.run_threshold(keyword, "ordinary", 1.0, "m.json") == 0.4
    assert miss_conditions.run_threshold(keyword, "exported", 1.0, "m.json") == 0.55
    with pytest.raises(SystemExit, match="m.json: no operating point at 2 FA/h"):
        miss_conditions.run_threshold(keyword, "ordinary", 2.0, "m.json")
    with pytest.raises(SystemExit, match="m.json: no exported threshold"):
        miss_conditions.run_threshold({"operating_points": []}, "exported", 1.0, "m.json")
