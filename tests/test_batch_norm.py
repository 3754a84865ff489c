"""training_config.bn_real_frames: BatchNorm statistics over a padded batch's real frames only."""

import copy

import pytest
import torch
from torch import nn

from kws.model import build_model
from kws.model.batch_norm import RealFramesBatchNorm1d, real_frames, use_real_frames

LENGTHS = torch.tensor([10, 6, 3])


def padded_batch(seed, channels=4, lengths=LENGTHS):
    """[B, C, T] with real frames at varied scales and padding of another level (as a constant input
    becomes after the first layers), and the real frames alone as one [1, C, sum(lengths)] sequence."""
    generator = torch.Generator().manual_seed(seed)
    frames = int(lengths.max())
    x = torch.randn(len(lengths), channels, frames, generator=generator) * 3 + 1
    for b, length in enumerate(lengths.tolist()):
        x[b, :, length:] = -7.0
    real = torch.cat([x[b, :, :length] for b, length in enumerate(lengths.tolist())], dim=1)[None]
    return x, real


def real_part(y, lengths=LENGTHS):
    return torch.cat([y[b, :, :length] for b, length in enumerate(lengths.tolist())], dim=1)[None]


def test_training_statistics_are_those_of_the_real_frames_alone():
    """Over two steps, outputs on the real frames, the running statistics and the gradients equal
    nn.BatchNorm1d's over the real frames cut out of the batch and joined (padding left out)."""
    torch.manual_seed(0)
    reference = nn.BatchNorm1d(4)
    with torch.no_grad():
        reference.weight.uniform_(0.5, 2)
        reference.bias.uniform_(-1, 1)
    norm = copy.deepcopy(reference)
    assert use_real_frames(norm) == [norm] and isinstance(norm, RealFramesBatchNorm1d)
    for step in range(2):
        x, real = padded_batch(step)
        x.requires_grad_(True)
        real = real.detach().requires_grad_(True)
        with real_frames([norm], LENGTHS, x.size(2)):
            y = norm(x)
        expected = reference(real)
        torch.testing.assert_close(real_part(y), expected, rtol=1e-5, atol=1e-5)
        probe = torch.randn_like(expected)
        (real_part(y) * probe).sum().backward()
        (expected * probe).sum().backward()
        torch.testing.assert_close(real_part(x.grad), real.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(norm.running_mean, reference.running_mean)
    torch.testing.assert_close(norm.running_var, reference.running_var)
    assert int(norm.num_batches_tracked) == int(reference.num_batches_tracked) == 2
    torch.testing.assert_close(norm.weight.grad, reference.weight.grad)
    torch.testing.assert_close(norm.bias.grad, reference.bias.grad)
    # the padding would have moved them: BatchNorm over the whole padded batch
    plain = nn.BatchNorm1d(4)
    plain(padded_batch(0)[0])
    assert not torch.allclose(plain.running_mean, norm.running_mean, atol=0.1)


def test_without_a_mask_or_in_eval_it_is_batch_norm():
    """Outside a training batch (no mask: validation, scoring, export) and in eval mode it computes what
    nn.BatchNorm1d computes, bit for bit; a mask of only real frames gives BatchNorm's training outputs."""
    x, _ = padded_batch(3)
    reference = nn.BatchNorm1d(4)
    norm = copy.deepcopy(reference)
    use_real_frames(norm)
    assert torch.equal(norm(x), reference(x))
    with real_frames([norm], torch.full((3,), x.size(2)), x.size(2)):
        torch.testing.assert_close(norm(x), reference(x), rtol=1e-5, atol=1e-5)
    assert norm.frame_mask is None  # the mask lives only inside the block
    reference.load_state_dict(norm.state_dict())  # the running statistics of the masked step
    norm.eval(), reference.eval()
    with real_frames([norm], LENGTHS, x.size(2)):
        assert torch.equal(norm(x), reference(x))
    with pytest.raises(ValueError, match="does not fit"):
        norm.train()
        with real_frames([norm], LENGTHS, x.size(2) + 1):
            norm(x)


def test_the_swapped_model_saves_and_loads_as_the_model_build_model_makes():
    """use_real_frames swaps every BatchNorm of a model in place (MDTC's and the DS-TCN's), with the same
    parameter objects; its state dict loads into a freshly built model, which evaluates alike."""
    for backbone in ({"type": "tcn", "ds": True, "num_layers": 2, "kernel_size": 3}, {"type": "mdtc", "num_stack": 1}):
        conf = {"hidden_dim": 8, "preprocessing": {"type": "linear"}, "backbone": backbone}
        torch.manual_seed(0)
        model = build_model(conf, 5, 2)
        params = list(model.parameters())
        norms = use_real_frames(model)
        assert norms and all(type(m) is RealFramesBatchNorm1d for m in norms)
        assert not any(type(m) is nn.BatchNorm1d for m in model.modules())
        assert list(model.parameters()) == params
        feats = torch.randn(3, 10, 5)
        with real_frames(norms, LENGTHS, 10):
            model(feats)[0].sum().backward()
        fresh = build_model(conf, 5, 2)
        fresh.load_state_dict(model.state_dict())
        model.eval(), fresh.eval()
        assert torch.equal(model(feats)[0], fresh(feats)[0])


def test_bf16_autocast_keeps_the_input_dtype_and_fp32_statistics():
    x, _ = padded_batch(4)
    norm = nn.BatchNorm1d(4)
    use_real_frames(norm)
    with real_frames([norm], LENGTHS, x.size(2)):
        y = norm(x.to(torch.bfloat16))
    assert y.dtype == torch.bfloat16 and norm.running_mean.dtype == torch.float32
    assert torch.isfinite(norm.running_var).all()


def test_the_written_out_gradient_is_the_derivative():
    """The backward of the masked normalisation, for any output gradient (padded frames' too), equals the
    numerical derivative (float64 gradcheck) with respect to the input, the scale and the shift."""
    from kws.model.batch_norm import _RealFramesNorm

    torch.manual_seed(0)
    x = torch.randn(3, 2, 5, dtype=torch.float64, requires_grad=True)
    mask = (torch.arange(5)[None, :] < torch.tensor([5, 3, 2])[:, None]).double()
    weight = torch.rand(2, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda *a: _RealFramesNorm.apply(a[0], mask, a[1], a[2], 1e-5)[0], (x, weight, bias)
    )
