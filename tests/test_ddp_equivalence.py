"""DDP against one process: the trainer's step with 2 gloo ranks equals a single-process step on the
union of their batches; a rank without a batch adds nothing; the all-reduced CV loss is the CV loss of
the whole list. Run in-process with the trainer's own functions (kws.trainer), plain SGD so that a
wrong gradient scale shows in the parameters (Adam's first step would hide it), and a model without
BatchNorm (whose batch statistics legitimately differ between one batch and two halves)."""

import multiprocessing

import pytest
import torch
import torch.distributed as dist

from kws import trainer
from kws.distributed import Dist
from kws.loss import criterion

MODEL = {
    "hidden_dim": 8,
    "preprocessing": {"type": "linear"},
    "backbone": {"type": "gru", "num_layers": 1, "dropout": 0.0},
    "classifier": {"type": "linear", "dropout": 0.0},
}
INPUT_DIM, KEYWORDS = 6, 2
CTX = multiprocessing.get_context("spawn")


def make_batch(seed, count, frames=20):
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(frames // 2, frames + 1, (count,), generator=generator)
    lengths[0] = frames
    return (
        [f"u{seed}_{i}" for i in range(count)],
        torch.randn(count, frames, INPUT_DIM, generator=generator),
        lengths,
        torch.tensor([(seed + i) % 3 - 1 for i in range(count)]),
        torch.zeros(count, dtype=torch.bool),  # no row mel-warped (kws.mel_warp)
    )


def union(a, b):
    return (a[0] + b[0], *(torch.cat([x, y]) for x, y in zip(a[1:], b[1:])))


def make_state(world_size):
    from kws.model import build_model

    torch.manual_seed(0)
    model = build_model(MODEL, INPUT_DIM, KEYWORDS)
    wrapped = torch.nn.parallel.DistributedDataParallel(model) if world_size > 1 else model
    return trainer.TrainState(
        model=wrapped,
        bare_model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.5),
        criterion=criterion("max_pooling"),
        dist=Dist(world_size, torch.device("cpu"), "gloo"),
        device=torch.device("cpu"),
        input_dim=INPUT_DIM,
        min_duration=3,
        grad_clip=1e9,
        guard=trainer.NonFiniteGuard(5),
        rank=dist.get_rank() if world_size > 1 else 0,
    )


def rank_main(rank, folder, batches, cv_batches):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=2)
    try:
        state = make_state(2)
        stats = trainer.train_one_epoch(state, batches[rank], epoch=1, counts=[len(b) for b in batches])
        cv = trainer.evaluate(state, cv_batches[rank])
        torch.save((state.bare_model.state_dict(), stats, cv), f"{folder}/rank{rank}.pt")
        # as the trainer ends each epoch: no rank tears gloo down while its peer still talks to it (without
        # it, one CI run in many saw rank 1 abort in teardown: "terminate called without an active exception")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_two_ranks(folder, batches, cv_batches):
    procs = [CTX.Process(target=rank_main, args=(r, str(folder), batches, cv_batches)) for r in (0, 1)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
        if proc.is_alive():
            proc.kill()
    assert [proc.exitcode for proc in procs] == [0, 0]
    return {r: torch.load(folder / f"rank{r}.pt", weights_only=True) for r in (0, 1)}


def single_process(batches, cv_batches):
    state = make_state(1)
    stats = trainer.train_one_epoch(state, batches, epoch=1, counts=[len(batches)])
    return state.bare_model.state_dict(), stats, trainer.evaluate(state, cv_batches)


def assert_close(a, b):
    for key in a:
        assert torch.allclose(a[key], b[key], rtol=1e-5, atol=1e-6), key


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def test_ddp_step_equals_one_step_on_the_union_and_cv_is_the_whole_list(tmp_path):
    a, b = make_batch(1, 4), make_batch(2, 4)
    cv_a, cv_b = make_batch(3, 3), make_batch(4, 2)
    ranks = run_two_ranks(tmp_path, [[a], [b]], [[cv_a], [cv_b]])
    weights, stats, cv = single_process([union(a, b)], [cv_a, cv_b])
    initial = make_state(1).bare_model.state_dict()
    assert any(not torch.equal(initial[k], weights[k]) for k in weights)  # the step moved the model
    for rank in (0, 1):
        rank_weights, rank_stats, rank_cv = ranks[rank]
        assert_close(rank_weights, weights)
        assert rank_stats["train_utts"] == 8 and rank_stats["batches"] == 1
        assert rank_stats["train_loss"] == pytest.approx(stats["train_loss"], rel=1e-5)
        assert rank_cv[2] == cv[2] == 5
        assert rank_cv[0] == pytest.approx(cv[0], rel=1e-6) and rank_cv[1] == pytest.approx(cv[1])


def test_a_rank_without_a_batch_adds_nothing(tmp_path):
    """Rank 1 has one batch fewer: on the second step the average is rank 0's gradient alone."""
    a, b, c = make_batch(1, 4), make_batch(2, 4), make_batch(5, 4)
    ranks = run_two_ranks(tmp_path, [[a, c], [b]], [[make_batch(3, 2)], [make_batch(4, 2)]])
    state = make_state(1)
    trainer.train_one_epoch(state, [union(a, b), c], epoch=1, counts=[2])
    for rank in (0, 1):
        assert_close(ranks[rank][0], state.bare_model.state_dict())
        assert ranks[rank][1]["batches"] == 2 and ranks[rank][1]["train_utts"] == 12
