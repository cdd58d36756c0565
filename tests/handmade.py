"""Hand-built pieces that several test files share.

sol          - a Solution built from an answer, for the vote and the rewards
magrpo_step  - llm_step.policy_step as train_magrpo.py calls it, on rank 0 of 1 on the CPU
"""

import torch

import solutions
from common import Ranks
from llm_step import policy_step


def sol(answer, confidence=0.5, text=None):
    """A hand-built Solution for vote / reward tests; `confidence` is what breaks vote ties."""
    text = text or (f"Answer: {answer}" if answer is not None else "no idea")
    s = solutions.parse_solution(text, "arith", completion_tokens=10)
    s.confidence = confidence
    return s


def magrpo_step(models, optimizer, sequences, advantages, cfg, pad):
    """One step of train_magrpo.py's `cfg` (its aggregation, KL weight, budget and micro-batch) at
    the rollouts' temperature 1, in fp32, one process."""
    return policy_step(
        models,
        optimizer,
        sequences,
        advantages,
        agg=cfg.loss_agg,
        beta=cfg.beta,
        temperature=1.0,
        max_len=cfg.max_new_tokens,
        micro_batch=cfg.micro_batch,
        pad=pad,
        bf16=False,
        ranks=Ranks(0, 1, torch.device("cpu")),
    )
