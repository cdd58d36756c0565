"""The CUDA check: what `make test` cannot run on a machine without a GPU, on a tiny random Llama
(2 layers, hidden 64, over the default tokenizer), run on a GPU machine and committed as one file.

  1. engine-vs-hf   the engine's greedy tokens against HF generate on the GPU, fp32 and bf16 (share
                    of identical rows: on a GPU, as on a CPU, bf16 near-ties may flip)
  2. lora-mixed     rows with different LoRA adapters in one batch on the GPU give each row the
                    tokens its adapter gives alone (greedy)
  3. seeded         sampling on the GPU: the same seeds give the same text twice; the per-row
                    uniforms come from CPU generators, so a seed means the same draw on any device
  4. scripts        eval.py (one process), then sft.py, train_rl.py, train_magrpo.py (adapters,
                    one per agent, bf16 rollouts) and train_mlpo.py (full weights) under
                    `torchrun --nproc_per_node=1`, so NCCL and DDP on the GPU; train_magrpo.py
                    extended from 2 to 3 steps resumes (a file committed before these two
                    scripts names their runs train_llm-agents and train_llm-leader)

    python -m experiments.cuda_check --out results/cuda/check.json [--tokenizer DIR]

--tokenizer: a directory with the default tokenizer (the default backbone's, converted here).
--device cpu runs the same checks on the CPU (gloo), to try the script where there is no GPU.
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from common import machine
from experiments.bench_common import hf_generate, random_llama_dir
from llm import lora
from llm.backbone import default_model_path
from llm.engine import Engine

ROOT = Path(__file__).resolve().parent.parent

DEVICE = "cuda"  # --device
PROMPTS = [f"What is {k} + {k * 7 % 13}? Explain step by step." * (1 + k % 4) for k in range(24)]


def tiny_model_dir(tokenizer_dir, out):
    """tests/conftest.py's tiny random Llama, saved as an HF directory."""
    return random_llama_dir(
        tokenizer_dir, out, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=128,
    )  # fmt: skip


def engine_vs_hf(model_dir):
    result = {}
    for dtype in ("float32", "bfloat16"):
        engine = Engine(model_path=model_dir, dtype=dtype, device=DEVICE, batch_size=8)
        prompts = [engine.chat(p) for p in PROMPTS]
        want = hf_generate(
            engine.model, engine.tokenizer, prompts, 32, engine.eos_ids, len(prompts)
        )
        ids = [engine.encode(p) for p in prompts]
        got = engine.sample(ids, list(range(len(prompts))), 32, 0, keep_eos=True)
        same = sum(tokens == w for (tokens, *_), w in zip(got, want))
        result[dtype] = {"identical_rows": same, "rows": len(prompts)}
    return result


def lora_mixed(model_dir):
    engine = Engine(model_path=model_dir, dtype="float32", device=DEVICE, batch_size=4)
    lora.add_lora(engine.model, 4, alpha=8, adapters=3, seed=0)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # a random B: a zero B is the base model, nothing to tell apart
        for layer in lora.lora_layers(engine.model).values():
            for b in layer.lora_B:
                b.copy_(torch.randn(b.shape, generator=generator) * 0.5)
    prompts = [engine.chat(p) for p in PROMPTS[:12]]
    adapters = [k % 3 if k % 4 else None for k in range(len(prompts))]
    mixed = engine.generate(prompts, list(range(12)), 16, 0, adapters=adapters)
    alone = [
        engine.generate([p], [k], 16, 0, adapters=[a])[0].text
        for k, (p, a) in enumerate(zip(prompts, adapters))
    ]
    return {
        "rows_as_alone": sum(m.text == a for m, a in zip(mixed, alone)),
        "rows": len(prompts),
        "distinct_texts": len({m.text for m in mixed}),
    }


def seeded(model_dir):
    engine = Engine(model_path=model_dir, dtype="float32", device=DEVICE)
    prompts = [engine.chat(p) for p in PROMPTS]
    runs = [engine.generate(prompts, list(range(24)), 24, 0.7, 0.95) for _ in range(2)]
    return {
        "same_text_twice": sum(a.text == b.text for a, b in zip(*runs)),
        "rows": len(prompts),
        "distinct_texts": len({c.text for c in runs[0]}),
    }


def scripts(model_dir, work):
    game = ["--model", model_dir, "--agents", "2", "--rounds", "1", "--max-new-tokens", "8"]
    train_game = [*game, "--questions", "8", "--val-n", "4"]
    llm = ["--algo", "magrpo", "--model", model_dir, "--questions-per-step", "2", "--group",
           "2", "--max-new-tokens", "6", "--val-n", "4", "--micro-batch", "3", "--eval-every",
           "2"]  # fmt: skip
    agents = [*llm, "--agents", "2", "--rounds", "1", "--separate-agents", "--dtype", "bfloat16",
              "--out-dir", "agents"]  # fmt: skip
    runs = {
        "eval": [
            "eval.py",
            *game,
            "--n",
            "3",
            "--protocols",
            "vanilla,sc,debate,mpdf-oracle",
            "--out",
            "eval.json",
        ],  # fmt: skip
        "sft": ["sft.py", *train_game, "--epochs", "2", "--out-dir", "sft"],
        "train_rl": [
            "train_rl.py",
            *train_game,
            "--epochs",
            "2",
            "--init",
            "sft/policy.safetensors",
            "--out-dir",
            "rl",
        ],  # fmt: skip
        "train_magrpo": ["train_magrpo.py", *agents, "--steps", "2"],
        "train_magrpo-resumed": ["train_magrpo.py", *agents, "--steps", "3"],
        "train_mlpo": [
            "train_mlpo.py",
            *llm,
            "--questions",
            "6",
            "--lora-rank",
            "0",
            "--steps",
            "2",
            "--out-dir",
            "leader",
        ],  # fmt: skip
    }
    results = {}
    for name, (script, *args) in runs.items():
        start = time.time()
        # eval.py is one process (torchrun would also take its --n for an option of its own)
        launcher = (
            [] if script == "eval.py" else ["-m", "torch.distributed.run", "--nproc_per_node=1"]
        )
        proc = subprocess.run(
            [sys.executable, *launcher, str(ROOT / script), *args],
            capture_output=True, text=True, cwd=work, timeout=600,
        )  # fmt: skip
        results[name] = {"returncode": proc.returncode, "seconds": round(time.time() - start, 1)}
        if proc.returncode:
            results[name]["stderr_tail"] = proc.stderr[-1500:]
    work = Path(work)
    if (work / "agents" / "metrics.jsonl").is_file():
        lines = [
            json.loads(x) for x in (work / "agents" / "metrics.jsonl").read_text().split("\n") if x
        ]
        results["train_magrpo-resumed"]["steps_logged"] = [r["step"] for r in lines if "loss" in r]
    for name, path in (("sft", "sft/summary.json"), ("train_rl", "rl/summary.json")):
        if (work / path).is_file():
            summary = json.loads((work / path).read_text())
            results[name]["dtype"] = summary.get("dtype")
    if (work / "eval.json").is_file():
        results["eval"]["dtype_reason"] = json.loads((work / "eval.json").read_text()).get(
            "dtype_reason"
        )
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--tokenizer", default="", help="the default tokenizer's directory")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        sys.exit("cuda_check.py: no CUDA device here (this check runs on a GPU machine)")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = tiny_model_dir(args.tokenizer or default_model_path(), Path(tmp) / "tiny")
        report = {"machine": machine(), "torch": torch.__version__}
        for name, check in (("engine_vs_hf", engine_vs_hf), ("lora_mixed", lora_mixed),
                            ("seeded", seeded)):  # fmt: skip
            report[name] = check(model_dir)
            print(name, json.dumps(report[name]), flush=True)
        report["scripts"] = scripts(model_dir, tmp)
        print("scripts", json.dumps(report["scripts"], indent=1), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
