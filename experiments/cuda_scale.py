"""The engine and train_magrpo.py at the scale users run: a randomly initialized Llama of about 1B
parameters (Llama-3.2-1B's shapes over the default tokenizer) in bf16 on one GPU, one file in
results/cuda/.

  1. generate   the engine against HF generate, greedy, on the same batch of deliberation-sized
                prompts: new tokens per second of each, and the rows whose tokens are identical
                (in bf16 near-ties may flip: the first position where a row differs is kept);
                the equality again in fp32 on 16 rows
  2. train      two steps of `train_magrpo.py` (LoRA adapters, bf16 rollouts, the KL
                term on, so every sequence is trained on although random weights earn no reward)
                under `torchrun --nproc_per_node=1`: seconds per step, rollout seconds, peak GPU
                memory

    python experiments/cuda_scale.py --tokenizer DIR --out results/cuda/scale-h100.json

--size tiny --device cpu runs the same on a 2-layer model on the CPU, to try the script here.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_common import hf_generate, random_llama_dir  # noqa: E402

from common import machine  # noqa: E402
from llm.backbone import default_model_path  # noqa: E402
from llm.engine import Engine  # noqa: E402

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


def timed(fn):
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.time()
    out = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return out, time.time() - start


def generate(model_dir, device, new_tokens, dtype="bfloat16", rows=len(PROMPTS)):
    engine = Engine(model_path=model_dir, dtype=dtype, device=device, batch_size=rows)
    prompts = [engine.chat(p) for p in PROMPTS[:rows]]
    ids = [engine.encode(p) for p in prompts]
    seeds = list(range(len(prompts)))

    def ours(n):
        return [row for row, *_ in engine.sample(ids[:n], seeds[:n], new_tokens, 0, keep_eos=True)]

    def reference(n):
        eos = engine.eos_ids
        return hf_generate(engine.model, engine.tokenizer, prompts[:n], new_tokens, eos, n)

    # a warm-up of both (kernels, allocator), then one timed run each
    ours(4), reference(4)
    got, ours_s = timed(lambda: ours(len(prompts)))
    want, reference_s = timed(lambda: reference(len(prompts)))
    differ = [
        next((t for t, (a, b) in enumerate(zip(x, y)) if a != b), min(len(x), len(y)))
        for x, y in zip(got, want)
        if x != y
    ]
    ours_rate = sum(map(len, got)) / ours_s
    reference_rate = sum(map(len, want)) / reference_s
    return {
        "parameters": sum(p.numel() for p in engine.model.parameters()),
        "rows": len(prompts),
        "new_tokens_max": new_tokens,
        "engine_tokens_per_s": ours_rate,
        "hf_tokens_per_s": reference_rate,
        "engine_over_hf": ours_rate / reference_rate,
        "identical_rows": len(prompts) - len(differ),
        "first_difference_at": sorted(differ),
    }


def train(model_dir, work, device, new_tokens):
    out = Path(work) / "agents"
    args = [
        "--model", model_dir, "--protocol", "parallel", "--agents", "3",
        "--group", "4", "--questions-per-step", "4", "--steps", "2", "--max-new-tokens",
        str(new_tokens), "--micro-batch", "12", "--beta", "0.1", "--dtype", "bfloat16",
        "--eval-every", "0", "--cache-dir", "", "--out-dir", str(out),
    ]  # fmt: skip
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=1"]
    env = dict(os.environ, **({} if device == "cuda" else {"CUDA_VISIBLE_DEVICES": ""}))
    proc = subprocess.run(
        [*launcher, str(ROOT / "train_magrpo.py"), *args],
        capture_output=True, text=True, cwd=work, timeout=500, env=env,
    )  # fmt: skip
    result = {"returncode": proc.returncode}
    if proc.returncode:
        result["stderr_tail"] = proc.stderr[-2000:]
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
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("cuda_scale.py: no CUDA device here (this runs on a GPU machine)")
    report = {"machine": machine(), "torch": torch.__version__, "size": args.size}
    if args.device == "cuda":
        report["gpu"] = torch.cuda.get_device_name()
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = args.tokenizer or default_model_path()
        model_dir = random_llama_dir(tokenizer, Path(tmp) / "model", torch.bfloat16,
                                     **SIZES[args.size])  # fmt: skip
        report["generate"] = generate(model_dir, args.device, args.new_tokens)
        print("generate", json.dumps(report["generate"]), flush=True)
        # random weights give near-uniform logits, whose near-ties bf16 rounding flips: the
        # tokens' equality is checked in fp32, on fewer rows
        report["generate_fp32"] = generate(model_dir, args.device, 32, "float32", rows=16)
        print("generate_fp32", json.dumps(report["generate_fp32"]), flush=True)
        report["train"] = train(model_dir, tmp, args.device, args.new_tokens)
        print("train", json.dumps(report["train"]), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
