"""Stage 1 (DESIGN §5): supervised bootstrapping of the meta-policy, or of the backbone itself.

    python sft.py --out-dir runs/sft                        # meta-policy -> runs/sft/policy.pt (pi_sft)
    torchrun --nproc_per_node=2 sft.py --out-dir runs/sft   # the same on 2 processes (gloo on CPU, NCCL on CUDA)
    python sft.py --target llm --out-dir runs/sft-llm       # backbone -> runs/sft-llm/model (an HF directory)

--target policy: play the game with a behaviour policy (uniform random by default) on training questions,
label every (agent, round) state with the oracle action (own answer right -> PERSIST; else a right peer ->
CONCEDE to the most confident right peer; else REFINE) and train the policy by cross-entropy.
--target llm: sample solutions to training questions, keep the right (and, with --trailer, well-formatted)
ones and fine-tune the backbone on them, with the loss on completion tokens only.

This file also holds what train_rl.py shares with it: the distributed setup, the corpus of game states,
the DDP training loop over states, checkpoints and automatic resume.
"""
import contextlib
import dataclasses
import json
import os
import random
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

import data
import deliberate
import softrank
from eval import parse_config


@dataclass
class Config:
    target: str = "policy"         # "policy" (the meta-policy) or "llm" (the backbone)
    task: str = "arith"
    path: str = ""                 # data file for file-based tasks
    level: int = 0                 # arith difficulty (0: the task's default)
    questions: int = 256           # training questions
    val_n: int = 64                # held-out training-split questions for the accuracy logged during training
    seed: int = 0                  # question split, LLM calls, data order, initialization
    agents: int = 3
    rounds: int = 3
    temperature: float = 0.7
    max_new_tokens: int = 192
    trailer: bool = False          # ask for the Steps / Confidence / Answer trailer
    behaviour: str = "random"      # the policy that plays the labelled games (a fixed policy or a checkpoint)
    hidden: int = 64
    heads: int = 4
    separate: bool = False         # one policy copy per agent
    epochs: int = 30
    batch_size: int = 256          # states (--target llm: sequences) per optimizer step, over all ranks
    lr: float = 3e-3
    weight_decay: float = 0.0
    # --target llm
    samples: int = 4               # solutions sampled per question
    micro_batch: int = 4           # sequences per forward/backward (memory); gradients accumulate
    llm_lr: float = 1e-5
    gradient_checkpointing: bool = False
    # engine and bookkeeping
    model: str = ""                # HF checkpoint directory; empty: the embedded default backbone
    dtype: str = "float32"
    engine_batch_size: int = 64
    cache_dir: str = "cache/generations"
    out_dir: str = "runs/sft"
    save_every: int = 50           # optimizer steps between checkpoints (and at the end)
    crash_at_step: int = 0         # testing resume: SIGKILL this process right after this optimizer step


# ----------------------------------------------------------------------------------------------------
# Distributed setup: `python` runs one process; `torchrun` sets RANK / WORLD_SIZE / LOCAL_RANK.
# ----------------------------------------------------------------------------------------------------
def init_distributed():
    """(rank, world size, device). NCCL on CUDA, gloo on CPU."""
    if "RANK" not in os.environ:
        return 0, 1, torch.device("cuda" if torch.cuda.is_available() else "cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return dist.get_rank(), dist.get_world_size(), device


def world_size():
    return dist.get_world_size() if dist.is_initialized() else 1


def barrier():
    if dist.is_initialized():
        dist.barrier()


def all_reduce_sum(values, device):
    """Sums a list of floats over all ranks (every rank must call it)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(t)
    return t.tolist()


def all_gather_list(items):
    """Every rank's list, concatenated in rank order, on every rank."""
    if not dist.is_initialized():
        return list(items)
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, list(items))
    return [x for part in gathered for x in part]


# ----------------------------------------------------------------------------------------------------
# Questions and the corpus of game states
# ----------------------------------------------------------------------------------------------------
def training_pool(cfg):
    """The task's training split (of a file: the ~5/6 that data.split_of puts in train) in a seeded shuffle;
    the first `val_n` are the validation questions."""
    kw = {"level": cfg.level} if cfg.level else {}
    pool = data.load_task(cfg.task, path=cfg.path or None, split="train", **kw)
    random.Random(cfg.seed).shuffle(pool)
    return pool


def training_questions(cfg, iteration=0):
    """(training questions of `iteration`, validation questions): disjoint slices of training_pool. The
    validation slice comes first, so it stays the same as the questions or iterations grow."""
    pool = training_pool(cfg)
    start = cfg.val_n + iteration * cfg.questions
    if start + cfg.questions > len(pool):
        raise ValueError(f"task {cfg.task!r} has {len(pool)} training questions: not enough for val_n={cfg.val_n}"
                         f" + questions={cfg.questions} per iteration over {iteration + 1} iteration(s)")
    return pool[start:start + cfg.questions], pool[:cfg.val_n]


def game_config(cfg, greedy_policy):
    """critic=True: the states of games played by a fixed behaviour policy carry the critic's p(Correct),
    as they will when the learned policy plays."""
    return deliberate.GameConfig(agents=cfg.agents, rounds=cfg.rounds, temperature=cfg.temperature,
                                 max_new_tokens=cfg.max_new_tokens, seed=cfg.seed, trailer=cfg.trailer,
                                 greedy_policy=greedy_policy, critic=True)


def make_engine(cfg, rank):
    """The generation engine of one rank: its own cache file, a progress bar on rank 0."""
    return deliberate.Engine(model_path=cfg.model or None, dtype=cfg.dtype, batch_size=cfg.engine_batch_size,
                             cache_dir=cfg.cache_dir or None, rank=rank, progress=rank == 0)


def collect_states(engine, examples, policy, cfg, counterfactual, rank, world, desc="collect"):
    """Plays the game with `policy` (actions sampled) on this rank's shard of `examples` and returns every
    rank's visited (agent, round) states, in a canonical order (so the corpus does not depend on the number
    of ranks). A state holds its observation, the action taken, the oracle label and, with
    `counterfactual`, the reward of each of the K actions (DESIGN §6)."""
    shard = examples[rank::world]
    bar = tqdm(total=cfg.rounds, desc=desc, disable=rank != 0, leave=False)
    transcripts = deliberate.play(engine, shard, policy, game_config(cfg, greedy_policy=False),
                                  record_states=True, counterfactual=counterfactual, progress=bar)
    bar.close()
    rows = []
    for tr in transcripts:
        for t in range(1, len(tr["rounds"])):
            before, record = tr["rounds"][t - 1], tr["rounds"][t]
            for i in range(cfg.agents):
                peers = [j for j in range(cfg.agents) if j != i]
                label = deliberate.oracle_action(before["agent_correct"][i],
                                                 [before["agent_correct"][j] for j in peers],
                                                 [before["confidence"][j] for j in peers])
                rows.append({"key": (tr["id"], t, i), "own": record["own"][i], "peers": record["peers"][i],
                             "agent": i, "action": record["actions"][i], "label": label,
                             "rewards": record["reward_vectors"][i] if counterfactual else None})
    rows = sorted(all_gather_list(rows), key=lambda r: r["key"])
    if not rows:
        raise ValueError("the games visited no state after round 0 (did every game stop at once?)")
    return rows


def states_to_tensors(rows):
    tensors = {"own": torch.tensor([r["own"] for r in rows], dtype=torch.float32),
               "peers": torch.tensor([r["peers"] for r in rows], dtype=torch.float32),
               "agent": torch.tensor([r["agent"] for r in rows]),
               "action": torch.tensor([r["action"] for r in rows]),
               "label": torch.tensor([r["label"] for r in rows])}
    if rows[0]["rewards"] is not None:
        tensors["rewards"] = torch.tensor([r["rewards"] for r in rows], dtype=torch.float32)
    return tensors


def load_or_collect(path, collect, rank):
    """The corpus at `path`, collected once: rank 0 writes it atomically; a resumed run reads it back."""
    if not Path(path).exists():
        rows = collect()
        if rank == 0:
            atomic_save(rows, path)
        barrier()
    return torch.load(path, weights_only=False)


def action_distribution(actions, n_actions):
    counts = torch.bincount(actions, minlength=n_actions).float()
    kinds = {"persist": counts[0], "refine": counts[1], "concede": counts[2:].sum()}
    return {k: round(float(v / counts.sum()), 4) for k, v in kinds.items()}


# ----------------------------------------------------------------------------------------------------
# Checkpoints: everything a resumed run needs to continue exactly (weights, optimizer, counters, RNGs)
# ----------------------------------------------------------------------------------------------------
def atomic_save(obj, path):
    """Write, then rename: a process killed mid-write leaves the previous file intact."""
    tmp = Path(str(path) + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def rng_states():
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_states(states):
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if states["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def load_checkpoint(out_dir, model, optimizer, rank):
    """Restores the latest checkpoint in out_dir, if any, and returns its counters ({} when starting)."""
    path = Path(out_dir) / "checkpoint.pt"
    if not path.exists():
        return {}
    state = torch.load(path, map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    set_rng_states(state["rng"])
    if rank == 0:
        print(f"resuming from {path} at {state['counters']}", file=sys.stderr)
    return state["counters"]


def save_checkpoint(out_dir, model, optimizer, counters, cfg, rank):
    """Rank 0 writes (the weights are the same on every rank); every rank waits for it."""
    if rank == 0:
        atomic_save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "counters": dict(counters),
                     "rng": rng_states(), "config": dataclasses.asdict(cfg)}, Path(out_dir) / "checkpoint.pt")
    barrier()


def accumulating(model, last):
    """Gradient accumulation under DDP: no all-reduce until the optimizer step's last micro-batch."""
    return model.no_sync() if isinstance(model, DDP) and not last else contextlib.nullcontext()


class MetricsLog:
    """metrics.jsonl, written by rank 0. On resume, the lines past the checkpoint's step (work the killed
    run did after its last checkpoint, which is being redone) are dropped."""

    def __init__(self, out_dir, rank, resume_step):
        self.path, self.rank = Path(out_dir) / "metrics.jsonl", rank
        if rank == 0 and self.path.exists():
            keep = [line for line in self.path.read_text().splitlines()
                    if line.strip() and json.loads(line).get("step", 0) <= resume_step]
            self.path.write_text("".join(line + "\n" for line in keep))

    def write(self, **record):
        if self.rank == 0:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")


# ----------------------------------------------------------------------------------------------------
# The training loop over a corpus of states: shared by sft.py (cross-entropy) and train_rl.py (SoftRankPO
# and its ablations). Every rank holds the whole corpus and runs the same schedule; each global batch is
# split over the ranks, so P processes compute the gradient of the same global batch as one process.
# ----------------------------------------------------------------------------------------------------
def batch_schedule(n_states, batch_size, epochs, seed, tag):
    """The global batches (index tensors) of every epoch, from (seed, tag, epoch) alone: a resumed run
    gets the same data order without replaying anything."""
    per_epoch = max(1, n_states // batch_size)  # the last partial batch is dropped (it would weigh more)
    batches = []
    for epoch in range(epochs):
        order = torch.randperm(n_states, generator=torch.Generator().manual_seed(
            deliberate.call_seed(seed, tag, epoch) % 2 ** 62))
        batches += [order[b * batch_size:(b + 1) * batch_size] for b in range(per_epoch)]
    return batches


def train_steps(model, optimizer, tensors, loss_fn, batches, first_step, on_step, rank, world, device,
                desc="train"):
    """Runs batches[first_step:]: one optimizer step per global batch.

    loss_fn(model, batch) -> (mean loss over the batch's rows, stats dict of floats). Each rank takes rows
    rank::world of the global batch and scales its mean loss by its share of the rows times the world size;
    DDP averages the gradients over ranks, so the result is the gradient of the global batch mean.
    on_step(step, stats) runs after every step (logging, checkpoints, evaluation), on every rank."""
    bar = tqdm(range(first_step, len(batches)), desc=desc, disable=rank != 0, leave=False)
    for step in bar:
        rows = batches[step]
        if len(rows) < world:
            raise ValueError(f"a batch of {len(rows)} states cannot be split over {world} ranks")
        mine = rows[rank::world]
        batch = {k: v[mine].to(device) for k, v in tensors.items()}
        loss, stats = loss_fn(model, batch)
        (loss * len(mine) * world / len(rows)).backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        # stats averaged over ranks, weighted by rows, so the log describes the global batch
        names = sorted(stats)
        summed = all_reduce_sum([stats[k] * len(mine) for k in names] + [len(mine)], device)
        stats = {k: v / summed[-1] for k, v in zip(names, summed)}
        stats["grad_norm"] = float(grad_norm)
        bar.set_postfix(loss=f"{stats.get('loss', 0.0):.4f}")
        on_step(step + 1, stats)


def wrap_ddp(module, device, find_unused):
    if world_size() == 1:
        return module
    return DDP(module, device_ids=[device.index] if device.type == "cuda" else None,
               find_unused_parameters=find_unused)


def unwrap(model):
    return model.module if isinstance(model, DDP) else model


def crash_if_asked(cfg, step):
    """The resume test's kill switch: die as a SIGKILL would kill us, with no cleanup."""
    if cfg.crash_at_step and step == cfg.crash_at_step:
        os.kill(os.getpid(), signal.SIGKILL)


def evaluate_policy(engine, examples, policy, cfg, rank, world, device):
    """Team accuracy and tokens per question of `policy` (greedy) on `examples`, every rank on its shard."""
    results = deliberate.play(engine, examples[rank::world], policy, game_config(cfg, greedy_policy=True))
    actions = [deliberate.action_kind(a) for r in results for record in r["rounds"][1:] for a in record["actions"]]
    sums = all_reduce_sum([sum(r["correct"] for r in results), sum(r["tokens"] for r in results), len(results)]
                          + [actions.count(k) for k in deliberate.ACTION_KINDS], device)
    correct, tokens, n, counts = sums[0], sums[1], sums[2], sums[3:]
    return {"val_accuracy": correct / n, "val_tokens": tokens / n,
            "val_actions": {k: round(c / max(sum(counts), 1), 4) for k, c in zip(deliberate.ACTION_KINDS, counts)}}


# ----------------------------------------------------------------------------------------------------
# --target policy
# ----------------------------------------------------------------------------------------------------
def cross_entropy_loss(model, batch):
    logits = model(batch["own"], batch["peers"], batch["agent"])
    loss = F.cross_entropy(logits, batch["label"])
    accuracy = (logits.argmax(-1) == batch["label"]).float().mean()
    return loss, {"loss": loss.item(), "label_accuracy": accuracy.item()}


def train_policy(cfg, rank, world, device):
    out = Path(cfg.out_dir)
    torch.manual_seed(cfg.seed)
    policy = deliberate.MetaPolicy(agents=cfg.agents, hidden=cfg.hidden, heads=cfg.heads, separate=cfg.separate)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    counters = load_checkpoint(out, policy, optimizer, rank) or {"step": 0}
    log = MetricsLog(out, rank, counters["step"])
    engine = make_engine(cfg, rank)
    questions, _ = training_questions(cfg)
    behaviour = deliberate.make_policy(cfg.behaviour)
    rows = load_or_collect(out / "corpus.pt", lambda: collect_states(
        engine, questions, behaviour, cfg, counterfactual=False, rank=rank, world=world), rank)
    tensors = states_to_tensors(rows)
    n_actions = 1 + cfg.agents
    label_mix = action_distribution(tensors["label"], n_actions)
    if rank == 0:
        print(f"{len(rows)} states from {len(questions)} questions; oracle labels {label_mix}", file=sys.stderr)
    batches = batch_schedule(len(rows), cfg.batch_size, cfg.epochs, cfg.seed, "sft")
    model = wrap_ddp(policy.to(device), device, find_unused=cfg.separate)

    def on_step(step, stats):
        log.write(step=step, **stats)
        if step % cfg.save_every == 0 or step == len(batches):
            save_checkpoint(out, policy, optimizer, {"step": step}, cfg, rank)
        crash_if_asked(cfg, step)

    train_steps(model, optimizer, tensors, cross_entropy_loss, batches, counters["step"], on_step, rank, world,
                device, desc="sft")
    with torch.no_grad():
        predicted = policy.cpu()(tensors["own"], tensors["peers"], tensors["agent"]).argmax(-1)
    summary = {"states": len(rows), "label_distribution": label_mix,
               "policy_distribution": action_distribution(predicted, n_actions),
               "label_accuracy": float((predicted == tensors["label"]).float().mean())}
    if rank == 0:
        deliberate.save_policy(policy, out / "policy.pt", train_config=dataclasses.asdict(cfg), summary=summary)
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        print(json.dumps(summary))
    return policy


# ----------------------------------------------------------------------------------------------------
# --target llm: fine-tune the backbone on its own right answers (rejection sampling), loss on completions
# ----------------------------------------------------------------------------------------------------
def completion_batch(sequences, pad_id, device):
    """(input_ids, attention_mask, loss_mask) from (prompt_ids, completion_ids) pairs: prompts left-padded to
    the longest prompt, completions right-padded after them, so every completion starts at the same column
    and the LM head only has to run on the last columns (token_logprobs). loss_mask is 1 exactly on the
    completion tokens, never on the prompt or the padding."""
    prompt_width = max(len(p) for p, _ in sequences)
    width = prompt_width + max(len(c) for _, c in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention = torch.zeros(len(sequences), width, dtype=torch.long)
    loss_mask = torch.zeros(len(sequences), width, dtype=torch.long)
    for b, (p, c) in enumerate(sequences):
        start, end = prompt_width - len(p), prompt_width + len(c)
        ids[b, start:end] = torch.tensor(p + c)
        attention[b, start:end] = 1
        loss_mask[b, prompt_width:end] = 1
    return ids.to(device), attention.to(device), loss_mask.to(device)


def token_logprobs(model, ids, attention, temperature=1.0, last=None):
    """log p(ids[:, t] | ids[:, :t]) of the `last` final columns (default: every t >= 1), aligned with
    ids[:, -last:], under `temperature`: a policy gradient must score the tokens with the distribution they
    were sampled from. The LM head and the softmax run on those columns only (the vocabulary is most of the
    memory), and position ids skip the left padding, as in generation."""
    last = last or ids.shape[1] - 1
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=attention, position_ids=positions,
                   logits_to_keep=last + 1).logits[:, :-1].float() / temperature
    return logits.gather(-1, ids[:, -last:, None])[..., 0] - torch.logsumexp(logits, -1)


def completion_logprobs(model, batch, temperature=1.0):
    """(log-probs, loss mask) over the completion columns of a completion_batch."""
    ids, attention, loss_mask = batch
    last = ids.shape[1] - int(loss_mask.any(0).nonzero()[0])
    return token_logprobs(model, ids, attention, temperature, last), loss_mask[:, -last:]


def train_llm(cfg, rank, world, device):
    out = Path(cfg.out_dir)
    engine = make_engine(cfg, rank)
    questions, _ = training_questions(cfg)
    shard = questions[rank::world]
    prompts = [engine.chat(deliberate.solve_prompt(ex, cfg.trailer)) for ex in shard for _ in range(cfg.samples)]
    seeds = [deliberate.call_seed(cfg.seed, ex.id, k, "sft-llm") for ex in shard for k in range(cfg.samples)]
    completions = engine.generate(prompts, seeds, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature)
    eos = engine.tokenizer.eos_token_id
    kept = []
    for k, (prompt, c) in enumerate(zip(prompts, completions)):
        ex = shard[k // cfg.samples]
        s = deliberate.parse_solution(c.text, ex.task)
        if c.finish == "eos" and data.is_correct(s.answer, ex.answer, ex.task) and (s.trailer_ok or not cfg.trailer):
            kept.append((engine.encode(prompt), engine.encode(c.text) + [eos]))
    kept = sorted(all_gather_list(kept))  # every rank sees the same dataset, whatever the world size
    if rank == 0:
        print(f"kept {len(kept)} right{' well-formatted' if cfg.trailer else ''} solutions of "
              f"{len(questions) * cfg.samples} samples", file=sys.stderr)
    if len(kept) < cfg.batch_size:
        raise ValueError(f"only {len(kept)} right solutions for a batch of {cfg.batch_size}: "
                         "raise --n or --samples, or lower --batch-size")
    model = engine.model.float().to(device).train()
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.llm_lr, weight_decay=cfg.weight_decay)
    counters = load_checkpoint(out, model, optimizer, rank) or {"step": 0}
    log = MetricsLog(out, rank, counters["step"])
    batches = batch_schedule(len(kept), cfg.batch_size, cfg.epochs, cfg.seed, "sft-llm")
    ddp = wrap_ddp(model, device, find_unused=False)
    pad = engine.tokenizer.pad_token_id if engine.tokenizer.pad_token_id is not None else eos
    bar = tqdm(range(counters["step"], len(batches)), desc="sft-llm", disable=rank != 0)
    for step in bar:
        mine = [kept[i] for i in batches[step][rank::world].tolist()]
        # the normalizer (completion tokens of the global batch) is computed once per optimizer step;
        # DDP averages over ranks, hence the factor world
        n_tokens = all_reduce_sum([sum(len(c) for _, c in mine)], device)[0] / world
        total = 0.0
        for m in range(0, len(mine), cfg.micro_batch):
            batch = completion_batch(mine[m:m + cfg.micro_batch], pad, device)
            last = m + cfg.micro_batch >= len(mine)
            with accumulating(ddp, last):
                logp, mask = completion_logprobs(ddp, batch)
                # cross-entropy on the completion tokens = the token-level policy gradient with advantage 1
                loss, _ = softrank.policy_gradient_loss(logp, logp.new_ones(len(logp)), mask, "token", n_tokens)
                loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss_mean = all_reduce_sum([total], device)[0] / world
        bar.set_postfix(loss=f"{loss_mean:.4f}")
        log.write(step=step + 1, loss=loss_mean)
        if (step + 1) % cfg.save_every == 0 or step + 1 == len(batches):
            save_checkpoint(out, model, optimizer, {"step": step + 1}, cfg, rank)
        crash_if_asked(cfg, step + 1)
    if rank == 0:
        model.eval().save_pretrained(out / "model")
        engine.tokenizer.save_pretrained(out / "model")
        print(json.dumps({"kept": len(kept), "steps": len(batches), "model": str(out / "model")}))
    return model


def main(cfg):
    if cfg.target not in ("policy", "llm"):
        sys.exit(f"unknown --target {cfg.target!r}: choose policy or llm")
    rank, world, device = init_distributed()
    Path(cfg.out_dir).mkdir(parents=True, exist_ok=True)
    try:
        return (train_policy if cfg.target == "policy" else train_llm)(cfg, rank, world, device)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main(parse_config(Config))
