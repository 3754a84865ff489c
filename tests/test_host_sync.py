"""No host sync per training step: between log intervals the loop reads nothing back from the tensors it
computes (kws.trainer.EpochSums, optimizer_step), so a GPU is never made to drain its queue for a
loss.item(). On a CPU every tensor is a host tensor, so this counts the reads that would be syncs on a
device: .item()/float()/bool()/int() (aten._local_scalar_dense), .tolist(), nonzero (a data-dependent
shape) and boolean-mask indexing. They must not grow with the number of steps."""

import math

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kws import trainer
from kws.distributed import Dist
from kws.loss import criterion
from kws.model import build_model
from kws.phones import PhoneCTCModel

INPUT_DIM, KEYWORDS, PHONES = 6, 2, 5
MODEL = {"hidden_dim": 8, "preprocessing": {"type": "linear"}, "backbone": {"type": "tcn", "ds": True, "num_layers": 2}}
# The loss's keyword-id range check reads host targets only (a GPU skips it: kws.loss._check)
HOST_ONLY = {("loss.py", "_check")}


class HostReads(TorchDispatchMode):
    """Counts the reads, each with the innermost kws function it came from."""

    READS = {
        torch.ops.aten._local_scalar_dense.default,
        torch.ops.aten.nonzero.default,
        torch.ops.aten.masked_select.default,
    }

    def __init__(self):
        super().__init__()
        self.sources = []

    def record(self):
        import traceback

        frames = [f for f in traceback.extract_stack() if "/kws/" in f.filename]
        self.sources.append((frames[-1].filename.rsplit("/", 1)[1], frames[-1].name) if frames else ("?", "?"))

    def __enter__(self):
        # .tolist() reads the data without going through the dispatcher: wrapped here instead
        self.tolist = torch.Tensor.tolist

        def counted_tolist(tensor):
            self.record()
            return self.tolist(tensor)

        torch.Tensor.tolist = counted_tolist
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist = self.tolist
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        boolean_index = func is torch.ops.aten.index.Tensor and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1]
        )
        if func in self.READS or boolean_index:
            self.record()
        return func(*args, **(kwargs or {}))

    def counted(self):
        return [source for source in self.sources if source not in HOST_ONLY]


def make_batch(index, count=4, frames=30):
    generator = torch.Generator().manual_seed(index)
    keys = [f"u{index}_{i}" for i in range(count)]
    lengths = torch.randint(frames // 2, frames + 1, (count,), generator=generator)
    feats = torch.randn(count, frames, INPUT_DIM, generator=generator)
    return keys, feats, lengths, torch.tensor([0, 1, -1, 0]), torch.zeros(count, dtype=torch.bool)  # none warped


def make_state(log_interval):
    torch.manual_seed(0)
    model = build_model(MODEL, INPUT_DIM, KEYWORDS)
    trained = PhoneCTCModel(model, PHONES)
    keys = [f"u{b}_{i}" for b in range(40) for i in range(4)]
    return trainer.TrainState(
        model=trained,
        bare_model=model,
        optimizer=trainer.make_optimizer(trained, {"lr": 1e-3}, "test"),  # fused Adam, the default
        criterion=criterion("max_pooling"),
        dist=Dist(1, torch.device("cpu"), "gloo"),
        device=torch.device("cpu"),
        input_dim=INPUT_DIM,
        min_duration=3,
        grad_clip=5.0,
        guard=trainer.NonFiniteGuard(5),
        log_interval=log_interval,
        end_anchor=4,
        end_frames={key: 12 for key in keys[::2]},
        prefix_negatives=3,
        phone_ctc=0.5,
        phone_targets={key: torch.tensor([1, 3, 2]) for key in keys[::3]},
        confusable_weight=0.3,
        confusable_keys=frozenset(keys[1::4]),
    )


def reads_in_an_epoch(steps, poison=(), log_interval=1000):
    """Host reads while training `steps` batches (the criterion's loss is NaN on the batches in
    `poison`), and the epoch's statistics."""
    state = make_state(log_interval)
    if poison:
        real = state.criterion

        def sometimes_nan(logits, *args, **kwargs):
            loss, acc = real(logits, *args, **kwargs)
            return (loss * float("nan") if sometimes_nan.calls in poison else loss), acc

        def counting(*args, **kwargs):
            sometimes_nan.calls += 1
            return sometimes_nan(*args, **kwargs)

        sometimes_nan.calls = 0
        state.criterion = counting
    batches = [make_batch(index) for index in range(steps)]
    with HostReads() as reads:
        stats = trainer.train_one_epoch(state, batches, epoch=1, counts=[steps])
    return reads.counted(), stats


def test_host_reads_do_not_grow_with_the_steps():
    few, few_stats = reads_in_an_epoch(6)
    many, many_stats = reads_in_an_epoch(12)
    assert sorted(few) == sorted(many), f"reads per step: {sorted(set(many) - set(few)) or many}"
    assert len(many) <= 3  # the guard's flags and the epoch's sums, once each (and Dist.sum's host values)
    assert few_stats["train_utts"] == 24 and many_stats["train_utts"] == 48
    assert many_stats["skipped_steps"] == 0 and 0 < many_stats["grad_norm"] < 50


def test_a_log_interval_reads_twice_and_skipped_steps_are_still_counted(caplog):
    """Every log interval reads the guard's flags and the logged values, once each; the guard sees every
    step's flag: NaN losses on two steps are two skipped steps, with the batch each happened in, and the
    epoch's loss leaves them out."""
    plain, clean = reads_in_an_epoch(8)
    logged, _ = reads_in_an_epoch(8, log_interval=3)
    assert len(logged) - len(plain) == 2 * 2  # batches 3 and 6
    reads, stats = reads_in_an_epoch(8, poison={2, 5})
    assert stats["skipped_steps"] == 2 and stats["train_utts"] == 32
    assert [r.getMessage().split(":")[0] for r in caplog.records if "non-finite" in r.getMessage()] == [
        "non-finite gradient norm at epoch 1 batch 2",
        "non-finite gradient norm at epoch 1 batch 5",
    ]
    assert math.isfinite(stats["train_loss"]) and stats["train_loss"] != clean["train_loss"]
    assert clean["skipped_steps"] == 0 and sorted(reads) == sorted(plain)
