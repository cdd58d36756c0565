"""sft.py and train_rl.py: the losses in process, then the scripts as users run them (subprocesses on a tiny
random model): plain python vs a 2-process torchrun, and a run killed with SIGKILL and resumed."""
import copy
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import data
import backbone
import policy as P
import rollouts
import softrank
import state as S
import train_rl
import training
from engine import Engine

ROOT = Path(__file__).resolve().parents[1]
GAME = ["--questions", "8", "--val-n", "4", "--agents", "3", "--rounds", "2", "--max-new-tokens", "8"]


# ---------------------------------------------------------------- losses and helpers, in process
def synthetic_batch(n=64, rewards=(0.0, 1.0, 0.0, -1.0)):
    g = torch.Generator().manual_seed(0)
    own, peers = torch.rand(n, len(S.OWN_FEATURES), generator=g), torch.rand(n, 2, len(S.PEER_FEATURES), generator=g)
    return {"own": own, "peers": peers, "agent": torch.arange(n) % 3, "action": torch.randint(0, 4, (n,), generator=g),
            "rewards": torch.tensor([rewards] * n), "ref_logits": torch.zeros(n, 4), "old_logits": torch.zeros(n, 4)}


@pytest.mark.parametrize("algo,objective", [(algo, "expected") for algo in train_rl.ALGOS]
                         + [(algo, objective) for algo in ("softrank", "grpo") for objective in ("unweighted", "eq4")])
def test_every_algo_moves_toward_the_best_action(algo, objective):
    torch.manual_seed(0)
    policy = P.MetaPolicy(agents=3)
    # Eq. 4 regresses beta * log(pi / pi_ref) onto A: at beta = 0 it has nothing to fit
    cfg = train_rl.Config(algo=algo, objective=objective, beta=0.1 if objective == "eq4" else 0.0, lam=0.0)
    batch = synthetic_batch()
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    before = torch.softmax(policy(batch["own"], batch["peers"], batch["agent"]), -1)[:, 1].mean()
    loss_fn = train_rl.make_loss(cfg)
    for _ in range(20):
        loss, stats = loss_fn(policy, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = torch.softmax(policy(batch["own"], batch["peers"], batch["agent"]), -1)[:, 1].mean()
    assert after > before + 0.1 and stats["frac_zero_std"] == 0.0


@pytest.mark.parametrize("algo", ["softrank", "grpo"])
def test_corpus_objective_minimum_is_a_lower_bound_that_descent_reaches(algo):
    """The summary's objective_minimum: no logits do better, and free logits descended on the loss reach it."""
    g = torch.Generator().manual_seed(1)
    rewards = torch.randint(-1, 3, (32, 4), generator=g).float()  # ties, flat rows and several distinct values
    tensors = {"rewards": rewards, "ref_logits": torch.randn(32, 4, generator=g)}
    cfg = train_rl.Config(algo=algo, objective="expected", beta=0.1, lam=0.02)
    _, minimum = train_rl.corpus_objective(torch.zeros(32, 4), tensors, cfg)
    logits = torch.randn(32, 4, generator=g, requires_grad=True)
    assert train_rl.corpus_objective(logits.detach(), tensors, cfg)[0] > minimum + 0.1  # far from it at first
    optimizer = torch.optim.Adam([logits], lr=0.05)
    for _ in range(1500):
        value, _ = train_rl.corpus_objective(logits, tensors, cfg)
        assert value >= minimum - 1e-6
        loss, _ = train_rl.objective_loss(logits, train_rl.action_advantages(rewards, cfg), tensors["ref_logits"], cfg)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert abs(value - minimum) < 1e-3
    assert train_rl.corpus_objective(logits, tensors, train_rl.Config(algo="ppo")) == (None, None)


def test_all_equal_rewards_teach_nothing_and_are_counted():
    policy = P.MetaPolicy(agents=3)
    batch = synthetic_batch(rewards=(1.0, 1.0, 1.0, 1.0))
    for algo in ("softrank", "grpo", "ppo"):
        loss, stats = train_rl.make_loss(train_rl.Config(algo=algo, beta=0.0, lam=0.0))(policy, batch)
        assert stats["frac_zero_std"] == 1.0
        loss.backward()
        assert all(p.grad is None or p.grad.abs().max() == 0 for p in policy.parameters())
        policy.zero_grad()


def test_softrank_loss_ignores_reward_scale_and_exp_grpo_does_not():
    policy = P.MetaPolicy(agents=3)
    batch = synthetic_batch(rewards=(0.0, 1.0, 0.5, -1.0))

    def loss(algo, scale, transform):
        cfg = train_rl.Config(algo=algo, reward_scale=scale, reward_transform=transform)
        return train_rl.make_loss(cfg)(policy, batch)[0].item()
    base = loss("softrank", 1.0, "none")
    assert loss("softrank", 0.1, "none") == base and loss("softrank", 10.0, "exp") == base
    assert loss("grpo", 10.0, "none") == pytest.approx(loss("grpo", 1.0, "none"), rel=1e-5)
    assert loss("grpo", 1.0, "exp") != pytest.approx(loss("grpo", 1.0, "none"), rel=1e-3)


def test_batch_schedule_is_a_function_of_its_arguments():
    a = training.batch_schedule(50, 16, 2, 0, "rl-0")
    assert len(a) == 2 * 3 and all(len(b) == 16 for b in a)  # the partial batch is dropped
    assert all(torch.equal(x, y) for x, y in zip(a, training.batch_schedule(50, 16, 2, 0, "rl-0")))
    assert not torch.equal(a[0], training.batch_schedule(50, 16, 2, 0, "rl-1")[0])
    assert len(training.batch_schedule(5, 16, 3, 0, "x")) == 3  # fewer states than a batch: one batch per epoch


def test_completion_batch_masks_prompt_and_padding(tiny_model):
    model, _ = tiny_model
    sequences = [([5, 6, 7], [8, 9]), ([5], [10, 11, 12, 13])]
    ids, attention, loss_mask = training.completion_batch(sequences, pad_id=0, device="cpu")
    # prompts left-padded, completions right-padded: every completion starts at column 3
    assert ids.tolist() == [[5, 6, 7, 8, 9, 0, 0], [0, 0, 5, 10, 11, 12, 13]]
    assert attention.tolist() == [[1, 1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1, 1]]
    assert loss_mask.tolist() == [[0, 0, 0, 1, 1, 0, 0], [0, 0, 0, 1, 1, 1, 1]]
    logp, mask = training.completion_logprobs(model, (ids, attention, loss_mask))
    assert logp.shape == (2, 4) and mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]

    # padding is never a target and never context: other pad ids, same loss
    def loss(pad):
        logp, mask = training.completion_logprobs(model, training.completion_batch(sequences, pad, "cpu"))
        return -torch.where(mask.bool(), logp, 0).sum()
    with torch.no_grad():
        assert loss(0).item() == loss(1234).item()


def test_completion_logprobs_match_each_sequence_alone(tiny_model):
    """Batched and padded on both sides, each completion scores as it does alone: the position ids skip
    the left padding, as in generation."""
    model, _ = tiny_model
    sequences = [([5, 6, 7, 30], [8, 9]), ([5], [10, 11, 12, 13]), ([40, 41], [42])]
    with torch.no_grad():
        batch = training.completion_batch(sequences, 0, "cpu")
        logp, mask = training.completion_logprobs(model, batch, temperature=0.7)
        for b, (p, c) in enumerate(sequences):
            ones = torch.ones(1, len(p) + len(c), dtype=torch.long)
            alone = training.token_logprobs(model, torch.tensor([p + c]), ones, temperature=0.7)[0, -len(c):]
            torch.testing.assert_close(logp[b, :len(c)], alone, rtol=1e-5, atol=1e-5)
            assert mask[b].sum() == len(c)


def test_run_distributed_meets_at_a_barrier_before_teardown(tmp_path, monkeypatch):
    """Ranks leave together (a gloo group torn down while a peer still writes rank-0 files aborted CI's
    torchrun run at exit); a failed rank skips the barrier, where its peers would wait for it forever."""
    calls = []
    monkeypatch.setattr(training, "init_distributed", lambda: (1, 2, torch.device("cpu")))
    monkeypatch.setattr(training.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(training.dist, "barrier", lambda: calls.append("barrier"))
    monkeypatch.setattr(training.dist, "destroy_process_group", lambda: calls.append("destroy"))
    cfg = types.SimpleNamespace(out_dir=str(tmp_path / "out"))
    assert training.run_distributed(lambda cfg, rank, world, device: calls.append("train") or rank, cfg) == 1
    assert calls == ["train", "barrier", "destroy"]

    def fail(cfg, rank, world, device):
        raise ValueError("bad batch")
    calls.clear()
    with pytest.raises(ValueError):
        training.run_distributed(fail, cfg)
    assert calls == ["destroy"]


# ---------------------------------------------------------------- the scripts, as subprocesses
def run(args, tmp_path, torchrun=False, check=True, scripted=False):
    """A stage script as users run it (python or a 2-process torchrun); scripted: with the scripted arith
    engine instead of a model (tests/scripted_run.py), so its games have right and wrong answers."""
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2"] if torchrun
                else [sys.executable])
    if scripted:
        launcher = launcher + [str(ROOT / "tests" / "scripted_run.py")]
        args = [Path(args[0]).name] + args[1:]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(launcher + args, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def weights(path):
    return torch.load(path, weights_only=False)["state_dict"]


def metrics(out_dir):
    return [json.loads(line) for line in (Path(out_dir) / "metrics.jsonl").read_text().splitlines()]


def max_difference(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def sft_runs(tmp_path_factory):
    """sft.py with the scripted arith engine, once with python and once with a 2-process torchrun."""
    root = tmp_path_factory.mktemp("sft")
    out = {}
    for name, torchrun in (("single", False), ("torchrun", True)):
        run([str(ROOT / "sft.py"), *GAME, "--epochs", "3", "--batch-size", "16", "--out-dir", str(root / name)],
            root, torchrun, scripted=True)
        out[name] = root / name
    return out


def test_sft_single_and_torchrun_agree(sft_runs):
    single, multi = sft_runs["single"], sft_runs["torchrun"]
    corpus = [torch.load(d / "corpus.pt", weights_only=False) for d in (single, multi)]
    assert [r["key"] for r in corpus[0]] == [r["key"] for r in corpus[1]] and len(corpus[0]) > 20
    assert [r["label"] for r in corpus[0]] == [r["label"] for r in corpus[1]]
    assert len({r["label"] for r in corpus[0]}) >= 3  # right and wrong answers: persist, refine and concede labels
    # same global batches, gradients summed in another order: equal up to float rounding (through Adam)
    assert max_difference(weights(single / "policy.pt"), weights(multi / "policy.pt")) < 1e-4
    lines = metrics(single)
    assert [r["step"] for r in lines] == list(range(1, len(lines) + 1)) and "loss" in lines[0]
    summary = json.loads((single / "summary.json").read_text())
    assert summary["states"] == len(corpus[0])
    assert set(summary["label_distribution"]) == {"persist", "refine", "concede"}
    checkpoint = torch.load(single / "checkpoint.pt", weights_only=False)
    assert {"model", "optimizer", "counters", "rng", "config"} <= checkpoint.keys()


@pytest.mark.parametrize("algo", ["softrank", "grpo"])
def test_train_rl_single_and_torchrun_agree(sft_runs, tmp_path, algo):
    """On a corpus with non-flat reward vectors, so the policy-gradient term is at work, not only KL and
    entropy: one process and two take the same steps."""
    outs = {}
    for name, torchrun in (("single", False), ("torchrun", True)):
        outs[name] = tmp_path / name
        run([str(ROOT / "train_rl.py"), "--init", str(sft_runs["single"] / "policy.pt"), *GAME, "--algo", algo,
             "--epochs", "3", "--batch-size", "16", "--lam", "0.05", "--out-dir", str(outs[name])],
            tmp_path, torchrun, scripted=True)
    a, b = weights(outs["single"] / "policy.pt"), weights(outs["torchrun"] / "policy.pt")
    assert max_difference(a, b) < 1e-4
    assert max_difference(a, weights(sft_runs["single"] / "policy.pt")) > 1e-4  # training moved the policy
    summary = json.loads((outs["single"] / "summary.json").read_text())
    assert {"corpus", "val_accuracy", "val_actions", "policy_actions_on_corpus"} <= summary.keys()
    assert summary["corpus"]["frac_zero_std"] < 0.9 and summary["corpus"]["frac_multi_valued"] > 0
    corpus = torch.load(outs["single"] / "corpus-0.pt", weights_only=False)
    assert all(len(r["rewards"]) == 4 and len(r["old_logits"]) == 4 for r in corpus)
    assert any(abs(r["pg"]) > 0 for r in metrics(outs["single"]) if "pg" in r)


def test_validation_during_training_does_not_change_the_policy(sft_runs, tmp_path):
    """--eval-every plays validation games between optimizer steps: they log accuracy and must leave training
    alone (no shared random state), so table c's curves belong to the policies the other tables use."""
    args = [str(ROOT / "train_rl.py"), "--init", str(sft_runs["single"] / "policy.pt"), *GAME, "--epochs", "3",
            "--batch-size", "8", "--lam", "0.05"]
    for every in ("0", "3"):
        run(args + ["--eval-every", every, "--out-dir", str(tmp_path / every)], tmp_path, scripted=True)
    assert max_difference(weights(tmp_path / "0" / "policy.pt"), weights(tmp_path / "3" / "policy.pt")) == 0
    validated = [r["step"] for r in metrics(tmp_path / "3") if "val_accuracy" in r]
    steps = max(r["step"] for r in metrics(tmp_path / "3") if "loss" in r)
    assert validated == [*range(0, steps + 1, 3), *([steps] if steps % 3 else [])]


@pytest.mark.parametrize("algo", ["softrank", "ppo"])
def test_train_rl_resumes_exactly_after_sigkill(sft_runs, tmp_path, algo):
    """Two online iterations on non-flat corpora, killed inside the second and resumed: bit-identical."""
    args = [str(ROOT / "train_rl.py"), "--init", str(sft_runs["single"] / "policy.pt"), *GAME,
            "--iterations", "2", "--epochs", "3", "--batch-size", "8", "--save-every", "4", "--lam", "0.05",
            "--algo", algo]
    run(args + ["--out-dir", str(tmp_path / "whole")], tmp_path, scripted=True)
    assert json.loads((tmp_path / "whole" / "summary.json").read_text())["corpus"]["frac_zero_std"] < 0.9
    steps = len(training.batch_schedule(len(torch.load(tmp_path / "whole" / "corpus-0.pt", weights_only=False)), 8, 3,
                                   0, "rl-0"))
    crash = steps + 3  # inside the second iteration, after a checkpoint of the first
    killed = run(args + ["--out-dir", str(tmp_path / "resumed"), "--crash-at-step", str(crash)], tmp_path,
                 check=False, scripted=True)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert not (tmp_path / "resumed" / "policy.pt").exists()
    resumed = run(args + ["--out-dir", str(tmp_path / "resumed")], tmp_path, scripted=True)
    assert "resuming from" in resumed.stderr
    assert max_difference(weights(tmp_path / "whole" / "policy.pt"), weights(tmp_path / "resumed" / "policy.pt")) == 0
    # the log is the uninterrupted run's: no step twice
    steps_logged = [r["step"] for r in metrics(tmp_path / "resumed") if "loss" in r]
    assert steps_logged == list(range(1, 2 * steps + 1))
    # the same command once more: the run is complete, nothing is trained, validated or rewritten again
    before = {name: (tmp_path / "resumed" / name).read_bytes() for name in ("metrics.jsonl", "summary.json",
                                                                              "policy.pt")}
    again = run(args + ["--out-dir", str(tmp_path / "resumed")], tmp_path, scripted=True)
    assert "resuming from" in again.stderr and "is finished" in again.stderr
    assert before == {name: (tmp_path / "resumed" / name).read_bytes() for name in before}
    # the same folder under other settings is refused, not passed off as a run of them
    other = run(args + ["--out-dir", str(tmp_path / "resumed"), "--beta", "0.5"], tmp_path, check=False, scripted=True)
    assert other.returncode != 0 and "beta: 0.05 there, 0.5 now" in other.stderr
    assert before == {name: (tmp_path / "resumed" / name).read_bytes() for name in before}


def test_scripts_reject_bad_input(tmp_path, tiny_model_dir):
    proc = run([str(ROOT / "train_rl.py"), "--init", str(tmp_path / "missing.pt")], tmp_path, check=False)
    assert proc.returncode != 0 and "run sft.py first" in proc.stderr
    proc = run([str(ROOT / "train_rl.py"), "--algo", "dpo"], tmp_path, check=False)
    assert proc.returncode != 0 and "unknown --algo" in proc.stderr
    proc = run([str(ROOT / "train_rl.py"), "--objective", "max"], tmp_path, check=False)
    assert proc.returncode != 0 and "unknown --objective" in proc.stderr
    proc = run([str(ROOT / "sft.py"), "--target", "nonsense"], tmp_path, check=False)
    assert proc.returncode != 0 and "unknown --target" in proc.stderr
    proc = run([str(ROOT / "sft.py"), "--model", tiny_model_dir, "--questions", "100000"], tmp_path, check=False)
    assert proc.returncode != 0 and "not enough" in proc.stderr


@pytest.mark.slow
def test_sft_llm_on_the_default_backbone(tmp_path, default_model_dir):
    """--target llm keeps right, finished solutions, trains on them and writes a directory --model accepts.
    Batches of one sequence under a 2-process torchrun leave a rank without rows at every step: it neither
    hangs nor drifts (the same weights as one process)."""
    args = [str(ROOT / "sft.py"), "--target", "llm", "--questions", "12", "--val-n", "4", "--samples", "4",
            "--max-new-tokens", "128", "--batch-size", "1", "--micro-batch", "1", "--epochs", "1",
            "--cache-dir", str(tmp_path / "cache")]
    run(args + ["--out-dir", str(tmp_path / "llm")], tmp_path)
    losses = [r["loss"] for r in metrics(tmp_path / "llm")]
    assert losses and all(0 < x < 10 for x in losses)
    tuned, _ = backbone.load_model(str(tmp_path / "llm" / "model"))
    original, _ = backbone.load_model(default_model_dir)
    changed = [name for name, p in tuned.named_parameters()
               if not torch.equal(p, dict(original.named_parameters())[name])]
    assert changed  # one optimizer step at lr 1e-5 moves the weights
    engine = Engine(model_path=str(tmp_path / "llm" / "model"))
    assert engine.generate([engine.chat("What is 2 + 3?")], [0], max_new_tokens=8)[0].completion_tokens > 0
    run(args + ["--out-dir", str(tmp_path / "llm2")], tmp_path, torchrun=True)
    two, _ = backbone.load_model(str(tmp_path / "llm2" / "model"))
    assert [r["step"] for r in metrics(tmp_path / "llm2")] == list(range(1, len(losses) + 1))
    assert max((a - b).abs().max().item() for a, b in zip(tuned.parameters(), two.parameters())) < 1e-5


# ---------------------------------------------------------------- --target agents (MAGRPO)
def rollout_sequences(tokenizer):
    """Two (prompt, completion) pairs of different prompt and completion lengths."""
    return [(tokenizer("Question: 2 + 3? Agent 2 says 5.")["input_ids"], tokenizer(" It is 5.")["input_ids"]),
            (tokenizer("Q: 7 - 1?")["input_ids"], tokenizer(" The answer is 6, yes.")["input_ids"])]


def rollout_batch(tokenizer):
    return training.completion_batch(rollout_sequences(tokenizer), tokenizer.pad_token_id, "cpu")


def agents_grads(model, batches, advantages, cfg, normalizer, reference=None):
    model.zero_grad()
    for batch, adv in zip(batches, advantages):
        loss, _ = train_rl.agents_loss(model, reference, batch, adv, cfg, normalizer)
        loss.backward()
    return [p.grad.clone() for p in model.parameters()]


def test_agents_loss_prompt_peers_and_padding_get_no_gradient(tiny_model):
    model, tokenizer = tiny_model
    ids, attention, mask = rollout_batch(tokenizer)
    logp, completion = training.completion_logprobs(model, (ids, attention, mask))
    logp = logp.detach().requires_grad_(True)
    loss, _ = softrank.policy_gradient_loss(logp, torch.tensor([1.0, -0.5]), completion, "token")
    loss.backward()
    completion = completion.bool()
    assert (logp.grad[~completion] == 0).all() and (logp.grad[completion] != 0).all()
    # whatever sits in the padding, the parameter gradients are the same, bit for bit
    cfg = train_rl.Config(target="agents", llm_beta=0.0)
    other = ids.clone()
    other[attention == 0] = 17
    a = agents_grads(model, [(ids, attention, mask)], [torch.tensor([1.0, -0.5])], cfg, 10.0)
    b = agents_grads(model, [(other, attention, mask)], [torch.tensor([1.0, -0.5])], cfg, 10.0)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("agg", ["token", "seq", "const"])
def test_agents_loss_gradient_does_not_depend_on_the_micro_batch_split(tiny_model, agg):
    model, tokenizer = tiny_model
    model = model.double()
    try:
        sequences = rollout_sequences(tokenizer)
        cfg = train_rl.Config(target="agents", llm_beta=0.1, loss_agg=agg)
        advantages = torch.tensor([1.0, -0.5], dtype=torch.float64)
        whole = training.completion_batch(sequences, tokenizer.pad_token_id, "cpu")
        normalizer = softrank.pg_normalizer(whole[2], agg, max_len=cfg.max_new_tokens)
        reference = copy_model(model)
        # each micro-batch is built from its own sequences (its own padding widths), as in training
        halves = [training.completion_batch(sequences[k:k + 1], tokenizer.pad_token_id, "cpu") for k in (0, 1)]
        whole = agents_grads(model, [whole], [advantages], cfg, normalizer, reference)
        split = agents_grads(model, halves, [advantages[:1], advantages[1:]], cfg, normalizer, reference)
        for x, y in zip(whole, split):
            torch.testing.assert_close(x, y, rtol=1e-9, atol=1e-12)
    finally:
        model.float()


def copy_model(model):
    reference = copy.deepcopy(model)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.01 * torch.randn_like(p))  # a different reference, so the KL term has a gradient
    return reference


def test_agents_one_step_changes_parameters_and_flat_groups_do_not(tiny_model):
    model, tokenizer = tiny_model
    model = copy.deepcopy(model)
    batch = rollout_batch(tokenizer)
    cfg = train_rl.Config(target="agents", llm_beta=0.0)
    grads = agents_grads(model, [batch], [torch.zeros(2)], cfg, 10.0)  # an all-equal group: advantages 0
    assert all(g.abs().max() == 0 for g in grads)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    agents_grads(model, [batch], [torch.tensor([1.0, -1.0])], cfg, 10.0)
    optimizer.step()
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))


def train_llm_target(tmp_path, model_dir, torchrun, target, *extra):
    """train_rl.py --target agents|leader for 2 steps of 2 questions x 2 rollouts into tmp_path/target,
    validated at steps 0 and 2; returns its training metric lines."""
    run([str(ROOT / "train_rl.py"), "--target", target, "--algo", "magrpo", "--model", model_dir,
         "--questions-per-step", "2", "--group", "2", "--max-new-tokens", "6", "--steps", "2", "--val-n", "4",
         "--micro-batch", "3", "--eval-every", "2", "--out-dir", str(tmp_path / target), *extra], tmp_path, torchrun)
    lines = metrics(tmp_path / target)
    # held-out validation at steps 0 and 2, on all 4 validation questions whatever the number of ranks
    assert [(r["step"], r["val_questions"]) for r in lines if "val_accuracy" in r] == [(0, 4), (2, 4)]
    return [r for r in lines if "loss" in r]


@pytest.mark.parametrize("torchrun", [False, True])
def test_train_agents_runs_and_counts_flat_groups(tmp_path, tiny_model_dir, torchrun):
    out = tmp_path / "agents"
    lines = train_llm_target(tmp_path, tiny_model_dir, torchrun, "agents", "--agents", "2", "--rounds", "1",
                             "--llm-beta", "0.1",
                             # the bf16 path (rollouts from a bf16 copy, autocast loss) in one of the two runs
                             "--dtype", "float32" if torchrun else "bfloat16")
    assert [r["step"] for r in lines] == [1, 2]
    # random weights never answer right: every group is flat, counted, and teaches nothing
    assert all(r["zero_std_groups"] == 2 and r["frac_zero_std"] == 1.0 and r["grad_norm"] == 0 for r in lines)
    engine = Engine(model_path=str(out / "model"))
    assert engine.generate([engine.chat("Hi")], [0], max_new_tokens=4)[0].completion_tokens > 0


@pytest.mark.parametrize("torchrun", [False, True])
def test_train_leader_runs_filters_and_counts_flat_groups(tmp_path, tiny_model_dir, torchrun):
    out = tmp_path / "leader"
    lines = train_llm_target(tmp_path, tiny_model_dir, torchrun, "leader", "--questions", "6", "--agents", "3",
                             "--llm-beta", "0", "--cache-dir", str(tmp_path / "cache"))
    # random peers are never right: no question is filtered out
    assert json.loads((out / "pool.json").read_text()) == {"candidates": 6, "kept": 6, "peer_accuracy": 0.0}
    assert [r["step"] for r in lines] == [1, 2]
    assert all(r["zero_std_groups"] == 2 and r["grad_norm"] == 0 for r in lines)
    # llm_beta 0: flat groups are skipped; each rank still runs one (zero) backward for the all-reduce
    assert all(r["trained_sequences"] == (2 if torchrun else 1) for r in lines)
    checkpoint = torch.load(out / "checkpoint.pt", weights_only=False)
    assert checkpoint["config"]["target"] == "leader"
    assert Engine(model_path=str(out / "model")).model.config.num_hidden_layers == 2


def test_leader_filter_drops_questions_the_peers_solve(monkeypatch, tmp_path):
    """--filter-easy 0.75: with 3 peers, a question 3/3 right is dropped, 2/3 (0.67) is kept."""
    examples = [data.Example(question=f"q{k}", answer="5", task="arith", id=f"t/{k}") for k in range(3)]
    right = {"t/0": 3, "t/1": 2, "t/2": 0}

    def run_llm(engine, calls, game):
        seen = {}
        outputs = []
        for ex, _, _ in calls:
            k = seen[ex.id] = seen.get(ex.id, 0) + 1
            outputs.append((S.parse_solution("Answer: " + ("5" if k <= right[ex.id] else "7"), "arith"), 1))
        return outputs
    monkeypatch.setattr(rollouts, "training_pool", lambda cfg: examples)
    monkeypatch.setattr(rollouts, "make_engine", lambda cfg, rank: None)
    monkeypatch.setattr(rollouts.deliberate, "run_llm", run_llm)
    cfg = train_rl.Config(target="leader", agents=3, questions=3, val_n=0)
    pool, stats = rollouts.peer_pool(cfg, 0, 1)
    assert [ex.id for ex, _ in pool] == ["t/1", "t/2"] and stats["kept"] == 2
    assert stats["peer_accuracy"] == pytest.approx((1 + 2 / 3) / 3)
    pool, _ = rollouts.peer_pool(train_rl.Config(target="leader", agents=3, questions=3, val_n=0, filter_easy=0), 0, 1)
    assert len(pool) == 3


@pytest.mark.slow
def test_llm_training_resumes_exactly_after_sigkill(tmp_path, default_model_dir):
    """--target agents on the default backbone (rewards vary: the format term), killed after step 2 of 3 and
    resumed: the same weights as an uninterrupted run, no metric step logged twice."""
    args = [str(ROOT / "train_rl.py"), "--target", "agents", "--algo", "magrpo", "--protocol", "parallel",
            "--agents", "1", "--questions-per-step", "2", "--group", "2", "--max-new-tokens", "24",
            "--format-reward", "0.5", "--steps", "3", "--save-every", "1", "--llm-lr", "1e-4", "--val-n", "4"]
    run(args + ["--out-dir", str(tmp_path / "whole")], tmp_path)
    killed = run(args + ["--out-dir", str(tmp_path / "resumed"), "--crash-at-step", "2"], tmp_path, check=False)
    assert killed.returncode == -9, killed.stderr[-2000:]
    resumed = run(args + ["--out-dir", str(tmp_path / "resumed")], tmp_path)
    assert "resuming from" in resumed.stderr
    whole = metrics(tmp_path / "whole")
    again = metrics(tmp_path / "resumed")
    assert [r["step"] for r in again] == [1, 2, 3]
    assert any(r["grad_norm"] > 0 for r in whole)  # the run learned something
    assert [r["mean_reward"] for r in again] == [r["mean_reward"] for r in whole]
    a, b = (torch.load(tmp_path / d / "checkpoint.pt", weights_only=False)["model"] for d in ("whole", "resumed"))
    assert max((a[k] - b[k]).abs().max().item() for k in a) == 0
