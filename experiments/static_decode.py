"""A static-shape decode step compiled once, against the engine's eager step, measured in one run
(gpt-fast's approach): is it worth building into the engine?

    python -m experiments.static_decode --out results/bench/static-decode.json
    python -m experiments.static_decode --threads 1 --out results/bench/static-decode-1thread.json

The 64 fixed deliberation prompts of `experiments/bench.py --bench generate` are prefilled once by
the engine into its slot cache (llm/kvcache.py). From that state two decode loops run `steps`
greedy steps of all 64 rows:
  eager    - the engine's own step: the HF forward over the window of the slot cache
  compiled - the same model through torch.compile, once: its cache layers write each new key and
             value in place at the step's column of the same fixed buffers and hand attention the
             buffers' first `width` columns (the width a symbolic size, so one graph serves every
             step), the query heads grouped onto the KV heads (SDPA's enable_gqa)
The two take turns `repeats` times (the machine is shared) and each reports its fastest turn; one
more turn of each runs under torch.profiler, its time put in buckets: matmuls, attention, the rest
of the ops (the compiled graph's own fused kernels count there) and Python. The greedy tokens of the
two loops are compared row by row. Compile time is reported apart.
"""

import os
import sys
import time
from collections import defaultdict
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile
from transformers.cache_utils import Cache

import data
from common import machine, parse_config, write_result
from experiments.bench_common import deliberation_prompts
from llm.engine import Engine
from llm.kvcache import PreallocatedLayer


@dataclass
class Config:
    dtypes: str = "float32,bfloat16"
    """the dtypes measured, comma-separated"""
    rows: int = 64
    steps: int = 32
    """greedy decode steps per turn"""
    repeats: int = 3
    threads: int = 0
    """torch's threads (0: its default)"""
    model: str = ""
    """HF checkpoint directory; empty: the embedded default backbone"""
    out: str = ""


class StaticSlotsLayer(PreallocatedLayer):
    """The engine's slot buffers seen with static shapes: a step writes its keys and values at
    column `column` (a tensor, the same object every step) and attends over columns [0, width)."""

    is_compileable = True

    def __init__(self, layer, step):
        super().__init__(layer.slots, layer.capacity)
        self.key_buffer, self.value_buffer, self.step = layer.key_buffer, layer.value_buffer, step
        self.dtype, self.device, self.is_initialized = layer.dtype, layer.device, True

    def update(self, key_states, value_states, *args, **kwargs):
        self.key_buffer.index_copy_(2, self.step.column, key_states)
        self.value_buffer.index_copy_(2, self.step.column, value_states)
        width = self.step.width
        return self.key_buffer[:, :, :width], self.value_buffer[:, :, :width]

    def get_mask_sizes(self, *args, **kwargs):
        return self.step.width, 0

    def get_seq_length(self):
        return self.step.width - 1


class StaticStep:
    """One greedy decode step of every slot through a torch.compile'd forward: next-token logits
    from (tokens, the attention mask's first `width` columns, positions)."""

    def __init__(self, engine, cache):
        self.engine, self.column, self.width = engine, torch.zeros(1, dtype=torch.long), 0
        self.cache = Cache(layers=[StaticSlotsLayer(layer, self) for layer in cache.layers])
        self.forward = torch.compile(self._forward)

    def _forward(self, tokens, mask, positions):
        self.width = mask.shape[1]
        return self.engine.model(
            input_ids=tokens[:, None],
            attention_mask=mask,
            position_ids=positions,
            cache_position=self.column,
            past_key_values=self.cache,
            use_cache=True,
        ).logits[:, -1]

    def __call__(self, tokens, mask, positions, end):
        self.column.fill_(end)
        window = mask[:, : end + 1]
        # one graph for every width: without this each new width recompiles
        torch._dynamo.mark_dynamic(window, 1)
        os.environ["TRANSFORMERS_SDPA_FORCE_GQA"] = "1"
        try:
            return self.forward(tokens, window, positions)
        finally:
            del os.environ["TRANSFORMERS_SDPA_FORCE_GQA"]


def eager_step(engine, cache):
    def step(tokens, mask, positions, end):
        for layer in cache.layers:
            layer.window(len(tokens), 0, end)
        return engine._forward(tokens[:, None], mask[:, : end + 1], cache, positions)[:, -1]

    return step


def decode(step, state, steps, around=None):
    """`steps` greedy steps from a copy of the prefilled state, inside the context `around` (the
    profiler; the copy stays outside): (tokens per row, seconds)."""
    mask, positions, logits, end = state["mask"].clone(), state["positions"].clone(), *state["at"]
    for layer, (keys, values) in zip(state["cache"].layers, state["buffers"]):
        layer.key_buffer.copy_(keys)
        layer.value_buffer.copy_(values)
    tokens, out = logits.argmax(-1), []
    with around or nullcontext():
        start = time.perf_counter()
        for _ in range(steps):
            out.append(tokens)
            mask[:, end] = 1
            logits = step(tokens, mask, positions, end)
            tokens, positions, end = logits.argmax(-1), positions + 1, end + 1
        seconds = time.perf_counter() - start
    return torch.stack(out, 1).tolist(), seconds


def buckets(prof, wall_ms):
    """Self CPU time (ms) of a profiled turn by bucket; Python: the wall time no op accounts for."""
    out = defaultdict(float)
    for event in prof.key_averages():
        name = event.key
        if name in ("aten::mm", "aten::addmm", "aten::linear", "mkldnn::_linear_pointwise"):
            kind = "matmuls"
        elif "attention" in name:
            kind = "attention"
        elif name.startswith(("aten::", "mkldnn::", "## Call CompiledFxGraph")):
            kind = "other ops (compiled: its fused kernels)"
        else:
            continue
        out[kind] += event.self_cpu_time_total / 1e3
    out["python and the rest"] = wall_ms - sum(out.values())
    return {k: round(v, 1) for k, v in out.items()}


def measure(cfg, dtype):
    engine = Engine(model_path=cfg.model or None, dtype=dtype, batch_size=cfg.rows)
    examples = data.load_task("arith", split="test", n=cfg.rows, seed=0)
    ids = [engine.encode(p) for p in deliberation_prompts(engine, examples)]
    longest = max(map(len, ids))
    capacity = longest + cfg.steps + 1
    cache = Cache(layers=[PreallocatedLayer(cfg.rows, capacity) for _ in range(engine.n_layers)])
    mask = torch.zeros((cfg.rows, capacity), dtype=torch.long)
    with torch.no_grad():
        slot_adapters = torch.full((cfg.rows,), -1)
        logits = engine.prefill_slots(ids, slot_adapters, cache, mask, 0, longest)
    state = {
        "cache": cache,
        "buffers": [(la.key_buffer.clone(), la.value_buffer.clone()) for la in cache.layers],
        "mask": mask,
        "positions": torch.tensor([[len(row)] for row in ids]),
        "at": (logits, longest),
    }
    # inductor fails on tensors made under inference_mode (pytorch #103132): no_grad
    with torch.no_grad():
        steps = {"eager": eager_step(engine, cache), "compiled": StaticStep(engine, cache)}
        began = time.perf_counter()
        decode(steps["compiled"], state, 2)
        compile_s = time.perf_counter() - began
        turns, tokens = {name: [] for name in steps}, {}
        for _ in range(cfg.repeats):
            for name, step in steps.items():
                tokens[name], seconds = decode(step, state, cfg.steps)
                turns[name].append(seconds / cfg.steps * 1e3)
        profiles = {}
        for name, step in steps.items():
            prof = profile(activities=[ProfilerActivity.CPU])
            _, seconds = decode(step, state, cfg.steps, prof)
            profiles[name] = buckets(prof, seconds * 1e3)
            profiles[name] = {k: round(v / cfg.steps, 1) for k, v in profiles[name].items()}
    step_ms = {name: min(t) for name, t in turns.items()}
    result = {
        "compile_s": compile_s,
        "step_ms": step_ms,
        "all_step_ms": {name: [round(t, 1) for t in ts] for name, ts in turns.items()},
        "speedup": step_ms["eager"] / step_ms["compiled"],
        "rows_identical": sum(a == b for a, b in zip(tokens["eager"], tokens["compiled"])),
        "profile_ms_per_step": profiles,
        "prompt_tokens_longest": longest,
    }
    print(dtype, result, file=sys.stderr, flush=True)
    return result


def main(cfg):
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    result = {
        "rows": cfg.rows,
        "steps": cfg.steps,
        "repeats": cfg.repeats,
        "threads": torch.get_num_threads(),
        "load_average_at_start": os.getloadavg(),
    }
    for dtype in cfg.dtypes.split(","):
        result[dtype] = measure(cfg, dtype)
    result["load_average_at_end"] = os.getloadavg()
    return write_result({**result, "torch": torch.__version__, "machine": machine()}, cfg.out)


if __name__ == "__main__":
    main(parse_config(Config, description=__doc__.split("\n\n")[0]))
