"""The generic training machinery the stage scripts share; nothing here knows the game.

Read top to bottom:
  parse_config               - argparse flags from a config dataclass (cleanrl style)
  distributed                - init / teardown (torchrun: NCCL on CUDA, gloo on CPU), collectives, DDP wrapping
  checkpoints                - atomic save, RNG states, save / load for an exact resume, the crash switch
  MetricsLog                 - metrics.jsonl that a resumed run does not write twice
  batch_schedule, train_steps - the global batches of every epoch, and the DDP step loop over a corpus
  accumulating               - gradient accumulation under DDP (no all-reduce until the last micro-batch)
  completion_batch, token_logprobs, completion_logprobs - an LLM's log-probs of its completion tokens
"""
import argparse
import contextlib
import dataclasses
import json
import os
import random
import signal
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from engine import call_seed


def parse_config(config_class, argv=None, description=None):
    """argparse flags built from a dataclass: --field-name, typed by the field's default."""
    parser = argparse.ArgumentParser(description=description)
    for f in dataclasses.fields(config_class):
        flag = "--" + f.name.replace("_", "-")
        if isinstance(f.default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default)
        else:
            parser.add_argument(flag, type=type(f.default), default=f.default)
    return config_class(**vars(parser.parse_args(argv)))


def write_result(result, out):
    """Prints a result as one JSON line (the last line of the output) and, when `out` names a file, writes it
    there (folders created)."""
    print(json.dumps(result))
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result, indent=1))
    return result


def machine():
    """What produced a result: the GPU when one is visible, else this CPU."""
    if torch.cuda.is_available():
        return f"cuda: {torch.cuda.get_device_name(0)}"
    return "cpu: " + next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                           if line.startswith("model name")), "unknown")


# ----------------------------------------------------------------------------------------------------
# Distributed: `python` runs one process; `torchrun` sets RANK / WORLD_SIZE / LOCAL_RANK.
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


def run_distributed(train, cfg):
    """Runs train(cfg, rank, world, device) in this process's group (out_dir created) and tears it down."""
    rank, world, device = init_distributed()
    Path(cfg.out_dir).mkdir(parents=True, exist_ok=True)
    try:
        result = train(cfg, rank, world, device)
        # ranks leave together: a gloo group torn down while a peer still writes its files (rank-0 work) can
        # abort the process at exit ("terminate called without an active exception": 5 runs in 50 measured)
        barrier()
        return result
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


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


def wrap_ddp(module, device, find_unused):
    if world_size() == 1:
        return module
    return DDP(module, device_ids=[device.index] if device.type == "cuda" else None,
               find_unused_parameters=find_unused)


def accumulating(model, last):
    """Gradient accumulation under DDP: no all-reduce until the optimizer step's last micro-batch."""
    return model.no_sync() if isinstance(model, DDP) and not last else contextlib.nullcontext()


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


def load_checkpoint(out_dir, model, optimizer, rank, cfg):
    """Restores the latest checkpoint in out_dir, if any, and returns its counters ({} when starting). A
    checkpoint written under other settings is refused: resuming it would silently train (or, finished, return)
    the old run under the new name."""
    path = Path(out_dir) / "checkpoint.pt"
    if not path.exists():
        return {}
    state = torch.load(path, map_location="cpu", weights_only=False)
    changed = {k: (v, getattr(cfg, k)) for k, v in state.get("config", {}).items()
               if k != "crash_at_step" and hasattr(cfg, k) and getattr(cfg, k) != v}
    if changed:
        sys.exit(f"{path} was written with other settings (" + ", ".join(
            f"{k}: {old!r} there, {new!r} now" for k, (old, new) in changed.items())
            + "): resume with the same flags, or pass another --out-dir")
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


def crash_if_asked(cfg, step):
    """The resume test's kill switch: die as a SIGKILL would kill us, with no cleanup."""
    if cfg.crash_at_step and step == cfg.crash_at_step:
        os.kill(os.getpid(), signal.SIGKILL)


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
# The training loop over a corpus of rows (sft.py: cross-entropy; train_rl.py: SoftRankPO and its
# ablations). Every rank holds the whole corpus and runs the same schedule; each global batch is split over
# the ranks, so P processes compute the gradient of the same global batch as one process.
# ----------------------------------------------------------------------------------------------------
def batch_schedule(n_rows, batch_size, epochs, seed, tag):
    """The global batches (index tensors) of every epoch, from (seed, tag, epoch) alone: a resumed run
    gets the same data order without replaying anything."""
    per_epoch = max(1, n_rows // batch_size)  # the last partial batch is dropped (it would weigh more)
    batches = []
    for epoch in range(epochs):
        generator = torch.Generator().manual_seed(call_seed(seed, tag, epoch) % 2 ** 62)
        order = torch.randperm(n_rows, generator=generator)
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


# ----------------------------------------------------------------------------------------------------
# An LLM's log-probs of its completions (sft.py --target llm, MAGRPO, MLPO)
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
