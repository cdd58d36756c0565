"""Where one decode step of the engine spends its time, before and after a change, measured in one
run: batch 64 (the fixed deliberation prompts of `experiments/bench.py --bench generate`, about 100
prompt tokens per row), sampling at T = 0.7 as the game does.

    python -m experiments.profile_decode --before 9341c01^ --out results/bench/profile.json

torch.profiler records two runs of Engine.sample on the same prompts, one new token and 1 + `steps`
new tokens (EOS switched off, so every row decodes every step); their difference divided by `steps`
is one decode step, prefill excluded. Ops are put in buckets by name and, for the matmuls, by shape
(the LM head's output is the vocabulary); "python and the rest" is the wall time no op accounts for.
The "before" engine is engine.py as it was at git revision `--before` (everything else from this
checkout), the "after" engine is this checkout's. This machine is shared: the two engines take turns
`repeats` times and each reports its fastest turn (the least disturbed).

    python -m experiments.profile_decode --compile --out results/bench/compile.json

compares this checkout's engine eager ("before") with the same engine whose model forward is wrapped
in torch.compile ("after"; dynamic shapes, since the batch and the cache length change every step).
Compiled kernels do not show as aten ops, so only the wall time of the step is comparable there, not
the buckets. In torch 2.13 on CPU inductor fails to compile it (README, "The engine"): kept to retry
on a later torch.

    python -m experiments.profile_decode --bf16 --out results/bench/profile-bf16.json

compares this checkout's engine in fp32 ("before") with the same engine in bf16 ("after").
"""

import importlib.util
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

import data
from common import machine, parse_config, write_result
from experiments.bench_common import deliberation_prompts

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Config:
    before: str = "9341c01^"  # git revision whose engine.py is "before" (the static-batch engine)
    repeats: int = 3
    rows: int = 64
    steps: int = 32  # decode steps profiled
    temperature: float = 0.7
    # before = this engine eager, after = this engine with torch.compile'd forward
    compile: bool = False
    # before = this engine in fp32, after = this engine in bf16 (docs/design.md §11)
    bf16: bool = False
    out: str = ""


MATMULS = {
    "aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear",
    "mkldnn::_linear_pointwise",
}  # fmt: skip
SAMPLING = {
    "aten::softmax", "aten::_softmax", "aten::sort", "aten::cumsum", "aten::multinomial",
    "aten::argmax", "aten::exponential_", "aten::log_softmax", "aten::_log_softmax", "aten::topk",
    "aten::gather", "aten::div", "aten::div_", "aten::masked_fill", "aten::masked_fill_",
    "aten::max", "aten::item", "aten::_local_scalar_dense", "aten::logsumexp",
}  # fmt: skip
COPIES = {
    "aten::cat", "aten::copy_", "aten::index_select", "aten::index", "aten::index_put_",
    "aten::clone", "aten::contiguous", "aten::slice_scatter", "aten::zeros", "aten::empty",
    "aten::new_ones", "aten::ones", "aten::fill_", "aten::to", "aten::_to_copy", "aten::stack",
    "aten::where",
}  # fmt: skip


def load_engine(rev):
    """llm/engine.py of this checkout, or engine.py of git revision `rev` (imported from a temporary
    copy; revisions before the llm/ folder import `backbone` and `kvcache` as top-level modules)."""
    path = ROOT / "llm" / "engine.py"
    if rev:
        # an old engine.py imports `backbone` and `kvcache` as top-level modules: today's
        for name in ("backbone", "kvcache"):
            sys.modules.setdefault(name, importlib.import_module(f"llm.{name}"))
        source = subprocess.run(
            ["git", "show", f"{rev}:engine.py"],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        path = Path(tempfile.mkdtemp()) / "engine_at_rev.py"
        path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bucket(event, vocab):
    name = event.key
    if name in MATMULS:
        return (
            "LM head"
            if any(vocab in shape for shape in event.input_shapes)
            else "matmuls (transformer body)"
        )
    if "attention" in name:
        return "attention"
    if name in SAMPLING:
        return "sampling and log-probs"
    if name in COPIES:
        return "KV cache, masks and copies"
    return "norms, activations, rotary (elementwise)"


def profiled(engine, ids, seeds, new_tokens, temperature):
    """Self CPU time per bucket (ms) and the wall time of one Engine.sample call."""
    vocab = engine.model.config.vocab_size
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        start = time.perf_counter()
        engine.sample(ids, seeds, max_new_tokens=new_tokens, temperature=temperature)
        wall = (time.perf_counter() - start) * 1e3
    buckets = defaultdict(float)
    for event in prof.key_averages(group_by_input_shape=True):
        buckets[bucket(event, vocab)] += event.self_cpu_time_total / 1e3
    buckets["python and the rest"] = wall - sum(buckets.values())
    return buckets, wall


def decode_step(engine, ids, seeds, cfg, grad_off):
    """One decode step (ms) by bucket: the difference of a 1 + steps token run and a 1 token run."""
    with grad_off():
        short, short_wall = profiled(engine, ids, seeds, 1, cfg.temperature)
        long, long_wall = profiled(engine, ids, seeds, 1 + cfg.steps, cfg.temperature)
    step_ms = (long_wall - short_wall) / cfg.steps
    buckets = {name: (long[name] - short.get(name, 0.0)) / cfg.steps for name in long}
    return {
        "decode_step_ms": step_ms,
        "tokens_per_s": cfg.rows / step_ms * 1e3,
        "buckets_ms": {k: round(v, 2) for k, v in sorted(buckets.items(), key=lambda kv: -kv[1])},
    }


def main(cfg):
    this = load_engine("")
    engines = {
        "before": load_engine("" if cfg.compile or cfg.bf16 else cfg.before).Engine(
            batch_size=cfg.rows
        ),
        "after": this.Engine(batch_size=cfg.rows, dtype="bfloat16" if cfg.bf16 else "float32"),
    }
    grad_off = {name: torch.inference_mode for name in engines}
    # inductor fails on tensors made under inference_mode (pytorch #103132): no_grad instead
    if cfg.compile:
        after = engines["after"]
        after.sample = torch.no_grad()(type(after).sample.__wrapped__.__get__(after))
        after.model.forward = torch.compile(after.model.forward, dynamic=True)
        grad_off["after"] = torch.no_grad
        print("compiling (the first calls take minutes) ...", file=sys.stderr)
    examples = data.load_task("arith", split="test", n=cfg.rows, seed=0)
    ids = [engines["after"].encode(p) for p in deliberation_prompts(engines["after"], examples)]
    seeds = list(range(cfg.rows))
    turns = {name: [] for name in engines}
    for name, engine in engines.items():
        engine.eos_ids = set()  # every row decodes every step
        with grad_off[name]():  # warm-up (and compilation) at the profiled batch and a small one
            engine.sample(ids[:2], seeds[:2], max_new_tokens=4, temperature=cfg.temperature)
            engine.sample(ids, seeds, max_new_tokens=4, temperature=cfg.temperature)
    for _ in range(cfg.repeats):
        for name, engine in engines.items():
            turns[name].append(decode_step(engine, ids, seeds, cfg, grad_off[name]))
    result = {
        "before_rev": "this checkout" if cfg.compile or cfg.bf16 else cfg.before,
        "dtypes": {name: engine.dtype for name, engine in engines.items()},
        "compiled_after": cfg.compile,
        "rows": cfg.rows,
        "steps": cfg.steps,
        "repeats": cfg.repeats,
        "mean_prompt_tokens": sum(map(len, ids)) / len(ids),
        "temperature": cfg.temperature,
        "threads": torch.get_num_threads(),
        "machine": machine(),
    }
    for name in engines:
        result[name] = min(turns[name], key=lambda t: t["decode_step_ms"])
        result[name]["all_step_ms"] = [round(t["decode_step_ms"], 1) for t in turns[name]]
        for bucket_name, ms in result[name]["buckets_ms"].items():
            print(
                f"{name:6s} {bucket_name:42s} {ms:8.1f} ms  "
                f"{ms / result[name]['decode_step_ms']:6.1%}",
                file=sys.stderr,
            )
    result["speedup"] = result["before"]["decode_step_ms"] / result["after"]["decode_step_ms"]
    return write_result(result, cfg.out)


if __name__ == "__main__":
    main(parse_config(Config, description=__doc__.split("\n\n")[0]))
