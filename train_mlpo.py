"""MLPO (arXiv 2507.08960, docs/design.md §8): a leader's LLM weights, trained to answer after
reading its frozen peers' solutions.

    python train_mlpo.py --agents 3 --out-dir runs/mlpo
    python eval.py --protocols leader=default+runs/mlpo/adapter      # peers answer, the trained
                                                                     # leader decides

Read top to bottom: the frozen peers' solutions to the training questions are generated once
(peer_pool); questions the peers already get right (>= --filter-easy of them) are dropped, and
with --balance-vote as many questions the peers' vote gets right are kept as it gets wrong; the
leader reads a question and its peers' solutions and answers, G samples per prompt, reward =
correctness. On-policy: one optimizer step per batch of samples, no ratio, no clip. A step reads:
leader_rollouts -> llm_step.rollout_update (softrank.group_advantages, then llm_step.policy_step).

The reward rules: the reward reads only the one `Answer:` field the prompt asks for, on the
completion's last line (data.strict_answer; the evaluation keeps its lenient reader), and a rollout
with a completion cut off at --max-new-tokens earns 0 (--truncated zero) or leaves the step (drop),
before the advantages (llm_step.rollout_update). Each step logs the truncated share and the share
of completions right only by the evaluation's leniency (lenient_only).

The leader trains a LoRA adapter by default (llm/lora.py; the base frozen), saved as the PEFT
folder adapter/; --lora-rank 0 fine-tunes every weight instead (an HF directory, model/).
"""

import json
import sys
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
    all_gather_list,
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
from llm.team import (
    EngineConfig,
    check_engine,
    check_model,
    check_models,
    make_engine,
    team_entries,
)
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
    leader_prompt,
    majority_vote,
    per_question,
    run_llm,
    solve_calls,
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
    temperature: float = 0.5
    """the agents' sampling temperature (the temperature study on validation questions)"""
    top_p: float = 1.0
    """nucleus sampling's probability mass"""
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
    loss_agg: str = "const"
    """token (DAPO) | seq (GRPO) | const (Dr.GRPO, MLPO's) | sum (CoMLRL's MAGRPO: each completion's
    token log-probs summed, times its advantage, averaged over completions), see softrank.aggregate
    """
    truncated: str = "zero"
    """a rollout with a completion cut off at --max-new-tokens before its end: zero (its reward is
    0, the least a rollout earns) | drop (out of the loss and of its group's statistics); the reward
    reads only the one `Answer:` field the prompt asks for (data.strict_answer)"""
    # the script's own
    peers_model: str = ""
    """the frozen peers' HF directory; empty: the same as --model"""
    peers: str = ""
    """the frozen peers as a team, one entry each as eval.py's --models"""
    filter_easy: float = 0.75
    """drop questions where at least this fraction of the peers is right (0: keep all)"""
    balance_vote: bool = False
    """after --filter-easy, keep as many questions the peers' vote gets right as it gets wrong,
    alternating: the leader learns where the vote fails without unlearning where it holds"""
    lr: float = 0.0
    """AdamW learning rate (0: 5e-4 for adapters, 1e-5 for full weights: results/README.md)"""
    out_dir: str = "runs/mlpo"
    """where the trained weights, the peer pool's statistics, metrics.jsonl and the checkpoint
    go"""

    def game(self):
        """The frozen peers' round 0 as these flags set it (the game's other settings at their
        defaults)."""
        return GameConfig(
            seed=self.seed,
            agents=self.agents,
            temperature=self.temperature,
            top_p=self.top_p,
            max_new_tokens=self.max_new_tokens,
            trailer=self.trailer,
            vote=self.vote,
            whole_solutions=self.whole_solutions,
        )


# --------------------------------------------------------------------------------------------------
# The peers' solutions (generated once) and the leader's rollouts over them
# --------------------------------------------------------------------------------------------------
def peer_solutions(examples, cfg, ranks):
    """[(example, the frozen peers' round-0 solutions)] for every example, in order: each rank
    generates its shard through the engine and its cache (the game's own calls), then every rank
    gets all of them."""
    # --peers: the frozen peers as a team of adapters, built as eval.py builds --models
    peers = EngineConfig(
        model=cfg.peers_model or cfg.model,
        models=cfg.peers,
        dtype=cfg.train_dtype,
        engine_batch_size=cfg.engine_batch_size,
        cache_dir=cfg.cache_dir,
    )
    engine = make_engine(peers, cfg.agents, ranks.rank, ranks.device)
    mine = list(range(ranks.rank, len(examples), ranks.world))
    game = cfg.game()
    outputs = run_llm(engine, solve_calls([examples[k] for k in mine], game), game)
    teams = per_question([s for s, _ in outputs], cfg.agents)
    gathered = sorted(all_gather_list(list(zip(mine, teams))), key=lambda item: item[0])
    return [(examples[k], solutions) for k, solutions in gathered]


def starting_adapters(cfg):
    """The adapters this run starts from or reads: --init-adapter's and the --peers' own."""
    peers = team_entries(cfg.peers, cfg.agents, "--peers") if cfg.peers else []
    return init_adapters(cfg) + [adapter for _, adapter in peers if adapter]


def peer_pool(cfg, ranks):
    """The offline pool: the frozen peers' solutions to the candidate training questions, generated
    once. Questions where at least cfg.filter_easy of the peers are right are dropped: the leader
    has nothing to learn there."""
    candidates = unseen_pool(cfg, starting_adapters(cfg))[cfg.val_n : cfg.val_n + cfg.questions]
    pool, peer_right, vote_right = [], [], []
    for example, solutions in peer_solutions(candidates, cfg, ranks):
        right = (
            sum(data.is_correct(s.answer, example.answer, example.task) for s in solutions)
            / cfg.agents
        )
        peer_right.append(right)
        if not cfg.filter_easy or right < cfg.filter_easy:
            pool.append((example, solutions))
            vote = majority_vote(solutions)[0]
            vote_right.append(data.is_correct(vote, example.answer, example.task))
    if cfg.balance_vote:
        pool, vote_right = balanced(pool, vote_right)
    stats = {
        "candidates": len(candidates),
        "kept": len(pool),
        "kept_vote_right": sum(vote_right),
        "peer_accuracy": sum(peer_right) / len(peer_right),
    }
    if ranks.rank == 0:
        print(f"peer pool: {json.dumps(stats)}", file=sys.stderr)
    if not pool and cfg.balance_vote:
        sys.exit(
            f"--balance-vote: of the {len(candidates)} questions the peers' vote gets none wrong "
            "or none right: add --questions"
        )
    if not pool:
        sys.exit(
            f"every one of the {len(candidates)} questions has >= {cfg.filter_easy} of its peers "
            "right: lower --filter-easy or add --questions"
        )
    return pool, stats


def balanced(pool, vote_right):
    """Every question of the pool the vote gets wrong, each followed by the next one it gets right,
    as far as both last (the pool's order kept within each kind); and the kept ones' vote_right."""
    wrong = [item for item, right in zip(pool, vote_right) if not right]
    right = [item for item, right in zip(pool, vote_right) if right]
    pairs = list(zip(wrong, right))
    return [item for pair in pairs for item in pair], [False, True] * len(pairs)


def leader_rollouts(team, items, cfg, step, read=data.strict_answer):
    """G samples of the leader (the team's agent 0) per (example, peer solutions) item. Returns
    (sequences, rewards): the leader's Sequences and a (len(items), G) tensor of rewards, its
    correctness (+ format_reward if it parses), its answer read with `read`: the training reward's
    strict reader (data.strict_answer), or the evaluation's lenient one (the held-out accuracy)."""
    calls = [(q, g) for q in range(len(items)) for g in range(cfg.group)]
    prompts = [leader_prompt(*items[q], cfg.trailer, cfg.whole_solutions) for q, _ in calls]
    seeds = [call_seed(cfg.seed, "leader", step, items[q][0].id, g) for q, g in calls]
    completions = sample(team, prompts, seeds, [0] * len(calls), cfg)
    sequences, rewards = [], torch.zeros(len(items), cfg.group)
    for (q, g), prompt, c in zip(calls, prompts, completions):
        ex = items[q][0]
        ids, truncated = prompt_ids(team, prompt, 0), c.finish == "length"
        lenient_only = data.lenient_only(c.text, ex.answer, ex.task)
        sequences.append(Sequence(q, g, 0, ids, c.token_ids, truncated, lenient_only))
        answer = read(c.text, ex.task)
        reward = float(data.is_correct(answer, ex.answer, ex.task))
        rewards[q, g] = reward + cfg.format_reward * (answer is not None)
    return sequences, rewards


def held_out_rollouts(team, items, cfg, step):
    """leader_rollouts read as eval.py reads the leader's answer: the held-out accuracy."""
    return leader_rollouts(team, items, cfg, step, read=data.extract_answer)


# --------------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------------
def train(cfg, ranks):
    out = Path(cfg.out_dir)
    torch.manual_seed(cfg.seed)
    pool, pool_stats = peer_pool(cfg, ranks)
    if ranks.rank == 0:
        (out / "pool.json").write_text(json.dumps(pool_stats))
    models, team = trained_team(cfg, 1, ranks.device)
    modules, references = loss_modules(models, cfg, ranks.device, kl=bool(cfg.beta))
    lr = learning_rate(cfg, adapter_lr=5e-4)
    optimizer, holder, counters = checkpointed(models, cfg, out, ranks, lr=lr, extendable="steps")
    log = MetricsLog(out, ranks.rank, counters["step"])
    # the leader is validated over its peers' solutions
    validation = unseen_pool(cfg, starting_adapters(cfg))[: cfg.val_n]
    if cfg.eval_every:
        validation = peer_solutions(validation, cfg, ranks)[ranks.rank :: ranks.world]
    pad = team.first.tokenizer.pad_token_id

    def validated(step):
        validate(models, team, held_out_rollouts, validation, cfg, step=step, ranks=ranks, log=log)

    if cfg.eval_every and counters["step"] == 0:
        validated(0)
    bar = tqdm(range(counters["step"], cfg.steps), desc=f"{cfg.algo} leader", disable=ranks.rank)
    for step in bar:
        began = time.time()
        start = step * cfg.questions_per_step
        items = [pool[(start + k) % len(pool)] for k in range(cfg.questions_per_step)]
        refresh_rollout_weights(models, team)
        sequences, rewards = leader_rollouts(team, items[ranks.rank :: ranks.world], cfg, step)
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
    """The whole configuration, before any model is loaded (a mistake: common.UsageError). A leader
    needs at least one peer."""
    check_task(cfg)
    check_game(cfg.game(), min_agents=1, min_rounds=0)
    engine = EngineConfig(model=cfg.model, engine_batch_size=cfg.engine_batch_size)
    check_engine(engine, cfg.agents, cfg.max_new_tokens)
    check_at_least(1, questions=cfg.questions)
    check_trainer(cfg)
    check_rollouts(cfg, world, softrank.GROUP_ADVANTAGES, softrank.PG_KINDS)
    check_choice("--truncated", cfg.truncated, TRUNCATED_RULES)
    if not 0 <= cfg.filter_easy <= 1:
        raise UsageError(f"--filter-easy {cfg.filter_easy}: a share of the peers, in [0, 1]")
    if cfg.peers:
        if cfg.peers_model:
            raise UsageError("--peers: the frozen peers as a team, not with --peers-model")
        check_models("--peers", cfg.peers, cfg.agents, cfg.max_new_tokens)
    if cfg.peers_model:
        check_model("--peers-model", cfg.peers_model, cfg.max_new_tokens)


if __name__ == "__main__":
    config = parse_config(Config, description=__doc__.split("\n\n")[0])
    with user_errors(config.out_dir):
        check(config, launch_world_size())
        with distributed(config.out_dir) as ranks:
            train(config, ranks)
