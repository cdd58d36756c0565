"""Stage 1 (DESIGN §5): supervised bootstrapping of the meta-policy, or of the backbone itself.

    python sft.py --out-dir runs/sft                        # meta-policy -> runs/sft/policy.pt (pi_sft)
    torchrun --nproc_per_node=2 sft.py --out-dir runs/sft   # the same on 2 processes (gloo on CPU, NCCL on CUDA)
    python sft.py --target llm --out-dir runs/sft-llm       # backbone -> runs/sft-llm/model (an HF directory)

--target policy: play the game with a behaviour policy (uniform random by default) on training questions,
label every (agent, round) state with the oracle action (own answer right -> PERSIST; else a right peer ->
CONCEDE to the most confident right peer; else REFINE) and train the policy by cross-entropy.
--target llm: sample solutions to training questions, keep the right (and, with --trailer, well-formatted)
ones and fine-tune the backbone on them, with the loss on completion tokens only.

The corpus of game states comes from corpus.py, the DDP loop, checkpoints and resume from training.py.
"""
import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

import data
import deliberate
import softrank
from corpus import (action_distribution, collect_states, load_or_collect, make_engine, states_to_tensors,
                    training_questions)
from engine import call_seed
from policy import FEATURE_SETS, MetaPolicy, make_policy, save_policy
from state import VOTE_RULES, n_actions, parse_solution
from training import (MetricsLog, accumulating, all_gather_list, all_reduce_sum, batch_schedule, completion_batch,
                      completion_logprobs, crash_if_asked, load_checkpoint, parse_config, run_distributed,
                      save_checkpoint, train_steps, wrap_ddp)


@dataclass
class Config:
    target: str = "policy"         # "policy" (the meta-policy) or "llm" (the backbone)
    task: str = "arith"
    path: str = ""                 # data file for file-based tasks
    level: int = 0                 # arith difficulty (0: the task's default)
    questions: int = 256           # training questions
    val_n: int = 64                # held-out training-split questions for the accuracy logged during training
    seed: int = 0                  # question split, LLM calls, data order, initialization
    agents: int = 3
    rounds: int = 3
    temperature: float = 0.5       # the agents' (README: the temperature study on validation questions)
    max_new_tokens: int = 192
    trailer: bool = False          # ask for the Steps / Confidence / Answer trailer
    critic: bool = False           # the policy's state carries the critic's p(Correct) (the game runs it)
    features: str = "all"          # the state features the policy reads: all | paper | confidence (policy.py)
    vote: str = "mean_prob"        # the vote's tie-break signal (state.VOTE_RULES)
    behaviour: str = "random"      # the policy that plays the labelled games (a fixed policy or a checkpoint)
    hidden: int = 64
    heads: int = 4
    separate: bool = False         # one policy copy per agent
    epochs: int = 30
    batch_size: int = 256          # states (--target llm: sequences) per optimizer step, over all ranks
    lr: float = 3e-3
    weight_decay: float = 0.0
    # --target llm
    samples: int = 4               # solutions sampled per question
    micro_batch: int = 4           # sequences per forward/backward (memory); gradients accumulate
    llm_lr: float = 1e-5
    gradient_checkpointing: bool = False
    # engine and bookkeeping
    model: str = ""                # HF checkpoint directory; empty: the embedded default backbone
    dtype: str = "float32"
    engine_batch_size: int = 128   # engine slots (README, "The engine": 1.2x the tokens/s of 64)
    cache_dir: str = "cache/generations"
    out_dir: str = "runs/sft"
    save_every: int = 50           # optimizer steps between checkpoints (and at the end)
    crash_at_step: int = 0         # testing resume: SIGKILL this process right after this optimizer step


# ----------------------------------------------------------------------------------------------------
# --target policy
# ----------------------------------------------------------------------------------------------------
def cross_entropy_loss(model, batch):
    logits = model(batch["own"], batch["peers"], batch["agent"])
    loss = F.cross_entropy(logits, batch["label"])
    accuracy = (logits.argmax(-1) == batch["label"]).float().mean()
    return loss, {"loss": loss.item(), "label_accuracy": accuracy.item()}


def train_policy(cfg, rank, world, device):
    out = Path(cfg.out_dir)
    torch.manual_seed(cfg.seed)
    policy = MetaPolicy(agents=cfg.agents, hidden=cfg.hidden, heads=cfg.heads, separate=cfg.separate,
                        critic=cfg.critic, features=cfg.features)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    counters = load_checkpoint(out, policy, optimizer, rank, cfg) or {"step": 0}
    log = MetricsLog(out, rank, counters["step"])
    engine = make_engine(cfg, rank)
    questions, _ = training_questions(cfg)
    behaviour = make_policy(cfg.behaviour)
    rows = load_or_collect(out / "corpus.pt", lambda: collect_states(
        engine, questions, behaviour, cfg, counterfactual=False, rank=rank, world=world, critic=cfg.critic), rank)
    tensors = states_to_tensors(rows)
    k = n_actions(cfg.agents)
    label_mix = action_distribution(tensors["label"], k)
    if rank == 0:
        print(f"{len(rows)} states from {len(questions)} questions; oracle labels {label_mix}", file=sys.stderr)
    batches = batch_schedule(len(rows), cfg.batch_size, cfg.epochs, cfg.seed, "sft")
    model = wrap_ddp(policy.to(device), device, find_unused=cfg.separate)

    def on_step(step, stats):
        log.write(step=step, **stats)
        if step % cfg.save_every == 0 or step == len(batches):
            save_checkpoint(out, policy, optimizer, {"step": step}, cfg, rank)
        crash_if_asked(cfg, step)

    train_steps(model, optimizer, tensors, cross_entropy_loss, batches, counters["step"], on_step, rank, world,
                device, desc="sft")
    with torch.no_grad():
        predicted = policy.cpu()(tensors["own"], tensors["peers"], tensors["agent"]).argmax(-1)
    summary = {"states": len(rows), "label_distribution": label_mix,
               "policy_distribution": action_distribution(predicted, k),
               "label_accuracy": float((predicted == tensors["label"]).float().mean())}
    if rank == 0:
        save_policy(policy, out / "policy.pt", train_config=dataclasses.asdict(cfg), summary=summary)
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        print(json.dumps(summary))
    return policy


# ----------------------------------------------------------------------------------------------------
# --target llm: fine-tune the backbone on its own right answers (rejection sampling), loss on completions
# ----------------------------------------------------------------------------------------------------
def train_llm(cfg, rank, world, device):
    out = Path(cfg.out_dir)
    engine = make_engine(cfg, rank)
    questions, _ = training_questions(cfg)
    shard = questions[rank::world]
    calls = [(ex, k) for ex in shard for k in range(cfg.samples)]
    prompts = [engine.chat(deliberate.solve_prompt(ex, cfg.trailer)) for ex, _ in calls]
    completions = engine.generate(prompts, [call_seed(cfg.seed, ex.id, k, "sft-llm") for ex, k in calls],
                                  max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature)
    eos = engine.tokenizer.eos_token_id
    kept = []
    for (ex, _), prompt, c in zip(calls, prompts, completions):
        s = parse_solution(c.text, ex.task)
        if c.finish == "eos" and data.is_correct(s.answer, ex.answer, ex.task) and (s.trailer_ok or not cfg.trailer):
            kept.append((engine.encode(prompt), engine.encode(c.text) + [eos]))
    kept = sorted(all_gather_list(kept))  # every rank sees the same dataset, whatever the world size
    if rank == 0:
        print(f"kept {len(kept)} right{' well-formatted' if cfg.trailer else ''} solutions of "
              f"{len(questions) * cfg.samples} samples", file=sys.stderr)
    if len(kept) < cfg.batch_size:
        raise ValueError(f"only {len(kept)} right solutions for a batch of {cfg.batch_size}: "
                         "raise --questions or --samples, or lower --batch-size")
    model = engine.model.float().to(device).train()
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.llm_lr, weight_decay=cfg.weight_decay)
    counters = load_checkpoint(out, model, optimizer, rank, cfg) or {"step": 0}
    log = MetricsLog(out, rank, counters["step"])
    batches = batch_schedule(len(kept), cfg.batch_size, cfg.epochs, cfg.seed, "sft-llm")
    ddp = wrap_ddp(model, device, find_unused=False)
    pad = engine.tokenizer.pad_token_id if engine.tokenizer.pad_token_id is not None else eos
    bar = tqdm(range(counters["step"], len(batches)), desc="sft-llm", disable=rank != 0)
    for step in bar:
        mine = [kept[i] for i in batches[step][rank::world].tolist()]
        # the normalizer (completion tokens of the global batch) is computed once per optimizer step;
        # DDP averages over ranks, hence the factor world
        n_tokens = all_reduce_sum([sum(len(c) for _, c in mine)], device)[0] / world
        weight = 1.0
        if not mine:  # a batch smaller than the world: this rank still runs one backward (weight 0) for DDP
            mine, weight = kept[:1], 0.0
        total = 0.0
        for m in range(0, len(mine), cfg.micro_batch):
            batch = completion_batch(mine[m:m + cfg.micro_batch], pad, device)
            last = m + cfg.micro_batch >= len(mine)
            with accumulating(ddp, last):
                logp, mask = completion_logprobs(ddp, batch)
                # cross-entropy on the completion tokens = the token-level policy gradient with advantage 1
                loss, _ = softrank.policy_gradient_loss(logp, logp.new_ones(len(logp)), mask, "token", n_tokens)
                loss = loss * weight
                loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss_mean = all_reduce_sum([total], device)[0] / world
        bar.set_postfix(loss=f"{loss_mean:.4f}")
        log.write(step=step + 1, loss=loss_mean)
        if (step + 1) % cfg.save_every == 0 or step + 1 == len(batches):
            save_checkpoint(out, model, optimizer, {"step": step + 1}, cfg, rank)
        crash_if_asked(cfg, step + 1)
    if rank == 0:
        model.eval().save_pretrained(out / "model")
        engine.tokenizer.save_pretrained(out / "model")
        print(json.dumps({"kept": len(kept), "steps": len(batches), "model": str(out / "model")}))
    return model


def main(cfg):
    if cfg.target not in ("policy", "llm"):
        sys.exit(f"unknown --target {cfg.target!r}: choose policy or llm")
    if cfg.vote not in VOTE_RULES:
        sys.exit(f"unknown --vote {cfg.vote!r}: choose one of {', '.join(VOTE_RULES)}")
    if cfg.features not in FEATURE_SETS:
        sys.exit(f"unknown --features {cfg.features!r}: choose one of {', '.join(FEATURE_SETS)}")
    return run_distributed(train_policy if cfg.target == "policy" else train_llm, cfg)


if __name__ == "__main__":
    main(parse_config(Config, description=__doc__.split("\n\n")[0]))
