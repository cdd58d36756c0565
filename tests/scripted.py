"""A stand-in for the engine in tests: answers come from a script of (prompt, seed), no model.

ScriptedEngine  - what play() needs of an Engine (generate, chat, encode, a tokenizer for the
                  critic's verdict tokens, next_token_logprobs); counts the calls
arith_script    - a script for the built-in arith questions that is right on a seed-decided share of
                  the calls, so games have right and wrong answers and the corpus has non-flat
                  reward vectors
scripted_run.py runs sft.py / train_rl.py with it, as users run them (python or torchrun).
"""

import math

import torch

import data
import deliberate
import solutions
from llm.engine import Completion


class ScriptedEngine:
    """Five tokens per completion; a `Confidence: c/10` line in the text sets every token's
    probability to c/10 (so every generation-confidence signal is c/10), else 0.5. The critic's
    p(Correct) is 0.7."""

    def __init__(self, script):
        self.script, self.calls, self.critic_calls = script, 0, 0

        class Tok:
            def __call__(self, text, add_special_tokens=False):
                return {"input_ids": [len(w) for w in text.split()]}

            def decode(self, ids):
                return ""

        self.tokenizer = Tok()

    def chat(self, user):
        return user

    def encode(self, prompt):
        return [1] * len(prompt.split())

    def generate(self, prompts, seeds, **kw):
        self.calls += len(prompts)
        completions = []
        for p, s in zip(prompts, seeds):
            text = self.script(p, s)
            confidence = solutions.parse_solution(text, "arith").self_confidence or 0.5
            completions.append(
                Completion(
                    text, len(p.split()), 5, "eos", token_logprobs=[math.log(confidence)] * 5
                )
            )
        return completions

    def continuation_logprobs(self, prompts, continuations):
        """The critic's verdicts (`Correct`, `Incorrect`): p(Correct) = 0.7."""
        self.critic_calls += len(prompts)
        return torch.log(torch.tensor([[0.7, 0.3]] * len(prompts)))


def arith_script(right_solve=0.35, right_refine=0.3):
    """Round-0 calls are right with chance right_solve, REFINE calls with chance right_refine,
    decided by the call's seed (reproducible, whatever the batch or rank); a wrong answer is off by
    1-3. The confidence line varies with the seed too, so the generation-confidence features
    vary."""
    gold = {
        ex.render(): ex.answer
        for split in ("train", "test")
        for ex in data.load_task("arith", split=split)
    }

    def script(prompt, seed):
        answer = int(gold[prompt.split("\n")[0]])
        chance = right_refine if "Your previous solution" in prompt else right_solve
        value = answer if (seed % 1000) / 1000 < chance else answer + 1 + seed % 3
        return f"{value} it is.\nConfidence: {1 + seed % 9}/10\nAnswer: {value}"

    return script


def played(*args, **kw):
    """deliberate.play's games as eval.py writes them: their transcripts."""
    return [game.transcript() for game in deliberate.play(*args, **kw)]
