"""The sampled episodes train_llm.py learns from (docs/design.md §8), on the game's prompts and
vote (deliberate.py), and the weights it trains.

Sequence          - one sampled completion, the unit the token-level loss trains on
joint_rollouts    - MAGRPO: G joint rollouts of a protocol (parallel or debate) per question, one
                    joint reward per rollout (the team vote's correctness)
leader_rollouts   - MLPO: G samples of the leader reading its peers' solutions, reward = correctness
peer_solutions    - the frozen peers' round-0 solutions to some questions (MLPO's pool, its
                    validation)
peer_pool         - MLPO's offline pool of frozen peers' solutions, easy questions filtered out
right_solutions   - --target sft's data: the backbone's own right solutions (rejection sampling)
worked_solutions  - --target sft's data: the task's worked solutions (data/worked.py)
refine_examples   - --target sft's REFINE data: sampled contexts, the worked solution as target
trained_team      - the weights train_llm.py trains (whole models or LoRA adapters) and the team
                    of engines that samples the rollouts from them; validate (greedy accuracy
                    on held-out questions), save_trained (adapter files or HF directories)
"""

import copy
import dataclasses
import json
import sys
from dataclasses import dataclass

import torch

import data
from common import FileRefused, UsageError, all_gather_list, all_reduce_sum, load_file
from data import training_pool, training_questions
from data.worked import WorkedSolutionMissing, worked_solution
from deliberate import (
    leader_prompt,
    majority_vote,
    parse_solution,
    per_question,
    refine_prompt,
    run_llm,
    solve_calls,
    solve_prompt,
)
from llm import lora
from llm.cache import call_seed
from llm.engine import Engine
from llm.team import Member, Team, make_engine


@dataclass
class Sequence:
    """One sampled completion of a step's rollouts: the learner trains on its completion tokens."""

    question: int  # index into the step's questions (on this rank)
    sample: int  # which of the question's G rollouts
    agent: int  # which agent wrote it (0 for the leader)
    prompt_ids: list
    completion_ids: list  # the sampled ids, the EOS included


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


def joint_rollouts(team, examples, cfg, step):
    """G rollouts of the protocol for each example. Returns (sequences, rewards): every agent's
    Sequences and a (len(examples), G) tensor of rewards, the team vote's correctness (+
    format_reward x the fraction of final answers that parse)."""
    teams = {(q, g): [None] * cfg.agents for q in range(len(examples)) for g in range(cfg.group)}
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
            sequences.append(Sequence(q, g, i, prompt_ids(team, prompt, i), c.token_ids))
            solutions[(q, g, i)] = parse_solution(
                c.text, examples[q].task, c.completion_tokens, c.token_logprobs, cfg.vote
            )
        for (q, g, i), solution in solutions.items():
            teams[(q, g)][i] = solution

    run_round(0, lambda q, g, i: solve_prompt(examples[q], cfg.trailer))
    for t in range(1, cfg.rounds + 1 if cfg.protocol == "debate" else 1):
        run_round(t, lambda q, g, i: refine_prompt(examples[q], teams[(q, g)], i, cfg.trailer))
    rewards = torch.zeros(len(examples), cfg.group)
    for (q, g), team in teams.items():
        vote, _ = majority_vote(team)
        rewards[q, g] = float(
            data.is_correct(vote, examples[q].answer, examples[q].task)
        ) + cfg.format_reward * sum(s.answer is not None for s in team) / len(team)
    return sequences, rewards


def leader_rollouts(team, items, cfg, step):
    """G samples of the leader (the team's agent 0) per (example, peer solutions) item, as
    joint_rollouts returns them: the leader's Sequences and a (len(items), G) tensor of rewards,
    its correctness (+ format_reward if it parses)."""
    calls = [(q, g) for q in range(len(items)) for g in range(cfg.group)]
    prompts = [leader_prompt(items[q][0], items[q][1], cfg.trailer) for q, _ in calls]
    seeds = [call_seed(cfg.seed, "leader", step, items[q][0].id, g) for q, g in calls]
    completions = sample(team, prompts, seeds, [0] * len(calls), cfg)
    sequences, rewards = [], torch.zeros(len(items), cfg.group)
    for (q, g), prompt, c in zip(calls, prompts, completions):
        example = items[q][0]
        sequences.append(Sequence(q, g, 0, prompt_ids(team, prompt, 0), c.token_ids))
        answer = parse_solution(c.text, example.task).answer
        rewards[q, g] = float(
            data.is_correct(answer, example.answer, example.task)
        ) + cfg.format_reward * (answer is not None)
    return sequences, rewards


def peer_solutions(examples, cfg, rank, world, device):
    """[(example, the frozen peers' round-0 solutions)] for every example, in order: each rank
    generates its shard through the engine and its cache (the game's own calls), then every rank
    gets all of them."""
    # --peers: the frozen peers as a team of adapters, built as eval.py builds --models
    peers = dataclasses.replace(cfg, model=cfg.peers_model or cfg.model, models=cfg.peers)
    engine = make_engine(peers, rank, device)
    mine = list(range(rank, len(examples), world))
    outputs = run_llm(engine, solve_calls([examples[k] for k in mine], cfg), cfg)
    teams = per_question([s for s, _ in outputs], cfg.agents)
    gathered = sorted(all_gather_list(list(zip(mine, teams))), key=lambda item: item[0])
    return [(examples[k], solutions) for k, solutions in gathered]


def peer_pool(cfg, rank, world, device):
    """MLPO's offline pool: the frozen peers' solutions to the candidate training questions,
    generated once. Questions where at least cfg.filter_easy of the peers are right are dropped: the
    leader has nothing to learn there."""
    candidates = training_pool(cfg)[cfg.val_n : cfg.val_n + cfg.questions]
    pool, peer_right = [], []
    for example, solutions in peer_solutions(candidates, cfg, rank, world, device):
        right = (
            sum(data.is_correct(s.answer, example.answer, example.task) for s in solutions)
            / cfg.agents
        )
        peer_right.append(right)
        if not cfg.filter_easy or right < cfg.filter_easy:
            pool.append((example, solutions))
    stats = {
        "candidates": len(candidates),
        "kept": len(pool),
        "peer_accuracy": sum(peer_right) / len(peer_right),
    }
    if rank == 0:
        print(f"peer pool: {json.dumps(stats)}", file=sys.stderr)
    if not pool:
        sys.exit(
            f"every one of the {len(candidates)} questions has >= {cfg.filter_easy} of its peers "
            "right: lower --filter-easy or add --questions"
        )
    return pool, stats


def right_solutions(engine, cfg, rank, world):
    """--target sft's data (rejection sampling): cfg.samples solutions of the backbone to each
    training question, kept where right and ended by the EOS (with --trailer, also well-formatted),
    as (prompt ids, completion ids + EOS). Each rank samples its shard; every rank gets all of them,
    sorted, whatever the world size."""
    questions, _ = training_questions(cfg)
    calls = [(ex, k) for ex in questions[rank::world] for k in range(cfg.samples)]
    prompts = [engine.chat(solve_prompt(ex, cfg.trailer)) for ex, _ in calls]
    seeds = [call_seed(cfg.seed, ex.id, k, "sft-llm") for ex, k in calls]
    completions = engine.generate(
        prompts, seeds, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature
    )
    eos = engine.tokenizer.eos_token_id
    kept = []
    for (ex, _), prompt, c in zip(calls, prompts, completions):
        s = parse_solution(c.text, ex.task)
        right = data.is_correct(s.answer, ex.answer, ex.task)
        if c.finish == "eos" and right and (s.trailer_ok or not cfg.trailer):
            kept.append((engine.encode(prompt), engine.encode(c.text) + [eos]))
    kept = sorted(all_gather_list(kept))
    if rank == 0:
        kind = " well-formatted" if cfg.trailer else ""
        print(
            f"kept {len(kept)} right{kind} solutions of {len(questions) * cfg.samples} samples",
            file=sys.stderr,
        )
    return kept


def worked_solutions(engine, cfg):
    """--target sft --solutions worked: (prompt ids, worked solution ids + EOS) of the training
    questions, the solve prompt as the game asks it."""
    questions, _ = training_questions(cfg)
    eos = engine.tokenizer.eos_token_id
    try:
        return [
            (
                engine.encode(engine.chat(solve_prompt(ex))),
                engine.encode(worked_solution(ex)) + [eos],
            )
            for ex in questions
        ]
    except WorkedSolutionMissing as e:
        raise UsageError(f"--solutions worked: {e}; use --solutions sampled") from None


def refine_examples(engine, cfg, rank, world):
    """--refine-contexts: one REFINE example per training question. Its prompt is the game's refine
    prompt with the agent's own solution and its cfg.agents - 1 peers' answers, all sampled (at
    --temperature) from the base model with the adapter file --refine-contexts names; its target is
    the worked solution, whether the sampled answer was right or wrong, so that an agent learns to
    answer right after reading its peers. Each rank samples its shard; every rank gets them all,
    in the questions' order."""
    try:
        adapter = lora.load_adapter(engine.model, load_file(cfg.refine_contexts, "adapter"))
    except lora.AdapterMismatch as e:
        raise FileRefused(f"{cfg.refine_contexts}: {e}") from None
    questions, _ = training_questions(cfg)
    mine = list(enumerate(questions))[rank::world]
    calls = [(q, ex, i) for q, ex in mine for i in range(cfg.agents)]
    completions = engine.generate(
        [engine.chat(solve_prompt(ex)) for _, ex, _ in calls],
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
            engine.encode(engine.chat(refine_prompt(ex, teams[q], 0))),
            engine.encode(worked_solution(ex)) + [eos],
        )
        for q, ex in mine
    ]
    return [(prompt, target) for _, prompt, target in sorted(all_gather_list(examples))]


def trained_team(cfg, device):
    """(the trained models, the team whose rollouts they sample). Full fine-tuning (--lora-rank 0):
    one model for every agent, or one per agent (--separate-agents). Otherwise one frozen base with
    one LoRA adapter, or one per agent, that the engine runs in one batch. No generation cache:
    the weights change every step. With --dtype bfloat16 the rollouts come from a bf16 copy
    refreshed every step (autocast on fp32 weights would cast every weight at every decoded
    token)."""
    n_trained = cfg.agents if cfg.separate_agents and cfg.target == "agents" else 1
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
        m.eval()  # generation: the KV cache (gradient checkpointing turns it off in train mode)
        if engine.model is not m:
            with torch.no_grad():
                for rollout_weight, weight in zip(engine.model.parameters(), m.parameters()):
                    rollout_weight.copy_(weight)


def validate(models, team, validation, cfg, rank, world, device, log, step):
    """Greedy accuracy on the held-out questions: the team's vote (agents) or the leader's answer
    over its peers (leader), every rank on its shard, one rollout per question at temperature 0."""
    refresh_rollout_weights(models, team)
    greedy = dataclasses.replace(cfg, group=1, rollout_temperature=0.0, format_reward=0.0)
    shard = validation[rank::world]
    right = torch.zeros(0)
    if shard and cfg.target == "leader":
        right = leader_rollouts(team, shard, greedy, step)[1]
    elif shard:
        right = joint_rollouts(team, shard, greedy, step)[1]
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
