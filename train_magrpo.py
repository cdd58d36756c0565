"""MAGRPO (arXiv 2508.04652, docs/design.md §8): the agents' LLM weights, trained on their own
deliberation under one joint reward.

    python train_magrpo.py --protocol debate --agents 3 --rounds 1 --out-dir runs/magrpo
    python eval.py --models default+runs/magrpo/adapter,... --protocols debate

Read top to bottom: G joint rollouts of the protocol per question (every agent answers; with
--protocol debate, --rounds REFINE rounds), one joint reward per rollout (the team vote's
correctness), its group advantage shared by every agent of the rollout; each agent learns from its
own sampled tokens only. With --reward revision, each agent's own reward instead: the vote's, +
SCoRe's shaped reward of its revision (revision_reward), its advantage among its own G rollouts.
On-policy: one optimizer step per batch of rollouts, no ratio, no clip. A step reads:
joint_rollouts -> llm_step.rollout_update (softrank.group_advantages, then llm_step.policy_step).

The reward rules: the reward reads only the one `Answer:` field the prompt asks for, on the
completion's last line (data.strict_answer; the evaluation keeps its lenient reader), and a rollout
with a completion cut off at --max-new-tokens earns 0 (--truncated zero) or leaves the step (drop),
before the advantages (llm_step.rollout_update). Each step logs the truncated share and the share
of completions right only by the evaluation's leniency (lenient_only).

LoRA adapters by default (llm/lora.py; the base frozen): one for every agent, or one per agent
(--separate-agents), saved as small PEFT folders (adapter/ or agent<i>/) that eval.py --models
default+<folder>,... plays (and PEFT and vLLM load); --lora-rank 0 fine-tunes every weight
instead (an HF directory per model).
"""

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

import data
import softrank
from common import (
    MetricsLog,
    UsageError,
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
from data import check_task
from llm.team import EngineConfig, check_engine
from llm.training import (
    check_rollouts,
    check_trainer,
    checkpointed,
    init_adapters,
    learning_rate,
    loss_modules,
    prompt_ids,
    refresh_rollout_weights,
    sample,
    save_trained,
    trained_team,
    unseen_pool,
    validate,
)
from llm_step import TRUNCATED_RULES, Sequence, rollout_update
from solutions import (
    GameConfig,
    check_game,
    majority_vote,
    parse_solution,
    refine_prompt,
    solve_prompt,
)


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
    max_new_tokens: int = 192
    """token budget of each LLM call"""
    trailer: bool = False
    """ask for the Steps / Confidence / Answer trailer (it costs the default backbone accuracy)"""
    vote: str = "mean_prob"
    """the vote's tie-break signal, the same for every protocol (solutions.VOTE_RULES)"""
    whole_solutions: bool = False
    """REFINE and the leader read every solution whole (default: REFINE sees peers' final answers
    and its own last 300 characters, the leader each solution's last 300)"""
    # the engine
    model: str = ""
    """HF checkpoint directory of the agents; empty: the embedded default backbone"""
    engine_batch_size: int = 128
    """engine slots (sequences decoded together; docs/design.md §11)"""
    # the run
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
    unseen_questions: bool = False
    """train and validate only on questions that no adapter this run starts from or reads (its
    --init-adapter, MLPO's --peers, and the adapters those started from) was trained on, as their
    mpdf.json records it: a team that learned its questions by heart leaves flat reward groups"""
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
    # the rollouts
    group: int = 4
    """G: rollouts per question, whose rewards give each its group advantage"""
    algo: str = "magrpo"
    """the group advantage: magrpo (reward - group mean, the paper's) | grpo (z-score) | softrank
    (softrank.group_advantages)"""
    tau: float = 0.5
    """SoftRank temperature of the quantiles (softrank.softrank_advantages, with --algo softrank;
    the study's choice, the paper's best: 0.8)"""
    format_reward: float = 0.0
    """+ this times the share of the rollout's final answers that the training reward reads (one
    `Answer:` field; MAGRPO: the team's, MLPO: the leader's)"""
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
    """token (DAPO) | seq (GRPO) | const (Dr.GRPO, MLPO's) | sum (CoMLRL's MAGRPO: each completion's
    token log-probs summed, times its advantage, averaged over completions), see softrank.aggregate
    """
    truncated: str = "zero"
    """a rollout with a completion cut off at --max-new-tokens before its end: zero (its reward is
    0, the least a rollout earns) | drop (out of the loss and of its group's statistics); the reward
    reads only the one `Answer:` field the prompt asks for (data.strict_answer)"""
    # the script's own
    protocol: str = "debate"
    """parallel (independent answers, then the vote) | debate (--rounds REFINE rounds)"""
    reward: str = "vote"
    """vote (the team vote's correctness, every agent's) | revision (each agent's own: the vote's,
    + revision_reward of its round-0 and final answers; debate only)"""
    revision_bonus: float = 0.5
    """--reward revision's bonus for wrong -> right and penalty for right -> wrong (below 1: a right
    first answer stays worth more than a wrong one)"""
    separate_agents: bool = False
    """one set of trained weights per agent, an adapter or a whole copy (default: one shared)"""
    lr: float = 0.0
    """AdamW learning rate (0: 5e-4 for adapters, 1e-5 for full weights: results/README.md)"""
    out_dir: str = "runs/magrpo"
    """where the trained weights, metrics.jsonl and the checkpoint go"""


# --------------------------------------------------------------------------------------------------
# The rollouts: the game played by the agents being trained
# --------------------------------------------------------------------------------------------------
def revision_reward(first, final, example, bonus):
    """SCoRe's shaped reward of one agent's revision (arXiv 2409.12917, stage II; docs/design.md
    §8): both answers' correctness, + bonus x (final - first): wrong -> right 1 + bonus, right ->
    wrong 1 - bonus, right -> right 2, wrong -> wrong 0."""
    right = [float(data.is_correct(s.answer, example.answer, example.task)) for s in (first, final)]
    return right[0] + right[1] + bonus * (right[1] - right[0])


def joint_rollouts(team, examples, cfg, step, read=data.strict_answer):
    """G rollouts of the protocol for each example. Returns (sequences, rewards): every agent's
    Sequences and a tensor of rewards, G columns and a row per example: the team vote's correctness
    (+ format_reward x the fraction of final answers that parse). With --reward revision, a row
    per example and agent (q * agents + i): that reward + the agent's revision_reward. A
    sequence's `question` is its row, so each agent's group is its own G rollouts.
    The rewards read each answer with `read`: the training reward's strict reader (the one
    `Answer:` field, data.strict_answer), or the evaluation's lenient one (the held-out accuracy);
    the game itself (the peers' answers a REFINE prompt shows, the sampling) reads as eval.py's."""
    per_agent = cfg.reward == "revision"
    teams = {(q, g): [None] * cfg.agents for q in range(len(examples)) for g in range(cfg.group)}
    # each rollout's solutions as the reward reads them
    graded = {key: [None] * cfg.agents for key in teams}
    sequences = []

    def run_round(t, prompt_of):
        """Every agent of every rollout answers prompt_of(q, g, i), built from the teams before the
        round (simultaneous moves), with its own weights (team: one call per engine)."""
        solutions = {}
        calls = [(q, g, i) for (q, g) in teams for i in range(cfg.agents)]
        prompts = [prompt_of(q, g, i) for q, g, i in calls]
        seeds = [call_seed(cfg.seed, "agents", step, examples[q].id, g, i, t) for q, g, i in calls]
        completions = sample(team, prompts, seeds, [i for _, _, i in calls], cfg)
        for (q, g, i), prompt, c in zip(calls, prompts, completions):
            ex = examples[q]
            solution = parse_solution(
                c.text, ex.task, token_logprobs=c.token_logprobs, vote=cfg.vote
            )
            lenient_only = data.lenient_only(c.text, ex.answer, ex.task)
            row = q * cfg.agents + i if per_agent else q
            ids = prompt_ids(team, prompt, i)
            truncated = c.finish == "length"
            sequences.append(Sequence(row, g, i, ids, c.token_ids, truncated, lenient_only))
            solutions[(q, g, i)] = solution
            graded[(q, g)][i] = dataclasses.replace(solution, answer=read(c.text, ex.task))
        for (q, g, i), solution in solutions.items():
            teams[(q, g)][i] = solution

    def refine(q, g, i):
        return refine_prompt(examples[q], teams[(q, g)], i, cfg.trailer, cfg.whole_solutions)

    run_round(0, lambda q, g, i: solve_prompt(examples[q], cfg.trailer, i))
    first = {key: list(team) for key, team in graded.items()}
    for t in range(1, cfg.rounds + 1 if cfg.protocol == "debate" else 1):
        run_round(t, refine)
    rewards = torch.zeros(len(examples) * (cfg.agents if per_agent else 1), cfg.group)
    for (q, g), team in graded.items():
        ex, (vote, _) = examples[q], majority_vote(team)
        joint = float(data.is_correct(vote, ex.answer, ex.task))
        joint += cfg.format_reward * sum(s.answer is not None for s in team) / len(team)
        if not per_agent:
            rewards[q, g] = joint
            continue
        for i in range(cfg.agents):
            own = revision_reward(first[(q, g)][i], team[i], ex, cfg.revision_bonus)
            rewards[q * cfg.agents + i, g] = joint + own
    return sequences, rewards


def vote_rollouts(team, examples, cfg, step):
    """joint_rollouts rewarded by the team vote whatever --reward says, read as eval.py reads it:
    the held-out accuracy."""
    cfg = dataclasses.replace(cfg, reward="vote")
    return joint_rollouts(team, examples, cfg, step, read=data.extract_answer)


# --------------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------------
def train(cfg, ranks):
    out = Path(cfg.out_dir)
    torch.manual_seed(cfg.seed)
    pool = unseen_pool(cfg, init_adapters(cfg))
    models, team = trained_team(cfg, cfg.agents if cfg.separate_agents else 1, ranks.device)
    modules, references = loss_modules(models, cfg, ranks.device, kl=bool(cfg.beta))
    lr = learning_rate(cfg, adapter_lr=5e-4)
    optimizer, holder, counters = checkpointed(models, cfg, out, ranks, lr=lr, extendable="steps")
    log = MetricsLog(out, ranks.rank, counters["step"])
    validation = pool[: cfg.val_n][ranks.rank :: ranks.world]
    pool = pool[cfg.val_n :]
    pad = team.first.tokenizer.pad_token_id

    def validated(step):
        validate(models, team, vote_rollouts, validation, cfg, step=step, ranks=ranks, log=log)

    if cfg.eval_every and counters["step"] == 0:
        validated(0)
    bar = tqdm(range(counters["step"], cfg.steps), desc=f"{cfg.algo} agents", disable=ranks.rank)
    for step in bar:
        began = time.time()
        start = step * cfg.questions_per_step
        questions = [pool[(start + k) % len(pool)] for k in range(cfg.questions_per_step)]
        refresh_rollout_weights(models, team)
        mine = questions[ranks.rank :: ranks.world]
        sequences, rewards = joint_rollouts(team, mine, cfg, step)
        rollout_s = time.time() - began
        stats = rollout_update(
            modules, optimizer, sequences, rewards, cfg, pad=pad, ranks=ranks, references=references
        )
        stats["rollout_s"] = rollout_s
        stats |= {"step_s": time.time() - began, "peak_memory_mb": peak_memory_mb(ranks.device)}
        bar.set_postfix(reward=f"{stats['mean_reward']:.3f}")
        log.write(step=step + 1, **stats)
        if cfg.eval_every and ((step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps):
            validated(step + 1)
        if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
            save_checkpoint(out, holder, optimizer, {"step": step + 1}, cfg, ranks.rank)
        crash_if_asked(cfg, step + 1)
    saved = save_trained(models, team.first.tokenizer, out, cfg, ranks.rank)
    if ranks.rank == 0:
        print(json.dumps({"steps": cfg.steps, "saved": saved}))


def check(cfg, world):
    """The whole configuration, before any model is loaded (a mistake: common.UsageError). One
    agent is allowed: MAGRPO with one agent is GRPO."""
    check_task(cfg)
    game = GameConfig(
        agents=cfg.agents, rounds=cfg.rounds, max_new_tokens=cfg.max_new_tokens, vote=cfg.vote
    )
    check_game(game, min_agents=1, min_rounds=0)
    engine = EngineConfig(model=cfg.model, engine_batch_size=cfg.engine_batch_size)
    check_engine(engine, cfg.agents, cfg.max_new_tokens)
    check_trainer(cfg)
    check_rollouts(cfg, world, softrank.GROUP_ADVANTAGES, softrank.PG_KINDS)
    check_choice("--truncated", cfg.truncated, TRUNCATED_RULES)
    check_choice("--protocol", cfg.protocol, ("parallel", "debate"))
    check_choice("--reward", cfg.reward, ("vote", "revision"))
    check_at_least(0, revision_bonus=cfg.revision_bonus)
    if cfg.reward == "revision" and (cfg.protocol != "debate" or cfg.rounds < 1):
        raise UsageError(
            "--reward revision rewards a revision: pass --protocol debate, --rounds >= 1"
        )


if __name__ == "__main__":
    config = parse_config(Config, description=__doc__.split("\n\n")[0])
    with user_errors(config.out_dir):
        check(config, launch_world_size())
        with distributed(config.out_dir) as ranks:
            train(config, ranks)
