"""The agents' LLM weights (docs/design.md §8): MAGRPO, MLPO, and a rejection-sampling warm start.

    python train_llm.py --target agents --protocol debate --agents 3 --rounds 1 \
        --out-dir runs/magrpo
    python eval.py --model runs/magrpo/model --protocols debate
    python train_llm.py --target leader --agents 3 --out-dir runs/mlpo
    python eval.py --protocols leader=runs/mlpo/model        # peers answer, the trained leader
                                                             # decides
    python train_llm.py --target sft --out-dir runs/sft-llm  # the backbone on its own right answers

--target agents (MAGRPO, arXiv 2508.04652): G joint rollouts of the protocol per question, one joint
reward per rollout (the team vote's correctness), its advantage shared by every agent of the
rollout; each agent learns from its own sampled tokens only. --target leader (MLPO, arXiv
2507.08960): the frozen peers' solutions to the training questions are generated once; questions the
peers already get right (>= --filter-easy of them) are dropped; the leader reads a question and its
peers' solutions and answers, G samples per prompt, reward = correctness. Both are on-policy: one
optimizer step per batch of rollouts, no ratio, no clip. A step reads: rollouts (rollouts.py)
-> group_advantages -> llm_step. --target sft: sample solutions to training questions, keep the
right (with --trailer, well-formatted) ones and fine-tune on them, the loss on completion tokens
only (llm_step with advantage 1).

Agents and leader train LoRA adapters by default (llm/lora.py; the base frozen): one for every
agent, or one per agent (--separate-agents), saved as small files (adapter.pt or agent<i>.pt) that
eval.py --models default+<file>,... plays; --lora-rank 0 fine-tunes every weight instead (an HF
directory per model).
"""

import copy
import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

import torch
from tqdm import tqdm

import softrank
from common import (
    GameConfig,
    MetricsLog,
    UsageError,
    accumulating,
    all_reduce_sum,
    average_gradients,
    batch_schedule,
    check_at_least,
    check_choice,
    check_game,
    check_model,
    check_models,
    check_positive,
    crash_if_asked,
    distributed,
    flag,
    launch_world_size,
    load_checkpoint,
    load_file,
    parse_config,
    peak_memory_mb,
    save_checkpoint,
    user_errors,
    wrap_ddp,
)
from data import training_pool
from llm import lora, rollouts
from llm.logprobs import completion_batch, completion_logprobs, without_dropout
from llm.team import make_engine

TARGETS = ("agents", "leader", "sft")
ADVANTAGES = {
    "magrpo": softrank.mean_baseline_advantages,
    "grpo": softrank.grpo_advantages,
    "softrank": softrank.softrank_advantages,
}


@dataclass
class Config(GameConfig):
    target: str = "agents"
    """agents: MAGRPO (the agents' weights) | leader: MLPO (one leader over frozen peers) | sft: the
    rejection-sampling warm start (the backbone on its own right answers)"""
    algo: str = "magrpo"
    """the group advantage: magrpo (reward - group mean, the paper's) | grpo (z-score) | softrank"""
    tau: float = 0.5
    """SoftRank temperature (--algo softrank)"""
    protocol: str = "debate"
    """--target agents: parallel (independent answers, then the vote) | debate (--rounds REFINE
    rounds)"""
    group: int = 4
    """G: joint rollouts (agents) or leader samples (leader) per question"""
    questions_per_step: int = 8
    """questions per optimizer step, over all ranks (whole groups per rank)"""
    steps: int = 20
    """optimizer steps (agents, leader)"""
    rollout_temperature: float = 1.0
    """sampling temperature of the rollouts, and of the log-probs the loss scores them with"""
    loss_agg: str = ""
    """token (DAPO) | seq (GRPO) | const (Dr.GRPO) | sum (CoMLRL's MAGRPO), see softrank.aggregate;
    empty: sum for agents (MAGRPO), const for the leader (MLPO), token for sft"""
    format_reward: float = 0.0
    """+ this times the fraction of the team's final answers that parse"""
    separate_agents: bool = False
    """one set of trained weights per agent, an adapter or a whole copy (default: one shared)"""
    lora_rank: int = 4
    """rank of the LoRA adapters trained on the frozen base (0: full fine-tuning of every
    weight)"""
    lora_targets: str = ""
    """the layers the adapters wrap: comma-separated parts of their names (e.g. q_proj,v_proj or
    self_attn); empty: every linear layer but the LM head"""
    lora_alpha: float = 32.0
    """LoRA scale alpha (the update is alpha / rank x B A)"""
    init_adapter: str = ""
    """agents, leader: start every trained adapter from this adapter file (one train_llm.py wrote,
    of the same rank and alpha) instead of from the base model, e.g. agents trained on parallel
    answers, then on debate"""
    lr: float = 0.0
    """AdamW learning rate (0: 5e-4 for adapters, 1e-5 for full weights: results/README.md)"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    micro_batch: int = 8
    """sequences per forward/backward; gradients accumulate over the optimizer step"""
    beta: float = 0.0
    """weight of the KL(pi || initial model) penalty (softrank.kl_k3); 0 as in both papers (no
    reference copy in memory)"""
    gradient_checkpointing: bool = False
    """recompute activations in the backward (less memory, more time)"""
    peers_model: str = ""
    """--target leader: the frozen peers' HF directory; empty: the same as --model"""
    peers: str = ""
    """--target leader: the frozen peers as a team, one entry each as eval.py's --models"""
    filter_easy: float = 0.75
    """--target leader: drop questions where at least this fraction of the peers is right (0: keep
    all)"""
    solutions: str = "worked"
    """--target sft: worked (the task's own worked solutions, data/worked.py: arith, gsm8k) |
    sampled (rejection sampling: the backbone's own right answers)"""
    refine_contexts: str = ""
    """--target sft --solutions worked: also one REFINE example per training question, its own
    solution and its peers' answers sampled from the base model with this adapter file (e.g. one
    trained on worked solutions), the worked solution its target"""
    samples: int = 4
    """--target sft --solutions sampled: solutions sampled per training question"""
    epochs: int = 30
    """--target sft: passes over the training solutions"""
    batch_size: int = 256
    """--target sft: sequences per optimizer step, over all ranks"""
    questions: int = 256
    """training questions (leader: candidates before the filter; agents: the pool cycles)"""
    val_n: int = 64
    """held-out training-split questions, never trained on"""
    eval_every: int = 0
    """optimizer steps between validations (0: none; else also at steps 0 and last)"""
    dtype: str = "float32"
    """float32 | bfloat16 (agents, leader: autocast on fp32 master weights, bf16 rollouts)"""
    out_dir: str = "runs/llm"
    """where the model directory, metrics.jsonl and the checkpoint go"""
    save_every: int = 50
    """optimizer steps between checkpoints (and at the end)"""
    crash_at_step: int = 0
    """testing resume: SIGKILL this process right after this optimizer step (0: never)"""


def loss_aggregation(cfg):
    """--loss-agg, else each method's own: MAGRPO's sum (CoMLRL: each completion's token log-probs
    summed, times its advantage, averaged over completions), MLPO's Dr.GRPO const, sft's token
    mean (the usual cross-entropy)."""
    return cfg.loss_agg or {"agents": "sum", "leader": "const"}.get(cfg.target, "token")


def group_advantages(rewards, cfg):
    """(questions, G) rewards -> the advantage every sequence of a rollout shares."""
    if cfg.algo == "softrank":
        return softrank.softrank_advantages(rewards, cfg.tau)
    return ADVANTAGES[cfg.algo](rewards)


def learning_rate(cfg):
    """--lr, else the measured defaults (results/README.md): full weights 1e-5; adapters 5e-4 on
    rollouts, 2e-3 on supervised solutions."""
    if not cfg.lr and cfg.lora_rank:
        return 2e-3 if cfg.target == "sft" else 5e-4
    return cfg.lr or 1e-5


class Learner(NamedTuple):
    """One set of trained weights in llm_step: the module the loss runs (DDP-wrapped for whole
    weights), the parameters it trains (clipped together), its LoRA adapter (None: whole weights)
    and the frozen model of the KL term (None with an adapter: the base, adapter off)."""

    module: torch.nn.Module
    parameters: list
    adapter: int | None = None
    reference: torch.nn.Module | None = None


def agents_loss(model, reference, batch, advantages, cfg, normalizer, temperature, adapter=None):
    """Token-level policy gradient on one micro-batch (+ beta x the KL(pi || initial model)
    penalty), both aggregated alike (softrank.aggregate: under seq the KL too is each sequence's
    mean) over the step's global normalizer: prompt, peers' text and padding carry no gradient
    (loss mask). `adapter`: the LoRA adapter the model runs with; the initial model is then the
    base itself."""
    with lora.selecting(model, adapter):
        logp, mask = completion_logprobs(model, batch, temperature)
    agg = loss_aggregation(cfg)
    loss, _ = softrank.policy_gradient_loss(logp, advantages, mask, agg, normalizer)
    kl = torch.zeros(())
    if cfg.beta:
        with torch.no_grad(), lora.selecting(model, None):
            ref_logp, _ = completion_logprobs(
                model if reference is None else reference, batch, temperature
            )
        kl = softrank.aggregate(softrank.kl_k3(logp, ref_logp), mask, agg, normalizer)
        loss = loss + cfg.beta * kl
    return loss, kl.item()


# non-reentrant (torch's recommended variant): needs no input that requires a gradient
# (the base is frozen under LoRA)
GRADIENT_CHECKPOINTING = {"use_reentrant": False}
# a rank without sequences runs this one at weight 0 (a token of each: any ids the model knows)
FILLER = rollouts.Sequence(0, 0, 0, [0], [0])


def llm_step(learners, optimizer, sequences, advantages, cfg, pad, device, world, temperature):
    """One optimizer step over this rank's sequences, in micro-batches.

    Each learner's normalizer covers the whole step (every micro-batch of every rank) of that
    learner's own sequences, computed once; gradients are averaged over ranks (DDP, or
    average_gradients for adapters, whose micro-batches each run one adapter of a shared model),
    hence the division by world. With --separate-agents each agent's gradient is thus that of its
    own objective, its loss over its own sequences (CoMLRL's per-agent MAGRPO), not 1 / agents of
    it; each learner's gradient is clipped on its own. A sequence of advantage 0 (a flat group)
    adds exactly 0 to the loss and its gradient, so it is skipped (without a KL term); a rank left
    with nothing still runs one backward at weight 0, for the all-reduce. Returns the step's
    statistics."""
    per_model = [[s for s in sequences if s.agent == e] for e in range(len(learners))]
    if len(learners) == 1:  # shared weights (or the leader's, or sft's): every sequence
        per_model = [sequences]
    counts = all_reduce_sum(
        [c for mine in per_model for c in (len(mine), sum(len(s.completion_ids) for s in mine))],
        device,
    )
    kind = loss_aggregation(cfg)
    normalizers = [
        softrank.step_normalizer(kind, counts[2 * e], counts[2 * e + 1], cfg.max_new_tokens) / world
        for e in range(len(learners))
    ]
    loss_total, kl_total, trained = 0.0, 0.0, 0
    for e, (learner, mine) in enumerate(zip(learners, per_model)):
        if not cfg.beta:
            mine = [s for s in mine if advantages[s.question, s.sample] != 0] or mine[:1]
        weight = 1.0
        if not mine:  # no sequence on this rank at all (a batch smaller than the world)
            mine, weight = [FILLER], 0.0
        trained += len(mine) if weight else 0
        chunks = range(0, len(mine), cfg.micro_batch)
        for k in chunks:
            chunk = mine[k : k + cfg.micro_batch]
            batch = completion_batch([(s.prompt_ids, s.completion_ids) for s in chunk], pad, device)
            rows = [s.question for s in chunk], [s.sample for s in chunk]
            chunk_advantages = advantages[rows].to(device) if weight else torch.zeros(len(chunk))
            with accumulating(learner.module, last=k == chunks[-1]):
                # bf16 matmuls on fp32 master weights (what Trainer's --bf16 does); the forward
                # only: backward runs in the forward's dtypes anyway
                bf16 = cfg.dtype == "bfloat16"
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                    loss, kl = agents_loss(
                        learner.module,
                        learner.reference,
                        batch,
                        chunk_advantages,
                        cfg,
                        normalizers[e],
                        temperature,
                        learner.adapter,
                    )
                loss.backward()
            loss_total, kl_total = loss_total + loss.item(), kl_total + kl
    for learner in (ln for ln in learners if ln.adapter is not None):  # DDP did the others
        average_gradients(learner.parameters, world)
    norms = torch.stack([torch.nn.utils.clip_grad_norm_(ln.parameters, 1.0) for ln in learners])
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    # loss and kl: the learners' mean (each learner's over its own sequences)
    return {
        "loss": loss_total / len(learners),
        "kl": kl_total / len(learners),
        "trained": trained,
        "tokens": sum(counts[1::2]),
        "grad_norm": float(norms.norm()),
    }


def learners_of(models, cfg, device):
    """One Learner per trained set of weights: each LoRA adapter of the one model, or each whole
    model (DDP-wrapped; with --beta, a frozen copy as the KL's reference)."""
    if cfg.lora_rank:
        model = models[0]
        return [
            Learner(model, lora.adapter_parameters(model, k), k)
            for k in range(lora.n_adapters(model))
        ]
    return [
        Learner(
            wrap_ddp(m, device, find_unused=False),
            list(m.parameters()),
            None,
            copy.deepcopy(m).eval().requires_grad_(False) if cfg.beta else None,
        )
        for m in models
    ]


def resumed(models, cfg, out, rank, device, extendable):
    """The optimizer of the trained weights, the module holding them for the checkpoint (the
    adapters only, MBs, or the whole models), the counters a checkpoint in `out` resumes from
    (`extendable`: the config field a resumed run may raise), the metrics log and the Learners."""
    params = [p for m in models for p in m.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=learning_rate(cfg), weight_decay=cfg.weight_decay)
    holder = torch.nn.ParameterList(params) if cfg.lora_rank else torch.nn.ModuleList(models)
    counters = load_checkpoint(out, holder, optimizer, rank, cfg, extendable=(extendable,))
    counters = counters or {"step": 0}
    log = MetricsLog(out, rank, counters["step"])
    for m in models:
        if cfg.gradient_checkpointing:
            m.activation_checkpointing_enable(GRADIENT_CHECKPOINTING)
    return optimizer, holder, counters, log, learners_of(models, cfg, device)


def train_agents_or_leader(cfg, rank, world, device):
    """MAGRPO (agents) and MLPO (leader): the same on-policy token-level loop; only the rollouts
    differ."""
    out = Path(cfg.out_dir)
    torch.manual_seed(cfg.seed)
    if cfg.target == "leader":
        pool, pool_stats = rollouts.peer_pool(cfg, rank, world, device)
        if rank == 0:
            (out / "pool.json").write_text(json.dumps(pool_stats))
    else:
        pool = training_pool(cfg)[cfg.val_n :]
    models, team = rollouts.trained_team(cfg, device)
    optimizer, holder, counters, log, learners = resumed(models, cfg, out, rank, device, "steps")
    pad = team.first.tokenizer.pad_token_id
    validation = training_pool(cfg)[: cfg.val_n]
    # the leader is validated over its peers' solutions
    if cfg.target == "leader" and cfg.eval_every:
        validation = rollouts.peer_solutions(validation, cfg, rank, world, device)

    if cfg.eval_every and counters["step"] == 0:
        rollouts.validate(models, team, validation, cfg, rank, world, device, log, 0)
    bar = tqdm(
        range(counters["step"], cfg.steps), desc=f"{cfg.algo} {cfg.target}", disable=rank != 0
    )
    for step in bar:
        began = time.time()
        start = step * cfg.questions_per_step
        questions = [pool[(start + k) % len(pool)] for k in range(cfg.questions_per_step)]
        questions = questions[rank::world]
        rollouts.refresh_rollout_weights(models, team)
        if cfg.target == "leader":
            sequences, rewards = rollouts.leader_rollouts(team, questions, cfg, step)
        else:
            sequences, rewards = rollouts.joint_rollouts(team, questions, cfg, step)
        rollout_s = time.time() - began
        advantages = group_advantages(rewards, cfg)
        for m in models:
            without_dropout(m.train())  # the loss scores the tokens as the sampler drew them
        update = llm_step(
            learners,
            optimizer,
            sequences,
            advantages,
            cfg,
            pad,
            device,
            world,
            cfg.rollout_temperature,
        )

        flat = softrank.flat_groups(rewards).float()
        sums = all_reduce_sum(
            [
                update["loss"],
                update["kl"],
                float(rewards.sum()),
                rewards.numel(),
                float(flat.sum()),
                len(flat),
                update["trained"],
            ],
            device,
        )
        stats = {
            "loss": sums[0] / world,
            "kl": sums[1] / world,
            "mean_reward": sums[2] / sums[3],
            "frac_zero_std": sums[4] / sums[5],
            "zero_std_groups": sums[4],
            "grad_norm": update["grad_norm"],
            "tokens": update["tokens"],
            "trained_sequences": sums[6],
            "rollout_s": rollout_s,
            "step_s": time.time() - began,
            "peak_memory_mb": peak_memory_mb(device),
        }
        bar.set_postfix(reward=f"{stats['mean_reward']:.3f}")
        log.write(step=step + 1, **stats)
        if cfg.eval_every and ((step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps):
            rollouts.validate(models, team, validation, cfg, rank, world, device, log, step + 1)
        if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
            save_checkpoint(out, holder, optimizer, {"step": step + 1}, cfg, rank)
        crash_if_asked(cfg, step + 1)
    if rank == 0:
        saved = rollouts.save_trained(models, team.first.tokenizer, out, cfg)
        print(json.dumps({"steps": cfg.steps, "saved": saved}))


def train_sft(cfg, rank, world, device):
    """Supervised training on solutions: the task's worked solutions (--solutions worked), or the
    backbone's own right answers (sampled: rejection sampling). Cross-entropy on the solution
    tokens (llm_step with advantage 1 on every sequence), epochs over a fixed set, an adapter by
    default."""
    out = Path(cfg.out_dir)
    torch.manual_seed(cfg.seed)
    models, team = rollouts.trained_team(cfg, device)
    if cfg.solutions == "worked":
        kept = rollouts.worked_solutions(team.first, cfg)
        if cfg.refine_contexts:
            contexts = make_engine(cfg, rank, device)
            kept += rollouts.refine_examples(contexts, cfg, rank, world)
            del contexts
    else:
        kept = rollouts.right_solutions(make_engine(cfg, rank, device), cfg, rank, world)
    if len(kept) < cfg.batch_size:
        raise UsageError(
            f"only {len(kept)} training solutions for a --batch-size of {cfg.batch_size}: "
            "raise --questions (or --samples), or lower --batch-size"
        )
    optimizer, holder, counters, log, learners = resumed(models, cfg, out, rank, device, "epochs")
    tokenizer = team.first.tokenizer
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    # validation: each held-out question's greedy answer alone (a team of one, no deliberation)
    alone = replace(cfg, agents=1, protocol="parallel")
    validation = training_pool(cfg)[: cfg.val_n]
    batches = batch_schedule(len(kept), cfg.batch_size, cfg.epochs, cfg.seed, "sft-llm")

    if cfg.eval_every and counters["step"] == 0:
        rollouts.validate(models, team, validation, alone, rank, world, device, log, 0)
    bar = tqdm(range(counters["step"], len(batches)), desc="sft-llm", disable=rank != 0)
    for step in bar:
        rows = batches[step][rank::world].tolist()
        sequences = [rollouts.Sequence(k, 0, 0, *kept[i]) for k, i in enumerate(rows)]
        advantages = torch.ones(max(len(sequences), 1), 1)
        without_dropout(models[0].train())
        update = llm_step(
            learners, optimizer, sequences, advantages, cfg, pad, device, world, temperature=1.0
        )
        loss = all_reduce_sum([update["loss"]], device)[0] / world
        bar.set_postfix(loss=f"{loss:.4f}")
        log.write(step=step + 1, loss=loss, grad_norm=update["grad_norm"])
        if cfg.eval_every and ((step + 1) % cfg.eval_every == 0 or step + 1 == len(batches)):
            rollouts.validate(models, team, validation, alone, rank, world, device, log, step + 1)
        if (step + 1) % cfg.save_every == 0 or step + 1 == len(batches):
            save_checkpoint(out, holder, optimizer, {"step": step + 1}, cfg, rank)
        crash_if_asked(cfg, step + 1)
    if rank == 0:
        saved = rollouts.save_trained(models, tokenizer, out, cfg)
        print(json.dumps({"solutions": len(kept), "steps": len(batches), "saved": saved}))


def check(cfg, world):
    """The whole configuration, before any model is loaded (a mistake: common.UsageError)."""
    check_choice("--target", cfg.target, TARGETS)
    # the trained weights are --model's; no policy decides, so no critic pass and no REFINE cost
    for name in ("models", "critic", "refine_cost"):
        if getattr(cfg, name) != getattr(GameConfig, name):
            raise UsageError(f"{flag(name)}: train_llm.py trains --model's weights, without it")
    # MAGRPO with one agent is GRPO; a leader needs at least one peer
    check_game(cfg, min_agents=1, min_rounds=0)
    check_at_least(cfg, 0, "val_n")
    check_choice("--algo", cfg.algo, tuple(ADVANTAGES))
    check_choice("--dtype", cfg.dtype, ("float32", "bfloat16"))
    check_choice("--protocol", cfg.protocol, ("parallel", "debate"))
    check_choice("--solutions", cfg.solutions, ("worked", "sampled"))
    if cfg.target == "sft" and cfg.solutions == "worked" and cfg.trailer:
        raise UsageError("--solutions worked: worked solutions carry no trailer (drop --trailer)")
    if cfg.loss_agg:
        check_choice("--loss-agg", cfg.loss_agg, softrank.PG_KINDS)
    check_at_least(cfg, 1, "steps", "questions", "questions_per_step", "micro_batch", "save_every")
    check_at_least(cfg, 1, "samples", "epochs", "batch_size")
    # a group of one has no baseline: every advantage would be 0
    check_at_least(cfg, 2, "group")
    check_at_least(cfg, 0, "beta", "eval_every", "format_reward", "weight_decay")
    # greedy rollouts of a group are identical: every group flat
    check_positive(cfg, "rollout_temperature", "tau", "lora_alpha")
    check_at_least(cfg, 0, "lr", "lora_rank")
    if not 0 <= cfg.filter_easy <= 1:
        raise UsageError(f"--filter-easy {cfg.filter_easy}: a share of the peers, in [0, 1]")
    if cfg.peers:
        if cfg.target != "leader" or cfg.peers_model:
            raise UsageError("--peers: the frozen peers of --target leader, not with --peers-model")
        check_models("--peers", cfg.peers, cfg.agents, cfg.max_new_tokens)
    if cfg.peers_model:
        check_model("--peers-model", cfg.peers_model, cfg.max_new_tokens)
    if cfg.refine_contexts and (cfg.target != "sft" or cfg.solutions != "worked"):
        raise UsageError("--refine-contexts: REFINE examples need --target sft --solutions worked")
    if cfg.refine_contexts:
        load_file(cfg.refine_contexts, "adapter")
    if cfg.init_adapter:
        if not cfg.lora_rank:
            raise UsageError("--init-adapter: adapters train with --lora-rank >= 1")
        state = load_file(cfg.init_adapter, "adapter")
        if not isinstance(state, dict) or (state.get("rank"), state.get("alpha")) != (
            cfg.lora_rank,
            cfg.lora_alpha,
        ):
            raise UsageError(
                f"--init-adapter {cfg.init_adapter}: rank {state.get('rank')}, alpha "
                f"{state.get('alpha')} there, --lora-rank {cfg.lora_rank} --lora-alpha "
                f"{cfg.lora_alpha} here"
            )
    if cfg.target != "sft" and cfg.questions_per_step % world:
        raise UsageError(
            f"--questions-per-step {cfg.questions_per_step} must be a multiple of the {world} "
            "processes (every rank owns whole questions)"
        )


if __name__ == "__main__":
    config = parse_config(Config, description=__doc__.split("\n\n")[0])
    with user_errors(config.out_dir):
        check(config, launch_world_size())
        with distributed(config.out_dir) as (rank, world, device):
            if config.target == "sft":
                train_sft(config, rank, world, device)
            else:
                train_agents_or_leader(config, rank, world, device)
