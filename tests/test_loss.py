"""kws.loss: the vectorised losses against a plain per-utterance loop (values and gradients).

The loops state kwsflow's rule, which is not WeKws's for target utterances no longer than min_duration
(see test_wekws_rule_differs_only_for_short_target_utterances and README.md, "Differences from WeKws").
"""

import math
import re
from pathlib import Path

import pytest
import torch

from kws.errors import KwsError
from kws.loss import criterion, cross_entropy_loss, max_pooling_loss, prefix_negative_loss

torch.set_num_threads(1)


def reference_max_pooling(logits, lengths, targets, min_duration=0):
    """kwsflow's max-pooling loss as a loop over utterances and keywords, on probabilities.

    WeKws's sum of -log(max p) for the target keyword and -log(min (1 - p)) for the others, but with
    kwsflow's window: frames from min_duration on, or all frames when the utterance is no longer than
    min_duration (WeKws then masks every frame, see wekws_max_pooling); no clamping; kwsflow's accuracy
    (the target fires, >= 0.5, and no other keyword does).
    """
    probs = torch.sigmoid(logits)
    batch, _, num_keywords = logits.shape
    loss = 0.0
    correct = 0
    for i in range(batch):
        length = int(lengths[i])
        target = int(targets[i])
        start = min_duration if length > min_duration else 0
        fired = []
        for k in range(num_keywords):
            if k == target:
                p = probs[i, start:length, k].max()
                loss = loss - torch.log(p)
            else:
                p = probs[i, :length, k].max()
                loss = loss - torch.log((1 - probs[i, :length, k]).min())
            fired.append(bool(p >= 0.5))
        ok = all(f == (k == target) for k, f in enumerate(fired))
        correct += int(ok)
    return loss / batch, correct / batch


def reference_cross_entropy(logits, lengths, targets, min_duration=0):
    """kwsflow's utterance-level cross entropy as a loop (its own criterion; WeKws's `ce` is frame-level)."""
    batch, _, num_keywords = logits.shape
    loss = 0.0
    correct = 0
    for i in range(batch):
        length = int(lengths[i])
        target = int(targets[i])
        start = min_duration if length > min_duration else 0
        scores = []
        for k in range(num_keywords):
            frames = logits[i, start:length, k] if k == target else logits[i, :length, k]
            scores.append(frames.max())
        scores.append(torch.zeros((), dtype=logits.dtype))
        scores = torch.stack(scores)
        cls = num_keywords if target < 0 else target
        loss = loss - torch.log_softmax(scores, dim=0)[cls]
        correct += int(int(scores.argmax()) == cls)
    return loss / batch, correct / batch


def random_batch(batch, frames, num_keywords, seed, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, frames, num_keywords, generator=g, dtype=torch.float64) * scale - 1.0
    lengths = torch.randint(1, frames + 1, (batch,), generator=g)
    lengths[0] = frames
    lengths[1] = 3  # short: at most min_duration for most cases below
    targets = torch.randint(-1, num_keywords, (batch,), generator=g)
    targets[0], targets[1] = 0, num_keywords - 1
    targets[2] = -1
    return logits, lengths, targets


CASES = [(k, md, seed) for k in (2, 20) for md in (0, 5, 30) for seed in (0, 1)]


@pytest.mark.parametrize(
    "loss_fn, reference",
    [
        (max_pooling_loss, reference_max_pooling),
        (cross_entropy_loss, reference_cross_entropy),
    ],
)
@pytest.mark.parametrize("num_keywords, min_duration, seed", CASES)
def test_matches_loop_reference(loss_fn, reference, num_keywords, min_duration, seed):
    logits, lengths, targets = random_batch(12, 40, num_keywords, seed)
    a = logits.clone().requires_grad_(True)
    b = logits.clone().requires_grad_(True)
    loss, acc = loss_fn(a, lengths, targets, min_duration=min_duration)
    ref_loss, ref_acc = reference(b, lengths, targets, min_duration=min_duration)
    loss.backward()
    ref_loss.backward()
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-10, abs=1e-10)
    assert float(acc) == pytest.approx(ref_acc)
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-9, atol=1e-12)


def test_float32_matches_float64():
    logits, lengths, targets = random_batch(8, 30, 20, seed=5)
    loss64, _ = max_pooling_loss(logits, lengths, targets, min_duration=4)
    loss32, _ = max_pooling_loss(logits.float(), lengths, targets, min_duration=4)
    assert loss32.dtype == torch.float32
    assert loss32.item() == pytest.approx(loss64.item(), rel=1e-5)


def test_padding_frames_are_ignored():
    logits, lengths, targets = random_batch(6, 20, 2, seed=3)
    lengths = torch.tensor([20, 3, 10, 15, 7, 1])
    padded = logits.clone()
    for i, n in enumerate(lengths.tolist()):
        padded[i, n:] = 100.0  # huge logits in the padding must not count
    for fn in (max_pooling_loss, cross_entropy_loss):
        torch.testing.assert_close(fn(padded, lengths, targets, 5)[0], fn(logits, lengths, targets, 5)[0])


def test_min_duration_window_and_short_utterances():
    logits = torch.full((2, 10, 1), -5.0, dtype=torch.float64)
    logits[:, 1, 0] = 5.0  # the keyword fires early (frame 1) only
    lengths = torch.tensor([10, 4])
    targets = torch.tensor([0, 0])
    # Utterance 0 (10 frames > 5): frame 1 is before min_duration -> miss; utterance 1 (4 <= 5): all frames.
    loss, acc = max_pooling_loss(logits, lengths, targets, min_duration=5)
    expected = (math.log1p(math.exp(5.0)) + math.log1p(math.exp(-5.0))) / 2
    assert loss.item() == pytest.approx(expected)
    assert float(acc) == 0.5


@pytest.mark.parametrize("num_keywords", [2, 9])  # the vectorised path and the CPU autograd node
def test_per_utterance_window_start_is_each_rows_own_min_duration(num_keywords):
    """train's end anchor: a [B] min_duration gives each utterance the loss it has with its own number."""
    generator = torch.Generator().manual_seed(4)
    logits = torch.randn(4, 30, num_keywords, generator=generator, dtype=torch.float64, requires_grad=True)
    lengths = torch.tensor([30, 25, 12, 30])
    targets = torch.tensor([0, 1, 0, -1])
    floors = torch.tensor([20, 5, 15, 0])  # row 2: 12 frames <= 15, so all of them (WeKws)
    loss, _ = max_pooling_loss(logits, lengths, targets, floors)
    (grad,) = torch.autograd.grad(loss, logits)
    rows = [
        max_pooling_loss(logits[i : i + 1], lengths[i : i + 1], targets[i : i + 1], int(floors[i]))[0] for i in range(4)
    ]
    assert loss.item() == pytest.approx(sum(r.item() for r in rows) / 4)
    (row_grad,) = torch.autograd.grad(sum(rows) / 4, logits)
    assert torch.allclose(grad, row_grad)
    late = torch.full((1, 30, 1), -5.0, dtype=torch.float64)
    late[0, 8, 0] = 5.0  # fires at frame 8 only: counts from floor 5, not from floor 20
    assert max_pooling_loss(late, [30], [0], torch.tensor([5]))[1] == 1.0
    assert max_pooling_loss(late, [30], [0], torch.tensor([20]))[1] == 0.0
    # window_end: frames from it on do not count for the target (an empty window keeps its first frame)
    assert max_pooling_loss(late, [30], [0], torch.tensor([5]), torch.tensor([9]))[1] == 1.0
    assert max_pooling_loss(late, [30], [0], torch.tensor([5]), torch.tensor([8]))[1] == 0.0
    assert max_pooling_loss(late, [30], [0], torch.tensor([8]), torch.tensor([3]))[1] == 1.0
    windows = torch.tensor([25, 25, 12, 30])
    loss, _ = max_pooling_loss(logits, lengths, targets, floors, windows)
    rows = [
        max_pooling_loss(
            logits[i : i + 1], lengths[i : i + 1], targets[i : i + 1], floors[i : i + 1], windows[i : i + 1]
        )[0]
        for i in range(4)
    ]
    assert loss.item() == pytest.approx(sum(r.item() for r in rows) / 4)
    truncated = max_pooling_loss(logits[:1, :25], lengths[:1].clamp(max=25), targets[:1], 20)[0]
    assert rows[0].item() == pytest.approx(truncated.item())  # stopping at frame 25 = an utterance of 25


def wekws_max_pooling(logits, lengths, targets, min_duration=0):
    """WeKws HEAD's max-pooling loss (wekws/model/loss.py) restated: for the target keyword the first
    min_duration frames are masked whatever the utterance's length, and probabilities are clamped to
    [1e-8, 1] before the log."""
    probs = torch.sigmoid(logits)
    loss = 0.0
    for i in range(logits.shape[0]):
        length, target = int(lengths[i]), int(targets[i])
        for k in range(logits.shape[2]):
            if k == target:
                window = probs[i, min_duration:length, k]
                best = window.max() if window.numel() else torch.zeros((), dtype=probs.dtype)
                loss = loss - torch.log(best.clamp(1e-8, 1.0))
            else:
                loss = loss - torch.log((1 - probs[i, :length, k]).min().clamp(1e-8, 1.0))
    return loss / logits.shape[0]


def test_wekws_rule_differs_only_for_short_target_utterances():
    """Longer utterances and fillers: the same loss. A keyword utterance of <= min_duration frames: WeKws's
    window is empty, its target term the constant -log(1e-8) (no gradient); kwsflow uses all its frames."""
    min_duration = 5
    logits, lengths, targets = random_batch(12, 20, 2, seed=4, scale=1.0)
    lengths[:6] = torch.tensor([3, 5, 4, 2, 6, 20])
    targets[:6] = torch.tensor([0, 1, -1, -1, 0, 1])
    for i in range(12):
        one = (logits[i : i + 1], lengths[i : i + 1], targets[i : i + 1])
        ours = max_pooling_loss(*one, min_duration=min_duration)[0].item()
        theirs = wekws_max_pooling(*one, min_duration=min_duration).item()
        if targets[i] >= 0 and lengths[i] <= min_duration:
            other = 1 - int(targets[i])
            filler_term = -torch.log(1 - torch.sigmoid(logits[i, : lengths[i], other]).max()).item()
            assert theirs == pytest.approx(-math.log(1e-8) + filler_term)
            assert ours == pytest.approx(reference_max_pooling(*one, min_duration=min_duration)[0].item())
            assert ours < theirs - 10
        else:
            assert ours == pytest.approx(theirs, rel=1e-12)


def test_readme_lists_each_difference_from_wekws_loss_and_cv():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = re.search(r"^#+ Differences from WeKws\n(.*?)(?=^#)", readme, re.S | re.M)
    assert section, "README.md has no 'Differences from WeKws' section"
    text = section.group(1).lower()
    for what in ("short keyword utterances", "-log(1e-8)", "clamp", "accuracy", "cv `min_duration`"):
        assert what in text, what


def test_extreme_logits_stay_finite():
    logits = torch.tensor(
        [[[200.0, -200.0], [-200.0, 200.0]], [[-300.0, -300.0], [-300.0, -300.0]]], requires_grad=True
    )
    loss, acc = max_pooling_loss(logits, torch.tensor([2, 2]), torch.tensor([0, -1]))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logits.grad).all()
    # Utterance 0: keyword 0 right (-log sigmoid(200) ~ 0) but keyword 1 fires too (~200 nats).
    assert loss.item() == pytest.approx(100.0, rel=1e-6)
    assert float(acc) == 0.5
    loss, _ = cross_entropy_loss(logits, torch.tensor([2, 2]), torch.tensor([0, -1]))
    assert torch.isfinite(loss)


def test_perfect_predictions_have_near_zero_loss_and_full_accuracy():
    logits = torch.full((3, 8, 2), -20.0)
    logits[0, 6, 0] = 20.0
    logits[1, 7, 1] = 20.0
    loss, acc = max_pooling_loss(logits, torch.tensor([8, 8, 8]), torch.tensor([0, 1, -1]), min_duration=2)
    assert loss.item() < 1e-6 and float(acc) == 1.0
    loss, acc = cross_entropy_loss(logits, torch.tensor([8, 8, 8]), torch.tensor([0, 1, -1]), min_duration=2)
    assert loss.item() < 1e-6 and float(acc) == 1.0


def test_lengths_beyond_the_batch_are_clamped():
    logits, _, targets = random_batch(4, 10, 2, seed=2)
    a, _ = max_pooling_loss(logits, torch.tensor([50, 10, 10, 10]), targets)
    b, _ = max_pooling_loss(logits, torch.tensor([10, 10, 10, 10]), targets)
    torch.testing.assert_close(a, b)


def test_out_of_range_target_is_a_user_error():
    logits = torch.zeros(2, 5, 2)
    with pytest.raises(KwsError, match="keyword id"):
        max_pooling_loss(logits, torch.tensor([5, 5]), torch.tensor([0, 2]))
    with pytest.raises(KwsError, match="keyword id"):
        cross_entropy_loss(logits, torch.tensor([5, 5]), torch.tensor([-2, 0]))


def test_criterion_lookup():
    assert criterion("max_pooling") is max_pooling_loss
    assert criterion("ce") is cross_entropy_loss
    assert criterion("cross_entropy") is cross_entropy_loss
    with pytest.raises(KwsError, match="training_config.criterion"):
        criterion("ctc")


def test_many_keywords_is_fast():
    import time

    logits = torch.randn(256, 200, 100, requires_grad=True)
    lengths = torch.randint(50, 201, (256,))
    targets = torch.randint(-1, 100, (256,))
    start = time.perf_counter()
    loss, _ = max_pooling_loss(logits, lengths, targets, min_duration=50)
    loss.backward()
    assert time.perf_counter() - start < 5.0


def test_prefix_negative_loss_is_each_positives_keyword_as_a_negative_before_its_prefix_end():
    """training_config.prefix_negatives: per positive with prefix_end > 0, -log(1 - max p) of its own
    keyword over frames [0, prefix_end) (clamped to the batch's frames), summed over the batch and divided
    by its size; fillers and positives without a prefix add nothing; the gradient reaches only the max."""
    generator = torch.Generator().manual_seed(7)
    logits = torch.randn(4, 12, 3, generator=generator, dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([0, 2, -1, 1])
    prefix_end = torch.tensor([5, 40, 6, 0])  # row 1 beyond the frames; row 2 a filler; row 3 no prefix
    loss = prefix_negative_loss(logits, targets, prefix_end)
    expected = sum(-torch.log1p(-torch.sigmoid(logits[b, :end, targets[b]]).max()) for b, end in ((0, 5), (1, 12))) / 4
    assert loss.item() == pytest.approx(expected.item(), rel=1e-12)
    loss.backward()
    touched = logits.grad.nonzero().tolist()
    assert [(b, k) for b, _, k in touched] == [(0, 0), (1, 2)]
    assert touched[0][1] == int(logits[0, :5, 0].argmax()) and touched[1][1] == int(logits[1, :, 2].argmax())

    none = prefix_negative_loss(logits, torch.tensor([-1, -1, 0, 1]), torch.tensor([5, 5, 0, -3]))
    assert none.item() == 0.0 and none.requires_grad


@pytest.mark.parametrize(
    "loss_fn, reference",
    [(max_pooling_loss, reference_max_pooling), (cross_entropy_loss, reference_cross_entropy)],
)
def test_weights_scale_each_utterances_term(loss_fn, reference, num_keywords=3):
    """training_config.confusable_weight: with per-utterance weights the loss is the sum of each
    utterance's own loss times its weight, over the batch size (the reference, one row at a time); a
    weight of 0 leaves that utterance out of the gradient; all ones are the unweighted loss; acc ignores
    the weights."""
    logits, lengths, targets = random_batch(6, 25, num_keywords, seed=3)
    weights = torch.tensor([1.0, 0.25, 0.0, 1.0, 0.5, 1.0], dtype=torch.float64)
    a = logits.clone().requires_grad_(True)
    loss, acc = loss_fn(a, lengths, targets, min_duration=5, weights=weights)
    rows = [reference(logits[i : i + 1], lengths[i : i + 1], targets[i : i + 1], min_duration=5)[0] for i in range(6)]
    assert loss.item() == pytest.approx(float(sum(w * r for w, r in zip(weights, rows)) / 6), rel=1e-10)
    assert float(acc) == pytest.approx(float(reference(logits, lengths, targets, min_duration=5)[1]))
    loss.backward()
    assert not a.grad[2].any() and a.grad[1].abs().sum() > 0
    ones, _ = loss_fn(logits, lengths, targets, min_duration=5, weights=torch.ones(6))
    assert ones.item() == pytest.approx(loss_fn(logits, lengths, targets, min_duration=5)[0].item(), rel=1e-12)
