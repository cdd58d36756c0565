"""Stage 2 (docs/design.md §6): SoftRankPO on an offline corpus of counterfactual rewards.

    python train_rl.py --init runs/sft/policy.safetensors --out-dir runs/rl  # -> runs/rl/policy.*
    torchrun --nproc_per_node=2 train_rl.py --init runs/sft/policy.safetensors --out-dir runs/rl
    python eval.py --protocols mpdf=runs/rl/policy.safetensors

Read top to bottom:
1. Corpus: play the game with the current policy (pi_sft at first; actions sampled) on training
   questions, every agent's REFINE sample drawn. At every visited (agent, round) state, every action
   is scored with the peers held at what they did: R(s) in R^K (deliberate.counterfactual_rewards).
   Stored: the state, R, the behaviour action and the behaviour policy's logits. The corpus is
   train()'s `corpus` argument: a study hands its own (experiments/LOG.md lists them).
2. Update, with pi_ref = pi_sft fixed (rl_loss). The algorithms differ only in the policy-gradient
   term; all of them add beta * KL(pi || pi_ref) - lam * H(pi), exact over the K actions:
     softrank   -sum_k pi(a_k|s) A_k, A = SoftRank advantages of R(s) (paper Eq. 2-3): only the
                order of the K rewards matters. Bounded; its optimum is
                pi* ∝ exp((A + beta log pi_ref) / (beta + lam)). --objective eq4 regresses onto it
                instead (paper Eq. 4); --objective unweighted is the literal -sum_k A_k log pi,
                which has no minimum, kept for comparison
     grpo       the same with A = z-scored R(s)
     ppo        clipped surrogate on the behaviour action, ratio to the behaviour policy (pi_sft in
                the first iteration), advantage R(s, a_b) - mean R(s)
     reinforce  -R(s, a_b) log pi(a_b|s): plain REINFORCE on the behaviour action, no baseline
3. --iterations M re-collects the corpus with the current policy before each update (online).

--reward-scale and --reward-transform (none, exp) change R before the advantages: the robustness
study. Every rank plays its shard of the questions; the corpus is gathered, so every rank holds all
of it and the update is the same schedule of global batches on any number of processes.
"""

import copy
import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

import softrank
from common import (
    MetricsLog,
    UsageError,
    all_reduce_sum,
    batch_schedule,
    check_at_least,
    check_choice,
    check_positive,
    crash_if_asked,
    distributed,
    global_mean,
    launch_world_size,
    load_checkpoint,
    load_made_under,
    parse_config,
    save_checkpoint,
    save_made_under,
    shard_rows,
    stack_rows,
    user_errors,
    wrap_ddp,
)
from data import check_task, training_questions
from deliberate import (
    ACTION_KINDS,
    PERSIST,
    REFINE,
    action_counts,
    action_distribution,
    check_team,
    concede,
    corpus_settings,
    counterfactual_rewards,
    load_policy,
    n_actions,
    play,
    play_shard,
    save_policy,
    state_rows,
)
from llm.team import check_engine, make_engine, resolve_engine_dtype, team_name
from solutions import GameConfig, check_game

# the algorithms that score every action of a state (the corpus knows each one's reward)
FULL_SET_ADVANTAGES = {
    "softrank": None,
    "grpo": softrank.grpo_advantages,
    "ranks": softrank.rank_advantages,
    "loo": softrank.rloo_advantages,
}
ALGOS = (*FULL_SET_ADVANTAGES, "ppo", "reinforce")
OBJECTIVES = ("expected", "unweighted", "eq4")


@dataclass
class Config:
    # the task
    task: str = "arith"
    """arith or split (built-in; split: its values dealt among the agents) or a file task: gsm8k,
    mawps, svamp, mc, math (with --path)"""
    path: str = ""
    """the data file of a file task"""
    level: int = 0
    """arith difficulty 1..4 (0: the task's default, easy)"""
    split_questions: float = 0.5
    """task split: the share of questions whose three values are dealt among the agents (the rest:
    every agent holds every value)"""
    values_held: int = 2
    """task split: how many of a split question's three values each agent holds (1 or 2)"""
    # the game
    seed: int = 0
    """seeds every LLM call (with the question id, agent and round), every sampled action, the
    questions, the data order and the initialization"""
    agents: int = 3
    """agents in the team"""
    rounds: int = 3
    """deliberation rounds after round 0"""
    temperature: float = 0.5
    """the agents' sampling temperature (the temperature study on validation questions)"""
    top_p: float = 1.0
    """nucleus sampling's probability mass"""
    max_new_tokens: int = 192
    """token budget of each LLM call"""
    trailer: bool = False
    """ask for the Steps / Confidence / Answer trailer (it costs the default backbone accuracy)"""
    critic: bool = False
    """run the critic pass: its p(Correct) in the state (always for a policy trained with it)"""
    vote: str = "mean_prob"
    """the vote's tie-break signal, the same for every protocol (solutions.VOTE_RULES)"""
    whole_solutions: bool = False
    """REFINE and the leader read every solution whole (default: REFINE sees peers' final answers
    and its own last 300 characters, the leader each solution's last 300)"""
    # the engine
    model: str = ""
    """HF checkpoint directory of the agents; empty: the embedded default backbone"""
    models: str = ""
    """one model per agent, comma-separated: an HF directory or `default`, + an adapter file
    (train_solver.py, train_magrpo.py) or not, e.g. default+a0.pt,default+a1.pt,default; agents on
    one base share its engine (empty: --model for every agent)"""
    dtype: str = "auto"
    """the backbone's dtype: float32 | bfloat16 | float16 | int8 | auto (bf16 where the CPU or GPU
    runs it natively, else fp32; docs/design.md §11)"""
    engine_batch_size: int = 128
    """engine slots (sequences decoded together; docs/design.md §11)"""
    cache_dir: str = "cache/generations"
    """the generation cache (empty: off); an identical run a second time makes no LLM call"""
    # the run
    questions: int = 256
    """training questions (train_rl.py: per iteration; train_mlpo.py: the candidates its filter
    keeps some of)"""
    val_n: int = 64
    """held-out training-split questions, never trained on, for the validation"""
    eval_every: int = 0
    """optimizer steps between validations (0: train_rl.py after each iteration only, the LLM-weight
    trainers none; else also at step 0 and the last)"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    save_every: int = 50
    """optimizer steps between checkpoints (and at the end)"""
    crash_at_step: int = 0
    """testing resume: SIGKILL this process right after this optimizer step (0: never)"""
    # the script's own
    init: str = "runs/sft/policy.safetensors"
    """pi_sft (sft.py's policy.safetensors): the starting policy and pi_ref"""
    algo: str = "softrank"
    """softrank | grpo (the z-scored rewards) | ranks (GOPO's evenly spaced ranks) | loo (C3's
    leave-one-out baseline) | ppo | reinforce (the last two on the behaviour action only): the
    paper's ablations and two later baselines, on the same corpus"""
    objective: str = "expected"
    """softrank, grpo, ranks, loo: expected (-sum_k pi_k A_k + KL - entropy, bounded) | eq4 (rank
    matching, paper Eq. 4) | unweighted (the literal -sum_k A_k log pi_k, unbounded, for
    comparison)"""
    tau: float = 0.5
    """SoftRank temperature of the quantiles (softrank.softrank_advantages, with --algo softrank;
    the study's choice, the paper's best: 0.8)"""
    beta: float = 0.05
    """weight of KL(pi || pi_ref)"""
    lam: float = 0.01
    """weight of the entropy bonus"""
    refine_cost: float = 0.5
    """a REFINE's reward pays this per 1000 tokens (prompt + completion) it spends: the study's
    choice (results/README.md)"""
    clip: float = 0.2
    """PPO's ratio clip"""
    reward_scale: float = 1.0
    """R -> scale * R before the advantages (the robustness study)"""
    reward_transform: str = "none"
    """none | exp: R -> exp(R) after the scale (the robustness study)"""
    iterations: int = 1
    """corpus collections, each followed by an update (more than 1: online SoftRankPO)"""
    epochs: int = 50
    """passes over each corpus (the update is cheap: the corpus's LLM calls cost the time)"""
    batch_size: int = 64
    """states per optimizer step, over all ranks"""
    lr: float = 1e-3
    """AdamW learning rate"""
    out_dir: str = "runs/rl"
    """where policy.safetensors (with its settings in policy.json), summary.json, metrics.jsonl,
    the corpora and the checkpoint go"""


# --------------------------------------------------------------------------------------------------
# 1. The corpus: every action of every visited state scored (docs/design.md §6)
# --------------------------------------------------------------------------------------------------
def corpus_games(engine, questions, behaviour, cfg, *, ranks, desc):
    """This rank's games of the corpus: the behaviour policy's actions sampled, every agent's
    REFINE sample drawn whether taken or not, each paying --refine-cost."""
    return play_shard(
        engine,
        questions,
        behaviour,
        GameConfig.of(cfg),
        ranks=ranks,
        desc=desc,
        refine_all=True,
        refine_cost=cfg.refine_cost,
    )


def scored_rows(games):
    """Every visited state of the games (all ranks', state_rows) with its counterfactual reward
    vector."""

    def rewards(g, m):
        return [{"rewards": v} for v in counterfactual_rewards(m, g.example.answer, g.example.task)]

    return state_rows(games, rewards)


def scored_states(engine, questions, behaviour, cfg, *, ranks, desc):
    """Stage 2's corpus: the states of the behaviour policy's games, each with the counterfactual
    reward of every action."""
    return scored_rows(corpus_games(engine, questions, behaviour, cfg, ranks=ranks, desc=desc))


def study_settings(cfg, corpus):
    """What a corpus depends on beyond this script's settings: the function that made it, and the
    fields a study's Config adds to this script's (its corpus reads them)."""
    own = {f.name for f in dataclasses.fields(Config)}
    added = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in own}
    return {"corpus": corpus.__name__, **added}


def best_action_kinds(rewards):
    """Which kind of action pays most in each state of a counterfactual corpus (docs/design.md §6):
    the share of states where PERSIST, REFINE or CONCEDE (to the best peer) alone reaches the
    highest reward, the share where kinds tie for it, and REFINE's mean reward minus PERSIST's."""
    by_kind = torch.stack(
        [rewards[:, PERSIST], rewards[:, REFINE], rewards[:, concede(0) :].amax(-1)], -1
    )
    winners = by_kind == by_kind.amax(-1, keepdim=True)
    sole = winners.sum(-1) == 1
    shares = {kind: (sole & winners[:, j]).float().mean() for j, kind in enumerate(ACTION_KINDS)}
    shares["tied"] = (~sole).float().mean()
    return {
        "best_kind": {kind: round(float(v), 4) for kind, v in shares.items()},
        "refine_minus_persist": float((rewards[:, REFINE] - rewards[:, PERSIST]).mean()),
    }


def corpus_statistics(tensors, k):
    """What a corpus of counterfactual rewards can teach. frac_zero_std: states whose K rewards are
    all equal (nothing to learn); frac_multi_valued: with three distinct rewards or more, the only
    ones where SoftRank and GRPO advantages can differ; best_action_kinds."""
    rewards = tensors["rewards"]
    distinct = torch.tensor([len(set(row)) for row in rewards.tolist()])
    return {
        "states": len(rewards),
        "frac_zero_std": float(softrank.flat_groups(rewards).float().mean()),
        "frac_multi_valued": float((distinct >= 3).float().mean()),
        "behaviour_actions": action_distribution(tensors["action"], k),
        "mean_reward_taken": float(rewards.gather(-1, tensors["action"][:, None]).mean()),
        "mean_reward_best": float(rewards.amax(-1).mean()),
        **best_action_kinds(rewards),
    }


# --------------------------------------------------------------------------------------------------
# 2. The update (docs/design.md §6)
# --------------------------------------------------------------------------------------------------
def transform_rewards(rewards, cfg):
    """The robustness study's change of reward scale: R -> scale * R, then exp(R) with
    --reward-transform exp."""
    rewards = rewards * cfg.reward_scale
    return rewards.exp() if cfg.reward_transform == "exp" else rewards


def action_advantages(rewards, cfg):
    """The advantage of every action of each state: SoftRank's (paper Eq. 2), or a baseline's."""
    if cfg.algo == "softrank":
        return softrank.softrank_advantages(rewards, cfg.tau)
    return FULL_SET_ADVANTAGES[cfg.algo](rewards)


def full_action_set_loss(logits, advantages, ref_logits, cfg):
    """The objective --objective names, on the advantages of all K actions (softrank, grpo)."""
    if cfg.objective == "eq4":
        return softrank.rank_matching_loss(logits, ref_logits, advantages, cfg.beta)
    if cfg.objective == "unweighted":
        return softrank.unweighted_softrank_loss(logits, advantages, ref_logits, cfg.beta, cfg.lam)
    return softrank.softrank_loss(logits, advantages, ref_logits, cfg.beta, cfg.lam)


def rl_loss(logits, batch, cfg):
    """The loss of a batch of corpus states (mean over states) and its statistics."""
    rewards = transform_rewards(batch["rewards"], cfg)
    if cfg.algo in FULL_SET_ADVANTAGES:
        loss, stats = full_action_set_loss(
            logits, action_advantages(rewards, cfg), batch["ref_logits"], cfg
        )
    else:  # the behaviour action only
        taken = batch["action"][:, None]
        logp = torch.log_softmax(logits, -1).gather(-1, taken)[:, 0]
        reward_taken = rewards.gather(-1, taken)[:, 0]
        if cfg.algo == "ppo":
            old_logp = torch.log_softmax(batch["old_logits"], -1).gather(-1, taken)[:, 0]
            advantage = reward_taken - rewards.mean(-1)
            pg, stats = softrank.ppo_clip_loss(logp, old_logp, advantage, cfg.clip)
        else:
            pg, stats = -(reward_taken * logp).mean(), {}
        # the KL and entropy terms of the full-action-set loss (its policy-gradient term is 0 here)
        no_advantage = torch.zeros_like(logits)
        regularizer, reg_stats = softrank.softrank_loss(
            logits, no_advantage, batch["ref_logits"], cfg.beta, cfg.lam
        )
        loss = pg + regularizer
        stats.update(pg=pg.item(), kl=reg_stats["kl"], entropy=reg_stats["entropy"])
    stats["frac_zero_std"] = softrank.flat_groups(rewards).float().mean().item()
    stats["loss"] = loss.item()
    return loss, stats


def corpus_objective(logits, tensors, cfg):
    """The objective over the whole corpus at `logits`, and its analytic minimum
    (softrank.optimal_policy; the expected-advantage objective only, else (None, None)): the bound
    the loss approaches."""
    if cfg.algo not in FULL_SET_ADVANTAGES or cfg.objective != "expected":
        return None, None
    advantages = action_advantages(transform_rewards(tensors["rewards"], cfg), cfg)
    ref = tensors["ref_logits"]
    best = softrank.optimal_policy(advantages, ref, cfg.beta, cfg.lam).log()
    return (
        full_action_set_loss(logits, advantages, ref, cfg)[0].item(),
        full_action_set_loss(best, advantages, ref, cfg)[0].item(),
    )


def policy_logits(policy, tensors):
    with torch.no_grad():
        return policy(tensors["own"], tensors["peers"], tensors["agent"])


def frozen_copy(policy):
    """A CPU copy to play games with: the trained module stays where DDP put it."""
    return copy.deepcopy(policy).cpu().eval()


def validate(engine, questions, policy, cfg, *, ranks, log, step):
    """The team's greedy accuracy, tokens per question and actions under `policy` on the validation
    questions, every rank on its shard, logged at `step`."""
    if not questions:  # --val-n 0
        return {"val_accuracy": None, "validation": "none (--val-n 0)"}
    games = play(
        engine, questions[ranks.rank :: ranks.world], frozen_copy(policy), GameConfig.of(cfg)
    )
    results = [g.transcript() for g in games]
    counts = action_counts(results)
    sums = all_reduce_sum(
        [sum(r["correct"] for r in results), sum(r["tokens"] for r in results), len(results)]
        + [counts[k] for k in ACTION_KINDS],
        ranks.device,
    )
    correct, tokens, n, counts = sums[0], sums[1], sums[2], sums[3:]
    result = {
        "val_accuracy": correct / n,
        "val_tokens": tokens / n,
        "val_actions": {k: round(c / max(sum(counts), 1), 4) for k, c in zip(ACTION_KINDS, counts)},
    }
    log.write(step=step, **result)
    if ranks.rank == 0:
        print(
            f"step {step}: val accuracy {result['val_accuracy']:.3f}, "
            f"actions {result['val_actions']}",
            file=sys.stderr,
        )
    return result


def check(cfg, world):
    """The whole configuration, before any model is loaded (a mistake: common.UsageError)."""
    check_task(cfg)
    check_game(GameConfig.of(cfg))
    check_engine(cfg, cfg.agents, cfg.max_new_tokens)
    check_at_least(1, questions=cfg.questions, save_every=cfg.save_every)
    check_at_least(0, val_n=cfg.val_n, eval_every=cfg.eval_every, weight_decay=cfg.weight_decay)
    check_choice("--algo", cfg.algo, ALGOS)
    check_choice("--objective", cfg.objective, OBJECTIVES)
    check_choice("--reward-transform", cfg.reward_transform, ("none", "exp"))
    check_at_least(1, iterations=cfg.iterations, epochs=cfg.epochs)
    # every rank takes rows of every global batch
    check_at_least(world, batch_size=cfg.batch_size)
    check_at_least(0, beta=cfg.beta, lam=cfg.lam, refine_cost=cfg.refine_cost)
    # a negative scale would reverse the rewards' order
    check_positive(lr=cfg.lr, tau=cfg.tau, clip=cfg.clip, reward_scale=cfg.reward_scale)
    if not Path(cfg.init).is_file():
        raise UsageError(f"--init {cfg.init!r} is not a policy file: run sft.py first")
    check_team(load_policy(cfg.init), cfg.agents, f"--init {cfg.init}")


def train(cfg, ranks, corpus=scored_states):
    """corpus(engine, questions, behaviour, cfg, ranks=, desc=) -> the rows of stage 2's corpus
    (scored_states'), where a study changes the method."""
    rank, world, device = ranks
    cfg, dtype_reason = resolve_engine_dtype(cfg, device)
    out = Path(cfg.out_dir)
    torch.manual_seed(cfg.seed)
    policy = load_policy(cfg.init).train()
    # a shared policy plays any team size (check_team): record this one
    policy.config["agents"] = cfg.agents
    reference = load_policy(cfg.init)  # pi_ref = pi_sft, fixed
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    counters = load_checkpoint(out, policy, optimizer, rank, cfg)
    counters = counters or {"iteration": 0, "step": 0, "global_step": 0}
    if counters["iteration"] >= cfg.iterations and (out / "summary.json").is_file():
        # a finished run, started again (by hand or by a study script): nothing to train or
        # overwrite
        if rank == 0:
            print(f"{out} is finished: {out / 'policy.safetensors'}", file=sys.stderr)
        return json.loads((out / "summary.json").read_text())
    log = MetricsLog(out, rank, counters["global_step"])
    engine = make_engine(cfg, cfg.agents, rank, device)
    model = wrap_ddp(policy.to(device), device, find_unused=policy.config["separate"])
    k = n_actions(cfg.agents)
    _, held_out = training_questions(cfg)
    settings = corpus_settings(
        cfg,
        GameConfig.of(cfg),
        questions=cfg.questions,
        val_n=cfg.val_n,
        init=cfg.init,
        refine_cost=cfg.refine_cost,
        **study_settings(cfg, corpus),
    )
    summary, validated = {}, {}  # validated: step -> the validation result at that step
    global_step = counters["global_step"]

    def validate_at(step):
        validated[step] = validate(engine, held_out, policy, cfg, ranks=ranks, log=log, step=step)

    for iteration in range(counters["iteration"], cfg.iterations):
        # 1. the corpus of this iteration, played by the current policy (collected once, then
        # read back)
        questions, _ = training_questions(cfg, iteration)
        behaviour = frozen_copy(policy)
        path = out / f"corpus-{iteration}.pt"
        rows = load_made_under(path, settings, "corpus")
        if rows is None:
            desc = f"corpus {iteration}"
            rows = corpus(engine, questions, behaviour, cfg, ranks=ranks, desc=desc)
            old_logits = policy_logits(behaviour, stack_rows(rows, ("own", "peers"), ("agent",)))
            for row, logits in zip(rows, old_logits.tolist()):
                # what the behaviour actions were sampled from (PPO's ratio)
                row["old_logits"] = logits
            save_made_under(rows, path, settings, rank)
        tensors = stack_rows(rows, ("own", "peers", "rewards", "old_logits"), ("agent", "action"))
        tensors["ref_logits"] = policy_logits(reference, tensors)
        corpus_stats = corpus_statistics(tensors, k)
        if rank == 0:
            print(f"iteration {iteration}: corpus {json.dumps(corpus_stats)}", file=sys.stderr)

        # 2. the update: epochs over the corpus in global batches, one optimizer step per batch
        batches = batch_schedule(len(rows), cfg.batch_size, cfg.epochs, cfg.seed, f"rl-{iteration}")
        first = counters["step"] if iteration == counters["iteration"] else 0
        if global_step == 0 and cfg.eval_every:
            validate_at(0)
        bar = tqdm(range(first, len(batches)), desc=f"{cfg.algo} {iteration}", disable=rank != 0)
        for step in bar:
            batch, weight = shard_rows(tensors, batches[step], rank, world, device)
            logits = model(batch["own"], batch["peers"], batch["agent"])
            loss, stats = rl_loss(logits, batch, cfg)
            (loss * weight).backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

            global_step += 1
            stats = global_mean(stats, len(batch["agent"]), device)
            stats["grad_norm"] = float(grad_norm)
            bar.set_postfix(loss=f"{stats['loss']:.4f}")
            log.write(step=global_step, iteration=iteration, **stats)
            if cfg.eval_every and global_step % cfg.eval_every == 0:
                validate_at(global_step)
            if (step + 1) % cfg.save_every == 0 or step + 1 == len(batches):
                at = {"iteration": iteration, "step": step + 1, "global_step": global_step}
                save_checkpoint(out, policy, optimizer, at, cfg, rank)
            crash_if_asked(cfg, global_step)

        # the next iteration starts from here
        at = {"iteration": iteration + 1, "step": 0, "global_step": global_step}
        save_checkpoint(out, policy, optimizer, at, cfg, rank)
        final_logits = policy_logits(frozen_copy(policy), tensors)
        greedy = final_logits.argmax(-1)
        objective, minimum = corpus_objective(final_logits, tensors, cfg)
        summary = {
            "iteration": iteration,
            "corpus": corpus_stats,
            "objective_on_corpus": objective,
            "objective_minimum": minimum,
            "policy_actions_on_corpus": action_distribution(greedy, k),
            "reward_of_greedy_action": float(tensors["rewards"].gather(-1, greedy[:, None]).mean()),
        }

    # 3. the final policy: validated (unless its last step was), saved with its settings and summary
    if global_step not in validated:
        validate_at(global_step)
    summary.update(
        validated[global_step], team=team_name(cfg), dtype=cfg.dtype, dtype_reason=dtype_reason
    )
    if rank == 0:
        extra = dict(train_config=dataclasses.asdict(cfg), summary=summary)
        save_policy(frozen_copy(policy), out / "policy.safetensors", **extra)
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    config = parse_config(Config, description=__doc__.split("\n\n")[0])
    with user_errors(config.out_dir):
        check(config, launch_world_size())
        with distributed(config.out_dir) as ranks:
            train(config, ranks)
