"""The committed adapters of team `varied`, converted to PEFT's layout, play as before and load in
PEFT, on the real backbone.

    python -m experiments.peft_check --out results/formats/peft-check.json

For each adapter (results/agents/NAME.pt and the folder NAME/ converted from it with `python -m
llm.lora NAME.pt NAME`): the engine's greedy answers to the first `n` arith test questions, once
with the .pt and once with the folder, each in an engine of its own (token for token, and the parsed
answers); then PEFT's logits on the same solve prompts (PeftModel.from_pretrained over the default
backbone, the folder as PEFT reads it) against the engine's with the folder (fp32, max abs
difference over every prompt position), beside how far the adapter moves PEFT's logits from the
base model's.
"""

import hashlib
from dataclasses import dataclass

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

import data
import solutions
from common import machine, parse_config, write_result
from llm import lora
from llm.backbone import default_model_path
from llm.engine import Engine
from llm.team import read_adapter

TEAM_VARIED = ("worked-refine-L1-r8-seed0", "worked-L1-r8-seed0", "worked-L1-r4-seed0")


@dataclass
class Config:
    n: int = 20
    """arith test questions"""
    max_new_tokens: int = 192
    """the game's budget for a solution"""
    out: str = ""
    """where the JSON result goes"""


def greedy(path, examples, cfg):
    """The engine's greedy completions of the solve prompts with the adapter at `path`, and the
    engine with its adapter's index."""
    engine = Engine(model_path=default_model_path(), dtype="float32")
    k = lora.load_adapter(engine.model, read_adapter(path))
    prompts = [engine.chat(solutions.solve_prompt(ex)) for ex in examples]
    done = engine.generate(
        prompts,
        list(range(len(prompts))),
        max_new_tokens=cfg.max_new_tokens,
        temperature=0.0,
        return_tokens=True,
        adapters=[k] * len(prompts),
    )
    return done, engine, k, prompts


def peft_difference(folder, engine, k, prompts):
    """Max abs difference of PEFT's logits and the engine's, over every position of every prompt;
    and of PEFT's to the base model's (its adapter disabled): how far the adapter moves them."""
    base = AutoModelForCausalLM.from_pretrained(default_model_path(), dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(base, str(folder)).eval()
    worst, moved = 0.0, 0.0
    with torch.no_grad(), lora.selecting(engine.model, k):
        for prompt in prompts:
            ids = torch.tensor([engine.encode(prompt)])
            theirs = peft_model(input_ids=ids).logits
            worst = max(worst, float((engine.model(input_ids=ids).logits - theirs).abs().max()))
            with peft_model.disable_adapter():
                moved = max(moved, float((peft_model(input_ids=ids).logits - theirs).abs().max()))
    return {"peft_max_abs_logit_difference": worst, "adapter_max_abs_logit_change": moved}


def main(cfg):
    examples = data.load_task("arith", split="test", n=cfg.n, seed=0)
    rows = []
    for name in TEAM_VARIED:
        old, _, _, _ = greedy(f"results/agents/{name}.pt", examples, cfg)
        new, engine, k, prompts = greedy(f"results/agents/{name}", examples, cfg)
        answers = [
            [solutions.parse_solution(c.text, "arith").answer for c in done] for done in (old, new)
        ]
        tokens = [[c.token_ids for c in done] for done in (old, new)]
        rows.append(
            {
                "adapter": name,
                "questions": len(examples),
                "identical_tokens": sum(a == b for a, b in zip(*tokens)),
                "identical_answers": sum(a == b for a, b in zip(*answers)),
                "right": sum(
                    a is not None and data.is_correct(a, ex.answer, "arith")
                    for a, ex in zip(answers[1], examples)
                ),
                "tokens_sha256": hashlib.sha256(str(tokens[1]).encode()).hexdigest()[:16],
                **peft_difference(f"results/agents/{name}", engine, k, prompts),
            }
        )
        print(rows[-1])
    return write_result({"machine": machine(), "dtype": "float32", "adapters": rows}, cfg.out)


if __name__ == "__main__":
    main(parse_config(Config, description=__doc__.split("\n\n")[0]))
