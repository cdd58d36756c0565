"""What the LLM-weight trainers share (train_solver.py, train_magrpo.py, train_mlpo.py;
docs/design.md §8): the weights they train and the engines that sample from them, resume, the
optimizer step over sampled completions, validation's log and the saved weights. Nothing here knows
the game: each script builds its own sequences and rewards.

Sequence          - one sampled completion, the unit the token-level loss trains on
TrainerConfig     - the flags every trainer shares (check_weights checks them); RolloutConfig,
                    those MAGRPO and MLPO share (check_rollouts)
trained_team      - the trained weights (whole models or LoRA adapters) and the team of engines
                    that samples from them; refresh_rollout_weights before each sampling
sample, prompt_ids - the rollouts' completions at the loss's temperature; a prompt's token ids
resumed           - the optimizer, the checkpoint's counters, the metrics log and the Learners
Objective         - what the step minimizes: the aggregation, the KL's weight, the temperature
policy_loss       - token-level policy gradient (+ beta x KL) on one micro-batch
policy_step       - one optimizer step over a rank's sequences, in micro-batches
rollout_stats     - a step's loss, rewards and flat groups over every rank
validate          - greedy accuracy on held-out questions (log_accuracy: its sum over the ranks)
save_trained      - adapter files or HF directories
"""

import copy
import dataclasses
import sys
from dataclasses import dataclass
from typing import NamedTuple

import torch

import softrank
from common import (
    FileRefused,
    GameConfig,
    MetricsLog,
    UsageError,
    accumulating,
    all_reduce_sum,
    average_gradients,
    check_at_least,
    check_choice,
    check_game,
    check_positive,
    flag,
    load_checkpoint,
    load_file,
    wrap_ddp,
)
from llm import lora
from llm.engine import Engine
from llm.logprobs import completion_batch, completion_logprobs
from llm.team import Member, Team

# non-reentrant (torch's recommended variant): needs no input that requires a gradient
# (the base is frozen under LoRA)
GRADIENT_CHECKPOINTING = {"use_reentrant": False}


@dataclass
class Sequence:
    """One sampled completion of a step's rollouts: the learner trains on its completion tokens."""

    question: int  # index into the step's questions (on this rank)
    sample: int  # which of the question's G rollouts
    agent: int  # which agent wrote it (0 for the leader)
    prompt_ids: list
    completion_ids: list  # the sampled ids, the EOS included


# a rank without sequences runs this one at advantage 0 (a token of each: any ids the model knows)
FILLER = Sequence(0, 0, 0, [0], [0])


@dataclass
class TrainerConfig(GameConfig):
    """The flags every LLM-weight trainer shares (check_weights checks them); each trainer's
    Config extends it with its own."""

    lora_rank: int = 4
    """rank of the LoRA adapters trained on the frozen base (0: full fine-tuning of every
    weight)"""
    lora_targets: str = ""
    """the layers the adapters wrap: comma-separated parts of their names (e.g. q_proj,v_proj or
    self_attn); empty: every linear layer but the LM head"""
    lora_alpha: float = 32.0
    """LoRA scale alpha (the update is alpha / rank x B A)"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    micro_batch: int = 8
    """sequences per forward/backward; gradients accumulate over the optimizer step"""
    gradient_checkpointing: bool = False
    """recompute activations in the backward (less memory, more time)"""
    val_n: int = 64
    """held-out training-split questions, never trained on"""
    eval_every: int = 0
    """optimizer steps between validations (0: none; else also at steps 0 and last)"""
    save_every: int = 50
    """optimizer steps between checkpoints (and at the end)"""
    crash_at_step: int = 0
    """testing resume: SIGKILL this process right after this optimizer step (0: never)"""
    dtype: str = "float32"
    """float32 | bfloat16 (autocast on fp32 master weights; rollouts and validation's answers from
    a bf16 copy)"""


@dataclass
class RolloutConfig(TrainerConfig):
    """The flags MAGRPO and MLPO share (check_rollouts checks them): the groups of sampled
    rollouts, their advantages and the KL term."""

    group: int = 4
    """G: rollouts per question, whose rewards give each its group advantage"""
    algo: str = "magrpo"
    """the group advantage: magrpo (reward - group mean, the paper's) | grpo (z-score) | softrank
    (softrank.group_advantages)"""
    tau: float = 0.5
    """SoftRank temperature (--algo softrank)"""
    format_reward: float = 0.0
    """+ this times the share of the rollout's final answers that parse (MAGRPO: the team's,
    MLPO: the leader's)"""
    questions_per_step: int = 8
    """questions per optimizer step, over all ranks (whole groups per rank); the training pool
    cycles"""
    steps: int = 20
    """optimizer steps"""
    rollout_temperature: float = 1.0
    """sampling temperature of the rollouts, and of the log-probs the loss scores them with"""
    beta: float = 0.0
    """weight of the KL(pi || initial model) penalty (softrank.kl_k3); 0 as in the papers (no
    reference copy in memory)"""


def check_weights(cfg):
    """The checks of the flags every LLM-weight trainer shares (a mistake: common.UsageError)."""
    # the trained weights are --model's; no policy decides, so no critic pass and no REFINE cost
    for name in ("models", "critic", "refine_cost"):
        if getattr(cfg, name) != getattr(GameConfig, name):
            raise UsageError(f"{flag(name)}: the LLM-weight trainers train --model's, without it")
    check_game(cfg, min_agents=1, min_rounds=0)
    check_choice("--dtype", cfg.dtype, ("float32", "bfloat16"))
    check_at_least(cfg, 1, "micro_batch", "save_every")
    check_at_least(cfg, 0, "val_n", "eval_every", "weight_decay", "lr", "lora_rank")
    check_positive(cfg, "lora_alpha")
    if cfg.eval_every and not cfg.val_n:
        raise UsageError("--eval-every: validation needs held-out questions (--val-n >= 1)")
    if cfg.init_adapter:
        if not cfg.lora_rank:
            raise UsageError("--init-adapter: adapters train with --lora-rank >= 1")
        state = load_file(cfg.init_adapter, "adapter")
        if not isinstance(state, dict):
            raise UsageError(f"--init-adapter {cfg.init_adapter}: not an adapter file")
        if (state.get("rank"), state.get("alpha")) != (cfg.lora_rank, cfg.lora_alpha):
            raise UsageError(
                f"--init-adapter {cfg.init_adapter}: rank {state.get('rank')}, alpha "
                f"{state.get('alpha')} there, --lora-rank {cfg.lora_rank} --lora-alpha "
                f"{cfg.lora_alpha} here"
            )


def check_rollouts(cfg, world):
    """The checks of RolloutConfig's flags and --loss-agg: the groups, their advantages, the
    loss."""
    check_choice("--algo", cfg.algo, softrank.GROUP_ADVANTAGES)
    check_choice("--loss-agg", cfg.loss_agg, softrank.PG_KINDS)
    check_at_least(cfg, 1, "steps", "questions_per_step")
    # a group of one has no baseline: every advantage would be 0
    check_at_least(cfg, 2, "group")
    check_at_least(cfg, 0, "beta", "format_reward")
    # greedy rollouts of a group are identical: every group flat
    check_positive(cfg, "rollout_temperature", "tau")
    if cfg.questions_per_step % world:
        raise UsageError(
            f"--questions-per-step {cfg.questions_per_step} must be a multiple of the {world} "
            "processes (every rank owns whole questions)"
        )


def trained_team(cfg, n_trained, device):
    """(the trained models, the team whose rollouts they sample). Full fine-tuning (--lora-rank 0):
    one model, or `n_trained` (one per agent). Otherwise one frozen base with `n_trained` LoRA
    adapters that the engine runs in one batch. No generation cache: the weights change every
    step. With --dtype bfloat16 the rollouts come from a bf16 copy refreshed every step (autocast
    on fp32 weights would cast every weight at every decoded token)."""
    engines = [
        Engine(
            model_path=cfg.model or None,
            dtype="float32",
            device=str(device),
            batch_size=cfg.engine_batch_size,
        )
        for _ in range(1 if cfg.lora_rank else n_trained)
    ]
    models = [e.model for e in engines]
    if cfg.lora_rank and cfg.init_adapter:
        state = load_file(cfg.init_adapter, "adapter")
        for k in range(n_trained):
            try:
                lora.load_adapter(models[0], state)
            except lora.AdapterMismatch as e:
                raise FileRefused(f"{cfg.init_adapter}: {e}") from None
            # from here on these weights are not the file's: no cache key or shared prefix as if
            models[0].lora["names"][k] = f"unsaved{k}"
    elif cfg.lora_rank:
        parts = [part for part in cfg.lora_targets.split(",") if part]
        lora.add_lora(models[0], cfg.lora_rank, cfg.lora_alpha, n_trained, cfg.seed, parts)
    if cfg.dtype == "bfloat16":
        engines = [
            Engine(
                model=copy.deepcopy(m).to(torch.bfloat16),
                tokenizer=e.tokenizer,
                device=str(device),
                batch_size=cfg.engine_batch_size,
            )
            for m, e in zip(models, engines)
        ]
    members = [
        Member(engines[0], e) if cfg.lora_rank else Member(engines[e]) for e in range(n_trained)
    ]
    return models, Team(members)


def refresh_rollout_weights(models, team):
    """The rollout engines sample from the current weights (a bf16 copy gets them copied)."""
    for m, engine in zip(models, team.engines()):
        # generation: the KV cache (gradient checkpointing turns it off in train mode)
        m.eval()
        if engine.model is not m:
            with torch.no_grad():
                for rollout_weight, weight in zip(engine.model.parameters(), m.parameters()):
                    rollout_weight.copy_(weight)


def sample(team, prompts, seeds, agents, cfg):
    """The rollouts' completions of user prompts by `agents`, with their token ids, at the
    temperature the loss scores them with (no top-p: the log-probs are of the whole tempered
    distribution)."""
    budget, temperature = cfg.max_new_tokens, cfg.rollout_temperature
    return team.generate(
        prompts,
        seeds,
        agents,
        max_new_tokens=budget,
        temperature=temperature,
        top_p=1.0,
        return_tokens=True,
    )


def prompt_ids(team, prompt, agent):
    """The token ids of a user prompt as `agent` reads it (its model's chat format)."""
    engine = team.member(agent).engine
    return engine.encode(engine.chat(prompt))


class Objective(NamedTuple):
    """What policy_step minimizes: the token-level policy gradient aggregated by `agg`
    (softrank.PG_KINDS), + `beta` x the KL(pi || initial model), on log-probs at `temperature`
    (the rollouts' own)."""

    agg: str
    beta: float
    temperature: float


class Learner(NamedTuple):
    """One set of trained weights in policy_step: the module the loss runs (DDP-wrapped for whole
    weights), the parameters it trains (clipped together), its LoRA adapter (None: whole weights)
    and the frozen model of the KL term (None with an adapter: the base, adapter off)."""

    module: torch.nn.Module
    parameters: list
    adapter: int | None = None
    reference: torch.nn.Module | None = None


def learners_of(models, cfg, objective, device):
    """One Learner per trained set of weights: each LoRA adapter of the one model, or each whole
    model (DDP-wrapped; with a KL term in the objective, a frozen copy as the KL's reference)."""
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
            copy.deepcopy(m).eval().requires_grad_(False) if objective.beta else None,
        )
        for m in models
    ]


def learning_rate(cfg, adapter_lr):
    """--lr, else the measured defaults (results/README.md): `adapter_lr` for adapters, 1e-5 for
    whole weights."""
    if not cfg.lr and cfg.lora_rank:
        return adapter_lr
    return cfg.lr or 1e-5


def resumed(models, cfg, lr, objective, out, rank, device, extendable):
    """The optimizer of the trained weights at `lr`, the module holding them for the checkpoint
    (the adapters only, MBs, or the whole models), the counters a checkpoint in `out` resumes from
    (`extendable`: the config field a resumed run may raise), the metrics log and the Learners of
    the `objective`."""
    params = [p for m in models for p in m.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=cfg.weight_decay)
    holder = torch.nn.ParameterList(params) if cfg.lora_rank else torch.nn.ModuleList(models)
    counters = load_checkpoint(out, holder, optimizer, rank, cfg, extendable=(extendable,))
    counters = counters or {"step": 0}
    log = MetricsLog(out, rank, counters["step"])
    for m in models:
        if cfg.gradient_checkpointing:
            m.activation_checkpointing_enable(GRADIENT_CHECKPOINTING)
    return optimizer, holder, counters, log, learners_of(models, cfg, objective, device)


def policy_loss(model, reference, batch, advantages, objective, normalizer, adapter=None):
    """Token-level policy gradient on one micro-batch (+ beta x the KL(pi || initial model)
    penalty), both aggregated alike (softrank.aggregate: under seq the KL too is each sequence's
    mean) over the step's global normalizer: prompt, peers' text and padding carry no gradient
    (loss mask). `adapter`: the LoRA adapter the model runs with (None: whole weights); the
    initial model is then the base itself. Returns (loss, the KL's value)."""
    agg, beta, temperature = objective
    with lora.selecting(model, adapter):
        logp, mask = completion_logprobs(model, batch, temperature)
    loss, _ = softrank.policy_gradient_loss(logp, advantages, mask, agg, normalizer)
    kl = torch.zeros(())
    if beta:
        with torch.no_grad(), lora.selecting(model, None):
            ref_logp, _ = completion_logprobs(
                model if reference is None else reference, batch, temperature
            )
        kl = softrank.aggregate(softrank.kl_k3(logp, ref_logp), mask, agg, normalizer)
        loss = loss + beta * kl
    return loss, kl.item()


def policy_step(learners, optimizer, sequences, advantages, objective, cfg, pad, device, world):
    """One optimizer step of the `objective` over this rank's sequences, in micro-batches of
    cfg.micro_batch.

    Each learner's normalizer covers the whole step (every micro-batch of every rank) of that
    learner's own sequences, computed once; gradients are averaged over ranks (DDP, or
    average_gradients for adapters, whose micro-batches each run one adapter of a shared model),
    hence the division by world. With --separate-agents each agent's gradient is thus that of its
    own objective, its loss over its own sequences (CoMLRL's per-agent MAGRPO), not 1 / agents of
    it; each learner's gradient is clipped on its own. A sequence of advantage 0 (a flat group)
    adds exactly 0 to the loss and its gradient, so it is skipped (without a KL term); a rank left
    with nothing still runs one backward at advantage 0, for the all-reduce. Returns the step's
    statistics."""
    per_model = [[s for s in sequences if s.agent == e] for e in range(len(learners))]
    # shared weights (or the leader's, or the solver's): every sequence
    if len(learners) == 1:
        per_model = [sequences]
    counts = all_reduce_sum(
        [c for mine in per_model for c in (len(mine), sum(len(s.completion_ids) for s in mine))],
        device,
    )
    normalizers = [
        softrank.step_normalizer(
            objective.agg, counts[2 * e], counts[2 * e + 1], cfg.max_new_tokens
        )
        / world
        for e in range(len(learners))
    ]
    loss_total, kl_total, trained = 0.0, 0.0, 0
    for e, (learner, mine) in enumerate(zip(learners, per_model)):
        if not objective.beta:
            mine = [s for s in mine if advantages[s.question, s.sample] != 0] or mine[:1]
        # no sequence on this rank at all (a batch smaller than the world): one filler at
        # advantage 0
        filler = not mine
        if filler:
            mine = [FILLER]
        trained += 0 if filler else len(mine)
        chunks = range(0, len(mine), cfg.micro_batch)
        for k in chunks:
            chunk = mine[k : k + cfg.micro_batch]
            batch = completion_batch([(s.prompt_ids, s.completion_ids) for s in chunk], pad, device)
            rows = [s.question for s in chunk], [s.sample for s in chunk]
            chunk_advantages = (
                torch.zeros(len(chunk), device=device) if filler else advantages[rows].to(device)
            )
            with accumulating(learner.module, last=k == chunks[-1]):
                # bf16 matmuls on fp32 master weights (what Trainer's --bf16 does); the forward
                # only: backward runs in the forward's dtypes anyway
                bf16 = cfg.dtype == "bfloat16"
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                    loss, kl = policy_loss(
                        learner.module,
                        learner.reference,
                        batch,
                        chunk_advantages,
                        objective,
                        normalizers[e],
                        learner.adapter,
                    )
                if filler:
                    # there for the all-reduce alone: neither its loss nor its KL term counts
                    loss, kl = loss * 0.0, 0.0
                loss.backward()
            loss_total, kl_total = loss_total + loss.item(), kl_total + kl
    # DDP averaged the whole weights' gradients
    for learner in (ln for ln in learners if ln.adapter is not None):
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


def rollout_stats(update, rewards, world, device):
    """What a step of rollouts logs, over every rank: policy_step's `update` and the (questions, G)
    `rewards` (their mean, and the groups whose rewards are all equal, which teach nothing)."""
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
    return {
        "loss": sums[0] / world,
        "kl": sums[1] / world,
        "mean_reward": sums[2] / sums[3],
        "frac_zero_std": sums[4] / sums[5],
        "zero_std_groups": sums[4],
        "grad_norm": update["grad_norm"],
        "tokens": update["tokens"],
        "trained_sequences": sums[6],
    }


def validate(models, team, rollouts, shard, cfg, step, rank, device, log):
    """Greedy accuracy on held-out questions: `rollouts` (the script's: (sequences, rewards) of
    (team, examples, cfg, step)) once per example of this rank's `shard` at temperature 0, its
    rewards the answers' correctness."""
    refresh_rollout_weights(models, team)
    greedy = dataclasses.replace(cfg, group=1, rollout_temperature=0.0, format_reward=0.0)
    right = rollouts(team, shard, greedy, step)[1] if shard else torch.zeros(0)
    log_accuracy(right, step, rank, device, log)


def log_accuracy(right, step, rank, device, log):
    """The held-out accuracy over every rank (`right`: this rank's 1 or 0 per question), logged."""
    sums = all_reduce_sum([float(right.sum()), right.numel()], device)
    log.write(step=step, val_accuracy=sums[0] / sums[1], val_questions=int(sums[1]))
    if rank == 0:
        print(
            f"step {step}: val accuracy {sums[0] / sums[1]:.3f} ({int(sums[1])} questions)",
            file=sys.stderr,
        )


def save_trained(models, tokenizer, out, cfg):
    """The trained weights: LoRA adapter files that --models reads (adapter.pt, or agent0.pt,
    agent1.pt, ...), or whole models as HF directories --model reads (model/, or agent0/, ...).
    Returns what was written."""
    if cfg.lora_rank:
        n = lora.n_adapters(models[0])
        paths = [out / ("adapter.pt" if n == 1 else f"agent{k}.pt") for k in range(n)]
        for k, path in enumerate(paths):
            torch.save(lora.adapter_state(models[0], k, cfg.model or "default"), path)
        return [str(p) for p in paths]
    paths = [out / ("model" if len(models) == 1 else f"agent{e}") for e in range(len(models))]
    for model, path in zip(models, paths):
        model.eval().save_pretrained(path)
        tokenizer.save_pretrained(path)
    return [str(p) for p in paths]
