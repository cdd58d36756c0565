"""sft.py and train_rl.py (the meta-policy): the losses in process, then the scripts as users run
them (tests/launch.py, with the scripted arith engine or a tiny random model): plain python vs a
2-process torchrun, and a run killed with SIGKILL and resumed."""

import gc
import json
import weakref
from pathlib import Path

import pytest
import torch
from launch import metrics, run

import common
import deliberate as D
import softrank
import train_rl

ROOT = Path(__file__).resolve().parents[1]
GAME = [
    "--questions",
    "8",
    "--val-n",
    "4",
    "--agents",
    "3",
    "--rounds",
    "2",
    "--max-new-tokens",
    "8",
]


# ---------------------------------------------------------------- losses and helpers, in process
def synthetic_batch(n=64, rewards=(0.0, 1.0, 0.0, -1.0)):
    g = torch.Generator().manual_seed(0)
    own, peers = (
        torch.rand(n, len(D.OWN_FEATURES), generator=g),
        torch.rand(n, 2, len(D.PEER_FEATURES), generator=g),
    )
    return {
        "own": own,
        "peers": peers,
        "agent": torch.arange(n) % 3,
        "action": torch.randint(0, 4, (n,), generator=g),
        "rewards": torch.tensor([rewards] * n),
        "ref_logits": torch.zeros(n, 4),
        "old_logits": torch.zeros(n, 4),
    }


def rl_loss(policy, batch, cfg):
    return train_rl.rl_loss(policy(batch["own"], batch["peers"], batch["agent"]), batch, cfg)


@pytest.mark.parametrize(
    "algo,objective",
    [(algo, "expected") for algo in train_rl.ALGOS]
    + [(algo, objective) for algo in ("softrank", "grpo") for objective in ("unweighted", "eq4")],
)
def test_every_algo_moves_toward_the_best_action(algo, objective):
    torch.manual_seed(0)
    policy = D.MetaPolicy(agents=3)
    # Eq. 4 regresses beta * log(pi / pi_ref) onto A: at beta = 0 it has nothing to fit
    cfg = train_rl.Config(
        algo=algo, objective=objective, beta=0.1 if objective == "eq4" else 0.0, lam=0.0
    )
    batch = synthetic_batch()
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    before = torch.softmax(policy(batch["own"], batch["peers"], batch["agent"]), -1)[:, 1].mean()
    for _ in range(20):
        loss, stats = rl_loss(policy, batch, cfg)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = torch.softmax(policy(batch["own"], batch["peers"], batch["agent"]), -1)[:, 1].mean()
    assert after > before + 0.1 and stats["frac_zero_std"] == 0.0


@pytest.mark.parametrize("algo", ["softrank", "grpo"])
def test_corpus_objective_minimum_is_a_lower_bound_that_descent_reaches(algo):
    """The summary's objective_minimum: no logits do better, and free logits descended on the loss
    reach it."""
    g = torch.Generator().manual_seed(1)
    # ties, flat rows and several distinct values
    rewards = torch.randint(-1, 3, (32, 4), generator=g).float()
    tensors = {"rewards": rewards, "ref_logits": torch.randn(32, 4, generator=g)}
    cfg = train_rl.Config(algo=algo, objective="expected", beta=0.1, lam=0.02)
    _, minimum = train_rl.corpus_objective(torch.zeros(32, 4), tensors, cfg)
    logits = torch.randn(32, 4, generator=g, requires_grad=True)
    # far from it at first
    assert train_rl.corpus_objective(logits.detach(), tensors, cfg)[0] > minimum + 0.1
    optimizer = torch.optim.Adam([logits], lr=0.05)
    for _ in range(1500):
        value, _ = train_rl.corpus_objective(logits, tensors, cfg)
        assert value >= minimum - 1e-6
        loss, _ = train_rl.full_action_set_loss(
            logits, train_rl.action_advantages(rewards, cfg), tensors["ref_logits"], cfg
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert abs(value - minimum) < 1e-3
    assert train_rl.corpus_objective(logits, tensors, train_rl.Config(algo="ppo")) == (None, None)


def test_all_equal_rewards_teach_nothing_and_are_counted():
    policy = D.MetaPolicy(agents=3)
    batch = synthetic_batch(rewards=(1.0, 1.0, 1.0, 1.0))
    for algo in ("softrank", "grpo", "ppo"):
        loss, stats = rl_loss(policy, batch, train_rl.Config(algo=algo, beta=0.0, lam=0.0))
        assert stats["frac_zero_std"] == 1.0
        loss.backward()
        assert all(p.grad is None or p.grad.abs().max() == 0 for p in policy.parameters())
        policy.zero_grad()


def test_softrank_loss_ignores_reward_scale_and_exp_grpo_does_not():
    policy = D.MetaPolicy(agents=3)
    batch = synthetic_batch(rewards=(0.0, 1.0, 0.5, -1.0))

    def loss(algo, scale, transform):
        cfg = train_rl.Config(algo=algo, reward_scale=scale, reward_transform=transform)
        return rl_loss(policy, batch, cfg)[0].item()

    base = loss("softrank", 1.0, "none")
    assert loss("softrank", 0.1, "none") == base and loss("softrank", 10.0, "exp") == base
    assert loss("grpo", 10.0, "none") == pytest.approx(loss("grpo", 1.0, "none"), rel=1e-5)
    assert loss("grpo", 1.0, "exp") != pytest.approx(loss("grpo", 1.0, "none"), rel=1e-3)


def test_rewards_are_scaled_then_exponentiated():
    rewards = torch.tensor([[1.0, -0.5]])
    cfg = train_rl.Config(reward_scale=2.0)
    assert torch.equal(train_rl.transform_rewards(rewards, cfg), torch.tensor([[2.0, -1.0]]))
    cfg = train_rl.Config(reward_scale=2.0, reward_transform="exp")
    assert torch.equal(train_rl.transform_rewards(rewards, cfg), torch.tensor([[2.0, -1.0]]).exp())


def test_each_algo_and_objective_is_its_loss_in_softrank():
    """The advantages at the config's tau (not softrank's default) and each --objective's loss,
    each the same number as softrank.py's function called by hand."""
    g = torch.Generator().manual_seed(3)
    logits, ref, rewards = (torch.randn(6, 4, generator=g) for _ in range(3))
    cfg = train_rl.Config(algo="softrank", tau=2.0)
    advantages = train_rl.action_advantages(rewards, cfg)
    assert torch.equal(advantages, softrank.softrank_advantages(rewards, 2.0))
    assert not torch.allclose(advantages, softrank.softrank_advantages(rewards))
    by_hand = {
        "eq4": softrank.rank_matching_loss(logits, ref, advantages, 0.1),
        "unweighted": softrank.unweighted_softrank_loss(logits, advantages, ref, 0.1, 0.02),
        "expected": softrank.softrank_loss(logits, advantages, ref, 0.1, 0.02),
    }
    values = set()
    for objective, (loss, _) in by_hand.items():
        cfg = train_rl.Config(objective=objective, beta=0.1, lam=0.02)
        assert train_rl.full_action_set_loss(logits, advantages, ref, cfg)[0].item() == loss.item()
        values.add(loss.item())
    assert len(values) == 3


@pytest.mark.parametrize("algo", ["ppo", "reinforce"])
def test_a_behaviour_action_loss_is_its_policy_gradient_plus_the_regularizer(algo):
    """PPO's clipped ratio of the taken action against the behaviour policy's (both log-softmax
    over the actions), its advantage the reward over the state's mean reward, at the config's
    clip; REINFORCE's -R log pi; plus the full-action-set loss's KL and entropy terms, all in the
    stats."""
    g = torch.Generator().manual_seed(4)
    n = 6
    batch = {
        "rewards": torch.randint(-1, 3, (n, 4), generator=g).float(),
        "action": torch.tensor([0, 1, 2, 3, 1, 2]),
        "ref_logits": torch.randn(n, 4, generator=g),
        "old_logits": torch.randn(n, 4, generator=g),
    }
    logits = torch.randn(n, 4, generator=g)
    cfg = train_rl.Config(algo=algo, clip=0.05, beta=0.1, lam=0.02)
    loss, stats = train_rl.rl_loss(logits, batch, cfg)
    rows, taken = torch.arange(n), batch["action"]
    logp = torch.log_softmax(logits, -1)[rows, taken]
    reward = batch["rewards"][rows, taken]
    if algo == "ppo":
        old_logp = torch.log_softmax(batch["old_logits"], -1)[rows, taken]
        advantage = reward - batch["rewards"].mean(-1)
        pg = softrank.ppo_clip_loss(logp, old_logp, advantage, 0.05)[0]
        assert pg != softrank.ppo_clip_loss(logp, old_logp, advantage)[0]
    else:
        pg = -(reward * logp).mean()
    regularizer, terms = softrank.softrank_loss(
        logits, torch.zeros_like(logits), batch["ref_logits"], 0.1, 0.02
    )
    assert regularizer.item() != 0
    assert loss.item() == pytest.approx((pg + regularizer).item(), abs=1e-6)
    assert stats["loss"] == loss.item() and stats["pg"] == pytest.approx(pg.item(), abs=1e-6)
    assert stats["kl"] == terms["kl"] and stats["entropy"] == terms["entropy"]


def test_the_policys_logits_without_a_graph_and_a_frozen_independent_copy():
    # a network per agent: each row's agent index matters
    policy = D.MetaPolicy(agents=3, separate=True).eval()
    batch = synthetic_batch(8)
    logits = train_rl.policy_logits(policy, batch)
    assert not logits.requires_grad
    assert torch.equal(logits, policy(batch["own"], batch["peers"], batch["agent"]))
    policy.train()
    frozen = train_rl.frozen_copy(policy)
    assert policy.training and not frozen.training
    assert all(not m.training for m in frozen.modules()) and all(
        m.training for m in policy.modules()
    )
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(1.0)
    assert all(
        not torch.equal(a, b) and b.device.type == "cpu"
        for a, b in zip(policy.parameters(), frozen.parameters())
    )


def test_batch_schedule_is_a_function_of_its_arguments():
    a = common.batch_schedule(50, 16, 2, 0, "rl-0")
    assert len(a) == 2 * 3 and all(len(b) == 16 for b in a)  # the partial batch is dropped
    assert all(torch.equal(x, y) for x, y in zip(a, common.batch_schedule(50, 16, 2, 0, "rl-0")))
    assert not torch.equal(a[0], common.batch_schedule(50, 16, 2, 0, "rl-1")[0])
    # fewer states than a batch: one batch per epoch
    assert len(common.batch_schedule(5, 16, 3, 0, "x")) == 3


def test_distributed_meets_at_a_barrier_before_teardown(tmp_path, monkeypatch):
    """Ranks leave together (a gloo group torn down while a peer still writes rank-0 files aborted
    CI's torchrun run at exit), with the block's garbage in reference cycles (FSDP2's modules)
    collected first; a failed rank skips the barrier, where its peers would wait for it
    forever."""
    calls = []
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(common.dist, "init_process_group", lambda backend: calls.append(backend))
    monkeypatch.setattr(common.dist, "get_rank", lambda: 1)
    monkeypatch.setattr(common.dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(common.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(common.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(common.dist, "barrier", lambda: calls.append("barrier"))
    monkeypatch.setattr(common.dist, "destroy_process_group", lambda: calls.append("destroy"))
    gc.disable()  # no collection but the one the block ends with
    try:
        with common.distributed(tmp_path / "out") as (rank, world, device):
            calls.append(("train", rank, world, device.type))
            cycle = torch.nn.Module()
            cycle.me = [cycle]
            weakref.finalize(cycle, calls.append, "cycle freed")
            del cycle
    finally:
        gc.enable()
    assert calls == ["gloo", ("train", 1, 2, "cpu"), "cycle freed", "barrier", "destroy"]
    assert (tmp_path / "out").is_dir()
    calls.clear()
    with pytest.raises(ValueError):
        with common.distributed(tmp_path / "out"):
            raise ValueError("bad batch")
    assert calls == ["gloo", "destroy"]


# ---------------------------------------------------------------- the scripts, as users run them
def weights(out_dir):
    """The tensors of the policy a run saved in out_dir."""
    return common.load_tensors(Path(out_dir) / "policy.safetensors", "policy")[0]


def max_difference(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in a)


def ddp_difference(a, b):
    """One process against two: (the largest weight difference, that of the attention's key bias).
    The key bias adds the same amount to every score of a query, which the softmax cancels: its
    gradient is 0 in exact arithmetic, rounding noise in practice, and Adam divides that noise by
    its own scale, so the bias drifts by up to ~lr per step, differently in each run (measured:
    2e-5, the other weights 7e-7 on an AMD EPYC). A weight whose gradient is almost 0 (a unit the
    GELU has nearly switched off) drifts the same way, less: on an Intel Xeon one weight of the
    concede head moved 1.06e-5, every other weight but the key bias below 1.5e-6."""
    key = {}
    for k in a:
        if k.endswith("attend.in_proj_bias"):
            hidden = a[k].numel() // 3
            key[k] = (a[k] - b[k])[hidden : 2 * hidden].abs().max().item()
            a, b = dict(a), dict(b)
            a[k], b[k] = a[k].clone(), b[k].clone()
            a[k][hidden : 2 * hidden] = b[k][hidden : 2 * hidden] = 0
    return max_difference(a, b), max(key.values())


@pytest.fixture(scope="session")
def sft_runs(tmp_path_factory):
    """sft.py with the scripted arith engine, once with python and once with a 2-process
    torchrun. Made once: the tests that read it share a worker (xdist_group "sft_runs") and keep
    it while other modules' tests run between them."""
    root = tmp_path_factory.mktemp("sft")
    out = {}
    for name, torchrun in (("single", False), ("torchrun", True)):
        run(
            [
                str(ROOT / "sft.py"),
                *GAME,
                "--epochs",
                "3",
                "--batch-size",
                "16",
                "--out-dir",
                str(root / name),
            ],
            root,
            torchrun,
            scripted=True,
        )
        out[name] = root / name
    return out


# train_rl.py from sft_runs' policy: SoftRankPO with the policy-gradient term at work
RL_ARGS = [*GAME, "--epochs", "3", "--batch-size", "16", "--lam", "0.05"]


@pytest.fixture(scope="session")
def rl_runs(sft_runs, tmp_path_factory):
    """train_rl.py from sft_runs' policy (RL_ARGS), once with python and once with a 2-process
    torchrun, made once for the tests of the "sft_runs" group that read it."""
    root = tmp_path_factory.mktemp("rl")
    init = ["--init", str(sft_runs["single"] / "policy.safetensors")]
    out = {}
    for name, torchrun in (("single", False), ("torchrun", True)):
        out[name] = root / name
        args = [str(ROOT / "train_rl.py"), *init, *RL_ARGS, "--out-dir", str(out[name])]
        run(args, root, torchrun, scripted=True)
    return out


@pytest.mark.xdist_group("sft_runs")
def test_sft_single_and_torchrun_agree(sft_runs):
    single, multi = sft_runs["single"], sft_runs["torchrun"]
    corpus = [common.load_file(d / "corpus.pt", "corpus")["rows"] for d in (single, multi)]
    assert [r["key"] for r in corpus[0]] == [r["key"] for r in corpus[1]] and len(corpus[0]) > 20
    assert [r["label"] for r in corpus[0]] == [r["label"] for r in corpus[1]]
    # right and wrong answers: persist, refine and concede labels
    assert len({r["label"] for r in corpus[0]}) >= 3
    # same global batches, gradients summed in another
    # order: equal up to float rounding (through Adam)
    rest, key_bias = ddp_difference(weights(single), weights(multi))
    assert rest < 1e-4 and key_bias < 1e-3
    lines = metrics(single)
    assert [r["step"] for r in lines] == list(range(1, len(lines) + 1)) and "loss" in lines[0]
    summary = json.loads((single / "summary.json").read_text())
    assert summary["states"] == len(corpus[0])
    assert set(summary["label_distribution"]) == {"persist", "refine", "concede"}
    checkpoint = common.load_file(single / "checkpoint.pt", "checkpoint")
    assert {"model", "optimizer", "counters", "rng", "config"} <= checkpoint.keys()


@pytest.mark.xdist_group("sft_runs")
def test_train_rl_single_and_torchrun_agree(sft_runs, rl_runs):
    """On a corpus with non-flat reward vectors, so the policy-gradient term is at work, not only KL
    and entropy: one process and two take the same steps. SoftRankPO, the method; the other
    losses share its batches and normalizer (test_every_algo_moves_toward_the_best_action in
    process, PPO as a script in the SIGKILL test)."""
    a, b = weights(rl_runs["single"]), weights(rl_runs["torchrun"])
    rest, key_bias = ddp_difference(a, b)
    assert rest < 1e-4 and key_bias < 1e-3
    # training moved the policy
    assert max_difference(a, weights(sft_runs["single"])) > 1e-4
    summary = json.loads((rl_runs["single"] / "summary.json").read_text())
    assert {"corpus", "val_accuracy", "val_actions", "policy_actions_on_corpus"} <= summary.keys()
    assert summary["corpus"]["frac_zero_std"] < 0.9 and summary["corpus"]["frac_multi_valued"] > 0
    corpus = common.load_file(rl_runs["single"] / "corpus-0.pt", "corpus")["rows"]
    assert all(len(r["rewards"]) == 4 and len(r["old_logits"]) == 4 for r in corpus)
    assert any(abs(r["pg"]) > 0 for r in metrics(rl_runs["single"]) if "pg" in r)
    # stage 1's default state reads what the texts tell, and stage 2 keeps the state it starts from
    for run_dir in (sft_runs["single"], rl_runs["single"]):
        assert D.load_policy(run_dir / "policy.safetensors").config["features"] == "text"


@pytest.mark.xdist_group("sft_runs")
def test_validation_during_training_does_not_change_the_policy(sft_runs, rl_runs, tmp_path):
    """--eval-every plays validation games between optimizer steps: they log accuracy and must leave
    training alone (no shared random state), so table c's curves belong to the policies the other
    tables use. Against rl_runs' single run, the same settings without --eval-every."""
    init = ["--init", str(sft_runs["single"] / "policy.safetensors")]
    args = [str(ROOT / "train_rl.py"), *init, *RL_ARGS, "--eval-every", "3"]
    run(args + ["--out-dir", str(tmp_path / "3")], tmp_path, scripted=True)
    assert max_difference(weights(rl_runs["single"]), weights(tmp_path / "3")) == 0
    validated = [r["step"] for r in metrics(tmp_path / "3") if "val_accuracy" in r]
    steps = max(r["step"] for r in metrics(tmp_path / "3") if "loss" in r)
    assert validated == [*range(0, steps + 1, 3), *([steps] if steps % 3 else [])]


@pytest.mark.xdist_group("sft_runs")
def test_train_rl_resumes_exactly_after_sigkill(sft_runs, tmp_path):
    """Two online iterations on non-flat corpora, killed inside the second and resumed:
    bit-identical. PPO: its corpus also carries the behaviour policy's logits, which the resumed
    iteration must find as the killed one wrote them; the checkpoint is every algo's."""
    args = [
        str(ROOT / "train_rl.py"),
        "--init",
        str(sft_runs["single"] / "policy.safetensors"),
        *GAME,
        "--iterations",
        "2",
        "--epochs",
        "3",
        "--batch-size",
        "8",
        "--save-every",
        "4",
        "--lam",
        "0.05",
        "--algo",
        "ppo",
    ]
    run(args + ["--out-dir", str(tmp_path / "whole")], tmp_path, scripted=True)
    summary = json.loads((tmp_path / "whole" / "summary.json").read_text())
    assert summary["corpus"]["frac_zero_std"] < 0.9
    # each iteration's steps: its own corpus's (the second is collected by the first's policy)
    steps = [
        len(
            common.batch_schedule(
                len(common.load_file(tmp_path / "whole" / f"corpus-{k}.pt", "corpus")["rows"]),
                8,
                3,
                0,
                f"rl-{k}",
            )
        )
        for k in (0, 1)
    ]
    crash = steps[0] + 3  # inside the second iteration, after a checkpoint of the first
    killed = run(
        args + ["--out-dir", str(tmp_path / "resumed"), "--crash-at-step", str(crash)],
        tmp_path,
        check=False,
        scripted=True,
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert not (tmp_path / "resumed" / "policy.safetensors").exists()
    resumed = run(args + ["--out-dir", str(tmp_path / "resumed")], tmp_path, scripted=True)
    assert "resuming from" in resumed.stderr
    a, b = (weights(tmp_path / d) for d in ("whole", "resumed"))
    assert max_difference(a, b) == 0
    # the log is the uninterrupted run's: no step twice
    steps_logged = [r["step"] for r in metrics(tmp_path / "resumed") if "loss" in r]
    assert steps_logged == list(range(1, sum(steps) + 1))
    # the same command once more: the run is complete,
    # nothing is trained, validated or rewritten again
    before = {
        name: (tmp_path / "resumed" / name).read_bytes()
        for name in ("metrics.jsonl", "summary.json", "policy.safetensors")
    }
    again = run(args + ["--out-dir", str(tmp_path / "resumed")], tmp_path, scripted=True)
    assert "resuming from" in again.stderr and "is finished" in again.stderr
    assert before == {name: (tmp_path / "resumed" / name).read_bytes() for name in before}
    # the same folder under other settings is refused, not passed off as a run of them
    other = run(
        args + ["--out-dir", str(tmp_path / "resumed"), "--beta", "0.5"],
        tmp_path,
        check=False,
        scripted=True,
    )
    assert other.returncode != 0 and "beta: 0.05 there, 0.5 now" in other.stderr
    assert before == {name: (tmp_path / "resumed" / name).read_bytes() for name in before}


def test_scripts_reject_bad_input(tmp_path, tiny_model_dir):
    """A refusal found once the run has started (too few training questions for the flags) ends
    with its line and status 2; the refusals of the flags alone, before anything loads, are
    tests/test_bad_input.py's (in process, and as a subprocess's one line and status 2)."""
    proc = run(
        [str(ROOT / "sft.py"), "--model", tiny_model_dir, "--questions", "100000"],
        tmp_path,
        check=False,
    )
    assert proc.returncode == 2 and "not enough" in proc.stderr
