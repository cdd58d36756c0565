"""What the LLM-weight trainers share (train_solver.py, train_magrpo.py, train_mlpo.py;
docs/design.md §8), the plumbing around their learning step: the weights they train and the engines
that sample from them, resume, validation's log and the saved weights. Nothing here knows the game
or the loss: each script builds its own sequences and rewards, and the step itself (micro-batches,
loss, backward, optimizer step) is llm_step.policy_step.

check_trainer, check_rollouts - the checks of the flags every trainer declares, and those of
                    MAGRPO's and MLPO's rollouts
trained_team      - the trained weights (whole models or LoRA adapters) and the team of engines
                    that samples from them; refresh_rollout_weights before each sampling
sample, prompt_ids - the rollouts' completions at the loss's temperature; a prompt's token ids
loss_modules      - the trained weights as the step runs them (DDP or FSDP2, gradient
                    checkpointing) and the KL's references
checkpointed      - the optimizer, the checkpoint's holder and the counters to go on from
unseen_pool       - the training questions, less those the starting adapters were trained on
                    (--unseen-questions; adapter_trainings: what each adapter's mpdf.json records)
rollout_stats     - what a step of rollouts logs
validate          - greedy accuracy on held-out questions (log_accuracy: its sum over the ranks)
save_trained      - adapter files or HF directories
"""

import copy
import dataclasses
import json
import sys
from pathlib import Path

import torch

from common import (
    FileRefused,
    UsageError,
    all_reduce_sum,
    check_at_least,
    check_choice,
    check_positive,
    load_checkpoint,
    sharded,
    whole,
    wrap_ddp,
    wrap_fsdp,
)
from data import trained_questions, training_pool
from llm import backbone, lora
from llm.engine import Engine
from llm.team import Member, Team, read_adapter

# non-reentrant (torch's recommended variant): needs no input that requires a gradient
# (the base is frozen under LoRA)
GRADIENT_CHECKPOINTING = {"use_reentrant": False}


def check_trainer(cfg):
    """The checks of the flags every LLM-weight trainer declares (the trained weights, the step,
    the validation; a mistake: common.UsageError)."""
    check_choice("--train-dtype", cfg.train_dtype, ("float32", "bfloat16"))
    check_at_least(1, micro_batch=cfg.micro_batch, save_every=cfg.save_every)
    check_at_least(0, lr=cfg.lr, lora_rank=cfg.lora_rank, val_n=cfg.val_n)
    check_at_least(0, eval_every=cfg.eval_every, weight_decay=cfg.weight_decay)
    check_positive(lora_alpha=cfg.lora_alpha)
    if cfg.eval_every and not cfg.val_n:
        raise UsageError("--eval-every: validation needs held-out questions (--val-n >= 1)")
    if cfg.init_adapter and not cfg.lora_rank:
        raise UsageError("--init-adapter: adapters train with --lora-rank >= 1")
    if cfg.fsdp and cfg.lora_rank:
        raise UsageError(
            "--fsdp shards whole weights (--lora-rank 0): adapters train on a frozen base that "
            "every process holds whole anyway"
        )
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


def adapter_trainings(paths):
    """The training settings recorded in each adapter folder of `paths` (its mpdf.json) and in
    every adapter it started from or read (its --init-adapter and --refine-contexts), each once:
    what a trainer starting from them needs to keep its questions apart from theirs."""
    trainings, todo, read = [], list(paths), set()
    while todo:
        path = todo.pop()
        if path in read:
            continue
        read.add(path)
        extras = Path(path) / lora.EXTRAS
        try:
            settings = json.loads(extras.read_text()).get("training") if extras.is_file() else None
        except (ValueError, AttributeError):
            settings = None
        if not isinstance(settings, dict):
            raise UsageError(
                f"{path}: records no training settings (its {lora.EXTRAS}), so its "
                "questions cannot be told apart"
            )
        trainings.append(settings)
        todo += [
            p
            for key in ("init_adapter", "refine_contexts")
            for p in str(settings.get(key) or "").split(",")
            if p
        ]
    return trainings


def unseen_pool(cfg, adapters):
    """The training pool (data.training_pool): with --unseen-questions, less every question the
    `adapters` and the adapters they started from were trained on, so that a trainer starting from
    a team that learned its questions by heart does not validate or train on them."""
    pool = training_pool(cfg)
    if not cfg.unseen_questions:
        return pool
    seen = trained_questions(adapter_trainings(adapters))
    return [example for example in pool if example.question not in seen]


def check_rollouts(cfg, world, advantages, aggregations):
    """The checks of the rollouts' flags (MAGRPO's and MLPO's): --algo among `advantages`,
    --loss-agg among `aggregations` (softrank's), the groups."""
    check_choice("--algo", cfg.algo, advantages)
    check_choice("--loss-agg", cfg.loss_agg, aggregations)
    check_at_least(1, steps=cfg.steps, questions_per_step=cfg.questions_per_step)
    # a group of one has no baseline: every advantage would be 0
    check_at_least(2, group=cfg.group)
    check_at_least(0, beta=cfg.beta, format_reward=cfg.format_reward)
    # greedy rollouts of a group are identical: every group flat
    check_positive(rollout_temperature=cfg.rollout_temperature, tau=cfg.tau)
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
    (autocast on fp32 weights would cast every weight at every decoded token); with --fsdp from a
    whole copy on every rank, refreshed from the shards before each sampling
    (refresh_rollout_weights): the engine decodes with whole weights, the trainer holds 1/world of
    them and their gradients and optimizer state."""
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
    if cfg.train_dtype == "bfloat16" or cfg.fsdp:
        dtype = torch.bfloat16 if cfg.train_dtype == "bfloat16" else torch.float32
        engines = [
            Engine(
                model=copy.deepcopy(m).to(dtype),
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
    """The rollout engines sample from the current weights: a separate copy (bf16, or whole
    weights beside FSDP2's shards) gets them copied, each sharded weight gathered whole first
    (every rank takes part: each gathers every weight)."""
    for m, engine in zip(models, team.engines()):
        # generation: the KV cache (gradient checkpointing turns it off in train mode)
        m.eval()
        if engine.model is not m:
            with torch.no_grad():
                for rollout_weight, weight in zip(engine.model.parameters(), m.parameters()):
                    rollout_weight.copy_(whole(weight))


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


def loss_modules(models, cfg, device, kl):
    """(the modules the loss runs, the KL's references): the trained `models` as
    llm_step.policy_step takes them. Whole weights are DDP-wrapped, or sharded in place with FSDP2
    (--fsdp), under several processes, and with a `kl` term each gets a frozen copy of its weights
    as they are now, before any step, sharded alike (with adapters the KL's reference is the base
    itself: None). Gradient checkpointing as --gradient-checkpointing asks. Call it before the
    optimizer is made: sharding replaces the parameters."""
    for m in models:
        if cfg.gradient_checkpointing:
            m.activation_checkpointing_enable(GRADIENT_CHECKPOINTING)
    if cfg.lora_rank:
        return models, None
    references = [copy.deepcopy(m).eval().requires_grad_(False) for m in models] if kl else None
    if cfg.fsdp:
        references = references and [wrap_fsdp(r, device) for r in references]
        return [wrap_fsdp(m, device) for m in models], references
    return [wrap_ddp(m, device, find_unused=False) for m in models], references


def checkpointed(models, cfg, out, ranks, *, lr, extendable):
    """(AdamW over the trained parameters at `lr`, the module that holds them in the checkpoint,
    the counters to go on from): the adapters' parameters (MBs) or the whole models, restored from
    a checkpoint in `out` if there is one (`extendable`: the flag a resumed run may raise, e.g.
    steps), else {"step": 0}."""
    params = [p for m in models for p in m.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=cfg.weight_decay)
    holder = torch.nn.ParameterList(params) if cfg.lora_rank else torch.nn.ModuleList(models)
    counters = load_checkpoint(out, holder, optimizer, ranks.rank, cfg, extendable=(extendable,))
    return optimizer, holder, counters or {"step": 0}


def learning_rate(cfg, adapter_lr):
    """--lr, else the measured defaults (results/README.md): `adapter_lr` for adapters, 1e-5 for
    whole weights."""
    if not cfg.lr and cfg.lora_rank:
        return adapter_lr
    return cfg.lr or 1e-5


def rollout_stats(update, rewards, flat, ranks):
    """What a step of rollouts logs, over every rank: the step's `update` (llm_step.policy_step's),
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
        "mean_reward": sums[2] / max(sums[3], 1),
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


def save_trained(models, tokenizer, out, cfg, rank):
    """The trained weights: LoRA adapters as PEFT folders that --models reads, and PEFT and vLLM too
    (adapter/, or agent0/, agent1/, ...; lora.write_peft, with the run's settings among this
    project's extras), or whole models as HF directories --model reads (model/, or agent0/, ...),
    each one directory written by rank 0 (FSDP2's shards gathered whole first: every rank calls
    it). Returns what was written."""
    if cfg.lora_rank:
        n = lora.n_adapters(models[0])
        base = cfg.model or backbone.DEFAULT_NAME
        settings = {"training": dataclasses.asdict(cfg)}
        paths = [out / ("adapter" if n == 1 else f"agent{k}") for k in range(n)]
        for k, path in enumerate(paths):
            agent = {"agent": None if n == 1 else k}
            if rank == 0:
                lora.write_peft(lora.adapter_state(models[0], k, base), path, settings | agent)
        return [str(p) for p in paths]
    paths = [out / ("model" if len(models) == 1 else f"agent{e}") for e in range(len(models))]
    for model, path in zip(models, paths):
        state = None
        if sharded(model):
            state = {name: whole(t).cpu() for name, t in model.state_dict().items()}
        if rank == 0:
            model.eval().save_pretrained(path, state_dict=state)
            tokenizer.save_pretrained(path)
    return [str(p) for p in paths]
