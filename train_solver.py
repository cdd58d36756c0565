"""An agent's LLM weights by supervised learning on solutions (docs/design.md §8): the task's own
worked solutions, or the backbone's own right answers (rejection sampling).

    python train_solver.py --out-dir runs/solver           # arith's worked solutions
    python eval.py --models default+runs/solver/adapter,default,default --protocols debate
    python train_solver.py --solutions sampled --out-dir runs/solver-sampled

Read top to bottom: the training solutions (worked_solutions, data/worked.py; or right_solutions,
sampled; with --refine-contexts also refine_examples, REFINE prompts over sampled peers with the
worked solution as target), then epochs of cross-entropy on the solution tokens only, the prompt
masked out: llm_step.policy_step with advantage 1 on every sequence and the token mean.

A LoRA adapter by default (llm/lora.py; the base frozen), saved as the PEFT folder adapter/ that
eval.py --models default+adapter,... plays; --lora-rank 0 fine-tunes every weight instead (an HF
directory, model/).
"""

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

import data
from common import (
    FileRefused,
    MetricsLog,
    UsageError,
    all_gather_list,
    all_reduce_sum,
    batch_schedule,
    call_seed,
    check_at_least,
    check_choice,
    crash_if_asked,
    distributed,
    launch_world_size,
    parse_config,
    peak_memory_mb,
    save_checkpoint,
    user_errors,
)
from data import check_task, training_pool, training_questions
from data.worked import WorkedSolutionMissing, worked_solution
from llm import lora
from llm.logprobs import without_dropout
from llm.team import EngineConfig, check_engine, make_engine, read_adapter
from llm.training import (
    check_trainer,
    checkpointed,
    learning_rate,
    log_accuracy,
    loss_modules,
    refresh_rollout_weights,
    save_trained,
    trained_team,
)
from llm_step import Sequence, policy_step
from solutions import GameConfig, check_game, parse_solution, refine_prompt, solve_prompt

# the cross-entropy of the solution tokens as policy_step computes it with advantage 1: every token
# of the step weighs the same (the token mean), no KL term, the model's own distribution
CROSS_ENTROPY = {"agg": "token", "beta": 0.0, "temperature": 1.0}


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
    temperature: float = 0.5
    """the agents' sampling temperature (the temperature study on validation questions)"""
    max_new_tokens: int = 192
    """token budget of each LLM call"""
    trailer: bool = False
    """ask for the Steps / Confidence / Answer trailer (it costs the default backbone accuracy)"""
    whole_solutions: bool = False
    """REFINE and the leader read every solution whole (default: REFINE sees peers' final answers
    and its own last 300 characters, the leader each solution's last 300)"""
    # the engine
    model: str = ""
    """HF checkpoint directory of the agents; empty: the embedded default backbone"""
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
    # the trained weights
    lora_rank: int = 4
    """rank of the LoRA adapters trained on the frozen base (0: full fine-tuning of every weight)"""
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
    fsdp: bool = False
    """--lora-rank 0 under several processes: shard the weights, gradients and optimizer state over
    them with torch FSDP2 (each transformer block its own unit), each process holding 1/world of
    them; the rollouts sample from a whole copy refreshed from the shards (default: DDP, every
    process holds everything)"""
    train_dtype: str = "float32"
    """float32 | bfloat16 (autocast on fp32 master weights; rollouts and validation's answers from a
    bf16 copy)"""
    # the script's own
    solutions: str = "worked"
    """worked (the task's own worked solutions, data/worked.py: arith, gsm8k) | sampled (rejection
    sampling: the backbone's own right answers, ended by themselves, their one `Answer:` field read
    strictly, data.strict_answer)"""
    refine_contexts: str = ""
    """--solutions worked: also one REFINE example per training question, its own solution and its
    peers' answers sampled from the base model with this adapter file (e.g. one trained on worked
    solutions), the worked solution its target"""
    samples: int = 4
    """--solutions sampled: solutions sampled per training question"""
    epochs: int = 30
    """passes over the training solutions"""
    batch_size: int = 256
    """sequences per optimizer step, over all ranks"""
    lr: float = 0.0
    """AdamW learning rate (0: 2e-3 for adapters, 1e-5 for full weights: results/README.md)"""
    out_dir: str = "runs/solver"
    """where the trained weights, metrics.jsonl and the checkpoint go"""

    def game(self):
        """The game's round 0 as these flags set it (the other settings at their defaults)."""
        return GameConfig(
            seed=self.seed,
            agents=self.agents,
            temperature=self.temperature,
            max_new_tokens=self.max_new_tokens,
            trailer=self.trailer,
            whole_solutions=self.whole_solutions,
        )


# --------------------------------------------------------------------------------------------------
# The training solutions: (prompt ids, solution ids + EOS) pairs
# --------------------------------------------------------------------------------------------------
def views(example, cfg):
    """The agents whose view of the question differs (task split: each agent's values, dealt), or
    [None]: every agent sees the one question."""
    return list(range(cfg.agents)) if "views" in example.meta else [None]


def worked_solutions(engine, cfg):
    """--solutions worked: (prompt ids, worked solution ids + EOS) of the training questions, the
    solve prompt as the game asks it; task split: one per agent, its view of the question and the
    solution from the values it holds (state them, say what it lacks, its best answer)."""
    questions, _ = training_questions(cfg)
    eos = engine.tokenizer.eos_token_id
    try:
        return [
            (
                engine.encode(engine.chat(solve_prompt(ex, agent=agent))),
                engine.encode(worked_solution(ex, agent)) + [eos],
            )
            for ex in questions
            for agent in views(ex, cfg)
        ]
    except WorkedSolutionMissing as e:
        raise UsageError(f"--solutions worked: {e}; use --solutions sampled") from None


def refine_examples(engine, cfg, ranks):
    """--refine-contexts: one REFINE example per training question. Its prompt is the game's refine
    prompt with the agent's own solution and its cfg.agents - 1 peers' answers (their whole
    solutions with --whole-solutions), all sampled (at --temperature) from the base model with the
    adapter file --refine-contexts names, each from its own view of the question; its target is the
    worked solution from every value, whether the sampled answer was right or wrong, so that an
    agent learns to answer right after reading its peers (task split: to take the values it lacks
    from their solutions). Each rank samples its shard; every rank gets them all, in the
    questions' order."""
    try:
        adapter = lora.load_adapter(engine.model, read_adapter(cfg.refine_contexts))
    except lora.AdapterMismatch as e:
        raise FileRefused(f"{cfg.refine_contexts}: {e}") from None
    questions, _ = training_questions(cfg)
    mine = list(enumerate(questions))[ranks.rank :: ranks.world]
    calls = [(q, ex, i) for q, ex in mine for i in range(cfg.agents)]
    # each agent answers the question as it sees it (task split: its values alone)
    agent = [i if "views" in ex.meta else None for _, ex, i in calls]
    completions = engine.generate(
        [engine.chat(solve_prompt(ex, agent=a)) for (_, ex, _), a in zip(calls, agent)],
        [call_seed(cfg.seed, ex.id, i, "refine-context") for _, ex, i in calls],
        max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature,
        adapters=[adapter] * len(calls),
    )
    teams = {}
    for (q, ex, i), c in zip(calls, completions):
        teams.setdefault(q, []).append(parse_solution(c.text, ex.task))
    eos = engine.tokenizer.eos_token_id
    examples = [
        (
            q,
            engine.encode(engine.chat(refine_prompt(ex, teams[q], 0, whole=cfg.whole_solutions))),
            engine.encode(worked_solution(ex)) + [eos],
        )
        for q, ex in mine
    ]
    return [(prompt, target) for _, prompt, target in sorted(all_gather_list(examples))]


def right_solutions(engine, cfg, ranks):
    """--solutions sampled (rejection sampling): cfg.samples solutions of the backbone to each
    training question, kept where right as the training reward reads it (data.strict_answer: the
    one `Answer:` field, on the last line) and ended by the EOS, never cut off at the token budget
    (with --trailer, also well-formatted), as (prompt ids, completion ids + EOS). Each rank samples
    its shard; every rank gets all of them, sorted, whatever the world size."""
    questions, _ = training_questions(cfg)
    calls = [(ex, k) for ex in questions[ranks.rank :: ranks.world] for k in range(cfg.samples)]
    # as agent 0 sees each question (task split: its values)
    prompts = [engine.chat(solve_prompt(ex, cfg.trailer, 0)) for ex, _ in calls]
    seeds = [call_seed(cfg.seed, ex.id, k, "sft-llm") for ex, k in calls]
    completions = engine.generate(
        prompts, seeds, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature
    )
    eos = engine.tokenizer.eos_token_id
    kept = []
    for (ex, _), prompt, c in zip(calls, prompts, completions):
        s = parse_solution(c.text, ex.task)
        # the training reward's reading: the one `Answer:` field, never the evaluation's fallbacks
        right = data.is_correct(data.strict_answer(c.text, ex.task), ex.answer, ex.task)
        if c.finish == "eos" and right and (s.trailer_ok or not cfg.trailer):
            kept.append((engine.encode(prompt), engine.encode(c.text) + [eos]))
    kept = sorted(all_gather_list(kept))
    if ranks.rank == 0:
        kind = " well-formatted" if cfg.trailer else ""
        print(
            f"kept {len(kept)} right{kind} solutions of {len(questions) * cfg.samples} samples",
            file=sys.stderr,
        )
    return kept


def validate(models, team, shard, cfg, *, step, ranks, log):
    """Greedy accuracy on this rank's held-out questions: each one's answer alone (a team of one,
    no deliberation; agent 0's view of the question), logged over every rank."""
    refresh_rollout_weights(models, team)
    right = torch.zeros(0)
    if shard:
        prompts = [solve_prompt(ex, cfg.trailer, 0) for ex in shard]
        # greedy (no seed draws anything), by agent 0, the trained one
        zeros = [0] * len(shard)
        completions = team.generate(
            prompts, zeros, zeros, max_new_tokens=cfg.max_new_tokens, temperature=0.0
        )
        answers = [parse_solution(c.text, ex.task).answer for ex, c in zip(shard, completions)]
        right = torch.tensor(
            [float(data.is_correct(a, ex.answer, ex.task)) for a, ex in zip(answers, shard)]
        )
    log_accuracy(right, log, step, ranks)


# --------------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------------
def train(cfg, ranks):
    out = Path(cfg.out_dir)
    torch.manual_seed(cfg.seed)
    models, team = trained_team(cfg, 1, ranks.device)
    # the base model's own generations, cached: sampled solutions, or REFINE contexts
    sampler = EngineConfig(
        model=cfg.model,
        dtype=cfg.train_dtype,
        engine_batch_size=cfg.engine_batch_size,
        cache_dir=cfg.cache_dir,
    )
    if cfg.solutions == "worked":
        kept = worked_solutions(team.first, cfg)
        if cfg.refine_contexts:
            contexts = make_engine(sampler, cfg.agents, ranks.rank, ranks.device)
            kept += refine_examples(contexts, cfg, ranks)
            del contexts
    else:
        engine = make_engine(sampler, cfg.agents, ranks.rank, ranks.device)
        kept = right_solutions(engine, cfg, ranks)
    if len(kept) < cfg.batch_size:
        raise UsageError(
            f"only {len(kept)} training solutions for a --batch-size of {cfg.batch_size}: "
            "raise --questions (or --samples), or lower --batch-size"
        )
    modules, _ = loss_modules(models, cfg, ranks.device, kl=False)
    lr = learning_rate(cfg, adapter_lr=2e-3)
    optimizer, holder, counters = checkpointed(models, cfg, out, ranks, lr=lr, extendable="epochs")
    log = MetricsLog(out, ranks.rank, counters["step"])
    tokenizer = team.first.tokenizer
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    validation = training_pool(cfg)[: cfg.val_n][ranks.rank :: ranks.world]
    batches = batch_schedule(len(kept), cfg.batch_size, cfg.epochs, cfg.seed, "sft-llm")

    if cfg.eval_every and counters["step"] == 0:
        validate(models, team, validation, cfg, step=0, ranks=ranks, log=log)
    bar = tqdm(range(counters["step"], len(batches)), desc="solver", disable=ranks.rank != 0)
    for step in bar:
        began = time.time()
        rows = batches[step][ranks.rank :: ranks.world].tolist()
        sequences = [Sequence(k, 0, 0, *kept[i]) for k, i in enumerate(rows)]
        advantages = torch.ones(max(len(sequences), 1), 1)
        without_dropout(models[0].train())
        update = policy_step(
            modules,
            optimizer,
            sequences,
            advantages,
            **CROSS_ENTROPY,
            max_len=cfg.max_new_tokens,
            micro_batch=cfg.micro_batch,
            pad=pad,
            bf16=cfg.train_dtype == "bfloat16",
            ranks=ranks,
        )
        loss = all_reduce_sum([update["loss"]], ranks.device)[0] / ranks.world
        bar.set_postfix(loss=f"{loss:.4f}")
        log.write(
            step=step + 1,
            loss=loss,
            grad_norm=update["grad_norm"],
            step_s=time.time() - began,
            peak_memory_mb=peak_memory_mb(ranks.device),
        )
        if cfg.eval_every and ((step + 1) % cfg.eval_every == 0 or step + 1 == len(batches)):
            validate(models, team, validation, cfg, step=step + 1, ranks=ranks, log=log)
        if (step + 1) % cfg.save_every == 0 or step + 1 == len(batches):
            save_checkpoint(out, holder, optimizer, {"step": step + 1}, cfg, ranks.rank)
        crash_if_asked(cfg, step + 1)
    saved = save_trained(models, tokenizer, out, cfg, ranks.rank)
    if ranks.rank == 0:
        print(json.dumps({"solutions": len(kept), "steps": len(batches), "saved": saved}))


def check(cfg, world):
    """The whole configuration, before any model is loaded (a mistake: common.UsageError)."""
    check_task(cfg)
    check_game(cfg.game(), min_agents=1, min_rounds=0)
    engine = EngineConfig(model=cfg.model, engine_batch_size=cfg.engine_batch_size)
    check_engine(engine, cfg.agents, cfg.max_new_tokens)
    check_at_least(1, questions=cfg.questions)
    check_trainer(cfg)
    check_choice("--solutions", cfg.solutions, ("worked", "sampled"))
    if cfg.solutions == "worked" and cfg.trailer:
        raise UsageError("--solutions worked: worked solutions carry no trailer (drop --trailer)")
    check_at_least(1, samples=cfg.samples, epochs=cfg.epochs, batch_size=cfg.batch_size)
    if cfg.refine_contexts and cfg.solutions != "worked":
        raise UsageError("--refine-contexts: REFINE examples need --solutions worked")
    if cfg.refine_contexts:
        read_adapter(cfg.refine_contexts)


if __name__ == "__main__":
    config = parse_config(Config, description=__doc__.split("\n\n")[0])
    with user_errors(config.out_dir):
        check(config, launch_world_size())
        with distributed(config.out_dir) as ranks:
            train(config, ranks)
