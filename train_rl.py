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
     softrank   -sum_k pi(a_k|s) A_k, A = SoftRank advantages of R(s) (paper Eq. 2-3): only the order of the
                K rewards matters. The expected advantage is bounded; its optimum is
                pi* ∝ exp((A + beta log pi_ref) / (beta + lam)). --objective eq4 regresses onto it instead
                (paper Eq. 4); --objective unweighted is the literal -sum_k A_k log pi, which has no minimum
                (softrank.unweighted_softrank_loss), kept for comparison
     grpo       the same with A = z-scored R(s)
     ppo        clipped surrogate on the behaviour action, ratio to the behaviour policy (pi_sft in the
                first iteration), advantage R(s, a_b) - mean R(s)
     reinforce  -R(s, a_b) log pi(a_b|s): plain REINFORCE on the behaviour action, no baseline, no ratio
3. --iterations M re-collects the corpus with the current policy before each of the M updates (online).

--reward-scale and --reward-transform (none, exp) change R before the advantages: the robustness study.
States whose K rewards are all equal teach the full-action-set losses nothing; their share is logged as
frac_zero_std. Every rank plays its shard of the questions; the corpus is gathered, so the update is the
same DDP schedule over the whole corpus on any number of processes (training.train_steps).

--target agents trains the agents' LLM weights instead (MAGRPO, DESIGN §8):
    python train_rl.py --target agents --algo magrpo --protocol debate --agents 3 --rounds 1 --out-dir runs/magrpo
    python eval.py --model runs/magrpo/model --protocols debate

--target leader trains one leader LLM over frozen peers (MLPO, DESIGN §8): the peers' solutions to the
training questions are generated once (engine + cache); questions the peers already get right
(>= --filter-easy of them) are dropped; the leader reads a question and its peers' solutions and answers,
G samples per prompt, reward = correctness, group advantages, Dr.GRPO's constant normalizer by default:
    python train_rl.py --target leader --algo magrpo --agents 3 --out-dir runs/mlpo
    python eval.py --protocols leader=runs/mlpo/model          # peers answer, the trained leader decides
"""
import copy
import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

import rollouts
import softrank
from corpus import (action_distribution, collect_states, corpus_statistics, evaluate_policy, load_or_collect,
                    make_engine, states_to_tensors, training_pool, training_questions)
from engine import Engine
from policy import load_policy, save_policy
from state import VOTE_RULES, n_actions
from training import (MetricsLog, accumulating, all_reduce_sum, batch_schedule, completion_batch,
                      completion_logprobs, crash_if_asked, load_checkpoint, parse_config, run_distributed,
                      save_checkpoint, train_steps, wrap_ddp)

ALGOS = ("softrank", "grpo", "ppo", "reinforce")
OBJECTIVES = ("expected", "unweighted", "eq4")


@dataclass
class Config:
    init: str = "runs/sft/policy.pt"  # pi_sft: the starting policy and pi_ref
    algo: str = "softrank"         # softrank | grpo | ppo | reinforce
    objective: str = "expected"    # expected: -sum_k pi_k A_k + KL, entropy (bounded; softrank.softrank_loss) |
    #                                unweighted: the literal -sum_k A_k log pi_k (unbounded, for comparison) |
    #                                eq4: rank matching (softrank.rank_matching_loss); for softrank and grpo
    tau: float = 0.5               # SoftRank temperature of the quantiles (paper's best: 0.8)
    beta: float = 0.05             # KL(pi || pi_ref) weight
    lam: float = 0.01              # entropy bonus
    refine_cost: float = 0.5       # a REFINE's reward pays this per 1000 tokens (prompt + completion) it spends:
    #                                the study's choice (README), same accuracy as 0 at half the tokens
    clip: float = 0.2              # PPO ratio clip
    reward_scale: float = 1.0      # R -> scale * R ...
    reward_transform: str = "none"  # ... then "exp": R -> exp(R)
    iterations: int = 1            # corpus collections (each followed by an update)
    # the study's update budget (experiments/run.py STUDY_RL): cheap, the corpus's LLM calls cost the time
    epochs: int = 50               # passes over each corpus
    batch_size: int = 64           # states per optimizer step, over all ranks
    lr: float = 1e-3
    weight_decay: float = 0.0
    task: str = "arith"
    path: str = ""
    level: int = 0
    questions: int = 256           # training questions per iteration (a fresh slice each iteration)
    val_n: int = 64                # held-out training-split questions for the logged accuracy
    eval_every: int = 0            # optimizer steps between validation games (0: after each iteration only;
    #                                --target agents / leader: 0 = no validation, else also at steps 0 and last)
    seed: int = 0
    agents: int = 3
    rounds: int = 3
    temperature: float = 0.5       # the agents' (README: the temperature study on validation questions)
    max_new_tokens: int = 192
    trailer: bool = False
    vote: str = "mean_prob"        # the vote's tie-break signal (state.VOTE_RULES); the critic: as --init's policy
    model: str = ""                # HF checkpoint directory; empty: the embedded default backbone
    dtype: str = "float32"        # the frozen backbone's; --target agents/leader: bfloat16 = autocast (fp32 weights)
    engine_batch_size: int = 128   # engine slots (README, "The engine": 1.2x the tokens/s of 64)
    cache_dir: str = "cache/generations"
    out_dir: str = "runs/rl"
    save_every: int = 50
    crash_at_step: int = 0         # testing resume: SIGKILL this process right after this optimizer step
    # --target agents (MAGRPO): the agents' LLM weights
    target: str = "policy"         # policy: the meta-policy (DESIGN §6); agents: MAGRPO; leader: MLPO (§8)
    protocol: str = "debate"       # parallel (independent answers, then the vote) | debate (R refine rounds)
    group: int = 4                 # G joint rollouts per question
    questions_per_step: int = 8    # questions per optimizer step, over all ranks (whole groups per rank)
    steps: int = 20                # optimizer steps
    rollout_temperature: float = 1.0  # sampling temperature of the rollouts, and of the log-probs
    loss_agg: str = ""             # token (DAPO) | seq (GRPO) | const (Dr.GRPO), see softrank.policy_gradient_loss;
    #                                "": the paper's, token for agents (MAGRPO), const for leader (MLPO)
    format_reward: float = 0.0     # + this times the fraction of the team's final answers that parse
    separate_agents: bool = False  # one LLM copy per agent (default: the agents share one set of weights)
    llm_lr: float = 1e-6
    micro_batch: int = 8           # sequences per forward/backward; gradients accumulate over the step
    llm_beta: float = 0.0          # k3 KL to the initial model; 0 as in both papers (no reference copy in memory)
    gradient_checkpointing: bool = False
    # --target leader (MLPO): --agents frozen peers, --questions candidate training questions
    peers_model: str = ""          # the peers' HF directory; empty: the same as --model
    filter_easy: float = 0.75      # drop questions where at least this fraction of the peers is right (0: keep all)


# ----------------------------------------------------------------------------------------------------
# --target policy: SoftRankPO (and its ablations) on the counterfactual corpus (DESIGN §6)
# ----------------------------------------------------------------------------------------------------
def transform_rewards(rewards, cfg):
    rewards = rewards * cfg.reward_scale
    return rewards.exp() if cfg.reward_transform == "exp" else rewards


def objective_loss(logits, advantages, ref_logits, cfg):
    """The full-action-set objective --objective names, on the advantages of every action."""
    if cfg.objective == "eq4":
        return softrank.rank_matching_loss(logits, ref_logits, advantages, cfg.beta)
    loss_fn = softrank.softrank_loss if cfg.objective == "expected" else softrank.unweighted_softrank_loss
    return loss_fn(logits, advantages, ref_logits, cfg.beta, cfg.lam)


def action_advantages(rewards, cfg):
    """The advantage of every action of a state (the full-action-set algorithms): SoftRank's or GRPO's."""
    if cfg.algo == "softrank":
        return softrank.softrank_advantages(rewards, cfg.tau)
    return softrank.grpo_advantages(rewards)


def corpus_objective(logits, tensors, cfg):
    """The objective over the whole corpus at `logits`, and its analytic minimum (the expected-advantage
    objective only: softrank.optimal_policy); None for the sampled-action algorithms."""
    if cfg.algo not in ("softrank", "grpo") or cfg.objective != "expected":
        return None, None
    advantages = action_advantages(transform_rewards(tensors["rewards"], cfg), cfg)
    best = softrank.optimal_policy(advantages, tensors["ref_logits"], cfg.beta, cfg.lam).log()
    return (objective_loss(logits, advantages, tensors["ref_logits"], cfg)[0].item(),
            objective_loss(best, advantages, tensors["ref_logits"], cfg)[0].item())


def make_loss(cfg):
    def loss_fn(model, batch):
        logits = model(batch["own"], batch["peers"], batch["agent"])
        rewards = transform_rewards(batch["rewards"], cfg)
        if cfg.algo in ("softrank", "grpo"):
            advantages = action_advantages(rewards, cfg)
            loss, stats = objective_loss(logits, advantages, batch["ref_logits"], cfg)
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


def train_policy(cfg, rank, world, device):
    """Stage 2 proper: SoftRankPO (or a baseline) on the counterfactual corpus, re-collected per iteration."""
    out = Path(cfg.out_dir)
    torch.manual_seed(cfg.seed)
    policy = load_policy(cfg.init).train()
    reference = load_policy(cfg.init)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    counters = load_checkpoint(out, policy, optimizer, rank, cfg) or {"iteration": 0, "step": 0, "global_step": 0}
    if counters["iteration"] >= cfg.iterations and (out / "summary.json").is_file():
        # a finished run, started again (by hand or by a study script): nothing to train, validate or overwrite
        if rank == 0:
            print(f"{out} is finished: {out / 'policy.pt'}", file=sys.stderr)
        return json.loads((out / "summary.json").read_text())
    log = MetricsLog(out, rank, counters["global_step"])
    engine = make_engine(cfg, rank)
    model = wrap_ddp(policy.to(device), device, find_unused=policy.config["separate"])
    k = n_actions(cfg.agents)
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
                                  desc=f"corpus {iteration}", refine_cost=cfg.refine_cost)
            for row, logits in zip(rows, policy_logits(behaviour, states_to_tensors(rows)).tolist()):
                row["old_logits"] = logits  # what the behaviour actions were sampled from (PPO's ratio)
            return rows

        rows = load_or_collect(out / f"corpus-{iteration}.pt", collect, rank)
        tensors = states_to_tensors(rows)
        tensors["old_logits"] = torch.tensor([r["old_logits"] for r in rows])
        tensors["ref_logits"] = policy_logits(reference, tensors)
        corpus_stats = corpus_statistics(tensors, k)
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
                save_checkpoint(out, policy, optimizer, {"iteration": iteration, "step": step,
                                                         "global_step": global_step}, cfg, rank)
            crash_if_asked(cfg, global_step)

        train_steps(model, optimizer, tensors, make_loss(cfg), batches, first, on_step, rank, world, device,
                    desc=f"{cfg.algo} {iteration}")
        base += len(batches)
        # the next iteration starts from here
        save_checkpoint(out, policy, optimizer, {"iteration": iteration + 1, "step": 0, "global_step": base}, cfg,
                        rank)
        final_logits = policy_logits(snapshot(), tensors)
        greedy = final_logits.argmax(-1)
        objective, minimum = corpus_objective(final_logits, tensors, cfg)
        summary = {"iteration": iteration, "corpus": corpus_stats,
                   "objective_on_corpus": objective, "objective_minimum": minimum,  # the bound the loss approaches
                   "policy_actions_on_corpus": action_distribution(greedy, k),
                   "reward_of_greedy_action": float(tensors["rewards"].gather(-1, greedy[:, None]).mean())}
    summary.update(validate(base))  # the final policy
    if rank == 0:
        save_policy(snapshot(), out / "policy.pt", train_config=dataclasses.asdict(cfg), summary=summary)
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        print(json.dumps(summary))
    return summary


# ----------------------------------------------------------------------------------------------------
# --target agents: MAGRPO (arXiv 2508.04652). G joint rollouts of the protocol per question, one joint
# reward per rollout, its advantage shared by every agent of the rollout; each agent learns from its own
# sampled tokens only. --target leader: MLPO (arXiv 2507.08960), G samples of the leader per question.
# On-policy: one optimizer step per batch of rollouts, no ratio, no clip. One step reads: rollouts
# (rollouts.py) -> group_advantages -> llm_update (the loss of the optimizer step).
# ----------------------------------------------------------------------------------------------------
AGENT_ALGOS = {"magrpo": softrank.mean_baseline_advantages, "grpo": softrank.grpo_advantages,
               "softrank": softrank.softrank_advantages}


def group_advantages(rewards, cfg):
    """(questions, G) rewards -> the advantage every sequence of a rollout shares."""
    advantage_fn = AGENT_ALGOS[cfg.algo]
    return advantage_fn(rewards, cfg.tau) if cfg.algo == "softrank" else advantage_fn(rewards)


def loss_aggregation(cfg):
    return cfg.loss_agg or ("const" if cfg.target == "leader" else "token")


def agents_loss(model, reference, batch, advantages, cfg, normalizer):
    """Token-level policy gradient on one micro-batch (+ llm_beta x the k3 KL to the initial model), divided
    by the step's global normalizer: prompt, peers' text and padding carry no gradient (loss mask)."""
    logp, mask = completion_logprobs(model, batch, cfg.rollout_temperature)
    loss, _ = softrank.policy_gradient_loss(logp, advantages, mask, loss_aggregation(cfg), normalizer)
    kl = torch.zeros(())
    if cfg.llm_beta:
        with torch.no_grad():
            ref_logp, _ = completion_logprobs(reference, batch, cfg.rollout_temperature)
        kl = torch.where(mask.bool(), softrank.kl_k3(logp, ref_logp), 0).sum() / normalizer
        loss = loss + cfg.llm_beta * kl
    return loss, kl.item()


def llm_update(models, wrapped, references, optimizer, sequences, advantages, cfg, pad, device, world):
    """The loss of one optimizer step over this rank's sequences, in micro-batches, then the step.

    The normalizer covers the whole step (every micro-batch of every rank) and is computed once; DDP
    averages gradients over ranks, hence the division by world. Returns the step's loss statistics."""
    counts = all_reduce_sum([len(sequences), sum(len(s.completion_ids) for s in sequences)], device)
    normalizer = {"token": counts[1], "seq": counts[0],
                  "const": counts[0] * cfg.max_new_tokens}[loss_aggregation(cfg)] / world
    loss_total, kl_total, trained = 0.0, 0.0, 0
    for e, (model, ddp) in enumerate(zip(models, wrapped)):
        mine = [s for s in sequences if len(models) == 1 or s.agent == e]
        if not cfg.llm_beta:
            # advantage 0 (a flat group) adds exactly 0 to the loss and its gradient: skip its forward and
            # backward. A rank left with nothing still runs one, for DDP's all-reduce.
            mine = [s for s in mine if advantages[s.question, s.sample] != 0] or mine[:1]
        trained += len(mine)
        chunks = range(0, len(mine), cfg.micro_batch)
        for k in chunks:
            chunk = mine[k:k + cfg.micro_batch]
            batch = completion_batch([(s.prompt_ids, s.completion_ids) for s in chunk], pad, device)
            chunk_advantages = advantages[[s.question for s in chunk], [s.sample for s in chunk]].to(device)
            with accumulating(ddp, last=k == chunks[-1]):
                # bf16 matmuls on fp32 master weights (what Trainer's --bf16 does); the forward only: backward
                # runs in the forward's dtypes anyway
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.dtype == "bfloat16"):
                    loss, kl = agents_loss(ddp, references[e], batch, chunk_advantages, cfg, normalizer)
                loss.backward()
            loss_total, kl_total = loss_total + loss.item(), kl_total + kl
    grad_norm = torch.nn.utils.clip_grad_norm_([p for m in models for p in m.parameters()], 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"loss": loss_total, "kl": kl_total, "trained": trained, "tokens": counts[1], "grad_norm": float(grad_norm)}


def llm_engines(cfg, device, rank, n_models):
    """(trained models, rollout engines). No generation cache: the weights change every step. With
    --dtype bfloat16 the rollouts come from a bf16 copy refreshed every step (autocast on fp32 weights would
    cast every weight at every decoded token)."""
    engines = [Engine(model_path=cfg.model or None, dtype="float32", device=str(device),
                      batch_size=cfg.engine_batch_size, rank=rank) for _ in range(n_models)]
    models = [e.model for e in engines]
    if cfg.dtype == "bfloat16":
        engines = [Engine(model=copy.deepcopy(m).to(torch.bfloat16), tokenizer=e.tokenizer, device=str(device),
                          batch_size=cfg.engine_batch_size, rank=rank) for m, e in zip(models, engines)]
    return models, engines


def refresh_rollout_weights(models, engines):
    for m, engine in zip(models, engines):
        m.eval()  # generation: the KV cache (gradient checkpointing turns it off in train mode)
        if engine.model is not m:
            with torch.no_grad():
                for rollout_weight, weight in zip(engine.model.parameters(), m.parameters()):
                    rollout_weight.copy_(weight)


def train_weights(cfg, rank, world, device):
    """--target agents (MAGRPO) and --target leader (MLPO): the same on-policy token-level loop; only the
    rollouts differ."""
    if cfg.questions_per_step % world:
        sys.exit(f"--questions-per-step {cfg.questions_per_step} must be a multiple of the {world} processes "
                 "(every rank owns whole questions)")
    out = Path(cfg.out_dir)
    torch.manual_seed(cfg.seed)
    n_models = cfg.agents if cfg.separate_agents and cfg.target == "agents" else 1
    if cfg.target == "leader":
        pool, pool_stats = rollouts.peer_pool(cfg, rank, world)
        if rank == 0:
            (out / "pool.json").write_text(json.dumps(pool_stats))
    else:
        pool = training_pool(cfg)[cfg.val_n:]
    models, engines = llm_engines(cfg, device, rank, n_models)
    references = ([copy.deepcopy(m).eval().requires_grad_(False) for m in models] if cfg.llm_beta
                  else [None] * n_models)
    optimizer = torch.optim.AdamW([p for m in models for p in m.parameters()], lr=cfg.llm_lr,
                                  weight_decay=cfg.weight_decay)
    holder = torch.nn.ModuleList(models)  # one state dict for the checkpoint
    counters = load_checkpoint(out, holder, optimizer, rank, cfg) or {"step": 0}
    log = MetricsLog(out, rank, counters["step"])
    for m in models:
        if cfg.gradient_checkpointing:
            m.gradient_checkpointing_enable()
    wrapped = [wrap_ddp(m, device, find_unused=False) for m in models]
    pad = engines[0].tokenizer.pad_token_id
    validation = training_pool(cfg)[:cfg.val_n]
    if cfg.target == "leader" and cfg.eval_every:  # the leader is validated over its peers' solutions
        validation = rollouts.peer_solutions(validation, cfg, rank, world)

    def validate(step):
        """Greedy accuracy on the held-out questions, the team's vote (agents) or the leader's answer over
        its peers (leader), every rank on its shard: the rollouts at temperature 0, one per question."""
        refresh_rollout_weights(models, engines)
        greedy = dataclasses.replace(cfg, group=1, rollout_temperature=0.0, format_reward=0.0)
        shard = validation[rank::world]
        right = (rollouts.leader_rollouts(engines[0], shard, greedy, step)[1] if cfg.target == "leader"
                 else rollouts.joint_rollouts(engines, shard, greedy, step)[1]) if shard else torch.zeros(0)
        sums = all_reduce_sum([float(right.sum()), right.numel()], device)
        log.write(step=step, val_accuracy=sums[0] / sums[1], val_questions=int(sums[1]))
        if rank == 0:
            print(f"step {step}: val accuracy {sums[0] / sums[1]:.3f} ({int(sums[1])} questions)", file=sys.stderr)

    if cfg.eval_every and counters["step"] == 0:
        validate(0)
    bar = tqdm(range(counters["step"], cfg.steps), desc=f"{cfg.algo} {cfg.target}", disable=rank != 0)
    for step in bar:
        began = time.time()
        start = step * cfg.questions_per_step
        questions = [pool[(start + k) % len(pool)] for k in range(cfg.questions_per_step)][rank::world]
        refresh_rollout_weights(models, engines)
        sequences, rewards = (rollouts.leader_rollouts(engines[0], questions, cfg, step) if cfg.target == "leader"
                              else rollouts.joint_rollouts(engines, questions, cfg, step))
        rollout_s = time.time() - began
        advantages = group_advantages(rewards, cfg)
        for m in models:
            m.train()
        update = llm_update(models, wrapped, references, optimizer, sequences, advantages, cfg, pad, device, world)
        flat = (rewards.amax(-1) == rewards.amin(-1)).float()
        sums = all_reduce_sum([update["loss"], update["kl"], float(rewards.sum()), rewards.numel(),
                               float(flat.sum()), len(flat), update["trained"]], device)
        stats = {"loss": sums[0] / world, "kl": sums[1] / world, "mean_reward": sums[2] / sums[3],
                 "frac_zero_std": sums[4] / sums[5], "zero_std_groups": sums[4], "grad_norm": update["grad_norm"],
                 "tokens": update["tokens"], "trained_sequences": sums[6], "rollout_s": rollout_s,
                 "step_s": time.time() - began}
        bar.set_postfix(reward=f"{stats['mean_reward']:.3f}")
        log.write(step=step + 1, **stats)
        if cfg.eval_every and ((step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps):
            validate(step + 1)
        if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
            save_checkpoint(out, holder, optimizer, {"step": step + 1}, cfg, rank)
        crash_if_asked(cfg, step + 1)
    if rank == 0:
        for e, model in enumerate(models):
            target = out / ("model" if n_models == 1 else f"agent{e}")
            model.eval().save_pretrained(target)
            engines[e].tokenizer.save_pretrained(target)
        print(json.dumps({"steps": cfg.steps, "model": str(out / "model")}))
    return models


def main(cfg):
    if cfg.target not in ("policy", "agents", "leader"):
        sys.exit(f"unknown --target {cfg.target!r}: choose policy, agents or leader")
    if cfg.vote not in VOTE_RULES:
        sys.exit(f"unknown --vote {cfg.vote!r}: choose one of {', '.join(VOTE_RULES)}")
    if cfg.target in ("agents", "leader"):
        if cfg.algo not in AGENT_ALGOS:
            sys.exit(f"unknown --algo {cfg.algo!r} for --target {cfg.target}: choose one of {', '.join(AGENT_ALGOS)}")
        if cfg.dtype not in ("float32", "bfloat16"):
            sys.exit(f"--dtype {cfg.dtype!r} for --target {cfg.target}: choose float32 or bfloat16 (autocast)")
        if cfg.loss_agg and cfg.loss_agg not in softrank.PG_KINDS:
            sys.exit(f"unknown --loss-agg {cfg.loss_agg!r}: choose one of {', '.join(softrank.PG_KINDS)}")
        if cfg.protocol not in ("parallel", "debate"):
            sys.exit(f"unknown --protocol {cfg.protocol!r}: choose parallel or debate")
    else:
        if cfg.algo not in ALGOS:
            sys.exit(f"unknown --algo {cfg.algo!r}: choose one of {', '.join(ALGOS)}")
        if cfg.objective not in OBJECTIVES:
            sys.exit(f"unknown --objective {cfg.objective!r}: choose one of {', '.join(OBJECTIVES)}")
        if cfg.reward_transform not in ("none", "exp"):
            sys.exit(f"unknown --reward-transform {cfg.reward_transform!r}: choose none or exp")
        if not Path(cfg.init).is_file():
            sys.exit(f"--init {cfg.init!r} is not a policy checkpoint: run sft.py first")
    return run_distributed(train_policy if cfg.target == "policy" else train_weights, cfg)


if __name__ == "__main__":
    main(parse_config(Config, description=__doc__.split("\n\n")[0]))
