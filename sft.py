"""Stage 1 (docs/design.md §5): supervised bootstrapping of the meta-policy.

    python sft.py --out-dir runs/sft                        # -> runs/sft/policy.* (pi_sft)
    torchrun --nproc_per_node=2 sft.py --out-dir runs/sft   # the same on 2 processes (gloo on
                                                            # CPU, NCCL on CUDA)

Read top to bottom: play the game with a behaviour policy (uniform random by default) on training
questions; label every (agent, round) state with the oracle action, from the state the agent decided
in (own answer right -> PERSIST; else a right peer -> CONCEDE to the most confident right peer; else
REFINE); train the policy by cross-entropy, one optimizer step per global batch of states. The LLM
itself is fine-tuned by train_solver.py (on worked solutions, or its own right answers).
"""

import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from common import (
    MetricsLog,
    UsageError,
    batch_schedule,
    check_at_least,
    check_choice,
    check_positive,
    crash_if_asked,
    distributed,
    global_mean,
    launch_world_size,
    load_checkpoint,
    load_made_under,
    parse_config,
    save_checkpoint,
    save_made_under,
    shard_rows,
    stack_rows,
    user_errors,
    wrap_ddp,
)
from data import check_task, training_questions
from deliberate import (
    FEATURE_SETS,
    FIXED_POLICIES,
    MetaPolicy,
    action_distribution,
    check_team,
    collect_states,
    corpus_settings,
    make_policy,
    n_actions,
    oracle_action,
    save_policy,
)
from llm.team import check_engine, make_engine, resolve_engine_dtype, team_name
from solutions import GameConfig, check_game


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
    temperature: float = 0.5
    """the agents' sampling temperature (the temperature study on validation questions)"""
    top_p: float = 1.0
    """nucleus sampling's probability mass"""
    max_new_tokens: int = 192
    """token budget of each LLM call"""
    trailer: bool = False
    """ask for the Steps / Confidence / Answer trailer (it costs the default backbone accuracy)"""
    critic: bool = False
    """run the critic pass: its p(Correct) in the state (always for a policy trained with it)"""
    vote: str = "mean_prob"
    """the vote's tie-break signal, the same for every protocol (solutions.VOTE_RULES)"""
    whole_solutions: bool = False
    """REFINE and the leader read every solution whole (default: REFINE sees peers' final answers
    and its own last 300 characters, the leader each solution's last 300)"""
    # the engine
    model: str = ""
    """HF checkpoint directory of the agents; empty: the embedded default backbone"""
    models: str = ""
    """one model per agent, comma-separated: an HF directory or `default`, + an adapter file
    (train_solver.py, train_magrpo.py) or not, e.g. default+a0.pt,default+a1.pt,default; agents on
    one base share its engine (empty: --model for every agent)"""
    dtype: str = "auto"
    """the backbone's dtype: float32 | bfloat16 | float16 | int8 | auto (bf16 where the CPU or GPU
    runs it natively, else fp32; docs/design.md §11)"""
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
    weight_decay: float = 0.0
    """AdamW weight decay"""
    save_every: int = 50
    """optimizer steps between checkpoints (and at the end)"""
    crash_at_step: int = 0
    """testing resume: SIGKILL this process right after this optimizer step (0: never)"""
    # the script's own
    features: str = "text"
    """the state features the policy reads: text | all | paper | confidence
    (deliberate.FEATURE_SETS; text: all, and what the texts tell: a value missing, steps that
    check)"""
    behaviour: str = "random"
    """the policy that plays the labelled games: persist | random | refine | oracle | a policy
    file"""
    hidden: int = 64
    """the policy network's width"""
    heads: int = 4
    """attention heads of the policy network"""
    separate: bool = False
    """one policy copy per agent (default: one shared by all agents)"""
    epochs: int = 30
    """passes over the corpus"""
    batch_size: int = 256
    """states per optimizer step, over all ranks"""
    lr: float = 3e-3
    """AdamW learning rate"""
    out_dir: str = "runs/sft"
    """where policy.safetensors (with its settings in policy.json), summary.json, metrics.jsonl,
    the corpus and the checkpoint go"""


def labelled_states(engine, questions, behaviour, game, ranks):
    """The states of games played by the behaviour policy (actions sampled), each labelled with the
    oracle's action in the state the agent decided in (`before`), never the round's outcome."""

    def labels(played, move):
        before = played.rounds[move.round - 1]
        return [
            {"label": oracle_action(i, before["agent_correct"], before["confidence"])}
            for i in range(game.agents)
        ]

    return collect_states(engine, questions, behaviour, game, labels, ranks=ranks)


def check(cfg, world):
    """The whole configuration, before any model is loaded (a mistake: common.UsageError)."""
    check_task(cfg)
    check_game(GameConfig.of(cfg))
    check_engine(cfg, cfg.agents, cfg.max_new_tokens)
    check_at_least(1, questions=cfg.questions, save_every=cfg.save_every)
    check_at_least(0, val_n=cfg.val_n, weight_decay=cfg.weight_decay)
    check_choice("--features", cfg.features, FEATURE_SETS)
    check_at_least(1, epochs=cfg.epochs, hidden=cfg.hidden, heads=cfg.heads)
    # every rank takes rows of every global batch
    check_at_least(world, batch_size=cfg.batch_size)
    check_positive(lr=cfg.lr)
    if cfg.hidden % cfg.heads:
        raise UsageError(f"--hidden {cfg.hidden}: must be a multiple of --heads {cfg.heads}")
    if cfg.behaviour not in FIXED_POLICIES:
        check_team(make_policy(cfg.behaviour), cfg.agents, f"--behaviour {cfg.behaviour}")


def train(cfg, ranks):
    rank, device = ranks.rank, ranks.device
    cfg, dtype_reason = resolve_engine_dtype(cfg, device)
    out = Path(cfg.out_dir)
    torch.manual_seed(cfg.seed)
    policy = MetaPolicy(
        cfg.agents, cfg.hidden, cfg.heads, separate=cfg.separate, critic=cfg.critic,
        features=cfg.features,
    )  # fmt: skip
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    counters = load_checkpoint(out, policy, optimizer, rank, cfg, extendable=("epochs",))
    counters = counters or {"step": 0}
    log = MetricsLog(out, rank, counters["step"])

    # the corpus: states of games played by the behaviour policy, with their oracle labels
    questions, _ = training_questions(cfg)
    engine = make_engine(cfg, cfg.agents, rank, device)
    game = GameConfig.of(cfg)
    settings = corpus_settings(
        cfg, game, questions=cfg.questions, val_n=cfg.val_n, behaviour=cfg.behaviour
    )
    rows = load_made_under(out / "corpus.pt", settings, "corpus")
    if rows is None:
        behaviour = make_policy(cfg.behaviour)
        rows = labelled_states(engine, questions, behaviour, game, ranks)
        save_made_under(rows, out / "corpus.pt", settings, rank)
    tensors = stack_rows(rows, ("own", "peers"), ("agent", "action", "label"))
    k = n_actions(cfg.agents)
    label_mix = action_distribution(tensors["label"], k)
    if rank == 0:
        print(
            f"{len(rows)} states from {len(questions)} questions; oracle labels {label_mix}",
            file=sys.stderr,
        )

    # cross-entropy on the oracle labels, one optimizer step per global batch of states
    batches = batch_schedule(len(rows), cfg.batch_size, cfg.epochs, cfg.seed, "sft")
    model = wrap_ddp(policy.to(device), device, find_unused=cfg.separate)
    bar = tqdm(range(counters["step"], len(batches)), desc="sft", disable=rank != 0)
    for step in bar:
        batch, weight = shard_rows(tensors, batches[step], rank, ranks.world, device)
        logits = model(batch["own"], batch["peers"], batch["agent"])
        loss = F.cross_entropy(logits, batch["label"])
        (loss * weight).backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

        accuracy = (logits.argmax(-1) == batch["label"]).float().mean()
        stats = {"loss": loss.item(), "label_accuracy": accuracy.item()}
        stats = global_mean(stats, len(batch["label"]), device)
        stats["grad_norm"] = float(grad_norm)
        bar.set_postfix(loss=f"{stats['loss']:.4f}")
        log.write(step=step + 1, **stats)
        if (step + 1) % cfg.save_every == 0 or step + 1 == len(batches):
            save_checkpoint(out, policy, optimizer, {"step": step + 1}, cfg, rank)
        crash_if_asked(cfg, step + 1)

    with torch.no_grad():
        predicted = policy.cpu()(tensors["own"], tensors["peers"], tensors["agent"]).argmax(-1)
    summary = {
        "states": len(rows),
        "label_distribution": label_mix,
        "policy_distribution": action_distribution(predicted, k),
        "label_accuracy": float((predicted == tensors["label"]).float().mean()),
        "team": team_name(cfg),
        "dtype": cfg.dtype,
        "dtype_reason": dtype_reason,
    }
    if rank == 0:
        config = dataclasses.asdict(cfg)
        save_policy(policy, out / "policy.safetensors", train_config=config, summary=summary)
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        print(json.dumps(summary))
    return policy


if __name__ == "__main__":
    config = parse_config(Config, description=__doc__.split("\n\n")[0])
    with user_errors(config.out_dir):
        check(config, launch_world_size())
        with distributed(config.out_dir) as ranks:
            train(config, ranks)
