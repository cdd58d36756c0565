"""Whole-weight training sharded with torch FSDP2 (--fsdp), on CPU with the gloo backend: one step
of each LLM-weight trainer's loss on 2 processes equals the step of one process (the same loss, KL,
gradient norm and updated weights, fp32, within the stated tolerances), each process holds half of
the parameters, gradients and optimizer state that DDP holds on each, a checkpoint of the shards
reads back whole; and a trainer run end to end (train_solver.py --lora-rank 0 --fsdp) under a
2-process torchrun saves the one process's model, also when killed by SIGKILL and resumed. The
rollout trainers' 2-process runs (tests/test_train_magrpo.py, tests/test_train_mlpo.py) shard with
--fsdp as well."""

import copy
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from launch import metrics, run
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

import common
import train_solver
from common import UsageError
from llm import backbone, training
from llm.engine import Engine
from llm.team import Member, Team

ROOT = Path(__file__).resolve().parents[1]
HELPER = str(ROOT / "tests" / "fsdp_run.py")
# fp32 over one process and over two, whose sums of the same terms differ in order: the loss and
# KL agree to ~1e-7 relative (tolerance 1e-5), the gradient norm to the last bits, and AdamW's
# update lr * m / (sqrt(v) + eps) turns a last-bit difference of a tiny gradient into up to 3e-6
# of a weight (tolerance 1e-5)
LOSS_RTOL, WEIGHT_ATOL = 1e-5, 1e-5


def launched(tmp_path, name, torchrun=True):
    """tests/fsdp_run.py's results, on 2 processes or on this one."""
    out = tmp_path / name / "result.pt"
    out.parent.mkdir()
    run([HELPER, out], tmp_path, torchrun=torchrun)
    return torch.load(out, weights_only=True)


@pytest.mark.slow
def test_an_fsdp2_step_of_each_trainer_is_the_one_process_step_on_half_the_memory(tmp_path):
    one, two = launched(tmp_path, "one", torchrun=False), launched(tmp_path, "two")
    assert (one["world"], two["world"]) == (1, 2)
    one, ddp, fsdp = one["one"], two["ddp"], two["fsdp"]
    for name in ("magrpo", "magrpo-kl", "mlpo", "solver"):
        for ours, theirs in ((fsdp[name], one[name]), (ddp[name], one[name])):
            for (loss, kl, norm), (loss1, kl1, norm1) in zip(ours["steps"], theirs["steps"]):
                assert loss == pytest.approx(loss1, rel=LOSS_RTOL)
                assert kl == pytest.approx(kl1, rel=LOSS_RTOL, abs=1e-12)
                assert norm == pytest.approx(norm1, rel=LOSS_RTOL)
            for k, w in theirs["weights"].items():
                torch.testing.assert_close(ours["weights"][k], w, rtol=0, atol=WEIGHT_ATOL)
        # the second step's KL term is at work where the loss has one
        assert (one[name]["steps"][1][1] > 0) == (name == "magrpo-kl")
        # every byte of parameters, gradients and AdamW's two moments: half on each of 2 processes,
        # all of it on each under DDP (as on one process)
        whole = one[name]["state_bytes"][0]
        assert ddp[name]["state_bytes"] == [whole, whole]
        assert all(0.49 * whole <= b <= 0.51 * whole for b in fsdp[name]["state_bytes"])
        assert max(fsdp[name]["state_bytes"]) <= 0.6 * max(ddp[name]["state_bytes"])
    # the last trainer's shards, checkpointed and read back into fresh shards: the same weights
    assert fsdp["checkpoint"] == {"counters": {"step": 1}, "same": True}


def test_fsdp_shards_whole_weights_only():
    cfg = train_solver.Config(fsdp=True, lora_rank=4)
    # the flag to set and why: a frozen base is whole on every process anyway
    with pytest.raises(UsageError, match=r"^--fsdp shards whole weights \(--lora-rank 0\)") as e:
        train_solver.check(cfg, 2)
    assert str(e.value).endswith("every process holds whole anyway")
    train_solver.check(train_solver.Config(fsdp=True, lora_rank=0), 2)


@pytest.mark.slow
def test_the_solver_under_fsdp2_saves_the_one_process_model_and_resumes_exactly(
    tmp_path, tiny_model_dir
):
    """train_solver.py --lora-rank 0 --fsdp, 2 processes against 1, killed by SIGKILL after step 1
    and resumed from its sharded checkpoint: the same losses and gradient norms as the one
    process, and the saved HF directory (rank 0's, gathered whole) the one process's model. A
    resume that lost a step, the data order or AdamW's moments moves a weight by about the
    learning rate (1e-4), ten times the tolerance. A batch of one sequence leaves a rank without
    rows at every step: it neither hangs nor drifts."""
    args = [
        *(str(ROOT / "train_solver.py"), "--model", tiny_model_dir, "--lora-rank", "0"),
        *("--questions", "3", "--val-n", "2", "--batch-size", "1", "--micro-batch", "1"),
        *("--epochs", "1", "--lr", "1e-4", "--save-every", "1"),
    ]
    run(args + ["--out-dir", str(tmp_path / "one")], tmp_path)
    resumed = ["--out-dir", str(tmp_path / "fsdp"), "--fsdp"]
    killed = run(args + resumed + ["--crash-at-step", "1"], tmp_path, torchrun=True, check=False)
    assert killed.returncode != 0
    again = run(args + resumed, tmp_path, torchrun=True)
    assert "resuming from" in again.stderr
    fsdp_lines = [r for r in metrics(tmp_path / "fsdp") if "loss" in r]
    assert [r["step"] for r in fsdp_lines] == [1, 2, 3]
    one_lines = [r for r in metrics(tmp_path / "one") if "loss" in r]
    for a, b in zip(one_lines, fsdp_lines, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=LOSS_RTOL)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=LOSS_RTOL)
    one, _ = backbone.load_model(str(tmp_path / "one" / "model"))
    fsdp, _ = backbone.load_model(str(tmp_path / "fsdp" / "model"))
    original, _ = backbone.load_model(tiny_model_dir)
    assert not torch.equal(one.lm_head.weight, original.lm_head.weight)
    for a, b in zip(one.parameters(), fsdp.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=WEIGHT_ATOL)
    # the folder is a model --model accepts
    engine = Engine(model_path=str(tmp_path / "fsdp" / "model"))
    assert engine.generate([engine.chat("Hi")], [0], max_new_tokens=4)[0].completion_tokens > 0


# --------------------------------------------------------------------------------------------------
# the sharding code in process: FSDP2 over a process group of this process alone (gloo)
# --------------------------------------------------------------------------------------------------
@pytest.fixture
def one_rank():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield common.Ranks(0, 1, torch.device("cpu"))
    dist.destroy_process_group()


def test_wrap_fsdp_shards_each_block_then_the_rest_and_nothing_without_a_group(
    tiny_model, one_rank
):
    model = copy.deepcopy(tiny_model[0])
    assert not common.sharded(model)
    assert common.wrap_fsdp(model, one_rank.device) is model
    blocks = list(model.model.layers)
    assert len(blocks) == 2 and all(isinstance(m, FSDPModule) for m in blocks + [model])
    assert not isinstance(model.model.embed_tokens, FSDPModule)
    assert all(isinstance(p, DTensor) for p in model.parameters()) and common.sharded(model)
    # a model that names no blocks (not an HF model): one unit, the whole
    linear = common.wrap_fsdp(torch.nn.Linear(2, 1), one_rank.device)
    assert isinstance(linear, FSDPModule) and common.sharded(linear)
    plain = copy.deepcopy(tiny_model[0])
    dist.destroy_process_group()
    try:
        assert common.wrap_fsdp(plain, one_rank.device) is plain and not common.sharded(plain)
    finally:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def test_sharded_gradients_wait_for_the_last_micro_batch_then_clip_and_count_whole(
    tiny_model, one_rank
):
    """accumulating: no gradient reaches the shards before the last micro-batch's backward, then
    both micro-batches' do, summed, as on a plain model; clip_gradients' norm is a plain tensor
    equal to the plain model's; whole() gathers a shard, leaves a tensor; state_bytes counts the
    parameters, their gradients and AdamW's two moments."""
    plain = copy.deepcopy(tiny_model[0])
    model = common.wrap_fsdp(copy.deepcopy(tiny_model[0]), one_rank.device)
    ids = [torch.tensor([[5, 6, 7]]), torch.tensor([[8, 9]])]
    for k, x in enumerate(ids):
        with common.accumulating(model, last=k == 1):
            model(input_ids=x).logits.logsumexp(-1).sum().backward()
        if k == 0:
            assert all(p.grad is None for p in model.parameters())
        plain(input_ids=x).logits.logsumexp(-1).sum().backward()
    for p, q in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(common.whole(p.grad), q.grad, rtol=1e-5, atol=1e-6)
    tensor = torch.ones(2)
    assert common.whole(tensor) is tensor
    norm = common.clip_gradients(model.parameters(), 1e9)
    assert type(norm) is torch.Tensor
    torch.testing.assert_close(norm, common.clip_gradients(plain.parameters(), 1e9))
    optimizer = torch.optim.AdamW(model.parameters())
    optimizer.step()
    # fp32: each parameter, its gradient and its two moments (4 x 4 bytes a number), and AdamW's
    # step counter (a float32 scalar per parameter tensor)
    numbers = sum(p.numel() for p in plain.parameters())
    tensors = len(list(plain.parameters()))
    assert common.state_bytes(list(model.parameters()), optimizer) == 16 * numbers + 4 * tensors
    assert common.all_reduce_max([3, 1.5], one_rank.device) == [3.0, 1.5]


def test_all_reduce_max_asks_the_group_for_the_max_in_float64(monkeypatch):
    seen = []
    group = SimpleNamespace(
        is_initialized=lambda: True,
        ReduceOp=dist.ReduceOp,
        all_reduce=lambda t, op=dist.ReduceOp.SUM: seen.append((t.dtype, op)),
    )
    monkeypatch.setattr(common, "dist", group)
    # float64: a count and a value near 1 come back as they were
    assert common.all_reduce_max([3, 1 + 1e-12], "cpu") == [3.0, 1 + 1e-12]
    assert seen == [(torch.float64, dist.ReduceOp.MAX)]


def test_sharded_state_dicts_are_whole_and_load_back_into_fresh_shards(tiny_model, one_rank):
    """state_dicts gathers FSDP2's shards into whole tensors (the parameters' names, AdamW's state
    by name), which load_state_dicts puts back into fresh shards: the weights and moments return."""
    model = common.wrap_fsdp(copy.deepcopy(tiny_model[0]), one_rank.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(input_ids=torch.tensor([[5, 6]])).logits.sum().backward()
    optimizer.step()
    weights, moments = common.state_dicts(model, optimizer)
    assert all(type(t) is torch.Tensor for t in weights.values())
    assert weights.keys() == tiny_model[0].state_dict().keys()
    # AdamW's moments whole too (not this rank's shards)
    tensors = [t for state in moments["state"].values() for t in state.values()]
    assert tensors and all(type(t) is torch.Tensor for t in tensors)
    assert set(moments["state"]) == set(weights)
    fresh = common.wrap_fsdp(copy.deepcopy(tiny_model[0]), one_rank.device)
    again = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    # torch's loader takes the dicts over (their tensors become shards): a copy to compare with
    loaded = {k: t.clone() for k, t in weights.items()}
    common.load_state_dicts(fresh, again, loaded, moments)
    for k, t in fresh.state_dict().items():
        assert torch.equal(common.whole(t), weights[k])
    for p, q in zip(fresh.parameters(), model.parameters()):
        assert torch.equal(
            common.whole(again.state[p]["exp_avg"]), common.whole(optimizer.state[q]["exp_avg"])
        )
    plain = copy.deepcopy(tiny_model[0])
    plain_optimizer = torch.optim.AdamW(plain.parameters())
    assert common.state_dicts(plain, plain_optimizer)[1] == plain_optimizer.state_dict()


def test_the_trainers_plumbing_shards_refreshes_and_saves_whole(tiny_model, one_rank, tmp_path):
    """loss_modules with --fsdp shards the trained models and the KL's frozen references alike;
    the rollout engine samples from its own whole copy (trained_team), which
    refresh_rollout_weights fills from the shards; save_trained writes the whole weights."""
    cfg = SimpleNamespace(lora_rank=0, gradient_checkpointing=False, fsdp=True)
    model = copy.deepcopy(tiny_model[0])
    modules, references = training.loss_modules([model], cfg, one_rank.device, kl=True)
    assert modules == [model] and common.sharded(model) and common.sharded(references[0])
    assert not any(p.requires_grad for p in references[0].parameters())
    copy_model = copy.deepcopy(tiny_model[0])
    with torch.no_grad():
        for p in copy_model.parameters():
            p.zero_()
    team = Team([Member(Engine(model=copy_model, tokenizer=tiny_model[1]))])
    training.refresh_rollout_weights([model], team)
    for p, q in zip(copy_model.parameters(), tiny_model[0].parameters()):
        assert torch.equal(p, q)
    saved = training.save_trained([model], tiny_model[1], tmp_path, cfg, 0)
    loaded, _ = backbone.load_model(saved[0])
    for p, q in zip(loaded.parameters(), tiny_model[0].parameters()):
        assert torch.equal(p, q)
