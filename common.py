"""What every script shares and no script should re-read (nanochat's common.py is the model): the
library's plumbing, which knows nothing of the method.

parse_config      - the command line from a script's flat config dataclass; each field's docstring
                    is its --help
usage_error       - a user's mistake: one line on stderr, exit status 2, no traceback; the checks
                    of a flag's value (check_choice, check_at_least, check_positive)
distributed       - DDP setup and teardown (torchrun: NCCL on CUDA, gloo on CPU), collectives, DDP
                    wrapping, FSDP2 sharding (wrap_fsdp) and its whole state dicts
shard_rows        - this rank's rows of a global batch, and the weight that makes ranks add up to
                    its mean
load_file         - the one way a file is read back (policy, checkpoint, corpus): tensors and plain
                    data only, so a shared file cannot run code; FileRefused names what is wrong
save_tensors      - weights as safetensors beside their settings' JSON; load_tensors, load_module
                    read them back (or an older .pt)
checkpoints       - atomic save, RNG states, save / load for an exact resume, the crash switch of
                    the tests
MetricsLog        - metrics.jsonl that a resumed run does not write twice
batch_schedule    - the global batches of every epoch, a function of the seed alone
write_result, machine - a result file, and what produced it (machine: the GPU, or the CPU and its
                    matmul flags, cpuinfo)
call_seed         - a reproducible seed for any draw (an LLM call, an epoch's batch order)
stack_rows        - rows as tensors
save_made_under, load_made_under - a file of rows (a corpus) saved with the settings that made it,
                    refused under others
"""

import argparse
import ast
import contextlib
import dataclasses
import functools
import gc
import hashlib
import inspect
import json
import os
import pickle
import random
import re
import resource
import signal
import sys
import textwrap
import warnings
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import torch.distributed as dist
from safetensors import SafetensorError
from safetensors.torch import load_file as load_safetensors
from safetensors.torch import save_file as save_safetensors
from torch.nn.parallel import DistributedDataParallel as DDP

import data


# --------------------------------------------------------------------------------------------------
# The command line: each script declares every flag it takes in one flat dataclass of its own
# (cleanrl style); a flag's help is the docstring right under its field, the string literal tyro and
# Sphinx read, so the script's class is the one place a flag is declared.
# --------------------------------------------------------------------------------------------------
@functools.cache
def field_docs(config_class):
    """{field name: the docstring under it} of a script's dataclass; a study's subclass (a lab file
    beside the script) adds its own fields' to the script's."""
    docs = {}
    for cls in reversed(config_class.__mro__):
        if not dataclasses.is_dataclass(cls):
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
        for node, after in zip(body, body[1:]):
            is_doc = isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
            if isinstance(node, ast.AnnAssign) and is_doc and isinstance(after.value.value, str):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def parse_config(config_class, argv=None, description=None):
    """argparse flags built from a script's dataclass: --field-name, typed by the field's default.
    The fields the class names in POSITIONAL are the command's arguments instead (`view.py
    FILE`)."""
    parser = argparse.ArgumentParser(description=description)
    docs = field_docs(config_class)
    positional = getattr(config_class, "POSITIONAL", ())
    for f in dataclasses.fields(config_class):
        text = docs.get(f.name, "").replace("%", "%%")  # argparse formats help strings with %
        if f.name in positional:
            parser.add_argument(f.name, type=type(f.default), help=text)
            continue
        flag = "--" + f.name.replace("_", "-")
        text = f"{text} (default: {f.default!r})"
        if isinstance(f.default, bool):
            action = argparse.BooleanOptionalAction
            parser.add_argument(flag, action=action, default=f.default, help=text)
        else:
            parser.add_argument(flag, type=type(f.default), default=f.default, help=text)
    return config_class(**vars(parser.parse_args(argv)))


class UsageError(ValueError):
    """A user's mistake (a flag's value, a file given on the command line): its message is the one
    line the user sees, naming the flag, the value and what would be accepted."""


def usage_error(message):
    """One line on stderr, exit status 2 (as argparse does), no traceback: tracebacks are for
    bugs."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


@contextlib.contextmanager
def user_errors(out_dir=None):
    """with user_errors(cfg.out_dir): ... -- a user's mistake found at any point (a bad flag, a
    data file, a prompt too long for the model) ends the run with its one line; Ctrl-C with one
    saying how to resume (out_dir None: a run with no checkpoint, whose generations are cached)."""
    try:
        yield
    except (UsageError, FileRefused, data.DataError) as error:
        usage_error(str(error))
    except KeyboardInterrupt:
        where = (
            f"from the last checkpoint in {out_dir}"
            if out_dir
            else "(finished generations are cached)"
        )
        print(f"\ninterrupted: rerun the same command to resume {where}", file=sys.stderr)
        sys.exit(130)


def flag(name):
    return "--" + name.replace("_", "-")


def check_choice(flag_name, value, choices):
    """Refuses a value outside `choices` with one line naming the flag."""
    if value not in choices:
        raise UsageError(
            f"unknown {flag_name} {value!r}: choose one of {', '.join(map(str, choices))}"
        )


def check_at_least(minimum, **flags):
    """Each flag's value must be >= minimum: check_at_least(1, steps=cfg.steps) refuses --steps 0
    in one line."""
    for name, value in flags.items():
        if value < minimum:
            raise UsageError(f"{flag(name)} {value!r}: must be at least {minimum}")


def check_positive(**flags):
    """Each flag's value must be > 0."""
    for name, value in flags.items():
        if not value > 0:
            raise UsageError(f"{flag(name)} {value!r}: must be > 0")


def launch_world_size():
    """The number of processes torchrun starts (1 under plain python), known before any runs."""
    return int(os.environ.get("WORLD_SIZE", 1))


def write_result(result, out):
    """Prints a result as one JSON line (the last line of the output) and, when `out` names a file,
    writes it there (folders created)."""
    print(json.dumps(result))
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result, indent=1))
    return result


# the CPU flags a result file names beside the CPU (machine): how fast a matmul runs depends on
# them, but they do not decide `--dtype auto` (a probe does: llm.backbone.resolve_dtype)
BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")
MATMUL_CPU_FLAGS = ("avx2", "avx512f", *BF16_CPU_FLAGS)


def cpuinfo(field):
    """The first value of `field` in /proc/cpuinfo ("model name", "flags"), "" where it cannot be
    read (not Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((line for line in f if line.startswith(field)), "")
    except OSError:
        return ""
    return line.partition(":")[2].strip()


def cpu_flags():
    return set(cpuinfo("flags").split())


def machine():
    """What produced a result: the GPU when one is visible, else this CPU and the flags its matmul
    speed depends on (bf16 in hardware: amx_bf16, avx512_bf16)."""
    if torch.cuda.is_available():
        return f"cuda: {torch.cuda.get_device_name(0)}"
    flags = [flag for flag in MATMUL_CPU_FLAGS if flag in cpu_flags()]
    return f"cpu: {cpuinfo('model name') or 'unknown'} ({' '.join(flags) or 'no avx2'})"


def call_seed(*parts):
    """A reproducible 60-bit seed for one LLM call (or any other draw), from anything
    JSON-serializable."""
    return int(hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:15], 16)


# --------------------------------------------------------------------------------------------------
# Distributed: `python` runs one process; `torchrun` sets RANK / WORLD_SIZE / LOCAL_RANK.
# --------------------------------------------------------------------------------------------------
class Ranks(NamedTuple):
    """This process's place in a run: its rank, the number of processes, its device."""

    rank: int
    world: int
    device: torch.device


@contextlib.contextmanager
def distributed(out_dir):
    """with distributed(out_dir) as ranks: ... -- this process's Ranks (rank, world, device) and
    the process group (NCCL on CUDA,
    gloo on CPU) for the block, out_dir created. The ranks meet at a barrier before the group is
    torn down: a gloo group torn down while a peer still writes its files (rank-0 work) can abort
    the process at exit ("terminate called without an active exception": 5 runs in 50 measured). A
    rank whose block raised skips the barrier, so its error surfaces instead of a hang. What the
    block wraps in DDP must die inside it (the trainers' train() returns there): a DDP reducer
    freed after the teardown destroys the gloo group itself, joining gloo's thread under the GIL
    (a hang). FSDP2's modules sit in reference cycles, which outlive the frame that made them
    until a garbage collection: the block ends with one, before the group is torn down (freed at
    exit, after it, they aborted a rank: "terminate called without an active exception")."""
    if "RANK" not in os.environ:
        rank, world = 0, 1
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        if torch.cuda.is_available():
            torch.cuda.set_device(local_rank)
            device = torch.device("cuda", local_rank)
        else:
            device = torch.device("cpu")
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    try:
        yield Ranks(rank, world, device)
        gc.collect()
        barrier()
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


def all_reduce_max(values, device):
    """The largest of each of a list of numbers over all ranks (every rank must call it)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def all_gather_list(items):
    """Every rank's list, concatenated in rank order, on every rank."""
    if not dist.is_initialized():
        return list(items)
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, list(items))
    return [x for part in gathered for x in part]


def peak_memory_mb(device):
    """The process's peak memory so far: CUDA memory allocated by torch on a GPU, else the peak
    resident set size (Linux reports it in KB)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def average_gradients(parameters, world):
    """What DDP does at the end of a backward, by hand: each gradient averaged over the ranks (a
    parameter without a gradient counts as zeros). For weights DDP cannot wrap: LoRA adapters of
    one model, each trained by its own micro-batches."""
    if world == 1 or not dist.is_initialized():
        return
    for p in parameters:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad)
        p.grad /= world


def wrap_ddp(module, device, find_unused):
    if world_size() == 1:
        return module
    device_ids = [device.index] if device.type == "cuda" else None
    return DDP(module, device_ids=device_ids, find_unused_parameters=find_unused)


# FSDP2 and torch's distributed checkpoint are imported where a process group exists, the only place
# a shard can: importing them takes most of a second, which every plain-python run (a test's
# subprocess, a refused flag) would pay for nothing.
def wrap_fsdp(model, device):
    """The model's weights, gradients and optimizer state sharded over the processes with torch's
    FSDP2 (fully_shard), in place: each transformer block its own unit (the classes the model
    names in its _no_split_modules, as HF's own FSDP wrapping does), then the rest. Its parameters
    become DTensors, this rank's 1/world of each; a forward gathers one block's whole weights at a
    time, a backward reduce-scatters its gradients. Without a process group (plain python): the
    model as it is."""
    if not dist.is_initialized():
        return model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (world_size(),))
    blocks = set(getattr(model, "_no_split_modules", None) or ())
    for module in model.modules():
        if type(module).__name__ in blocks:
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def accumulating(model, last):
    """Gradient accumulation across processes: no gradient exchange until the optimizer step's last
    micro-batch (DDP's all-reduce, FSDP2's reduce-scatter)."""
    if sharded(model):
        model.set_requires_gradient_sync(last)
        return contextlib.nullcontext()
    return model.no_sync() if isinstance(model, DDP) and not last else contextlib.nullcontext()


def whole(tensor):
    """A tensor whole on this rank: a DTensor (an FSDP2 shard, a replicated norm) gathered, any
    other tensor as it is. Every rank must call it for a sharded one."""
    return tensor.full_tensor() if sharded_tensor(tensor) else tensor


def sharded_tensor(tensor):
    """Whether `tensor` is FSDP2's, a DTensor (its local part a shard, or a replica)."""
    if not dist.is_initialized():
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def clip_gradients(parameters, max_norm):
    """clip_grad_norm_ over `parameters` (sharded or not), returning the norm before clipping as a
    plain tensor."""
    return whole(torch.nn.utils.clip_grad_norm_(parameters, max_norm))


def sharded(module):
    """Whether `module` holds FSDP2-sharded parameters (itself or a submodule fully_shard wrapped):
    its state dicts are gathered and scattered by every rank."""
    if not dist.is_initialized():
        return False
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in module.modules())


def state_dicts(module, optimizer):
    """(the module's state dict, the optimizer's), to save: FSDP2's shards gathered whole onto rank
    0's CPU (every rank must call it; the other ranks get empty dicts), else as they are."""
    if not sharded(module):
        return module.state_dict(), optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state = get_model_state_dict(module, options=options)
    return model_state, get_optimizer_state_dict(module, optimizer, options=options)


def load_state_dicts(module, optimizer, model_state, optimizer_state):
    """state_dicts' inverse: whole state dicts into the module and optimizer, each rank taking its
    shards where they are sharded."""
    if not sharded(module):
        module.load_state_dict(model_state)
        optimizer.load_state_dict(optimizer_state)
        return
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(module, model_state, options=options)
    set_optimizer_state_dict(module, optimizer, optimizer_state, options=options)


def state_bytes(parameters, optimizer):
    """The bytes this rank holds of the trained parameters, their gradients and the optimizer's
    state (an FSDP2 shard counts its local part): what sharding divides by the world size."""

    def local(t):
        return t.to_local() if sharded_tensor(t) else t

    tensors = [local(p) for p in parameters] + [
        local(p.grad) for p in parameters if p.grad is not None
    ]
    tensors += [
        local(v) for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)
    ]
    return sum(t.numel() * t.element_size() for t in tensors)


def shard_rows(tensors, rows, rank, world, device):
    """This rank's part (rows rank::world) of a global batch of corpus rows, and the weight of its
    mean loss: its share of the rows times the world size. DDP averages gradients over ranks, so P
    processes compute the gradient of the global batch mean, as one process does."""
    if len(rows) < world:
        raise ValueError(f"a batch of {len(rows)} rows cannot be split over {world} ranks")
    mine = rows[rank::world]
    return {k: v[mine].to(device) for k, v in tensors.items()}, len(mine) * world / len(rows)


def stack_rows(rows, floats=(), ints=()):
    """Rows of plain values (dicts) -> a tensor per key: float32 for `floats`, int64 for `ints`."""
    tensors = {k: torch.tensor([r[k] for r in rows], dtype=torch.float32) for k in floats}
    return tensors | {k: torch.tensor([r[k] for r in rows]) for k in ints}


def global_mean(stats, rows, device):
    """Per-rank means of `rows` rows each -> the means over the global batch (every rank must call
    it)."""
    names = sorted(stats)
    summed = all_reduce_sum([stats[k] * rows for k in names] + [rows], device)
    return {k: v / summed[-1] for k, v in zip(names, summed)}


# --------------------------------------------------------------------------------------------------
# Reading files back. A plain torch.load unpickles whatever a file names, so a policy someone shares
# could run any command when loaded (an object whose __reduce__ returns (os.system, ...)). torch's
# weights_only unpickler builds tensors, dicts, lists, tuples, strings, numbers, bools and None, and
# refuses every other global: everything the project writes is made of these alone.
# --------------------------------------------------------------------------------------------------
class FileRefused(ValueError):
    """A file that is not read: missing, corrupt, or holding more than tensors and plain data."""


def load_file(path, what):
    """The tensors and plain data in `path` (on the CPU), or FileRefused with one line naming the
    file and the problem; `what` (policy, checkpoint, corpus) says which file was expected."""
    try:
        with warnings.catch_warnings():
            # an old-style pickle earns a note on its pickle protocol: noise beside a refusal
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return torch.load(path, map_location="cpu", weights_only=True)
    except OSError as error:  # missing, a folder, no permission
        raise FileRefused(f"{path}: cannot read the {what} file ({error.strerror})") from None
    except pickle.UnpicklingError as error:
        # torch's message is a paragraph: keep the global a crafted file would call, or else the
        # instruction the unpickler stopped at ("Unsupported operand 149")
        named = re.search(r"GLOBAL (\S+)", str(error))
        stopped = re.search(r"WeightsUnpickler error:\s*(.+)", str(error))
        if named:
            why = f"it would run code: `{named[1]}`"
        else:
            why = stopped[1] if stopped else "not plain data"
        raise FileRefused(f"{path}: not a plain-data {what} file ({why}); refused") from error
    except Exception as error:  # a truncated or corrupt archive fails anywhere in torch.load
        kind = type(error).__name__
        raise FileRefused(f"{path}: not a {what} file torch can read ({kind}); refused") from error


def save_tensors(tensors, settings, path):
    """Weights (a state dict) as safetensors at `path` (NAME.safetensors) and their settings as JSON
    beside it (NAME.json): what other tools read, and nothing in either can run code."""
    path = Path(path)
    if path.suffix != ".safetensors":
        raise ValueError(f"{path}: a tensors file is named NAME.safetensors")
    save_safetensors({k: v.contiguous() for k, v in tensors.items()}, path)
    path.with_suffix(".json").write_text(json.dumps(settings, indent=1) + "\n")


def load_tensors(path, what):
    """(tensors, settings) of save_tensors' files, or of an older .pt file holding a "state_dict"
    beside its settings (load_file); FileRefused in one line where either is missing or not what
    it should be."""
    path = Path(path)
    if path.suffix != ".safetensors":
        stored = load_file(path, what)
        if not isinstance(stored, dict) or not isinstance(stored.get("state_dict"), dict):
            raise FileRefused(f"{path}: not a {what} file (no state_dict)")
        return stored["state_dict"], {k: v for k, v in stored.items() if k != "state_dict"}
    try:
        tensors = load_safetensors(path)
        settings = json.loads(path.with_suffix(".json").read_text())
    except (OSError, ValueError, SafetensorError) as error:
        raise FileRefused(
            f"{path}: cannot read the {what} file and its settings ({error})"
        ) from None
    return tensors, settings


def load_module(path, what, build):
    """(module, settings): a module saved with save_tensors (or an older .pt), built from its
    settings by `build` and given its tensors; FileRefused in one line where they do not fit it (a
    tensor missing, extra or of another shape) or the settings build nothing."""
    tensors, settings = load_tensors(path, what)
    try:
        module = build(settings)
        keys = module.load_state_dict(tensors, strict=False)
    except (KeyError, TypeError, ValueError, RuntimeError) as error:
        why = str(error).strip().splitlines()[-1].strip()
        raise FileRefused(f"{path}: not a {what} this code can build ({why})") from None
    for kind, names in (("missing", keys.missing_keys), ("unexpected", keys.unexpected_keys)):
        if names:
            raise FileRefused(f"{path}: tensor {names[0]!r} {kind} (not this {what}'s tensors)")
    return module, settings


# --------------------------------------------------------------------------------------------------
# Checkpoints: everything a resumed run needs to continue exactly (weights, optimizer, counters,
# RNGs)
# --------------------------------------------------------------------------------------------------
def atomic_save(obj, path):
    """Write, then rename: a process killed mid-write leaves the previous file intact."""
    tmp = Path(str(path) + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def rng_states():
    """Every RNG's state as tensors and plain data (load_file reads nothing else): numpy's key array
    becomes a list of ints; Python's state is a tuple of ints already."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    name, key, position, has_gauss, gauss = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": (name, key.tolist(), int(position), int(has_gauss), float(gauss)),
        "torch": torch.get_rng_state(),
        "cuda": cuda,
    }


def set_rng_states(states):
    random.setstate(states["python"])
    name, key, *rest = states["numpy"]
    np.random.set_state((name, np.array(key, dtype=np.uint32), *rest))
    torch.set_rng_state(states["torch"])
    if states["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def refuse_other_settings(path, made, changed):
    """A file of a run (a checkpoint, a corpus) made under other settings is refused: one line
    naming each {setting: (there, now)} difference."""
    if changed:
        differences = ", ".join(
            f"{k}: {old!r} there, {new!r} now" for k, (old, new) in changed.items()
        )
        raise UsageError(
            f"{path} was {made} with other settings ({differences}): rerun with the same flags, "
            "or pass another --out-dir"
        )


def load_made_under(path, settings, what):
    """The data a run saved at `path` with save_made_under (a resumed run reads it back), or None.
    A file made under other settings (a run killed before its first checkpoint, rerun with other
    flags) is refused, not reused."""
    if not Path(path).exists():
        return None
    stored = load_file(path, what)
    if not isinstance(stored, dict) or "settings" not in stored:
        raise UsageError(f"{path}: a {what} without its settings (an older version): delete it")
    changed = {
        k: (v, settings[k]) for k, v in stored["settings"].items() if settings.get(k, v) != v
    }
    refuse_other_settings(path, "collected", changed)
    return stored["rows"]


def save_made_under(rows, path, settings, rank):
    """Rank 0 writes `rows` atomically, with the settings that made them; every rank waits."""
    if rank == 0:
        atomic_save({"settings": settings, "rows": rows}, path)
    barrier()


# settings a resumed run may change: none of them changes what the run computes
FREE_TO_CHANGE = ("crash_at_step", "cache_dir", "save_every", "eval_every")


def load_checkpoint(out_dir, model, optimizer, rank, cfg, extendable=()):
    """Restores the latest checkpoint in out_dir, if any, and returns its counters ({} when
    starting). A checkpoint written under other settings is refused: resuming it would silently
    train (or, finished, return) the old run under the new name. Only FREE_TO_CHANGE settings may
    differ, and the `extendable` ones (a step or epoch count) may grow: the run goes on."""
    path = Path(out_dir) / "checkpoint.pt"
    if not path.exists():
        return {}
    state = load_file(path, "checkpoint")
    now = dataclasses.asdict(cfg)
    # a setting the flags no longer have (a checkpoint of an older version) is not compared
    changed = {
        k: (v, now[k])
        for k, v in state.get("config", {}).items()
        if k in now and k not in FREE_TO_CHANGE and now[k] != v
    }
    extended = {
        k: change for k, change in changed.items() if k in extendable and change[1] > change[0]
    }
    refused = {k: change for k, change in changed.items() if k not in extended}
    refuse_other_settings(path, "written", refused)
    load_state_dicts(model, optimizer, state["model"], state["optimizer"])
    set_rng_states(state["rng"])
    if rank == 0:
        print(f"resuming from {path} at {state['counters']}", file=sys.stderr)
        for k, (old, new) in extended.items():
            print(f"extending the run: {flag(k)} {old} -> {new}", file=sys.stderr)
    return state["counters"]


def save_checkpoint(out_dir, model, optimizer, counters, cfg, rank):
    """Every rank calls it (FSDP2's shards are gathered by all of them); rank 0 writes (whole
    weights are the same on every rank); every rank waits for it."""
    model_state, optimizer_state = state_dicts(model, optimizer)
    if rank == 0:
        state = {
            "model": model_state,
            "optimizer": optimizer_state,
            "counters": dict(counters),
            "rng": rng_states(),
            "config": dataclasses.asdict(cfg),
        }
        atomic_save(state, Path(out_dir) / "checkpoint.pt")
    barrier()


def crash_if_asked(cfg, step):
    """The resume test's kill switch: die as a SIGKILL would kill us, with no cleanup."""
    if cfg.crash_at_step and step == cfg.crash_at_step:
        os.kill(os.getpid(), signal.SIGKILL)


class MetricsLog:
    """metrics.jsonl, written by rank 0. On resume, the lines past the checkpoint's step (work the
    killed run did after its last checkpoint, which is being redone) are dropped; without a
    checkpoint (resume_step 0) every line is, the step-0 validation included, which the run begun
    again writes anew."""

    def __init__(self, out_dir, rank, resume_step):
        self.path, self.rank = Path(out_dir) / "metrics.jsonl", rank
        if rank == 0 and self.path.exists():
            lines = [line for line in self.path.read_text().splitlines() if line.strip()]
            keep = [
                line
                for line in lines
                if resume_step and json.loads(line).get("step", 0) <= resume_step
            ]
            self.path.write_text("".join(line + "\n" for line in keep))

    def write(self, **record):
        if self.rank == 0:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")


def batch_schedule(n_rows, batch_size, epochs, seed, tag):
    """The global batches (index tensors) of every epoch, from (seed, tag, epoch) alone: a resumed
    run gets the same data order without replaying anything. Every rank holds the whole corpus and
    runs the same schedule; each global batch is split over the ranks (shard_rows)."""
    # the last partial batch is dropped (it would weigh more)
    per_epoch = max(1, n_rows // batch_size)
    batches = []
    for epoch in range(epochs):
        generator = torch.Generator().manual_seed(call_seed(seed, tag, epoch) % 2**62)
        order = torch.randperm(n_rows, generator=generator)
        batches += [order[b * batch_size : (b + 1) * batch_size] for b in range(per_epoch)]
    return batches
