"""Rhythm augmentation on the feature batch (kws.time_warp, dataset_conf.time_warp)."""

import numpy as np
import pytest
import torch

from kws.dataset import Featurizer, cv_dataset_conf
from kws.errors import KwsError
from kws.time_warp import TimeWarp, parse_conf, source_positions
from kws.trainer import positive_ends

FBANK = {"num_mel_bins": 40, "frame_shift": 10, "frame_length": 25, "dither": 0.0}


def test_the_warp_is_increasing_and_keeps_both_ends():
    positions = source_positions(100, 3, [1.3, 0.77, 1.0, 1.2], [0.2, 0.5, 0.9])
    assert positions[0] == 0 and positions[-1] == 100
    assert np.all(np.diff(positions) > 0)
    assert not np.allclose(positions, np.arange(101))  # it does move the frames between
    assert np.allclose(source_positions(50, 2, [1.0, 1.0, 1.0], [0.3, 0.6]), np.arange(51))


def test_a_lengthened_segment_takes_more_output_frames():
    """The first of two halves said 1.3x as long (the second 1 / 1.3x): the source's midpoint is reached later."""
    positions = source_positions(100, 1, [1.3, 1 / 1.3], [0.5])
    assert np.interp(50.0, positions, np.arange(101)) > 60


def test_the_anchor_frame_the_tail_and_the_padding_stay_put():
    """Frames are ramps, so an output frame's value is the source time it was read from."""
    ramp = torch.arange(40, dtype=torch.float32)[None, :, None].expand(3, 40, 2).contiguous()
    ramp[2, 30:] = 0  # the third utterance is 30 frames long, then padding
    warp = TimeWarp(parse_conf({"p": 1.0, "stretch": 0.5}), anchors={"pos": 20})
    out = warp(ramp, ["pos", "neg", "short"], [40, 40, 30], np.random.default_rng(1))
    assert out[0, 20, 0] == 20 and torch.equal(out[0, 20:], ramp[0, 20:])  # keyword end and after
    assert not torch.equal(out[0, :20], ramp[0, :20])
    assert out[1, 0, 0] == 0 and out[1, 39, 0] == 39 and not torch.equal(out[1], ramp[1])  # no anchor: whole
    assert out[2, 29, 0] == 29 and torch.all(out[2, 30:] == 0)
    assert torch.all(out[:, 1:, 0][:, :19] >= out[:, :-1, 0][:, :19])  # time runs forwards


def test_only_drawn_utterances_change():
    feats = torch.randn(8, 50, 40)
    warped = TimeWarp(parse_conf({"p": 0.5}))(feats, list("abcdefgh"), [50] * 8, np.random.default_rng(3))
    changed = [not torch.equal(warped[row], feats[row]) for row in range(8)]
    assert any(changed) and not all(changed)
    assert torch.equal(
        TimeWarp(parse_conf({"p": 0.0}))(feats, list("abcdefgh"), [50] * 8, np.random.default_rng(3)), feats
    )


def test_featurizer_warps_training_batches_only_and_reproducibly():
    g = torch.Generator().manual_seed(0)
    samples = (torch.randn(3, 16000, generator=g) * 3000).round().to(torch.int16)
    batch = (["a", "b", "c"], samples, torch.tensor([16000, 12000, 9000]), torch.tensor([0, 1, -1]))
    conf = {"fbank_conf": FBANK, "time_warp": {"p": 1.0}}
    plain = Featurizer({"fbank_conf": FBANK})(batch, epoch=1, index=0)[1]
    warped = [Featurizer(conf, seed=5, anchors={"a": 60})(batch, epoch=e, index=0)[1] for e in (1, 1, 2)]
    assert torch.equal(warped[0], warped[1])  # same seed, epoch and batch: bit-identical
    assert not torch.equal(warped[0], warped[2])  # a new rhythm every epoch
    assert not torch.equal(plain, warped[0])
    assert torch.equal(warped[0][0, 60:], plain[0, 60:])  # the keyword end of "a" stays
    assert "time_warp" not in cv_dataset_conf(conf)
    assert torch.equal(Featurizer(cv_dataset_conf(conf))(batch, epoch=1, index=0)[1], plain)


def test_only_positives_are_anchored_at_their_keyword_end():
    class Listing:
        items = [{"key": "kw", "label": 0}, {"key": "near", "label": -1}, {"key": "real", "label": 1}]

    assert positive_ends(Listing, {"kw": 80, "near": 70}) == {"kw": 80}


@pytest.mark.parametrize(
    "conf, message",
    [
        ({"q": 1}, r"dataset_conf.time_warp.q: unknown key"),
        ({"p": 1.5}, r"dataset_conf.time_warp.p: expected a probability"),
        ({"knots": 2.5}, r"dataset_conf.time_warp.knots: expected a whole number"),
        ({"stretch": 0}, r"dataset_conf.time_warp.stretch: expected a number in \(0, 1\]"),
        ({"stretch": "x"}, r"dataset_conf.time_warp.stretch: expected a number"),
        ("yes", r"dataset_conf.time_warp: expected a mapping"),
    ],
)
def test_bad_settings_name_the_key(conf, message):
    with pytest.raises(KwsError, match=message):
        parse_conf(conf)
    with pytest.raises(KwsError, match=message):
        Featurizer({"fbank_conf": FBANK, "time_warp": conf})
