"""Phoneme supervision (training_config.phone_ctc): the corpus's utt2phones, data.list's phones, the CTC
loss and head beside the keyword loss, and what checkpoints, resume and DDP make of it."""

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers_train import (
    assert_training_head_shaped_the_model_and_resumes,
    head_test_corpus,
    torchrun_argv,
    train_argv,
    train_one_thread,
    write_config,
)
from kws import checkpoint as ckpt
from kws.detect import Detector
from kws.errors import KwsError
from kws.phone_check import PhoneCheck, keyword_path_scores
from kws.phones import PhoneCTCModel, phone_ctc_loss, phone_targets, phone_vocabulary
from kws.runners import load_exported
from kws.synth.phrases import phone_string

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
# what the tiny corpus's utterances "say": keyword 0, keyword 1, filler (helpers_train.make_split)
PHONES = {0: "h eI k eI", 1: "n i h Au", -1: "s @ m T I N"}


def test_phone_string_keeps_phonemes_only():
    """Stress marks, tone digits, eSpeak's language switches and bare length marks are not phonemes."""
    words = [["X", "'ai55"], ["S;", "j", "'Au214"], ["(en)", "b", "'A:", ":"], ["k", "'A:", "(cmn)"]]
    assert phone_string(words) == "X ai S; j Au b A: k A:"


def test_phoneme_input_is_split_by_the_inventory():
    from kws.synth.phrases import phoneme_input_string

    inventory = {"h", "eI", "k", "E", "s", "@", "b", "L", "@L", "j", "u:", "d"}
    assert phoneme_input_string("[[h'eI k,eId,@b@Lj,u:'Es]]", inventory) == "h eI k eI d @ b @L j u: E s"


def test_the_default_corpus_plan_reads_every_utterance_but_streams():
    """eSpeak's phonemes for every planned utterance's text; a keyword's phonemes start each positive."""
    from kws.synth.corpus import plan_corpus, utterance_phones

    plan, _ = plan_corpus("tiny", 666)
    phones = utterance_phones(plan)
    items = [item for items in plan.values() for item in items]
    assert {i["key"] for i in items if i["kind"] != "stream"} == set(phones)
    assert all(phones.values())
    # in Hanzi or pinyin, with or without pauses and a command after it, a keyword reads the same
    keywords = {"<HI_XIAOWEN>": "X ai S; j Au w u@ n", "<NIHAO_WENWEN>": "n i X Au w u@ n w u@ n"}
    positives = [i for i in items if i["token"] in keywords]
    assert positives and all(phones[i["key"]].startswith(keywords[i["token"]]) for i in positives)


def test_utt2phones_reaches_data_list(tmp_path):
    from conftest import write_tiny_corpus
    from kws.datalist import read_data_list, write_data_list
    from kws.lists import check_split

    write_tiny_corpus(tmp_path)
    split = tmp_path / "train"
    keys = [line.split()[0] for line in (split / "wav.scp").read_text().splitlines()]
    (split / "utt2phones").write_text(f"{keys[0]} h  eI k\n")
    items = check_split(split, tmp_path / "dict" / "words.txt")
    assert items[0]["phones"] == "h eI k" and all("phones" not in item for item in items[1:])
    write_data_list(tmp_path / "data.list", items)
    assert read_data_list(tmp_path / "data.list")[0]["phones"] == "h eI k"

    (split / "utt2phones").write_text("nobody h eI\n")
    with pytest.raises(KwsError, match=r"utt2phones:1: 'nobody' is not a key"):
        check_split(split, tmp_path / "dict" / "words.txt")
    bad = tmp_path / "bad.list"
    bad.write_text(json.dumps({"key": "a", "txt": 0, "duration": 1.0, "wav": "a.wav", "phones": ["h"]}) + "\n")
    with pytest.raises(KwsError, match=r"bad.list:1: phones must be a string"):
        read_data_list(bad)


def test_targets_skip_cropped_and_unknown():
    items = [
        {"key": "a", "phones": "h eI k"},
        {"key": "b", "phones": "k eI"},
        {"key": "c"},
        {"key": "d", "phones": "x"},
    ]
    vocabulary = phone_vocabulary(items[:3])
    assert vocabulary == ["eI", "h", "k"]
    targets = phone_targets(items, vocabulary, skip={"b"})
    assert set(targets) == {"a"} and targets["a"].tolist() == [2, 1, 3]


def test_ctc_head_learns_and_a_batch_without_targets_still_reaches_it():
    from kws.model import build_model

    torch.manual_seed(0)
    conf = {
        "hidden_dim": 8,
        "preprocessing": {"type": "linear"},
        "backbone": {"type": "tcn", "ds": True, "num_layers": 2, "kernel_size": 3},
    }
    model = PhoneCTCModel(build_model(conf, 4, 1, None), 3)
    feats = torch.randn(2, 30, 4)
    model.eval()
    logits, phone_logits = model(feats)
    assert torch.equal(logits, model.model(feats)[0])  # the keyword output is the KWSModel's own
    assert phone_logits.shape == (2, 30, 4)
    model.train()
    targets = {"a": torch.tensor([1, 2, 3]), "b": torch.tensor([3, 3])}
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    losses = []
    for _ in range(30):
        loss = phone_ctc_loss(model(feats)[1], [30, 20], ["a", "b"], targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    model.zero_grad()
    none = phone_ctc_loss(model(feats)[1], [30, 20], ["x", "y"], targets)
    none.backward()
    assert none.item() == 0.0 and model.phone_head.weight.grad is not None
    # utterances in `skip` (dataset_conf.mel_warp.phone_ctc: false skips the warped ones) do not count
    phone_logits = model(feats)[1]
    only_b = phone_ctc_loss(phone_logits, [30, 20], ["a", "b"], targets, torch.tensor([True, False]))
    assert torch.allclose(only_b, phone_ctc_loss(phone_logits[1:], [20], ["b"], targets))
    skip_all = phone_ctc_loss(phone_logits, [30, 20], ["a", "b"], targets, torch.tensor([True, True]))
    assert skip_all.item() == 0.0


@pytest.fixture(scope="module")
def phone_corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("phones")
    return head_test_corpus(root, lambda item, _: {"phones": PHONES[item["txt"]]})


train = train_one_thread


def test_phone_ctc_trains_a_plain_model_and_resumes_exactly(phone_corpus):
    """The head trains beside the model and is checkpointed apart from it: load_model and averaging see
    the plain KWSModel; a run resumed from epoch 1 ends bit-identical, head and all."""
    root, corpus, config, _ = phone_corpus
    on = ["--override", "training_config.phone_ctc=0.5"]
    payload = assert_training_head_shaped_the_model_and_resumes(train, corpus, config, root, on, "phone_head")
    assert payload["phones"] == ["@", "Au", "I", "N", "T", "eI", "h", "i", "k", "m", "n", "s"]
    assert payload["phone_head"]["weight"].shape == (13, 12)


def test_phone_ctc_without_phones_trains_as_before(phone_corpus, caplog):
    """A list without phones (a real corpus): a warning, and the very model of a run without phone_ctc."""
    root, _, config, plain = phone_corpus
    assert train(plain, config, root / "plain_off", "--max_epoch", "1") == 0
    assert train(plain, config, root / "plain_on", "--max_epoch", "1", "--override", "training_config.phone_ctc=1") == 0
    assert "no utterance of the training list has `phones`" in caplog.text
    on = torch.load(root / "plain_on" / "epoch_001.pt", weights_only=True)
    off = torch.load(root / "plain_off" / "epoch_001.pt", weights_only=True)
    assert "phone_head" not in on and all(torch.equal(on["model"][k], off["model"][k]) for k in off["model"])
    with pytest.raises(KwsError, match="training_config.phone_ctc must be a weight"):
        train(plain, config, root / "bad", "--override", "training_config.phone_ctc=-1")


def test_phone_ctc_under_ddp_with_uneven_shards(phone_corpus):
    """Two gloo processes, 4 and 3 batches: the rank without a batch still gives the head a gradient."""
    root, corpus, _, _ = phone_corpus
    config = write_config(
        root / "ddp.yaml", {"dataset_conf.batch_conf.batch_size": 2, "training_config.phone_ctc": 0.5}
    )
    argv = train_argv(corpus, config, root / "ddp", "--threads", "2", "--max_epoch", "1", "--timeout", "120")
    result = subprocess.run(
        [*torchrun_argv(2), str(REPO / "scripts" / "train.py"), *argv, "--ddp.dist_backend", "gloo"],
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    payload = torch.load(root / "ddp" / "epoch_001.pt", weights_only=True)
    assert "phone_head" in payload and not any(k.startswith("module.") for k in payload["phone_head"])


def head_saying(classes, num_classes=6, sure=0.9):
    """log-probs of a head that says `classes` (0: blank) frame by frame, `sure` on each."""
    probs = np.full((len(classes), num_classes), (1 - sure) / (num_classes - 1))
    probs[np.arange(len(classes)), classes] = sure
    return np.log(probs)


def relative_to_best(log_probs):
    """What PhoneOutputs gives the check: each class's probability relative to the frame's best."""
    return np.exp(log_probs - log_probs.max(axis=1, keepdims=True))


def test_keyword_path_scores_reward_the_keyword_said_and_nothing_else():
    """The phoneme head's check of a keyword (kws.phone_check.keyword_path_scores): 0 at the frame where the
    head has just said the keyword's phonemes in order, below 0 where a phoneme is missing or swapped, and
    causal (a frame's score never reads later frames)."""

    keyword = [1, 2, 2, 3]  # a repeated phoneme needs a blank between its two frames
    said = head_saying([0, 1, 1, 0, 2, 0, 2, 3, 0, 0])
    scores = keyword_path_scores(said, keyword)
    assert scores[7] == pytest.approx(0.0) and scores[8] == pytest.approx(0.0)  # at its last phoneme, then blank
    assert np.all(scores[:7] < -1.0)  # before the keyword is complete
    missing_last = keyword_path_scores(head_saying([0, 1, 0, 2, 0, 2, 0, 0]), keyword)
    swapped = keyword_path_scores(head_saying([0, 1, 0, 2, 0, 2, 4, 0]), keyword)
    assert missing_last.max() < -1.0 and swapped.max() < -1.0
    longer = np.concatenate([said, head_saying([4, 5, 4])])
    assert np.array_equal(keyword_path_scores(longer, keyword)[: len(said)], scores)  # causal


def test_path_scores_are_the_best_ctc_path_ending_at_each_frame():
    """PhoneCheck.path_scores equals the dynamic programme written out state by state, to the last bit, for
    several keywords at once: the CTC topology (stay, advance one state, skip the blank between two different
    phonemes, never between a repeated one), a path starting on the first blank or phoneme at any frame and
    ending on the last phoneme or the blank after it. A check without phonemes scores no keyword."""
    rng = np.random.default_rng(3)
    frames, classes = 40, 6
    relative = rng.dirichlet(np.full(classes, 0.3), size=frames)
    relative_log = np.log(relative / relative.max(axis=1, keepdims=True))
    labels = [[1, 2, 2, 3], [4, 5], [3]]
    check = PhoneCheck(labels, 0.5)
    scores, _ = check.path_scores(relative_log, check.init_state()[0])
    for k, label in enumerate(labels):
        topology = [0] + [state for phoneme in label for state in (phoneme, 0)]
        before, expected = [-np.inf] * len(topology), []
        for t in range(frames):
            now = []
            for s, state in enumerate(topology):
                candidates = [before[s]] + ([before[s - 1]] if s >= 1 else []) + ([0.0] if s < 2 else [])
                if s >= 2 and state != 0 and state != topology[s - 2]:
                    candidates.append(before[s - 2])
                now.append(max(candidates) + relative_log[t, state])
            before = now
            expected.append(max(now[-1], now[-2]))
        assert scores[:, k].tolist() == expected, f"keyword {k}"
    unchecked = PhoneCheck([None, []], 0.5)
    assert unchecked.path_scores(relative_log, unchecked.init_state()[0])[0].shape == (frames, 0)


def test_phone_check_streams_exactly_and_checks_each_keyword_on_its_own():
    """PhoneCheck over several keywords at once == each keyword alone; chunk by chunk == whole; a keyword
    without phonemes, or alpha 0, passes its posteriors unchanged; checked scores never exceed them."""
    rng = np.random.default_rng(1)
    frames, classes = 80, 7
    relative = rng.dirichlet(np.full(classes, 0.3), size=frames)
    relative /= relative.max(axis=1, keepdims=True)
    posteriors = rng.uniform(size=(frames, 3))
    outputs = np.concatenate([posteriors, relative], axis=1)
    labels = [[1, 2, 2, 3], None, [4, 5]]
    check = PhoneCheck(labels, 0.5)
    whole, _ = check.apply(outputs, check.init_state())
    log_relative = np.log(relative)
    for k in (0, 2):
        alone = np.exp(0.5 * keyword_path_scores(log_relative, labels[k]) / len(labels[k]))
        np.testing.assert_allclose(whole[:, k], posteriors[:, k] * alone, rtol=1e-12)
    assert np.array_equal(whole[:, 1], posteriors[:, 1]) and np.all(whole <= posteriors)
    state, pieces = check.init_state(), []
    for start, stop in ((0, 1), (1, 30), (30, 31), (31, frames)):
        piece, state = check.apply(outputs[start:stop], state)
        pieces.append(piece)
    assert np.array_equal(np.concatenate(pieces), whole)
    off = PhoneCheck(labels, 0.0)
    assert np.array_equal(off.apply(outputs, off.init_state())[0], posteriors)

    # over a window: max p * exp(alpha * max s / |P|), both over the last 7 frames; chunk by chunk == whole
    windowed = PhoneCheck(labels, 0.5, window=7)
    whole, _ = windowed.apply(outputs, windowed.init_state())
    for k in (0, 2):
        s = keyword_path_scores(log_relative, labels[k])
        expected = [
            posteriors[max(0, t - 6) : t + 1, k].max() * np.exp(0.5 * s[max(0, t - 6) : t + 1].max() / len(labels[k]))
            for t in range(frames)
        ]
        np.testing.assert_allclose(whole[:, k], expected, rtol=1e-12)
    assert np.array_equal(whole[:, 1], posteriors[:, 1])
    state, pieces = windowed.init_state(), []
    for start, stop in ((0, 1), (1, 3), (3, 3), (3, 30), (30, frames)):
        piece, state = windowed.apply(outputs[start:stop], state)
        pieces.append(piece)
    assert np.array_equal(np.concatenate(pieces), whole)


def test_a_window_lets_a_keyword_head_that_fires_early_pass_the_check():
    """The keyword head peaks on the phrase's first phonemes, frames before the last one is said: frame by
    frame the check finds no complete path there and holds the keyword down; over a window that spans the
    gap it passes at the peak's score. A phrase never said still gets no path through it."""
    keyword = [1, 2, 3]
    said = head_saying([0, 1, 0, 2, 0, 3, 0, 0, 0, 0])  # the path completes at frame 5
    posteriors = np.zeros((len(said), 1))
    posteriors[2, 0] = 0.9  # the keyword head's peak, three frames early
    outputs = np.concatenate([posteriors, relative_to_best(said)], axis=1)
    frame_by_frame = PhoneCheck([keyword], 1.0)
    assert frame_by_frame.apply(outputs, frame_by_frame.init_state())[0].max() < 0.9 * np.exp(-1.0)
    windowed = PhoneCheck([keyword], 1.0, window=4)
    checked = windowed.apply(outputs, windowed.init_state())[0][:, 0]
    assert checked.max() == pytest.approx(0.9) and checked.argmax() == 5  # when the last phoneme is heard
    unsaid = np.concatenate([posteriors, relative_to_best(head_saying([0, 1, 0, 2, 0, 4, 0, 0, 0, 0]))], axis=1)
    assert windowed.apply(unsaid, windowed.init_state())[0].max() < 0.9 * np.exp(-1.0)
    for bad in (0, 2.5, True):
        with pytest.raises(KwsError, match="score.phone_check_window"):
            PhoneCheck([keyword], 1.0, window=bad)


def _positives_with_keyword_end(path, out):
    """The list with each positive marked as said alone (keyword_end at its last second)."""
    items = [json.loads(line) for line in Path(path).read_text().splitlines()]
    out.write_text(
        "".join(json.dumps({**i, **({"keyword_end": i["duration"]} if i["txt"] >= 0 else {})}) + "\n" for i in items)
    )
    return out


@pytest.fixture(scope="module")
def checked_model(phone_corpus, tmp_path_factory):
    """(folder with avg.pt, corpus with positives said alone, words.txt, the averaged payload): two epochs
    trained with the phoneme head, averaged."""
    from kws.average import average_checkpoints, average_state_dicts

    root, corpus, config, _ = phone_corpus
    folder = tmp_path_factory.mktemp("checked")
    corpus = {
        **corpus,
        "train": _positives_with_keyword_end(corpus["train"], folder / "train.list"),
        "dev": _positives_with_keyword_end(corpus["dev"], folder / "dev.list"),
    }
    on = ["--override", "training_config.phone_ctc=0.5"]
    assert train(corpus, config, folder / "model", "--max_epoch", "2", *on) == 0
    averaged = average_checkpoints(folder / "model", 2, mode="last", out=folder / "avg.pt")
    epochs = [torch.load(folder / "model" / f"epoch_00{e}.pt", weights_only=True) for e in (1, 2)]
    expected_head = average_state_dicts([e["phone_head"] for e in epochs])
    assert all(torch.equal(averaged["phone_head"][k], expected_head[k]) for k in expected_head)
    return folder, corpus, root / "corpus" / "dict" / "words.txt", averaged


def test_phone_check_from_training_to_the_detector(checked_model, tmp_path):
    """Trained with the phoneme head, averaged (the head too), scored with score.phone_check and exported with
    it: score.txt is p * exp(alpha * path score / phonemes) of the averaged head, and the streaming detector
    of either export reads the same checked scores."""
    from kws.detect import wav_chunks
    from kws.export import export_model
    from kws.features import fbank_conf_of, inference_fbank
    from kws.score import score, utterance_features

    folder, corpus, words, averaged = checked_model
    (tmp_path / "avg.pt").symlink_to(folder / "avg.pt")
    assert averaged["keyword_phones"] == [PHONES[0].split(), PHONES[1].split()]

    score(tmp_path / "avg.pt", corpus["dev"], words, tmp_path / "plain.txt")
    score(tmp_path / "avg.pt", corpus["dev"], words, tmp_path / "checked.txt", phone_check=1.0)
    plain = [line.split() for line in (tmp_path / "plain.txt").read_text().splitlines()]
    checked = [line.split() for line in (tmp_path / "checked.txt").read_text().splitlines()]
    assert [row[:2] for row in plain] == [row[:2] for row in checked]
    assert any(row != other for row, other in zip(plain, checked))

    # the same numbers from the training-time model, recomputed here from its parts
    model, payload = ckpt.load_model(tmp_path / "avg.pt")
    wrapped = PhoneCTCModel(model, len(payload["phones"])).eval()
    wrapped.phone_head.load_state_dict(payload["phone_head"])
    classes = {p: i + 1 for i, p in enumerate(payload["phones"])}
    fbank = inference_fbank(fbank_conf_of(payload["config"]["dataset_conf"]))
    first = json.loads(Path(corpus["dev"]).read_text().splitlines()[0])
    with torch.no_grad():
        logits, phone_logits = wrapped(utterance_features(first, fbank)[None])
    log_probs = torch.log_softmax(phone_logits[0], -1).numpy()
    for k, row in enumerate(checked[:2]):
        labels = [classes[p] for p in PHONES[k].split()]
        factor = np.exp(keyword_path_scores(log_probs, labels) / len(labels))
        expected = torch.sigmoid(logits[0, :, k]).numpy() * factor
        np.testing.assert_allclose(np.array(row[2:], dtype=float), expected, atol=2e-6)

    # exported with a window, the detector streams the scores scoring gives with it
    score(tmp_path / "avg.pt", corpus["dev"], words, tmp_path / "windowed.txt", phone_check=1.0, phone_check_window=20)
    windowed = [line.split() for line in (tmp_path / "windowed.txt").read_text().splitlines()]
    assert any(row != other for row, other in zip(checked, windowed))
    export_model(
        tmp_path / "avg.pt",
        words,
        tmp_path / "export",
        corpus["dev"],
        num_utts=3,
        phone_check=1.0,
        phone_check_window=20,
    )
    wav = first["wav"]
    for suffix in ("onnx", "pt"):
        detector = Detector(load_exported(tmp_path / "export" / f"model.{suffix}"), keep_posteriors=True)
        assert detector.meta["phone_check"]["keyword_phones"] == averaged["keyword_phones"]
        assert detector.meta["phone_check"]["window"] == 20
        for chunk in wav_chunks(wav, 1600):
            detector.accept(chunk)
        streamed = detector.posteriors()
        for k, row in enumerate(windowed[:2]):
            np.testing.assert_allclose(streamed[:, k], np.array(row[2:], dtype=float), atol=2e-5)


def _script(name):
    """scripts/<name>.py as a module (its parse_args and main)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"{name}_script", REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _score_script():
    return _script("score")


def test_the_check_chosen_on_dev_is_the_one_scoring_and_the_det_rank_best(checked_model, tmp_path):
    """score.phone_check and score.phone_check_window as lists: each (alpha, window)'s dev FRR is what
    score.py with them and compute_det give at the export's target on ordinary negatives (a near-miss left
    out); the lowest mean over keywords wins, ties to the larger alpha, then the smaller window; score.py
    then takes the written file as --phone-check."""
    from kws.det import compute_det
    from kws.phone_choice import choose_phone_check
    from kws.score import score

    score_script = _score_script()

    folder, corpus, words, _ = checked_model
    items = [json.loads(line) for line in Path(corpus["dev"]).read_text().splitlines()]
    near_miss = next(i for i, item in enumerate(items) if item["txt"] < 0)
    items[near_miss]["kind"] = "near_miss"
    dev = tmp_path / "dev.list"
    dev.write_text("".join(json.dumps(item) + "\n" for item in items))
    candidates, windows = [2.0, 0, 0.5, 8], [30, 1]
    # 1e4 FA/h: a few false alarms in the dev split's seconds, where this barely trained model's alphas differ
    choice = choose_phone_check(
        folder / "avg.pt", dev, words, tmp_path / "phone_check.json", candidates, windows, fa_target=1e4
    )
    assert json.loads((tmp_path / "phone_check.json").read_text()) == choice
    assert choice["candidates"] == [0.0, 0.5, 2.0, 8.0] and choice["windows"] == [1, 30]
    assert choice["negatives"] == "ordinary"
    pairs = [(0.0, 1)] + [(alpha, window) for window in (1, 30) for alpha in (0.5, 2.0, 8.0)]
    assert list(choice["dev_frr"]) == [f"alpha {a:g}" + (f", window {w}" if a else "") for a, w in pairs]
    means = {}
    for alpha, window in pairs:
        scored = tmp_path / f"score_{alpha:g}_{window}.txt"
        score(folder / "avg.pt", dev, words, scored, phone_check=alpha, phone_check_window=window)
        metrics = compute_det(scored, dev, words, tmp_path / f"det_{alpha:g}_{window}", fa_targets=[1e4])
        row = choice["dev_frr"][f"alpha {alpha:g}" + (f", window {window}" if alpha else "")]
        for name, summary in metrics["keywords"].items():
            expected = summary["ordinary"]["operating_points"][0]["frr"]
            assert row[name] == (1.0 if expected is None else expected), (alpha, window, name)
        assert row["mean"] == pytest.approx(np.mean([row[name] for name in metrics["keywords"]]))
        means[alpha, window] = row["mean"]
    assert len(set(means.values())) > 1  # the candidates do differ here
    best = min(means.values())
    assert choice["alpha"] == max(alpha for (alpha, _), mean in means.items() if mean == best)
    assert choice["window"] == min(w for (a, w), mean in means.items() if mean == best and a == choice["alpha"])

    score_script.main(
        ["--checkpoint", str(folder / "avg.pt"), "--test-data", str(dev), "--dict", str(words)]
        + ["--out", str(tmp_path / "chosen.txt"), "--phone-check", str(tmp_path / "phone_check.json")]
    )
    chosen = tmp_path / f"score_{choice['alpha']:g}_{choice['window']}.txt"
    assert (tmp_path / "chosen.txt").read_bytes() == chosen.read_bytes()

    # the command line the workflow runs writes the same choice
    _script("choose_phone_check").main(
        ["--checkpoint", str(folder / "avg.pt"), "--dev-data", str(dev), "--dict", str(words)]
        + ["--candidates", "2", "0", "0.5", "8", "--windows", "30", "1", "--fa-target", "1e4"]
        + ["--out", str(tmp_path / "cli.json")]
    )
    assert json.loads((tmp_path / "cli.json").read_text()) == {**choice, "checkpoint": str(folder / "avg.pt")}


def test_the_lowest_mean_frr_wins_and_ties_go_to_the_larger_alpha_then_the_smaller_window():
    from kws.phone_choice import best_check, check_candidates, window_candidates

    def table(means):
        return {pair: {"mean": mean} for pair, mean in means.items()}

    assert best_check(table({(0.0, 1): 0.5, (0.25, 1): 0.3, (0.5, 1): 0.3, (1.0, 1): 0.4})) == (0.5, 1)
    assert best_check(table({(0.0, 1): 0.2, (0.25, 1): 1 / 3 - 1e-12, (0.5, 1): 1.0})) == (0.0, 1)
    assert best_check(table({(0.0, 1): 0.1 + 0.2, (0.25, 1): 0.3})) == (0.25, 1)  # equal but for rounding
    assert best_check(table({(0.5, 1): 0.3, (0.5, 50): 0.3, (0.5, 100): 0.2, (0.25, 100): 0.2})) == (0.5, 100)
    assert best_check(table({(0.5, 100): 0.3, (0.5, 50): 0.3, (0.25, 1): 0.3})) == (0.5, 50)
    assert check_candidates([0.5, 0, 0.5]) == [0.0, 0.5]
    for bad in ([], [-0.1, 1]):
        with pytest.raises(KwsError, match="score.phone_check: candidates must be numbers >= 0"):
            check_candidates(bad)
    assert window_candidates([50, 1, 50]) == [1, 50]
    for bad in ([], [0, 50]):
        with pytest.raises(KwsError, match="score.phone_check_window"):
            window_candidates(bad)


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "neither a number nor a phone_check.json file"),
        ("{not json", "not a phone_check.json with an `alpha`"),
        ('{"candidates": [0]}', "not a phone_check.json with an `alpha`"),
        ('{"alpha": -1}', "`alpha` must be a number >= 0"),
        ('{"alpha": 0.5, "window": 0}', "`window` must be a whole number >= 1"),
        ('{"alpha": 0.5, "window": 2.5}', "`window` must be a whole number >= 1"),
        ("[0.5]", "not a phone_check.json with an `alpha`"),
    ],
)
def test_a_bad_phone_check_file_is_a_one_line_error(tmp_path, capsys, content, message):
    score_script = _score_script()

    path = tmp_path / "phone_check.json"
    if content is not None:
        path.write_text(content)
    argv = ["--checkpoint", "a.pt", "--test-data", "t.list", "--dict", "w.txt", "--out", str(tmp_path / "s.txt")]
    with pytest.raises(SystemExit) as exit_info:
        score_script.parse_args(argv + ["--phone-check", str(path)])
    assert exit_info.value.code == 2
    assert f"argument --phone-check: {path}: {message}" in capsys.readouterr().err


def test_the_window_comes_from_the_command_line_or_the_chosen_file_not_both(tmp_path, capsys):
    from kws.phone_check import phone_check_setting

    score_script = _score_script()
    argv = ["--checkpoint", "a.pt", "--test-data", "t.list", "--dict", "w.txt", "--out", str(tmp_path / "s.txt")]
    assert phone_check_setting(score_script.parse_args(argv)) == (0.0, 1)
    assert phone_check_setting(score_script.parse_args(argv + ["--phone-check", "0.5"])) == (0.5, 1)
    given = argv + ["--phone-check", "0.5", "--phone-check-window", "50"]
    assert phone_check_setting(score_script.parse_args(given)) == (0.5, 50)
    chosen, before = tmp_path / "phone_check.json", tmp_path / "before_windows.json"
    chosen.write_text('{"alpha": 0.25, "window": 100}')
    before.write_text('{"alpha": 0.25}')  # written before the window: frame by frame
    assert phone_check_setting(score_script.parse_args(argv + ["--phone-check", str(chosen)])) == (0.25, 100)
    assert phone_check_setting(score_script.parse_args(argv + ["--phone-check", str(before)])) == (0.25, 1)
    for extra, message in (
        (["--phone-check", str(chosen), "--phone-check-window", "50"], f"{chosen} already gives the window (100)"),
        (["--phone-check", "0.5", "--phone-check-window", "0"], "score.phone_check_window: frames must be"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            score_script.main(argv + extra)
        error = capsys.readouterr().err
        assert exit_info.value.code == 1 and error.count("\n") == 1 and message in error
    assert not (tmp_path / "s.txt").exists()


def test_phone_check_without_a_head_scores_the_keyword_head_alone(phone_corpus, tmp_path, caplog):
    from kws.phone_choice import choose_phone_check
    from kws.score import score

    root, corpus, config, _ = phone_corpus
    assert train(corpus, config, tmp_path / "model", "--max_epoch", "1") == 0
    words = root / "corpus" / "dict" / "words.txt"
    score(tmp_path / "model" / "epoch_001.pt", corpus["dev"], words, tmp_path / "plain.txt")
    score(tmp_path / "model" / "epoch_001.pt", corpus["dev"], words, tmp_path / "checked.txt", phone_check=0.5)
    assert (tmp_path / "plain.txt").read_bytes() == (tmp_path / "checked.txt").read_bytes()
    assert "no phoneme head" in caplog.text
    choice = choose_phone_check(tmp_path / "model" / "epoch_001.pt", corpus["dev"], words, tmp_path / "c.json", [0, 1])
    assert choice["alpha"] == 0.0 and choice["reason"] == "no phoneme check to weigh"
    with pytest.raises(KwsError, match="score.phone_check must be a number >= 0"):
        score(tmp_path / "model" / "epoch_001.pt", corpus["dev"], words, tmp_path / "bad.txt", phone_check=-1)
    assert not (tmp_path / "bad.txt").exists()
