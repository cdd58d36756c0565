"""Stage 2 (DESIGN §6): SoftRankPO on an offline corpus of counterfactual rewards.

    python train_rl.py --init runs/sft/policy.pt --out-dir runs/rl             # -> runs/rl/policy.pt
    torchrun --nproc_per_node=2 train_rl.py --init runs/sft/policy.pt --out-dir runs/rl
    python eval.py --protocols mpdf=runs/rl/policy.pt

1. Corpus: play the game with the current policy (pi_sft at first; actions sampled) on training questions.
   At every visited (agent, round) state, every action is evaluated with the peers' actions held at what
   they did: R(s) in R^K (deliberate.play(counterfactual=True)). Stored: state, R, behaviour action and
   the behaviour policy's logits.
2. Update, with pi_ref = pi_sft fixed. The algorithms differ only in the policy-gradient term; all of them
   add beta * KL(pi || pi_ref) - lam * H(pi), exact over the K actions:
     softrank   -sum_k A_k log pi(a_k|s), A = SoftRank advantages of R(s) (paper Eq. 2-3): only the order
                of the K rewards matters
     grpo       the same with A = z-scored R(s)
     ppo        clipped surrogate on the behaviour action, ratio to the behaviour policy (pi_sft in the
                first iteration), advantage R(s, a_b) - mean R(s)
     reinforce  -R(s, a_b) log pi(a_b|s): plain REINFORCE on the behaviour action, no baseline, no ratio
3. --iterations M re-collects the corpus with the current policy before each of the M updates (online).

--reward-scale and --reward-transform (none, exp) change R before the advantages: the robustness study.
States whose K rewards are all equal teach the full-action-set losses nothing; their share is logged as
frac_zero_std. Every rank plays its shard of the questions; the corpus is gathered, so the update is the
same DDP schedule over the whole corpus on any number of processes (sft.train_steps).
"""
import copy
import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

import deliberate
import softrank
from eval import parse_config
from sft import (MetricsLog, action_distribution, barrier, batch_schedule, collect_states, crash_if_asked,
                 evaluate_policy, init_distributed, load_checkpoint, load_or_collect, save_checkpoint,
                 states_to_tensors, train_steps, training_questions, wrap_ddp)

ALGOS = ("softrank", "grpo", "ppo", "reinforce")


@dataclass
class Config:
    init: str = "runs/sft/policy.pt"  # pi_sft: the starting policy and pi_ref
    algo: str = "softrank"         # softrank | grpo | ppo | reinforce
    tau: float = 0.5               # SoftRank temperature of the quantiles (paper's best: 0.8)
    beta: float = 0.05             # KL(pi || pi_ref) weight
    lam: float = 0.01              # entropy bonus
    clip: float = 0.2              # PPO ratio clip
    reward_scale: float = 1.0      # R -> scale * R ...
    reward_transform: str = "none"  # ... then "exp": R -> exp(R)
    iterations: int = 1            # corpus collections (each followed by an update)
    epochs: int = 10               # passes over each corpus
    batch_size: int = 256          # states per optimizer step, over all ranks
    lr: float = 1e-3
    weight_decay: float = 0.0
    task: str = "arith"
    path: str = ""
    level: int = 0
    questions: int = 256           # training questions per iteration (a fresh slice each iteration)
    val_n: int = 64                # held-out training-split questions for the logged accuracy
    eval_every: int = 0            # optimizer steps between validation games (0: after each iteration only)
    seed: int = 0
    agents: int = 3
    rounds: int = 3
    temperature: float = 0.7
    max_new_tokens: int = 192
    trailer: bool = False
    model: str = ""                # HF checkpoint directory; empty: the embedded default backbone
    dtype: str = "float32"
    engine_batch_size: int = 64
    cache_dir: str = "cache/generations"
    out_dir: str = "runs/rl"
    save_every: int = 50
    crash_at_step: int = 0         # testing resume: SIGKILL this process right after this optimizer step


def transform_rewards(rewards, cfg):
    rewards = rewards * cfg.reward_scale
    return rewards.exp() if cfg.reward_transform == "exp" else rewards


def make_loss(cfg):
    def loss_fn(model, batch):
        logits = model(batch["own"], batch["peers"], batch["agent"])
        rewards = transform_rewards(batch["rewards"], cfg)
        if cfg.algo in ("softrank", "grpo"):
            advantages = (softrank.softrank_advantages(rewards, cfg.tau) if cfg.algo == "softrank"
                          else softrank.grpo_advantages(rewards))
            loss, stats = softrank.softrank_loss(logits, advantages, batch["ref_logits"], cfg.beta, cfg.lam)
        else:
            taken = batch["action"][:, None]
            logp = torch.log_softmax(logits, -1).gather(-1, taken)[:, 0]
            reward_taken = rewards.gather(-1, taken)[:, 0]
            if cfg.algo == "ppo":
                old_logp = torch.log_softmax(batch["old_logits"], -1).gather(-1, taken)[:, 0]
                pg, stats = softrank.ppo_clip_loss(logp, old_logp, reward_taken - rewards.mean(-1), cfg.clip)
            else:
                pg, stats = -(reward_taken * logp).mean(), {}
            # the KL and entropy terms of the full-action-set loss (its policy-gradient term is 0 here)
            regularizer, reg_stats = softrank.softrank_loss(logits, torch.zeros_like(logits), batch["ref_logits"],
                                                            cfg.beta, cfg.lam)
            loss = pg + regularizer
            stats.update(pg=pg.item(), kl=reg_stats["kl"], entropy=reg_stats["entropy"])
        stats["frac_zero_std"] = (rewards.amax(-1) == rewards.amin(-1)).float().mean().item()
        stats["loss"] = loss.item()
        return loss, stats
    return loss_fn


def policy_logits(policy, tensors):
    with torch.no_grad():
        return policy(tensors["own"], tensors["peers"], tensors["agent"])


def main(cfg):
    if cfg.algo not in ALGOS:
        sys.exit(f"unknown --algo {cfg.algo!r}: choose one of {', '.join(ALGOS)}")
    if cfg.reward_transform not in ("none", "exp"):
        sys.exit(f"unknown --reward-transform {cfg.reward_transform!r}: choose none or exp")
    if not Path(cfg.init).is_file():
        sys.exit(f"--init {cfg.init!r} is not a policy checkpoint: run sft.py first")
    rank, world, device = init_distributed()
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    policy = deliberate.load_policy(cfg.init).train()
    reference = deliberate.load_policy(cfg.init)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    counters = load_checkpoint(out, policy, optimizer) or {"iteration": 0, "step": 0, "global_step": 0}
    if counters["global_step"] and rank == 0:
        print(f"resuming from {out / 'checkpoint.pt'}: iteration {counters['iteration']}, "
              f"step {counters['step']}", file=sys.stderr)
    log = MetricsLog(out, rank, counters["global_step"])
    engine = deliberate.Engine(model_path=cfg.model or None, dtype=cfg.dtype, batch_size=cfg.engine_batch_size,
                               cache_dir=cfg.cache_dir or None, rank=rank, progress=rank == 0)
    model = wrap_ddp(policy.to(device), device, find_unused=policy.config["separate"])
    n_actions = 1 + cfg.agents
    summary = {}
    _, val_questions = training_questions(cfg)

    def snapshot():  # a CPU copy to play with: the trained module stays where DDP put it
        return copy.deepcopy(policy).cpu().eval()

    validated = {}

    def validate(global_step):
        if global_step in validated:  # the last step was validated already
            return validated[global_step]
        result = validated[global_step] = evaluate_policy(engine, val_questions, snapshot(), cfg, rank, world, device)
        log.write(step=global_step, **result)
        if rank == 0:
            print(f"step {global_step}: val accuracy {result['val_accuracy']:.3f}, actions "
                  f"{result['val_actions']}", file=sys.stderr)
        return result

    base = counters["global_step"] - counters["step"]  # global step at the start of the current iteration
    for iteration in range(counters["iteration"], cfg.iterations):
        questions, _ = training_questions(cfg, iteration)
        behaviour = snapshot()

        def collect():
            rows = collect_states(engine, questions, behaviour, cfg, counterfactual=True, rank=rank, world=world,
                                  desc=f"corpus {iteration}")
            for row, logits in zip(rows, policy_logits(behaviour, states_to_tensors(rows)).tolist()):
                row["old_logits"] = logits  # what the behaviour actions were sampled from (PPO's ratio)
            return rows

        rows = load_or_collect(out / f"corpus-{iteration}.pt", collect, rank)
        tensors = states_to_tensors(rows)
        tensors["old_logits"] = torch.tensor([r["old_logits"] for r in rows])
        tensors["ref_logits"] = policy_logits(reference, tensors)
        rewards = tensors["rewards"]
        corpus_stats = {"states": len(rows), "frac_zero_std": float((rewards.amax(-1) == rewards.amin(-1)).float().mean()),
                        "behaviour_actions": action_distribution(tensors["action"], n_actions),
                        "mean_reward_taken": float(rewards.gather(-1, tensors["action"][:, None]).mean()),
                        "mean_reward_best": float(rewards.amax(-1).mean())}
        if rank == 0:
            print(f"iteration {iteration}: corpus {json.dumps(corpus_stats)}", file=sys.stderr)
        batches = batch_schedule(len(rows), cfg.batch_size, cfg.epochs, cfg.seed, f"rl-{iteration}")
        first = counters["step"] if iteration == counters["iteration"] else 0
        if base == 0 and first == 0 and cfg.eval_every:
            validate(0)

        def on_step(step, stats):
            global_step = base + step
            log.write(step=global_step, iteration=iteration, **stats)
            if cfg.eval_every and global_step % cfg.eval_every == 0:
                validate(global_step)
            if step % cfg.save_every == 0 or step == len(batches):
                if rank == 0:
                    save_checkpoint(out, policy, optimizer, {"iteration": iteration, "step": step,
                                                             "global_step": global_step}, cfg)
                barrier()
            crash_if_asked(cfg, global_step)

        train_steps(model, optimizer, tensors, make_loss(cfg), batches, first, on_step, rank, world, device,
                    desc=f"{cfg.algo} {iteration}")
        base += len(batches)
        if rank == 0:  # the next iteration starts from here
            save_checkpoint(out, policy, optimizer, {"iteration": iteration + 1, "step": 0, "global_step": base},
                            cfg)
        barrier()
        greedy = policy_logits(snapshot(), tensors).argmax(-1)
        summary = {"iteration": iteration, "corpus": corpus_stats,
                   "policy_actions_on_corpus": action_distribution(greedy, n_actions),
                   "reward_of_greedy_action": float(rewards.gather(-1, greedy[:, None]).mean())}
    summary.update(validate(base))  # the final policy
    if rank == 0:
        deliberate.save_policy(snapshot(), out / "policy.pt", train_config=dataclasses.asdict(cfg), summary=summary)
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        print(json.dumps(summary))
    if dist.is_initialized():
        dist.destroy_process_group()
    return summary


if __name__ == "__main__":
    main(parse_config(Config))
