"""What the LLM-weight trainers share (train_solver.py, train_magrpo.py, train_mlpo.py;
docs/design.md §8), the plumbing around their learning step: the weights they train and the engines
that sample from them, resume, micro-batching, validation's log and the saved weights. Nothing here
knows the game or the loss: each script builds its own sequences and rewards, and the step itself
(its loss, backward and optimizer step) is softrank.policy_step.

Sequence          - one sampled completion, the unit the token-level loss trains on
TrainerConfig     - the flags every trainer shares (check_trainer checks them); RolloutConfig,
                    those of MAGRPO's and MLPO's rollouts (check_rollouts)
trained_team      - the trained weights (whole models or LoRA adapters) and the team of engines
                    that samples from them; refresh_rollout_weights before each sampling
sample, prompt_ids - the rollouts' completions at the loss's temperature; a prompt's token ids
Objective         - the loss's settings (softrank.policy_step's loss)
Learner, resumed  - one set of trained weights; the optimizer, the checkpoint's counters, the
                    metrics log and the Learners
Updater           - what an optimizer step runs its loss in: each learner's sequences and their
                    counts over every rank, micro-batches under gradient accumulation (and bf16
                    autocast), the clipped step; rollout_stats, what a step of rollouts logs
validate          - greedy accuracy on held-out questions (log_accuracy: its sum over the ranks)
save_trained      - adapter files or HF directories
"""

import copy
import dataclasses
import sys
from dataclasses import dataclass
from typing import NamedTuple

import torch

from common import (
    FileRefused,
    MetricsLog,
    UsageError,
    accumulating,
    all_reduce_sum,
    average_gradients,
    check_at_least,
    check_choice,
    check_positive,
    load_checkpoint,
    wrap_ddp,
)
from llm import backbone, lora
from llm.engine import Engine
from llm.logprobs import completion_batch
from llm.team import Member, Team, read_adapter

# non-reentrant (torch's recommended variant): needs no input that requires a gradient
# (the base is frozen under LoRA)
GRADIENT_CHECKPOINTING = {"use_reentrant": False}


@dataclass
class Sequence:
    """One sampled completion of a step's rollouts: the learner trains on its completion tokens."""

    # its row of the step's (rows, G) rewards: the question's index on this rank, or a row the
    # script defines (one per question and agent, for rewards of each agent's own)
    question: int
    sample: int  # which of the question's G rollouts
    agent: int  # which agent wrote it (0 for the leader)
    prompt_ids: list
    completion_ids: list  # the sampled ids, the EOS included


# a rank without sequences runs this one at advantage 0 (a token of each: any ids the model knows)
FILLER = Sequence(0, 0, 0, [0], [0])


@dataclass
class TrainerConfig:
    """The flags every LLM-weight trainer shares (check_trainer checks them)."""

    lora_rank: int = 4
    """rank of the LoRA adapters trained on the frozen base (0: full fine-tuning of every
    weight)"""
    lora_targets: str = ""
    """the layers the adapters wrap: comma-separated parts of their names (e.g. q_proj,v_proj or
    self_attn); empty: every linear layer but the LM head"""
    lora_alpha: float = 32.0
    """LoRA scale alpha (the update is alpha / rank x B A)"""
    init_adapter: str = ""
    """start every trained adapter from this adapter (of --lora-rank's rank and --lora-alpha's
    alpha) instead of from the base model, e.g. one trained on worked solutions; or a comma list,
    one per trained adapter (a team's agents, --separate-agents), each at its own rank and alpha,
    the highest rank first"""
    micro_batch: int = 8
    """sequences per forward/backward; gradients accumulate over the optimizer step"""
    gradient_checkpointing: bool = False
    """recompute activations in the backward (less memory, more time)"""
    train_dtype: str = "float32"
    """float32 | bfloat16 (autocast on fp32 master weights; rollouts and validation's answers from
    a bf16 copy)"""


@dataclass
class RolloutConfig:
    """The flags of MAGRPO's and MLPO's rollouts (check_rollouts): the groups of sampled
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
    loss_agg: str = "sum"
    """token (DAPO) | seq (GRPO) | const (Dr.GRPO) | sum (CoMLRL's MAGRPO: each completion's token
    log-probs summed, times its advantage, averaged over completions), see softrank.aggregate"""


def check_trainer(cfg):
    """The checks of TrainerConfig's flags and of the validation the trainers run (a mistake:
    common.UsageError)."""
    check_choice("--train-dtype", cfg.train_dtype, ("float32", "bfloat16"))
    check_at_least(cfg, 1, "micro_batch")
    check_at_least(cfg, 0, "lr", "lora_rank")
    check_positive(cfg, "lora_alpha")
    if cfg.eval_every and not cfg.val_n:
        raise UsageError("--eval-every: validation needs held-out questions (--val-n >= 1)")
    if cfg.init_adapter and not cfg.lora_rank:
        raise UsageError("--init-adapter: adapters train with --lora-rank >= 1")
    paths = init_adapters(cfg)
    for path in paths:
        state = read_adapter(path)
        if not isinstance(state, dict):
            raise UsageError(f"--init-adapter {path}: not an adapter file")
        rank, alpha = state.get("rank"), state.get("alpha")
        if len(paths) == 1 and (rank, alpha) != (cfg.lora_rank, cfg.lora_alpha):
            raise UsageError(
                f"--init-adapter {path}: rank {rank}, alpha {alpha} there, --lora-rank "
                f"{cfg.lora_rank} --lora-alpha {cfg.lora_alpha} here"
            )


def init_adapters(cfg):
    """--init-adapter's adapters: none, one for every trained adapter, or one for each."""
    return [path for path in cfg.init_adapter.split(",") if path]


def check_rollouts(cfg, world, advantages, aggregations):
    """The checks of RolloutConfig's flags: --algo among `advantages`, --loss-agg among
    `aggregations` (softrank's), the groups."""
    check_choice("--algo", cfg.algo, advantages)
    check_choice("--loss-agg", cfg.loss_agg, aggregations)
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
    step. With --train-dtype bfloat16 the rollouts come from a bf16 copy refreshed every step
    (autocast on fp32 weights would cast every weight at every decoded token)."""
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
    paths = init_adapters(cfg)
    if cfg.lora_rank and paths:
        if len(paths) not in (1, n_trained):
            raise UsageError(
                f"--init-adapter: {len(paths)} adapters for {n_trained} trained ones (one for "
                "all, or one each)"
            )
        for k in range(n_trained):
            path = paths[k % len(paths)]
            try:
                lora.load_adapter(models[0], read_adapter(path))
            except lora.AdapterMismatch as e:
                raise FileRefused(f"{path}: {e}") from None
            # from here on these weights are not the file's: no cache key or shared prefix as if
            models[0].lora["names"][k] = f"unsaved{k}"
    elif cfg.lora_rank:
        parts = [part for part in cfg.lora_targets.split(",") if part]
        lora.add_lora(models[0], cfg.lora_rank, cfg.lora_alpha, n_trained, cfg.seed, parts)
    if cfg.train_dtype == "bfloat16":
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
    """What softrank.policy_step minimizes: the token-level policy gradient aggregated by `agg`
    (softrank.PG_KINDS), + `beta` x the KL(pi || initial model), on log-probs at `temperature`
    (the rollouts' own)."""

    agg: str
    beta: float
    temperature: float


class Learner(NamedTuple):
    """One set of trained weights in an optimizer step: the module the loss runs (DDP-wrapped for
    whole weights), the parameters it trains (clipped together), its LoRA adapter (None: whole
    weights) and the frozen model of a KL term (None with an adapter: the base, adapter off)."""

    module: torch.nn.Module
    parameters: list
    adapter: int | None = None
    reference: torch.nn.Module | None = None


def learners_of(models, cfg, kl, device):
    """One Learner per trained set of weights: each LoRA adapter of the one model, or each whole
    model (DDP-wrapped; with a `kl` term in the loss, a frozen copy as the KL's reference)."""
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
            copy.deepcopy(m).eval().requires_grad_(False) if kl else None,
        )
        for m in models
    ]


def learning_rate(cfg, adapter_lr):
    """--lr, else the measured defaults (results/README.md): `adapter_lr` for adapters, 1e-5 for
    whole weights."""
    if not cfg.lr and cfg.lora_rank:
        return adapter_lr
    return cfg.lr or 1e-5


class Resumed(NamedTuple):
    """What `resumed` returns: the optimizer of the trained weights, the module that holds them
    for the checkpoint, the counters to resume from, the metrics log and the Learners."""

    optimizer: torch.optim.Optimizer
    holder: torch.nn.Module
    counters: dict
    log: MetricsLog
    learners: list


def resumed(models, cfg, out, ranks, *, lr, kl=False, extendable="steps"):
    """The optimizer of the trained weights at `lr`, the module holding them for the checkpoint
    (the adapters only, MBs, or the whole models), the counters a checkpoint in `out` resumes from
    (`extendable`: the config field a resumed run may raise), the metrics log and the Learners
    (`kl`: the loss has a KL term). ranks: common.Ranks."""
    params = [p for m in models for p in m.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=cfg.weight_decay)
    holder = torch.nn.ParameterList(params) if cfg.lora_rank else torch.nn.ModuleList(models)
    counters = load_checkpoint(out, holder, optimizer, ranks.rank, cfg, extendable=(extendable,))
    counters = counters or {"step": 0}
    log = MetricsLog(out, ranks.rank, counters["step"])
    for m in models:
        if cfg.gradient_checkpointing:
            m.activation_checkpointing_enable(GRADIENT_CHECKPOINTING)
    learners = learners_of(models, cfg, kl, ranks.device)
    return Resumed(optimizer, holder, counters, log, learners)


@dataclass(frozen=True)
class Updater:
    """What an optimizer step over sampled sequences runs its loss in (softrank.policy_step): the
    step's counts over every rank, micro-batches of `micro_batch` sequences under gradient
    accumulation (bf16 autocast with `bf16`), the gradients averaged over ranks and clipped per
    Learner, the optimizer's step. Updater.of makes it from a trainer's flags."""

    optimizer: torch.optim.Optimizer
    micro_batch: int
    pad: int
    ranks: object  # common.Ranks
    max_len: int  # the completions' token budget (softrank.step_normalizer's const)
    bf16: bool = False

    @classmethod
    def of(cls, optimizer, cfg, pad, ranks):
        """The updater of a trainer's flags (TrainerConfig, --max-new-tokens)."""
        bf16 = cfg.train_dtype == "bfloat16"
        return cls(optimizer, cfg.micro_batch, pad, ranks, cfg.max_new_tokens, bf16)

    def groups(self, learners, sequences):
        """(learner, its sequences, (their number, their completion tokens) summed over every
        rank) per learner: one learner (shared weights, the leader's, the solver's) trains on every
        sequence, one per agent on that agent's."""
        mine = [sequences]
        if len(learners) > 1:
            mine = [[s for s in sequences if s.agent == e] for e in range(len(learners))]
        sums = all_reduce_sum(
            [c for g in mine for c in (len(g), sum(len(s.completion_ids) for s in g))],
            self.ranks.device,
        )
        return list(zip(learners, mine, zip(sums[0::2], sums[1::2])))

    def micro_batches(self, learner, sequences):
        """(chunk, its completion_batch, the context its forward and backward run in) per
        micro-batch of `sequences`: gradients accumulate, DDP syncing them on the last. No
        sequence at all (a rank with no question this step): one empty chunk over a FILLER
        sequence, whose backward the collectives still need."""
        starts = range(0, max(len(sequences), 1), self.micro_batch)
        for k in starts:
            chunk = sequences[k : k + self.micro_batch]
            pairs = [(s.prompt_ids, s.completion_ids) for s in chunk or [FILLER]]
            batch = completion_batch(pairs, self.pad, self.ranks.device)
            yield chunk, batch, accumulating(learner.module, last=k == starts[-1])

    def autocast(self):
        """The forward's context: bf16 matmuls on fp32 master weights with `bf16` (what Trainer's
        --bf16 does); the backward runs in the forward's dtypes anyway."""
        device = self.ranks.device
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.bf16)

    def step(self, learners):
        """Averages the adapters' gradients over ranks (DDP averaged the whole weights'), clips
        each learner's, steps the optimizer; returns the gradients' norm over every learner."""
        for learner in (ln for ln in learners if ln.adapter is not None):
            average_gradients(learner.parameters, self.ranks.world)
        norms = torch.stack([torch.nn.utils.clip_grad_norm_(ln.parameters, 1.0) for ln in learners])
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norms.norm())


def rollout_stats(update, rewards, flat, ranks):
    """What a step of rollouts logs, over every rank: the step's `update` (softrank.policy_step's),
    the (questions, G) `rewards` (their mean) and which groups are `flat` (their rewards all equal:
    they teach nothing)."""
    flat = flat.float()
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
        ranks.device,
    )
    return {
        "loss": sums[0] / ranks.world,
        "kl": sums[1] / ranks.world,
        "mean_reward": sums[2] / sums[3],
        "frac_zero_std": sums[4] / sums[5],
        "zero_std_groups": sums[4],
        "grad_norm": update["grad_norm"],
        "tokens": update["tokens"],
        "trained_sequences": sums[6],
    }


def validate(models, team, rollouts, shard, cfg, *, step, ranks, log):
    """Greedy accuracy on held-out questions: `rollouts` (the script's: (sequences, rewards) of
    (team, examples, cfg, step)) once per example of this rank's `shard` at temperature 0, its
    rewards the answers' correctness."""
    refresh_rollout_weights(models, team)
    greedy = dataclasses.replace(cfg, group=1, rollout_temperature=0.0, format_reward=0.0)
    right = rollouts(team, shard, greedy, step)[1] if shard else torch.zeros(0)
    log_accuracy(right, log, step, ranks)


def log_accuracy(right, log, step, ranks):
    """The held-out accuracy over every rank (`right`: this rank's 1 or 0 per question), logged."""
    sums = all_reduce_sum([float(right.sum()), right.numel()], ranks.device)
    log.write(step=step, val_accuracy=sums[0] / sums[1], val_questions=int(sums[1]))
    if ranks.rank == 0:
        print(
            f"step {step}: val accuracy {sums[0] / sums[1]:.3f} ({int(sums[1])} questions)",
            file=sys.stderr,
        )


def save_trained(models, tokenizer, out, cfg):
    """The trained weights: LoRA adapters as PEFT folders that --models reads, and PEFT and vLLM too
    (adapter/, or agent0/, agent1/, ...; lora.write_peft, with the run's settings among this
    project's extras), or whole models as HF directories --model reads (model/, or agent0/, ...).
    Returns what was written."""
    if cfg.lora_rank:
        n = lora.n_adapters(models[0])
        base = cfg.model or backbone.DEFAULT_NAME
        settings = {"training": dataclasses.asdict(cfg)}
        paths = [out / ("adapter" if n == 1 else f"agent{k}") for k in range(n)]
        for k, path in enumerate(paths):
            agent = {"agent": None if n == 1 else k}
            lora.write_peft(lora.adapter_state(models[0], k, base), path, settings | agent)
        return [str(p) for p in paths]
    paths = [out / ("model" if len(models) == 1 else f"agent{e}") for e in range(len(models))]
    for model, path in zip(models, paths):
        model.eval().save_pretrained(path)
        tokenizer.save_pretrained(path)
    return [str(p) for p in paths]
