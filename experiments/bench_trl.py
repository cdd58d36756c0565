"""Step time of GRPO on the LLM weights: train_magrpo.py --agents 1 vs TRL's
GRPOTrainer.

    bash experiments/bench_trl.sh  # makes .venv-trl (the project's pins + trl), then runs this file

The same setup on both sides, in one process, one after the other: the default backbone, 8 arith
training prompts x 4 completions per step, 64 new tokens at temperature 1 (no top-p/top-k), reward =
correctness, advantage = reward - group mean (no std scaling), the Dr.GRPO loss (token sum / (32 x
64)), beta 0, one AdamW step per batch of 32 completions (one micro-batch of 32 on both sides);
fp32, then bf16 (autocast, fp32 master weights, on both sides); every weight trained (TRL without
peft, ours --lora-rank 0). The first step of each run is warm-up and is not timed; the figure is
the median of the others. Prints a table and, as its last line, JSON; --out writes it too.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import data
import solutions
from llm import backbone

ROOT = Path(__file__).resolve().parents[1]

PROMPTS, GROUP, NEW_TOKENS, LR = 8, 4, 64, 1e-6


def ours(steps, dtype, root):
    """train_magrpo.py as users run it (a subprocess: no script imports another); its
    metrics.jsonl."""
    out = Path(root) / f"ours-{dtype}"
    flags = {"agents": 1, "protocol": "parallel", "algo": "magrpo",
             "loss-agg": "const", "beta": 0.0, "questions-per-step": PROMPTS, "group": GROUP,
             "max-new-tokens": NEW_TOKENS, "rollout-temperature": 1.0, "lr": LR,
             "micro-batch": PROMPTS * GROUP, "steps": steps, "save-every": 10**6, "dtype": dtype,
             "val-n": 0, "lora-rank": 0, "out-dir": out}  # fmt: skip
    command = [sys.executable, str(ROOT / "train_magrpo.py")]
    subprocess.run(command + [f"--{k}={v}" for k, v in flags.items()], check=True)
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["step_s"] for r in lines], [r["rollout_s"] for r in lines]


def trl(steps, dtype, root):
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    # our run's questions, in order (train_magrpo.py's default task and seed)
    pool_of = SimpleNamespace(task="arith", path="", level=0, seed=0)
    examples = data.training_pool(pool_of)[: PROMPTS * steps]
    dataset = Dataset.from_list(
        [
            {
                "prompt": [{"role": "user", "content": solutions.solve_prompt(ex)}],
                "answer": ex.answer,
            }
            for ex in examples
        ]
    )

    def correctness(completions, answer, **_):
        return [
            float(
                data.is_correct(
                    solutions.parse_solution(c[0]["content"], "arith").answer, a, "arith"
                )
            )
            for c, a in zip(completions, answer)
        ]

    class StepTimer(TrainerCallback):
        times, began = [], 0.0

        def on_step_begin(self, *_, **__):
            self.began = time.time()

        def on_step_end(self, *_, **__):
            self.times.append(time.time() - self.began)

    model, tokenizer = backbone.load_model()
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    args = GRPOConfig(
        output_dir=str(Path(root) / f"trl-{dtype}"),
        per_device_train_batch_size=PROMPTS * GROUP,
        num_generations=GROUP,
        gradient_accumulation_steps=1,
        max_completion_length=NEW_TOKENS,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        loss_type="dr_grpo",
        scale_rewards="none",
        learning_rate=LR,
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_steps=steps,
        use_cpu=True,
        bf16=dtype == "bfloat16",
        save_strategy="no",
        report_to=[],
        logging_steps=1,
        shuffle_dataset=False,
        seed=0,
    )
    timer = StepTimer()
    GRPOTrainer(
        model=model.train(),
        reward_funcs=correctness,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[timer],
    ).train()
    return timer.times


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--steps", type=int, default=3, help="steps per run; the first one is not timed"
    )
    parser.add_argument(
        "--dtypes", default="float32", help="float32,bfloat16: bf16 only where the CPU has it"
    )
    parser.add_argument("--out", default="runs/bench_trl.json")
    cli = parser.parse_args()
    if cli.steps < 2:
        sys.exit("--steps must be >= 2: the first step is warm-up")
    result = {
        "setup": {
            "prompts": PROMPTS,
            "completions_per_prompt": GROUP,
            "new_tokens": NEW_TOKENS,
            "loss": "dr_grpo / const",
            "steps": cli.steps,
        }
    }
    with tempfile.TemporaryDirectory() as root:
        for dtype in cli.dtypes.split(","):
            step_s, rollout_s = ours(cli.steps, dtype, root)
            trl_s = trl(cli.steps, dtype, root)
            result[dtype] = {
                "ours_step_s": statistics.median(step_s[1:]),
                "ours_rollout_s": statistics.median(rollout_s[1:]),
                "trl_step_s": statistics.median(trl_s[1:]),
                "ours_all": step_s,
                "trl_all": trl_s,
            }
            result[dtype]["ratio"] = result[dtype]["ours_step_s"] / result[dtype]["trl_step_s"]
            print(
                f"{dtype}: ours {result[dtype]['ours_step_s']:.1f} s/step (rollouts "
                f"{result[dtype]['ours_rollout_s']:.1f} s), TRL {result[dtype]['trl_step_s']:.1f} "
                f"s/step, ratio {result[dtype]['ratio']:.2f}",
                flush=True,
            )
    if cli.out:
        Path(cli.out).parent.mkdir(parents=True, exist_ok=True)
        Path(cli.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
