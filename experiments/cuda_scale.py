"""The engine at GPU speed, in one run on one GPU: a randomly initialized Llama of Llama-3.2-1B's
shapes (1.17 B parameters, over the default tokenizer) made on the device, so nothing large travels.

  generate   new tokens per second of greedy decoding of the same deliberation-sized prompts, at 8
             and 64 prompts x `--new-tokens`, in bf16 and fp32, by
               engine static   the engine's decode step at static shapes, replayed as CUDA graphs
                               (llm/graphs.py; the default on a GPU)
               engine eager    the engine's eager step (the default on CPU)
               hf default      HF `generate` with its default (dynamic) cache
               hf static       HF `generate` with its static cache, compiled (its automatic
                               torch.compile, mode reduce-overhead: CUDA graphs of fused kernels)
             each after a warm-up call of the same shapes (graphs captured, compiles done; the
             warm-up's seconds are reported apart), then the best of two timed calls
  tokens     fp32 greedy tokens of the engine (static and eager) against HF generate's, row by row
             (in bf16 near-ties of random weights flip, so bf16 equality is reported, not asked)
  step       the replay of one captured step alone, and the eager sampling after it (argmax or
             temperature / top-p, the log-probs): where a step's time goes
  train      two steps of `train_magrpo.py` under `torchrun --nproc_per_node=1` (LoRA adapters,
             bf16 rollouts through the graphs, the KL term on): seconds per step, rollout seconds
  compiled   the engine's static step with its kernels fused by torch.compile first (decode
             "compiled"), if time is left

Sections run in that order of priority and each is saved as soon as it ends; a section that would
start past `--budget-s` is skipped (one device call must hold it all).

    python -m experiments.cuda_scale --tokenizer DIR --out results/cuda/scale-h200.json

--size tiny --device cpu runs the same on a 2-layer model on the CPU, to try the script here.
"""

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

from common import machine
from experiments.bench_common import hf_generate
from llm.backbone import default_model_path
from llm.engine import Engine
from llm.sampling import pick_next_tokens

ROOT = Path(__file__).resolve().parent.parent

SIZES = {
    # Llama-3.2-1B: 16 layers, hidden 2048, 32 heads over 8 KV heads, MLP 8192
    "1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, intermediate_size=8192),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=128),
}  # fmt: skip
PROMPTS = [
    f"Problem {k}: Tom has {k + 3} apples and buys {2 * k + 5} more. Agent 2 says "
    f"{3 * k + 8}, Agent 3 says {3 * k + 9}. Check the solutions and solve the problem again. "
    "End with 'Answer: <a number>'." * (1 + k % 3)
    for k in range(64)
]
ROWS = (64, 8)


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn):
    sync()
    start = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - start


def best_of(fn, repeats=2):
    """(the output, the warm-up's seconds, the fastest of `repeats` timed calls' seconds)."""
    _, warm = timed(fn)
    runs = [timed(fn) for _ in range(repeats)]
    return runs[0][0], warm, min(s for _, s in runs)


def random_llama(tokenizer, size, device):
    """A random Llama (seed 0) over the tokenizer, made on `device` in fp32."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        max_position_embeddings=1024, tie_word_embeddings=False, **SIZES[size],
    )  # fmt: skip
    with torch.device(device):
        model = LlamaForCausalLM(config).eval()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


class Bench:
    """The measurements over one model (one dtype): the engines and HF generate on the same
    prompts."""

    def __init__(self, model, tokenizer, device, new_tokens):
        self.model, self.tokenizer, self.device = model, tokenizer, device
        self.new_tokens = new_tokens
        plain = Engine(model=model, tokenizer=tokenizer, device=device, decode="eager")
        self.prompts = [plain.chat(p) for p in PROMPTS]
        self.ids = [plain.encode(p) for p in self.prompts]
        self.eos = plain.eos_ids
        self.engines = {}

    def engine(self, decode):
        if decode not in self.engines:
            self.engines[decode] = Engine(
                model=self.model, tokenizer=self.tokenizer, device=self.device,
                batch_size=max(ROWS), decode=decode,
            )  # fmt: skip
        return self.engines[decode]

    def run_engine(self, decode, rows, temperature=0.0, top_p=1.0):
        engine = self.engine(decode)

        def call():
            out = engine.sample(
                self.ids[:rows], list(range(rows)), self.new_tokens, temperature, top_p,
                keep_eos=True,
            )  # fmt: skip
            return [s.tokens for s in out]

        return self.record(*best_of(call), rows)

    def run_hf(self, rows, static):
        extra = {"cache_implementation": "static"} if static else {}

        def call():
            return hf_generate(
                self.model, self.tokenizer, self.prompts[:rows], self.new_tokens, self.eos, rows,
                **extra,
            )  # fmt: skip

        return self.record(*best_of(call), rows)

    @staticmethod
    def record(tokens, warm_s, seconds, rows):
        new = sum(map(len, tokens))
        return {
            "rows": rows,
            "new_tokens": new,
            "seconds": round(seconds, 4),
            "warm_up_seconds": round(warm_s, 3),
            "tokens_per_s": round(new / seconds, 1),
            "tokens": tokens,
        }


def compare(got, want):
    """Rows identical, and where each other row first differs."""
    differ = [
        next((t for t, (a, b) in enumerate(zip(x, y)) if a != b), min(len(x), len(y)))
        for x, y in zip(got, want)
        if x != y
    ]
    identical = len(got) - len(differ)
    return {"rows": len(got), "identical_rows": identical, "first_difference_at": differ}


@torch.inference_mode()
def step_split(bench, rows):
    """The static engine's captured step replayed alone, against the eager sampling after it."""
    engine = bench.engine("static")
    static = engine.static
    bucket = max(key for key in static.graphs if key[0] == rows)
    run = static.graphs[bucket]
    logits = run()[:rows]
    generators = [torch.Generator().manual_seed(k) for k in range(rows)]

    def per_call_ms(fn, n=30):
        fn()
        _, seconds = timed(lambda: [fn() for _ in range(n)])
        return round(seconds / n * 1e3, 3)

    def pick(temperature, top_p):
        def fn():
            tokens = pick_next_tokens(logits, generators, temperature, top_p)
            logp = torch.log_softmax(logits.float(), -1)
            return logp.gather(-1, tokens[:, None]).squeeze(-1).tolist()

        return fn

    return {
        "bucket_rows_width": list(bucket),
        "replay_ms": per_call_ms(run),
        "greedy_pick_ms": per_call_ms(pick(0.0, 1.0)),
        "temperature_top_p_pick_ms": per_call_ms(pick(0.7, 0.9)),
    }


def train(model_dir, work, device, new_tokens):
    out = Path(work) / "agents"
    args = [
        "--model", model_dir, "--protocol", "parallel", "--agents", "3",
        "--group", "4", "--questions-per-step", "4", "--steps", "2", "--max-new-tokens",
        str(new_tokens), "--micro-batch", "12", "--beta", "0.1", "--train-dtype", "bfloat16",
        "--eval-every", "0", "--out-dir", str(out),
    ]  # fmt: skip
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=1"]
    env = dict(os.environ, **({} if device == "cuda" else {"CUDA_VISIBLE_DEVICES": ""}))
    proc = subprocess.run(
        [*launcher, str(ROOT / "train_magrpo.py"), *args],
        capture_output=True, text=True, cwd=work, timeout=300, env=env,
    )  # fmt: skip
    result = {"returncode": proc.returncode}
    if proc.returncode:
        result["stderr_tail"] = proc.stderr[-3000:]
    metrics = out / "metrics.jsonl"
    if metrics.is_file():
        steps = [json.loads(x) for x in metrics.read_text().splitlines() if x]
        keys = ("step", "step_s", "rollout_s", "peak_memory_mb", "tokens", "trained_sequences")
        result["steps"] = [{k: r.get(k) for k in keys} for r in steps if "loss" in r]
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--tokenizer", default="", help="the default tokenizer's directory")
    parser.add_argument("--size", default="1b", choices=tuple(SIZES))
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--budget-s", type=float, default=420, help="no section starts after it")
    parser.add_argument("--sections", default="", help="comma-separated; empty: all, in order")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("cuda_scale.py: no CUDA device here (this runs on a GPU machine)")
    from transformers import AutoTokenizer, __version__

    began = time.time()
    report = {
        "machine": machine(),
        "torch": torch.__version__,
        "transformers": __version__,
        "size": args.size,
        "new_tokens_max": args.new_tokens,
        "sections_skipped": [],
        "errors": {},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def section(name, fn, needs_s=0):
        if time.time() - began + needs_s > args.budget_s:
            report["sections_skipped"].append(name)
            print("skipped", name, flush=True)
            return None
        start = time.time()
        try:
            report[name] = fn()
        except Exception:
            report["errors"][name] = traceback.format_exc()[-3000:]
            print(report["errors"][name], file=sys.stderr, flush=True)
        report.setdefault("section_seconds", {})[name] = round(time.time() - start, 1)
        report["seconds"] = round(time.time() - began, 1)
        print(name, json.dumps(report.get(name), default=str)[:600], flush=True)
        out.write_text(json.dumps(report, indent=1) + "\n")
        return report.get(name)

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or default_model_path())
    model32 = random_llama(tokenizer, args.size, args.device)
    model16 = copy.deepcopy(model32).to(torch.bfloat16)
    report["parameters"] = sum(p.numel() for p in model32.parameters())
    benches = {
        "bfloat16": Bench(model16, tokenizer, args.device, args.new_tokens),
        "float32": Bench(model32, tokenizer, args.device, args.new_tokens),
    }
    # token lists stay in the report only where they are compared
    runs = {}

    def measure(dtype, names):
        bench, result = benches[dtype], {}
        for rows in ROWS:
            for name in names:
                if name.startswith("engine"):
                    runs[dtype, name, rows] = bench.run_engine(name.split()[1], rows)
                else:
                    runs[dtype, name, rows] = bench.run_hf(rows, static=name == "hf static")
                result[f"{name} @{rows}"] = {
                    k: v for k, v in runs[dtype, name, rows].items() if k != "tokens"
                }
        return result

    def ratios(dtype):
        result = {}
        for rows in ROWS:
            mine = runs.get((dtype, "engine static", rows))
            for other in ("hf default", "hf static", "engine eager"):
                theirs = runs.get((dtype, other, rows))
                if mine and theirs:
                    result[f"static over {other} @{rows}"] = round(
                        mine["tokens_per_s"] / theirs["tokens_per_s"], 3
                    )
        return result

    def tokens(dtype):
        result = {}
        for rows in ROWS:
            want = runs[dtype, "hf default", rows]["tokens"]
            for name in ("engine static", "engine eager"):
                if (dtype, name, rows) in runs:
                    got = runs[dtype, name, rows]["tokens"]
                    result[f"{name} vs hf @{rows}"] = compare(got, want)
        return result

    def saved_and_trained():
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = Path(tmp) / "model"
            model16.save_pretrained(model_dir)
            tokenizer.save_pretrained(model_dir)
            return train(str(model_dir), tmp, args.device, args.new_tokens)

    def compiled_over_static():
        return {
            rows: round(
                runs["bfloat16", "engine compiled", rows]["tokens_per_s"]
                / runs["bfloat16", "engine static", rows]["tokens_per_s"],
                3,
            )
            for rows in ROWS
        }

    def sampled():
        result = benches["bfloat16"].run_engine("static", max(ROWS), 0.7, 0.9)
        return {k: v for k, v in result.items() if k != "tokens"}

    names = ("engine static", "engine eager", "hf default")
    # (name, what it runs, the seconds it needs left to start), in order of priority
    sections = [
        ("bfloat16", lambda: measure("bfloat16", names), 0),
        ("float32", lambda: measure("float32", names), 60),
        ("tokens_float32", lambda: tokens("float32"), 0),
        ("tokens_bfloat16", lambda: tokens("bfloat16"), 0),
        ("step_bfloat16", lambda: step_split(benches["bfloat16"], max(ROWS)), 0),
        ("train", saved_and_trained, 60),
        ("bfloat16_hf_static", lambda: measure("bfloat16", ("hf static",)), 90),
        ("ratios_bfloat16", lambda: ratios("bfloat16"), 0),
        ("bfloat16_compiled", lambda: measure("bfloat16", ("engine compiled",)), 90),
        ("compiled_over_static", compiled_over_static, 0),
        ("sampled_bfloat16", sampled, 20),
        ("float32_hf_static", lambda: measure("float32", ("hf static",)), 90),
        ("ratios_float32", lambda: ratios("float32"), 0),
    ]
    wanted = set(args.sections.split(",")) if args.sections else None
    for name, fn, needs_s in sections:
        if name in ("bfloat16_hf_static", "bfloat16_compiled", "float32_hf_static") and (
            args.device != "cuda"
        ):
            continue
        if wanted is None or name in wanted:
            section(name, fn, needs_s)
    report["seconds"] = round(time.time() - began, 1)
    out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
