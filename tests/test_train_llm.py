"""train_llm.py (the agents' and the leader's LLM weights): the completion log-probs and the
token-level loss in process, then the script as users run it (subprocesses on a tiny random model or
the default backbone): plain python vs a 2-process torchrun, and a run killed with SIGKILL and
resumed."""

import copy
import dataclasses
import json
from pathlib import Path

import pytest
import torch
from test_train import metrics, run

import common
import data
import deliberate
import deliberate as D
import softrank
import train_llm
from data.worked import worked_solution
from llm import backbone, lora, rollouts
from llm.engine import Engine
from llm.logprobs import completion_batch, completion_logprobs, token_logprobs

ROOT = Path(__file__).resolve().parents[1]


def test_completion_batch_masks_prompt_and_padding(tiny_model):
    model, _ = tiny_model
    sequences = [([5, 6, 7], [8, 9]), ([5], [10, 11, 12, 13])]
    ids, attention, loss_mask = completion_batch(sequences, pad_id=0, device="cpu")
    # prompts left-padded, completions right-padded: every completion starts at column 3
    assert ids.tolist() == [[5, 6, 7, 8, 9, 0, 0], [0, 0, 5, 10, 11, 12, 13]]
    assert attention.tolist() == [[1, 1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1, 1]]
    assert loss_mask.tolist() == [[0, 0, 0, 1, 1, 0, 0], [0, 0, 0, 1, 1, 1, 1]]
    logp, mask = completion_logprobs(model, (ids, attention, loss_mask))
    assert logp.shape == (2, 4) and mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]

    # padding is never a target and never context: other pad ids, same loss
    def loss(pad):
        logp, mask = completion_logprobs(model, completion_batch(sequences, pad, "cpu"))
        return -torch.where(mask.bool(), logp, 0).sum()

    with torch.no_grad():
        assert loss(0).item() == loss(1234).item()


def test_completion_logprobs_match_each_sequence_alone(tiny_model):
    """Batched and padded on both sides, each completion scores as it does alone: the position ids
    skip the left padding, as in generation."""
    model, _ = tiny_model
    sequences = [([5, 6, 7, 30], [8, 9]), ([5], [10, 11, 12, 13]), ([40, 41], [42])]
    with torch.no_grad():
        batch = completion_batch(sequences, 0, "cpu")
        logp, mask = completion_logprobs(model, batch, temperature=0.7)
        for b, (p, c) in enumerate(sequences):
            ones = torch.ones(1, len(p) + len(c), dtype=torch.long)
            alone = token_logprobs(model, torch.tensor([p + c]), ones, temperature=0.7)[
                0, -len(c) :
            ]
            torch.testing.assert_close(logp[b, : len(c)], alone, rtol=1e-5, atol=1e-5)
            assert mask[b].sum() == len(c)


@pytest.mark.slow
def test_rejection_sampling_sft_on_the_default_backbone(tmp_path, default_model_dir):
    """--target sft keeps right, finished solutions, trains on them and writes a directory --model
    accepts. Batches of one sequence under a 2-process torchrun leave a rank without rows at every
    step: it neither hangs nor drifts (the same weights as one process)."""
    args = [
        str(ROOT / "train_llm.py"),
        "--target",
        "sft",
        "--solutions",
        "sampled",
        "--lora-rank",
        "0",
        "--questions",
        "12",
        "--val-n",
        "4",
        "--samples",
        "4",
        "--max-new-tokens",
        "128",
        "--batch-size",
        "1",
        "--micro-batch",
        "1",
        "--epochs",
        "1",
        "--cache-dir",
        str(tmp_path / "cache"),
    ]
    run(args + ["--out-dir", str(tmp_path / "llm")], tmp_path)
    losses = [r["loss"] for r in metrics(tmp_path / "llm")]
    assert losses and all(0 < x < 10 for x in losses)
    tuned, _ = backbone.load_model(str(tmp_path / "llm" / "model"))
    original, _ = backbone.load_model(default_model_dir)
    changed = [
        name
        for name, p in tuned.named_parameters()
        if not torch.equal(p, dict(original.named_parameters())[name])
    ]
    assert changed  # one optimizer step at lr 1e-5 moves the weights
    engine = Engine(model_path=str(tmp_path / "llm" / "model"))
    completion = engine.generate([engine.chat("What is 2 + 3?")], [0], max_new_tokens=8)[0]
    assert completion.completion_tokens > 0
    run(args + ["--out-dir", str(tmp_path / "llm2")], tmp_path, torchrun=True)
    two, _ = backbone.load_model(str(tmp_path / "llm2" / "model"))
    assert [r["step"] for r in metrics(tmp_path / "llm2")] == list(range(1, len(losses) + 1))
    assert (
        max((a - b).abs().max().item() for a, b in zip(tuned.parameters(), two.parameters())) < 1e-5
    )


def test_worked_solutions_are_the_solve_prompt_and_the_solution_then_eos(tiny_model_dir):
    engine = Engine(model_path=tiny_model_dir)
    cfg = train_llm.Config(target="sft", questions=3, val_n=2, seed=1)
    pairs = rollouts.worked_solutions(engine, cfg)
    questions, _ = rollouts.training_questions(cfg)
    assert len(pairs) == 3
    for ex, (prompt, completion) in zip(questions, pairs):
        assert prompt == engine.encode(engine.chat(deliberate.solve_prompt(ex)))
        assert completion[-1] == engine.tokenizer.eos_token_id
        solution = engine.tokenizer.decode(completion[:-1])
        assert solution.endswith(f"Answer: {ex.answer}") and " = " in solution


def test_refine_examples_show_sampled_peers_and_teach_the_worked_solution(tmp_path, tiny_model_dir):
    """A REFINE example per question: the refine prompt over the solutions sampled from the
    adapter the flag names (the agent's own, its peers' answers), the worked solution as target."""
    model, _ = backbone.load_model(tiny_model_dir)
    lora.add_lora(model, 2, 8.0, adapters=1)
    path = tmp_path / "contexts.pt"
    torch.save(lora.adapter_state(model, 0, "tiny"), path)
    cfg = train_llm.Config(
        target="sft",
        questions=3,
        val_n=2,
        seed=1,
        agents=3,
        refine_contexts=str(path),
        max_new_tokens=8,
    )
    engine = Engine(model_path=tiny_model_dir)
    pairs = rollouts.refine_examples(engine, cfg, 0, 1)
    questions, _ = rollouts.training_questions(cfg)
    assert len(pairs) == 3
    for ex, (prompt, target) in zip(questions, pairs):
        text = engine.tokenizer.decode(prompt)
        assert ex.question in text and "Your previous solution:" in text
        assert "Agent 2:" in text and "Agent 3:" in text and "Agent 1:" not in text
        assert engine.tokenizer.decode(target[:-1]) == worked_solution(ex)
    # a file that is not an adapter is refused by name
    torch.save({"x": torch.zeros(1)}, tmp_path / "bad.pt")
    bad = dataclasses.replace(cfg, refine_contexts=str(tmp_path / "bad.pt"))
    with pytest.raises(common.FileRefused, match="bad.pt"):
        rollouts.refine_examples(Engine(model_path=tiny_model_dir), bad, 0, 1)


def sft_args(tmp_path, model_dir, *extra):
    """train_llm.py --target sft on 8 worked arith solutions, every step the same 8."""
    return [
        str(ROOT / "train_llm.py"),
        "--target",
        "sft",
        "--model",
        model_dir,
        "--questions",
        "8",
        "--val-n",
        "2",
        "--batch-size",
        "8",
        "--micro-batch",
        "4",
        "--epochs",
        "4",
        "--lr",
        "1e-2",
        "--save-every",
        "1",
        *extra,
    ]


@pytest.mark.parametrize("torchrun", [False, True])
def test_worked_sft_lowers_the_loss_on_its_solutions(tmp_path, tiny_model_dir, torchrun):
    """Four steps on the same 8 worked solutions lower their loss; the result is an adapter on the
    layers asked for, which a team of the base model plays."""
    out = tmp_path / "sft"
    args = sft_args(
        tmp_path,
        tiny_model_dir,
        "--lora-rank",
        "2",
        "--lora-targets",
        "q_proj,v_proj",
        "--out-dir",
        str(out),
    )
    run(args, tmp_path, torchrun)
    losses = [r["loss"] for r in metrics(out) if "loss" in r]
    assert len(losses) == 4 and all(b < a for a, b in zip(losses, losses[1:]))
    assert losses[-1] < losses[0] - 0.1
    state = common.load_file(out / "adapter.pt", "adapter")
    assert state["rank"] == 2 and state["targets"]
    assert all(name.endswith(("q_proj", "v_proj")) for name in state["targets"])
    engine = Engine(model_path=tiny_model_dir)
    k = lora.load_adapter(engine.model, state)
    assert sorted(lora.lora_layers(engine.model)) == sorted(state["targets"])
    completion = engine.generate([engine.chat("Hi")], [0], max_new_tokens=4, adapters=[k])[0]
    assert completion.completion_tokens > 0


def test_worked_sft_resumes_exactly_after_sigkill(tmp_path, tiny_model_dir):
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    run(sft_args(tmp_path, tiny_model_dir, "--out-dir", str(whole)), tmp_path)
    killed = run(
        sft_args(tmp_path, tiny_model_dir, "--out-dir", str(resumed), "--crash-at-step", "2"),
        tmp_path,
        check=False,
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    run(sft_args(tmp_path, tiny_model_dir, "--out-dir", str(resumed)), tmp_path)
    assert [r["step"] for r in metrics(resumed)] == [1, 2, 3, 4]
    assert [r["loss"] for r in metrics(resumed)] == [r["loss"] for r in metrics(whole)]
    a, b = (common.load_file(d / "adapter.pt", "adapter")["tensors"] for d in (whole, resumed))
    assert all(torch.equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------- --target agents (MAGRPO)
def rollout_sequences(tokenizer):
    """Two (prompt, completion) pairs of different prompt and completion lengths."""
    return [
        (
            tokenizer("Question: 2 + 3? Agent 2 says 5.")["input_ids"],
            tokenizer(" It is 5.")["input_ids"],
        ),
        (tokenizer("Q: 7 - 1?")["input_ids"], tokenizer(" The answer is 6, yes.")["input_ids"]),
    ]


def rollout_batch(tokenizer):
    return completion_batch(rollout_sequences(tokenizer), tokenizer.pad_token_id, "cpu")


def agents_grads(model, batches, advantages, cfg, normalizer, reference=None):
    model.zero_grad()
    for batch, adv in zip(batches, advantages):
        loss, _ = train_llm.agents_loss(model, reference, batch, adv, cfg, normalizer, 1.0)
        loss.backward()
    return [p.grad.clone() for p in model.parameters()]


def test_agents_loss_prompt_peers_and_padding_get_no_gradient(tiny_model):
    model, tokenizer = tiny_model
    ids, attention, mask = rollout_batch(tokenizer)
    logp, completion = completion_logprobs(model, (ids, attention, mask))
    logp = logp.detach().requires_grad_(True)
    loss, _ = softrank.policy_gradient_loss(logp, torch.tensor([1.0, -0.5]), completion, "token")
    loss.backward()
    completion = completion.bool()
    assert (logp.grad[~completion] == 0).all() and (logp.grad[completion] != 0).all()
    # whatever sits in the padding, the parameter gradients are the same, bit for bit
    cfg = train_llm.Config(target="agents", beta=0.0)
    other = ids.clone()
    other[attention == 0] = 17
    a = agents_grads(model, [(ids, attention, mask)], [torch.tensor([1.0, -0.5])], cfg, 10.0)
    b = agents_grads(model, [(other, attention, mask)], [torch.tensor([1.0, -0.5])], cfg, 10.0)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("agg", softrank.PG_KINDS)
def test_agents_loss_gradient_does_not_depend_on_the_micro_batch_split(tiny_model, agg):
    model, tokenizer = tiny_model
    model = model.double()
    try:
        sequences = rollout_sequences(tokenizer)
        cfg = train_llm.Config(target="agents", beta=0.1, loss_agg=agg)
        advantages = torch.tensor([1.0, -0.5], dtype=torch.float64)
        whole = completion_batch(sequences, tokenizer.pad_token_id, "cpu")
        normalizer = softrank.pg_normalizer(whole[2], agg, max_len=cfg.max_new_tokens)
        reference = copy_model(model)
        # each micro-batch is built from its own sequences (its own padding widths), as in training
        halves = [
            completion_batch(sequences[k : k + 1], tokenizer.pad_token_id, "cpu") for k in (0, 1)
        ]
        whole = agents_grads(model, [whole], [advantages], cfg, normalizer, reference)
        split = agents_grads(
            model, halves, [advantages[:1], advantages[1:]], cfg, normalizer, reference
        )
        for x, y in zip(whole, split):
            torch.testing.assert_close(x, y, rtol=1e-9, atol=1e-12)
    finally:
        model.float()


def test_agents_loss_averages_the_kl_per_sequence_under_seq(tiny_model):
    """--loss-agg seq with --beta (TRL's grpo): the policy-gradient term and the KL term are both
    each sequence's token mean, then the mean over sequences; the logged kl is that mean of k3."""
    model, tokenizer = tiny_model
    batch = rollout_batch(tokenizer)  # completions of different lengths
    reference = copy_model(model)
    cfg = train_llm.Config(target="agents", beta=0.2, loss_agg="seq")
    A = torch.tensor([1.0, -0.5])
    with torch.no_grad():
        loss, kl = train_llm.agents_loss(model, reference, batch, A, cfg, 2.0, 1.0)
        logp, mask = completion_logprobs(model, batch)
        ref_logp, _ = completion_logprobs(reference, batch)
    k3 = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1

    def per_sequence_mean(x):
        return torch.stack([x[b][mask[b].bool()].mean() for b in range(len(x))]).mean()

    assert kl == pytest.approx(per_sequence_mean(k3).item(), rel=1e-5)
    expected = per_sequence_mean(-A.unsqueeze(-1) * logp + cfg.beta * k3)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)


def copy_model(model):
    reference = copy.deepcopy(model)
    with torch.no_grad():
        for p in reference.parameters():
            # a different reference, so the KL term has a gradient
            p.add_(0.01 * torch.randn_like(p))
    return reference


def test_agents_one_step_changes_parameters_and_flat_groups_do_not(tiny_model):
    model, tokenizer = tiny_model
    model = copy.deepcopy(model)
    batch = rollout_batch(tokenizer)
    cfg = train_llm.Config(target="agents", beta=0.0)
    # an all-equal group: advantages 0
    grads = agents_grads(model, [batch], [torch.zeros(2)], cfg, 10.0)
    assert all(g.abs().max() == 0 for g in grads)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    agents_grads(model, [batch], [torch.tensor([1.0, -1.0])], cfg, 10.0)
    optimizer.step()
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))


def train_llm_target(tmp_path, model_dir, torchrun, target, *extra):
    """train_llm.py --target agents|leader for 2 steps of 2 questions x 2 rollouts into
    tmp_path/target, validated at steps 0 and 2; returns its training metric lines."""
    run(
        [
            str(ROOT / "train_llm.py"),
            "--target",
            target,
            "--algo",
            "magrpo",
            "--model",
            model_dir,
            "--questions-per-step",
            "2",
            "--group",
            "2",
            "--max-new-tokens",
            "6",
            "--steps",
            "2",
            "--val-n",
            "4",
            "--micro-batch",
            "3",
            "--eval-every",
            "2",
            "--out-dir",
            str(tmp_path / target),
            *extra,
        ],
        tmp_path,
        torchrun,
    )
    lines = metrics(tmp_path / target)
    # held-out validation at steps 0 and 2, on all 4
    # validation questions whatever the number of ranks
    assert [(r["step"], r["val_questions"]) for r in lines if "val_accuracy" in r] == [
        (0, 4),
        (2, 4),
    ]
    return [r for r in lines if "loss" in r]


@pytest.mark.parametrize("torchrun", [False, True])
def test_train_agents_runs_and_counts_flat_groups(tmp_path, tiny_model_dir, torchrun):
    out = tmp_path / "agents"
    # adapters (the default), one per agent; the bf16 path (rollouts from a bf16 copy, autocast
    # loss) in one of the two runs
    lines = train_llm_target(
        tmp_path,
        tiny_model_dir,
        torchrun,
        "agents",
        "--agents",
        "2",
        "--rounds",
        "1",
        "--beta",
        "0.1",
        "--separate-agents",
        "--dtype",
        "float32" if torchrun else "bfloat16",
    )
    assert [r["step"] for r in lines] == [1, 2]
    # random weights never answer right: every group is flat, counted, and teaches nothing
    assert all(
        r["zero_std_groups"] == 2 and r["frac_zero_std"] == 1.0 and r["grad_norm"] == 0
        for r in lines
    )
    # small adapter files that a team of the base model plays
    assert sorted(p.name for p in out.glob("*.pt")) == ["agent0.pt", "agent1.pt", "checkpoint.pt"]
    engine = Engine(model_path=tiny_model_dir)
    for name in ("agent0.pt", "agent1.pt"):
        k = lora.load_adapter(engine.model, common.load_file(out / name, "adapter"))
        completion = engine.generate([engine.chat("Hi")], [0], max_new_tokens=4, adapters=[k])[0]
        assert completion.completion_tokens > 0


@pytest.mark.parametrize("torchrun", [False, True])
def test_train_leader_runs_filters_and_counts_flat_groups(tmp_path, tiny_model_dir, torchrun):
    out = tmp_path / "leader"
    # full fine-tuning (--lora-rank 0): an HF directory
    lines = train_llm_target(
        tmp_path,
        tiny_model_dir,
        torchrun,
        "leader",
        "--questions",
        "6",
        "--agents",
        "3",
        "--beta",
        "0",
        "--lora-rank",
        "0",
        "--cache-dir",
        str(tmp_path / "cache"),
    )
    # random peers are never right: no question is filtered out
    assert json.loads((out / "pool.json").read_text()) == {
        "candidates": 6,
        "kept": 6,
        "peer_accuracy": 0.0,
    }
    assert [r["step"] for r in lines] == [1, 2]
    assert all(r["zero_std_groups"] == 2 and r["grad_norm"] == 0 for r in lines)
    # beta 0: flat groups are skipped; each rank still runs one (zero) backward for the all-reduce
    assert all(r["trained_sequences"] == (2 if torchrun else 1) for r in lines)
    checkpoint = common.load_file(out / "checkpoint.pt", "checkpoint")
    assert checkpoint["config"]["target"] == "leader"
    assert Engine(model_path=str(out / "model")).model.config.num_hidden_layers == 2
    # the peers' generations of every rank in one database
    assert {p.name.split("-")[0] for p in (tmp_path / "cache").iterdir()} == {"generations.db"}


def test_leader_filter_drops_questions_the_peers_solve(monkeypatch, tmp_path):
    """--filter-easy 0.75: with 3 peers, a question 3/3 right is dropped, 2/3 (0.67) is kept."""
    examples = [
        data.Example(question=f"q{k}", answer="5", task="arith", id=f"t/{k}") for k in range(3)
    ]
    right = {"t/0": 3, "t/1": 2, "t/2": 0}

    def run_llm(engine, calls, game):
        seen = {}
        outputs = []
        for ex, *_ in calls:
            k = seen[ex.id] = seen.get(ex.id, 0) + 1
            outputs.append(
                (D.parse_solution("Answer: " + ("5" if k <= right[ex.id] else "7"), "arith"), 1)
            )
        return outputs

    monkeypatch.setattr(rollouts, "training_pool", lambda cfg: examples)
    monkeypatch.setattr(rollouts, "make_engine", lambda cfg, rank, device: None)
    monkeypatch.setattr(rollouts, "run_llm", run_llm)
    cfg = train_llm.Config(target="leader", agents=3, questions=3, val_n=0)
    pool, stats = rollouts.peer_pool(cfg, 0, 1, "cpu")
    assert [ex.id for ex, _ in pool] == ["t/1", "t/2"] and stats["kept"] == 2
    assert stats["peer_accuracy"] == pytest.approx((1 + 2 / 3) / 3)
    keep_all = train_llm.Config(target="leader", agents=3, questions=3, val_n=0, filter_easy=0)
    pool, _ = rollouts.peer_pool(keep_all, 0, 1, "cpu")
    assert len(pool) == 3


def test_leader_peers_are_the_team_the_flag_names(monkeypatch, tmp_path):
    """--peers: the frozen peers' engine is built from that team (one entry per peer), and the flag
    is refused beside --peers-model, for another target, or with one entry too few."""
    built = {}

    def make_engine(cfg, rank, device):
        built.update(models=cfg.models, model=cfg.model)

    monkeypatch.setattr(rollouts, "make_engine", make_engine)
    monkeypatch.setattr(
        rollouts,
        "run_llm",
        lambda engine, calls, game: [(D.parse_solution("Answer: 5", "arith"), 1) for _ in calls],
    )
    examples = [data.Example(question="q", answer="5", task="arith", id="t/0")]
    adapter = tmp_path / "a.pt"
    adapter.write_bytes(b"")
    peers = f"default+{adapter},default"
    cfg = train_llm.Config(target="leader", agents=2, peers=peers)
    train_llm.check(cfg, 1)
    [(example, solutions)] = rollouts.peer_solutions(examples, cfg, 0, 1, "cpu")
    assert built == {"models": peers, "model": ""} and len(solutions) == 2
    for wrong in ({"peers_model": str(tmp_path)}, {"target": "agents"}, {"agents": 3}):
        with pytest.raises(common.UsageError, match="--peers:"):
            train_llm.check(dataclasses.replace(cfg, **wrong), 1)


@pytest.mark.slow
def test_llm_training_resumes_exactly_after_sigkill(tmp_path, default_model_dir):
    """--target agents on the default backbone (rewards vary: the format term), killed after step 2
    of 3 and resumed: the same weights as an uninterrupted run, no metric step logged twice."""
    args = [
        str(ROOT / "train_llm.py"),
        "--target",
        "agents",
        "--algo",
        "magrpo",
        "--protocol",
        "parallel",
        "--agents",
        "1",
        "--questions-per-step",
        "2",
        "--group",
        "2",
        "--max-new-tokens",
        "24",
        "--format-reward",
        "0.5",
        "--steps",
        "3",
        "--save-every",
        "1",
        "--lr",
        "1e-4",
        "--val-n",
        "4",
    ]
    run(args + ["--out-dir", str(tmp_path / "whole")], tmp_path)
    killed = run(
        args + ["--out-dir", str(tmp_path / "resumed"), "--crash-at-step", "2"],
        tmp_path,
        check=False,
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    resumed = run(args + ["--out-dir", str(tmp_path / "resumed")], tmp_path)
    assert "resuming from" in resumed.stderr
    whole = metrics(tmp_path / "whole")
    again = metrics(tmp_path / "resumed")
    assert [r["step"] for r in again] == [1, 2, 3]
    assert any(r["grad_norm"] > 0 for r in whole)  # the run learned something
    assert [r["mean_reward"] for r in again] == [r["mean_reward"] for r in whole]
    a, b = (
        common.load_file(tmp_path / d / "checkpoint.pt", "checkpoint")["model"]
        for d in ("whole", "resumed")
    )
    assert max((a[k] - b[k]).abs().max().item() for k in a) == 0
