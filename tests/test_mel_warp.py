"""Speaker augmentation on the feature batch (kws.mel_warp, dataset_conf.mel_warp)."""

import numpy as np
import pytest
import torch

from kws.dataset import Featurizer, cv_dataset_conf
from kws.errors import KwsError
from kws.mel_warp import MelWarp, parse_conf, warp_matrix

FBANK = {"num_mel_bins": 40, "frame_shift": 10, "frame_length": 25, "dither": 0.0}
FLAT = np.array([0.0, 8000.0])


def test_no_warp_is_the_identity_and_every_row_is_a_weighted_mean():
    assert np.allclose(warp_matrix((FLAT, np.array([1.0, 1.0])), 40), np.eye(40))
    knots = np.array([0.0, 500.0, 1500.0, 3000.0, 6000.0, 8000.0])
    matrix = warp_matrix((knots, np.array([1.2, 1.2, 0.85, 1.1, 1.0, 1.0])), 40)
    assert np.allclose(matrix.sum(axis=1), 1.0) and (matrix >= 0).all()


@pytest.mark.parametrize("factor, direction", [(1.15, 1), (0.87, -1)])
def test_a_formant_moves_the_way_the_warp_says(factor, direction):
    """A peak in the envelope (a formant) at bin 12 moves up for factors above 1, down below."""
    peak = np.exp(-0.5 * ((np.arange(40) - 12) / 1.5) ** 2)
    moved = warp_matrix((FLAT, np.array([factor, factor])), 40) @ peak
    centre = float((moved * np.arange(40)).sum() / moved.sum())
    assert direction * (centre - 12) > 0.5


def test_vtl_moves_every_formant_the_same_way():
    """`kind: vtl`: one factor for the whole envelope, so two formants (bins 8 and 20) move together."""
    warp = MelWarp(parse_conf({"p": 1.0, "kind": "vtl", "low": 1.15, "high": 1.15}))
    bins = np.arange(40)
    envelope = np.exp(-0.5 * ((bins - 8) / 1.5) ** 2) + np.exp(-0.5 * ((bins - 20) / 1.5) ** 2)
    feats = torch.tensor(envelope, dtype=torch.float32).expand(1, 5, 40).contiguous()
    moved, rows = warp(feats, np.random.default_rng(0))
    moved = moved[0, 0].numpy()
    assert rows.tolist() == [True]
    for start, stop in ((0, 14), (14, 30)):
        part = moved[start:stop]
        centre = float((part * bins[start:stop]).sum() / part.sum())
        assert centre - (8 if start == 0 else 20) > 0.3


def test_only_drawn_utterances_change_and_padding_stays_zero():
    feats = torch.randn(6, 30, 40)
    feats[:, 20:] = 0
    warped, rows = MelWarp(parse_conf({"p": 0.5}))(feats, np.random.default_rng(3))
    changed = [not torch.equal(warped[row], feats[row]) for row in range(6)]
    assert any(changed) and not all(changed)
    assert rows.tolist() == changed  # what the phoneme loss is told (mel_warp.phone_ctc)
    assert torch.all(warped[:, 20:] == 0)
    unchanged, rows = MelWarp(parse_conf({"p": 0.0}))(feats, np.random.default_rng(3))
    assert torch.equal(unchanged, feats) and not rows.any()


def test_featurizer_warps_training_batches_only_and_reproducibly():
    g = torch.Generator().manual_seed(0)
    samples = (torch.randn(3, 16000, generator=g) * 3000).round().to(torch.int16)
    batch = (["a", "b", "c"], samples, torch.tensor([16000, 12000, 9000]), torch.tensor([0, 1, -1]))
    conf = {"fbank_conf": FBANK, "mel_warp": {"p": 1.0}}
    plain = Featurizer({"fbank_conf": FBANK})(batch, epoch=1, index=0)[1]
    warped = [Featurizer(conf, seed=5)(batch, epoch=e, index=0)[1] for e in (1, 1, 2)]
    assert Featurizer(conf, seed=5)(batch, epoch=1, index=0)[4].tolist() == [True] * 3
    assert not Featurizer({"fbank_conf": FBANK})(batch, epoch=1, index=0)[4].any()
    assert torch.equal(warped[0], warped[1])  # same seed, epoch and batch: bit-identical
    assert not torch.equal(warped[0], warped[2])  # a new speaker every epoch
    assert not torch.equal(plain, warped[0])
    assert "mel_warp" not in cv_dataset_conf(conf)
    assert torch.equal(Featurizer(cv_dataset_conf(conf))(batch, epoch=1, index=0)[1], plain)


@pytest.mark.parametrize(
    "conf, message",
    [
        ({"q": 1}, r"dataset_conf.mel_warp.q: unknown key"),
        ({"p": 1.5}, r"dataset_conf.mel_warp.p: expected a probability"),
        ({"low": 1.2, "high": 0.9}, r"dataset_conf.mel_warp: expected 0.5 <= low <= high <= 2"),
        ({"high": "x"}, r"dataset_conf.mel_warp.high: expected a number"),
        ("yes", r"dataset_conf.mel_warp: expected a mapping"),
        ({"kind": "pitch"}, r"dataset_conf.mel_warp.kind: expected one of formants, vtl"),
        ({"phone_ctc": "no"}, r"dataset_conf.mel_warp.phone_ctc: expected true or false"),
    ],
)
def test_bad_settings_name_the_key(conf, message):
    with pytest.raises(KwsError, match=message):
        parse_conf(conf)
    with pytest.raises(KwsError, match=message):
        Featurizer({"fbank_conf": FBANK, "mel_warp": conf})
