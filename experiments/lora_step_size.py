"""How far one AdamW step moves the model, adapters against whole weights (behind the adapters'
learning-rate sweep): a supervised check free of RL noise. 16 arith prompts with a fixed right
completion each, 8 full-batch AdamW steps (gradient clipped at 1, as the LLM-weight trainers do),
the mean NLL of the completion tokens before each step, for whole weights at 1e-5 (the MAGRPO
preset's rate) and rank-4 adapters (alpha 32, train_magrpo.py's defaults) at 1e-4 and 5e-4.

    python -m experiments.lora_step_size --out results/llm/lora-step-size.json
"""

import argparse
import copy
import json
import time
from pathlib import Path

import torch

from common import machine
from llm import backbone, lora
from llm.logprobs import completion_batch, completion_logprobs

ROOT = Path(__file__).resolve().parent.parent

RUNS = [("whole weights", 0, 1e-5), ("adapters", 4, 1e-4), ("adapters", 4, 5e-4)]
STEPS = 8


def batch_of_right_answers(tokenizer):
    sequences = []
    for a in range(3, 43, 5):
        for b in (7, 12):
            prompt = tokenizer.apply_chat_template(
                [{"role": "user", "content": f"What is {a} + {b}?"}],
                tokenize=False,
                add_generation_prompt=True,
            )
            answer = f"{a} + {b} = {a + b}. The answer is {a + b}."
            sequences.append(
                (
                    tokenizer(prompt, add_special_tokens=False)["input_ids"],
                    tokenizer(answer, add_special_tokens=False)["input_ids"],
                )
            )
    return completion_batch(sequences, tokenizer.pad_token_id, "cpu")


def nll_curve(base, batch, rank, lr):
    torch.manual_seed(0)
    model = copy.deepcopy(base).train()
    adapter = None
    params = list(model.parameters())
    if rank:
        lora.add_lora(model, rank, 32.0, adapters=1, seed=0)
        adapter, params = 0, lora.adapter_parameters(model, 0)
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    curve = []
    for _ in range(STEPS):
        with lora.selecting(model, adapter):
            logp, mask = completion_logprobs(model, batch)
        loss = -(logp * mask).sum() / mask.sum()
        curve.append(round(loss.item(), 4))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return curve


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    base, tokenizer = backbone.load_model(None, "float32")
    batch = batch_of_right_answers(tokenizer)
    rows = []
    for kind, rank, lr in RUNS:
        start = time.time()
        curve = nll_curve(base, batch, rank, lr)
        rows.append({"trained": kind, "rank": rank, "lr": lr, "nll_before_each_step": curve,
                     "seconds": round(time.time() - start, 1)})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    report = {"machine": machine(), "sequences": len(batch[0]), "steps": STEPS, "runs": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
