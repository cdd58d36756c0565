"""One optimizer step of each LLM-weight trainer's loss (llm_step.policy_step) on a tiny random
Llama, the whole weights trained, as a trainer runs it: python (one process), or torchrun with DDP
or FSDP2 (llm.training.loss_modules). Each rank takes its share of the questions, as the trainers
do; rank 0 saves (torch.save) what tests/test_fsdp.py compares: each trainer's loss, KL and
gradient norm over two steps, the updated weights (whole), and every rank's bytes of parameters,
gradients and optimizer state; and under FSDP2 a checkpoint written and read back into fresh
shards. Under torchrun one launch trains under DDP, then under FSDP2 (a launch costs more than
the steps).

    python tests/fsdp_run.py OUT.pt
    torchrun --nproc_per_node=2 tests/fsdp_run.py OUT.pt
"""

import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import (  # noqa: E402
    all_gather_list,
    all_reduce_sum,
    distributed,
    load_checkpoint,
    save_checkpoint,
    state_bytes,
    whole,
)
from llm import training  # noqa: E402
from llm_step import Sequence, policy_step  # noqa: E402

# each trainer's loss: (aggregation, KL weight, advantages: the group's, or 1 for the solver)
TRAINERS = {
    "magrpo": ("sum", 0.0, True),
    "magrpo-kl": ("sum", 0.1, True),
    "mlpo": ("const", 0.0, True),
    "solver": ("token", 0.0, False),
}
QUESTIONS, G = 4, 3


@dataclass
class Run:
    """The settings a checkpoint records."""

    steps: int = 1


def tiny_llama():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        tie_word_embeddings=False,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def rollouts(rank, world, with_groups):
    """This rank's questions (q = rank, rank + world, ...), G completions each of its own length,
    and their advantages (rows: this rank's questions)."""
    g = torch.Generator().manual_seed(7)
    every = [
        [(torch.randint(3, 90, (4,), generator=g).tolist(),
          torch.randint(3, 90, (2 + (q * G + k) % 5,), generator=g).tolist()) for k in range(G)]
        for q in range(QUESTIONS)
    ]  # fmt: skip
    advantages = torch.randn(QUESTIONS, G, generator=g) if with_groups else torch.ones(QUESTIONS, G)
    mine = list(range(rank, QUESTIONS, world))
    sequences = [Sequence(row, k, 0, *every[q][k]) for row, q in enumerate(mine) for k in range(G)]
    return sequences, advantages[mine]


def trained(ranks, out, fsdp):
    """Two steps of each trainer's loss on this rank, its state's bytes and weights after them, and
    (FSDP) a checkpoint of the shards read back."""
    flags = SimpleNamespace(lora_rank=0, gradient_checkpointing=False, fsdp=fsdp)
    result = {}
    for name, (agg, beta, with_groups) in TRAINERS.items():
        model = tiny_llama().train()
        modules, references = training.loss_modules([model], flags, ranks.device, kl=beta > 0)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        sequences, advantages = rollouts(ranks.rank, ranks.world, with_groups)
        # two steps: the second's KL term is not 0 (the weights left the reference)
        steps = []
        for _ in range(2):
            stats = policy_step(
                modules, optimizer, sequences, advantages, agg=agg, beta=beta,
                temperature=1.0, max_len=8, micro_batch=2, pad=0, bf16=False, ranks=ranks,
                references=references,
            )  # fmt: skip
            # the step's loss and KL over every rank, as the trainers log them
            summed = all_reduce_sum([stats["loss"], stats["kl"]], ranks.device)
            steps.append([x / ranks.world for x in summed] + [stats["grad_norm"]])
        # the bytes are counted with the gradients held: one more backward, no step
        modules[0](input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
        held = all_gather_list([state_bytes(list(model.parameters()), optimizer)])
        optimizer.zero_grad(set_to_none=True)
        weights = {k: whole(v).detach().clone() for k, v in model.state_dict().items()}
        result[name] = {"steps": steps, "state_bytes": held, "weights": weights}
    if fsdp:
        # a checkpoint of the last trainer's shards, read back into a fresh sharded model
        holder = torch.nn.ModuleList([model])
        cfg = Run()
        folder = Path(out).parent / "checkpoint"
        folder.mkdir(exist_ok=True)
        save_checkpoint(folder, holder, optimizer, {"step": 1}, cfg, ranks.rank)
        fresh = tiny_llama()
        training.loss_modules([fresh], flags, ranks.device, kl=False)
        again = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
        counters = load_checkpoint(folder, torch.nn.ModuleList([fresh]), again, ranks.rank, cfg)
        restored = {k: whole(v) for k, v in fresh.state_dict().items()}
        same = all(torch.equal(restored[k], weights[k]) for k in weights)
        result["checkpoint"] = {"counters": counters, "same": same}
    return result


def main(out):
    """{"world", "one": ...} on one process; {"world", "ddp": ..., "fsdp": ...} under torchrun."""
    with distributed(Path(out).parent) as ranks:
        # the models die before the process group is torn down (DDP's with trained()'s frame,
        # FSDP2's, in reference cycles, at the collection distributed() ends with): a DDP reducer
        # freed after the teardown destroys the gloo group itself, joining gloo's thread while
        # holding the GIL that thread waits for (a hang at exit)
        result = {"world": ranks.world}
        if ranks.world == 1:
            result["one"] = trained(ranks, out, fsdp=False)
        else:
            result["ddp"] = trained(ranks, out, fsdp=False)
            result["fsdp"] = trained(ranks, out, fsdp=True)
        if ranks.rank == 0:
            torch.save(result, out)


if __name__ == "__main__":
    main(sys.argv[1])
