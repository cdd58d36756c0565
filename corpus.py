"""The game as training data (docs/design.md §5, §6): training questions, the corpus of visited game
states, and the validation of a policy during training. Shared by sft.py and train_rl.py.

  check_game                        - the game's flags, checked before anything is loaded
  training_pool, training_questions - the task's training split, a validation slice, a slice per
                                      iteration
  resolve_engine_dtype              - --dtype auto made concrete on this machine, and why
  make_engine                       - the engine of one rank (or a team's engines: --models),
                                      from a script's config
  collect_states                    - play, and keep every (agent, round) state with its oracle
                                      label and, for stage 2, its counterfactual reward vector
  states_to_tensors, load_corpus, save_corpus, action_distribution, corpus_statistics - the corpus
                                      as tensors, on disk, and what it holds
  evaluate_policy                   - the team's accuracy and cost under a policy, every rank on its
                                      shard
"""

import json
import random
from dataclasses import replace
from pathlib import Path

import torch
from tqdm import tqdm

import data
import deliberate
from common import (
    FileRefused,
    UsageError,
    all_gather_list,
    all_reduce_sum,
    atomic_save,
    barrier,
    check_at_least,
    check_choice,
    load_file,
    refuse_other_settings,
)
from llm import lora
from llm.backbone import DTYPES, default_model_path, resolve_dtype
from llm.engine import Engine
from llm.team import Member, Team
from policy import oracle_action
from softrank import flat_groups
from state import ACTION_KINDS, PERSIST, REFINE, VOTE_RULES, concede


def check_game(cfg, min_agents=2, min_rounds=1):
    """The flags of the game every script plays (task, team, sampling, model), before anything is
    loaded: a mistake is one line (common.UsageError), not a traceback after minutes of work."""
    check_choice("--task", cfg.task, data.TASKS)
    if cfg.task in data.FILE_TASKS and not cfg.path:
        raise UsageError(f"--task {cfg.task} reads a data file: pass it with --path")
    if cfg.path and not Path(cfg.path).is_file():
        raise UsageError(f"--path {cfg.path!r}: no such file")
    if cfg.path and cfg.task not in data.FILE_TASKS:
        raise UsageError(f"--path {cfg.path!r}: task {cfg.task} is generated and reads no file")
    if not 0 <= cfg.level <= 4:
        raise UsageError(f"--level {cfg.level}: choose 1..4 (0: the task's default)")
    check_at_least(cfg, min_agents, "agents")
    # rounds 0: round 0 only, the team's vote of independent answers (no decision is ever taken)
    check_at_least(cfg, min_rounds, "rounds")
    check_at_least(cfg, 0, "temperature", *(["val_n"] if hasattr(cfg, "val_n") else []))
    check_at_least(cfg, 1, "max_new_tokens", "engine_batch_size")
    check_choice("--vote", cfg.vote, VOTE_RULES)
    check_choice("--dtype", cfg.dtype, ("auto", *DTYPES))
    if getattr(cfg, "models", "") and cfg.model:
        raise UsageError("--model and --models: pass one (--models names every agent's model)")
    check_model("--model", cfg.model, cfg.max_new_tokens)
    if getattr(cfg, "models", ""):
        check_models("--models", cfg.models, cfg.agents, cfg.max_new_tokens)


def check_models(flag_name, models, agents, max_new_tokens):
    """A --models list (team_entries): one entry per agent, each base a model directory, each
    adapter an existing file (whether it fits its base is checked when it loads)."""
    for base, adapter in team_entries(models, agents, flag_name):
        check_model(flag_name, base, max_new_tokens)
        if adapter and not Path(adapter).is_file():
            raise UsageError(f"{flag_name}: no adapter file {adapter!r}")


def team_entries(models, agents, flag_name="--models"):
    """--models "A,B,C" -> one (base model directory, adapter file) per agent: an entry is a model
    directory or `default` (the embedded backbone), + an adapter file (train_llm.py) or not."""
    entries = [entry.strip() for entry in models.split(",")]
    if len(entries) != agents:
        raise UsageError(f"{flag_name}: {len(entries)} entries for {agents} agents (one per agent)")
    team = []
    for entry in entries:
        base, _, adapter = entry.partition("+")
        team.append(("" if base == "default" else base, adapter))
    return team


def team_name(cfg):
    """What a run's files and header call its team: the --models list, else the one model."""
    return cfg.models or cfg.model or "default"


def check_model(flag_name, path, max_new_tokens):
    """An HF checkpoint directory (empty: the default backbone) whose context holds the token
    budget."""
    folder = Path(path or default_model_path())
    if not (folder / "config.json").is_file():
        raise UsageError(f"{flag_name} {path!r}: not an HF checkpoint directory (no config.json)")
    if not any(
        (folder / name).is_file() for name in ("tokenizer.json", "tokenizer.model", "vocab.json")
    ):
        raise UsageError(
            f"{flag_name} {path!r}: no tokenizer files (tokenizer.json) in the directory"
        )
    settings = json.loads((folder / "config.json").read_text())
    context = settings.get("max_position_embeddings") or settings.get("n_positions")
    if context and max_new_tokens >= context:
        raise UsageError(
            f"--max-new-tokens {max_new_tokens}: the model's context holds {context} tokens, "
            "prompt included"
        )


def training_pool(cfg):
    """The task's training split (of a file: the ~5/6 that data.split_of puts in train) in a seeded
    shuffle; the first `val_n` are the validation questions."""
    kw = {"level": cfg.level} if cfg.level else {}
    pool = data.load_task(cfg.task, path=cfg.path or None, split="train", **kw)
    random.Random(cfg.seed).shuffle(pool)
    return pool


def training_questions(cfg, iteration=0):
    """(training questions of `iteration`, validation questions): disjoint slices of training_pool.
    The validation slice comes first, so it stays the same as the questions or iterations grow."""
    pool = training_pool(cfg)
    start = cfg.val_n + iteration * cfg.questions
    if start + cfg.questions > len(pool):
        raise UsageError(
            f"task {cfg.task!r} has {len(pool)} training questions: not enough for "
            f"val_n={cfg.val_n} + questions={cfg.questions} per iteration over {iteration + 1} "
            "iteration(s)"
        )
    return pool[start : start + cfg.questions], pool[: cfg.val_n]


def resolve_engine_dtype(cfg, device="cpu"):
    """(cfg with --dtype auto replaced by the dtype the engines run on `device`, why): the scripts
    record both in their files and print them with their results (a refused run prints only its
    error line). On a CPU, auto probes the model's shapes at --engine-batch-size rows (a team's:
    its first agent's base model)."""
    model = cfg.model
    if getattr(cfg, "models", ""):
        model = team_entries(cfg.models, cfg.agents)[0][0]
    dtype, why = resolve_dtype(cfg.dtype, device, model or None, cfg.engine_batch_size)
    return replace(cfg, dtype=dtype), why


def make_engine(cfg, rank, device="cpu", models=None):
    """The generation engine of one rank on its device: the cache file that every rank shares, a
    progress bar on rank 0. With --models (or `models`, a list of the same form), a llm.team.Team:
    one engine per distinct base model, each agent's adapter loaded into its base's engine (the
    file read as data: common.load_file)."""
    models = getattr(cfg, "models", "") if models is None else models
    if models:
        engines, adapters, members = {}, {}, []
        for base, adapter in team_entries(models, cfg.agents):
            if base not in engines:
                engines[base] = make_engine(replace(cfg, model=base), rank, device, models="")
            if adapter and (base, adapter) not in adapters:
                try:
                    adapters[base, adapter] = lora.load_adapter(
                        engines[base].model, load_file(adapter, "adapter")
                    )
                except lora.AdapterMismatch as e:
                    raise FileRefused(f"{adapter}: {e}") from None
            members.append(Member(engines[base], adapters.get((base, adapter))))
        return Team(members)
    return Engine(
        model_path=cfg.model or None,
        dtype=cfg.dtype,
        device=str(device),
        batch_size=cfg.engine_batch_size,
        cache_dir=cfg.cache_dir or None,
        progress=rank == 0,
    )


def collect_states(
    engine,
    examples,
    policy,
    cfg,
    counterfactual,
    rank,
    world,
    desc="collect",
    critic=False,
    refine_cost=0.0,
):
    """Plays the game with `policy` (actions sampled) on this rank's shard of `examples` and returns
    every rank's visited (agent, round) states, in a canonical order (so the corpus does not depend
    on the number of ranks). A state holds its observation, the action taken, the oracle label and,
    with `counterfactual`, the reward of each of the K actions (docs/design.md §6), a REFINE paying
    `refine_cost` per 1000 tokens."""
    shard = examples[rank::world]
    bar = tqdm(total=cfg.rounds, desc=desc, disable=rank != 0, leave=False)
    game = deliberate.game_config(cfg, greedy_policy=False, critic=critic, refine_cost=refine_cost)
    transcripts = deliberate.play(
        engine, shard, policy, game, record_states=True, counterfactual=counterfactual, progress=bar
    )
    bar.close()
    rows = []
    for tr in transcripts:
        for t in range(1, len(tr["rounds"])):
            before, record = tr["rounds"][t - 1], tr["rounds"][t]
            for i in range(cfg.agents):
                # the label of the state the agent decided
                # in (`before`), never of the round's outcome
                label = oracle_action(i, before["agent_correct"], before["confidence"])
                rows.append(
                    {
                        "key": (tr["id"], t, i),
                        "own": record["own"][i],
                        "peers": record["peers"][i],
                        "agent": i,
                        "action": record["actions"][i],
                        "label": label,
                        "rewards": record["reward_vectors"][i] if counterfactual else None,
                    }
                )
    rows = sorted(all_gather_list(rows), key=lambda r: r["key"])
    if not rows:
        raise ValueError("the games visited no state after round 0 (did every game stop at once?)")
    return rows


def states_to_tensors(rows):
    tensors = {
        "own": torch.tensor([r["own"] for r in rows], dtype=torch.float32),
        "peers": torch.tensor([r["peers"] for r in rows], dtype=torch.float32),
        "agent": torch.tensor([r["agent"] for r in rows]),
        "action": torch.tensor([r["action"] for r in rows]),
        "label": torch.tensor([r["label"] for r in rows]),
    }
    if rows[0]["rewards"] is not None:
        tensors["rewards"] = torch.tensor([r["rewards"] for r in rows], dtype=torch.float32)
    return tensors


# the settings that decide what a corpus holds (the game, the questions, the behaviour policy): a
# corpus is reused only under the same ones
CORPUS_SETTINGS = (
    "task", "path", "level", "questions", "val_n", "seed", "agents", "rounds", "temperature",
    "max_new_tokens", "trailer", "vote", "model", "models", "dtype", "critic", "behaviour", "init",
    "refine_cost",
)  # fmt: skip


def corpus_settings(cfg):
    return {name: getattr(cfg, name) for name in CORPUS_SETTINGS if hasattr(cfg, name)}


def load_corpus(path, cfg):
    """The corpus a run collected at `path` (a resumed run reads it back), or None. A corpus
    collected under other settings (a run killed before its first checkpoint, rerun with other
    flags) is refused, not reused."""
    if not Path(path).exists():
        return None
    stored = load_file(path, "corpus")
    wanted = corpus_settings(cfg)
    if not isinstance(stored, dict) or "settings" not in stored:
        raise UsageError(f"{path}: a corpus without its settings (an older version): delete it")
    changed = {k: (v, wanted[k]) for k, v in stored["settings"].items() if wanted.get(k, v) != v}
    refuse_other_settings(path, "collected", changed)
    return stored["rows"]


def save_corpus(rows, path, rank, cfg):
    """Rank 0 writes the corpus atomically, with the settings that made it; every rank waits."""
    if rank == 0:
        atomic_save({"settings": corpus_settings(cfg), "rows": rows}, path)
    barrier()


def action_distribution(actions, n_actions):
    """Share of each kind of action in a tensor of action indices."""
    counts = torch.bincount(actions, minlength=n_actions).float()
    kinds = {
        "persist": counts[PERSIST],
        "refine": counts[REFINE],
        "concede": counts[concede(0) :].sum(),
    }
    return {k: round(float(v / counts.sum()), 4) for k, v in kinds.items()}


def best_action_kinds(rewards):
    """Which kind of action pays most in each state of a counterfactual corpus: the share of states
    where PERSIST, REFINE or CONCEDE (to the best peer to concede to) alone reaches the state's
    highest reward, the share where two kinds tie for it (flat states among them), and REFINE's
    mean reward minus PERSIST's (its token cost included): whether refining ever pays, and where
    (docs/design.md §6)."""
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
    all equal (nothing to learn). frac_multi_valued: states with at least three distinct rewards,
    the only ones where SoftRank and GRPO advantages can differ (with two values both give the same
    two-level vector). best_kind, refine_minus_persist: best_action_kinds."""
    rewards = tensors["rewards"]
    distinct = torch.tensor([len(set(row)) for row in rewards.tolist()])
    return {
        "states": len(rewards),
        "frac_zero_std": float(flat_groups(rewards).float().mean()),
        "frac_multi_valued": float((distinct >= 3).float().mean()),
        "behaviour_actions": action_distribution(tensors["action"], k),
        "mean_reward_taken": float(rewards.gather(-1, tensors["action"][:, None]).mean()),
        "mean_reward_best": float(rewards.amax(-1).mean()),
        **best_action_kinds(rewards),
    }


def evaluate_policy(engine, examples, policy, cfg, rank, world, device):
    """Team accuracy and tokens per question of `policy` (greedy) on `examples`, every rank on its
    shard."""
    game = deliberate.game_config(cfg, greedy_policy=True)
    results = deliberate.play(engine, examples[rank::world], policy, game)
    counts = deliberate.action_counts(results)
    sums = all_reduce_sum(
        [sum(r["correct"] for r in results), sum(r["tokens"] for r in results), len(results)]
        + [counts[k] for k in ACTION_KINDS],
        device,
    )
    correct, tokens, n, counts = sums[0], sums[1], sums[2], sums[3:]
    return {
        "val_accuracy": correct / n,
        "val_tokens": tokens / n,
        "val_actions": {k: round(c / max(sum(counts), 1), 4) for k, c in zip(ACTION_KINDS, counts)},
    }
