"""How well each confidence signal tells a right round-0 solution from a wrong one (the AUROC
table).

    python -m experiments.confidence_auroc --task arith --n 200 --out results/auroc/arith.json
    python -m experiments.confidence_auroc --task mawps \
        --path ../shared/data/mawps_asdiv/train.csv --n 200 --out results/auroc/mawps.json

The round-0 solutions are the game's own calls (solutions.solve_calls: same prompts and seeds as
eval.py, so they come from the generation cache when eval.py made them). Signals: the critic as it
was (p(Correct) from the first tokens where `Correct` and `Incorrect` differ, i.e. `Correct` vs
`In`), the critic as it is (deliberate.run_critic: each verdict scored by its whole token sequence),
and the free generation-confidence signals (solutions.generation_confidence). AUROC 0.5 is
chance; below 0.5 the signal points the wrong way.
"""

import dataclasses
from dataclasses import dataclass

import torch

import data
import deliberate
from common import parse_config, write_result
from llm.team import as_team, make_engine
from solutions import CONFIDENCE_SIGNALS, GameConfig, run_llm, solve_calls
from stats import auroc


@dataclass
class Config:
    task: str = "arith"
    path: str = ""
    split: str = ""  # "" = test for arith, all for a file (as eval.py)
    n: int = 200
    seed: int = 0
    agents: int = 3
    temperature: float = 0.7
    max_new_tokens: int = 192
    model: str = ""
    # a team of adapters, as eval.py's --models ("default+results/agents/x.pt,..."): the round-0
    # solutions are its agents'; the critic is its first agent's base model, as in the game
    models: str = ""
    dtype: str = "float32"
    engine_batch_size: int = 128
    cache_dir: str = "cache/generations"
    out: str = ""


def verdict_token_ids(tokenizer):
    """Token ids that tell `Correct` from `Incorrect` at the verdict position. `Incorrect` is often
    two tokens (`In` + `correct`), so compare the first tokens where the two spellings differ, after
    their common prefix (returned too: the prompt must end with it)."""
    good, bad = (
        tokenizer(w, add_special_tokens=False)["input_ids"] for w in ("Correct", "Incorrect")
    )
    k = 0
    while k < min(len(good), len(bad)) - 1 and good[k] == bad[k]:
        k += 1
    if good[k] == bad[k]:
        raise ValueError("the tokenizer cannot tell 'Correct' from 'Incorrect'")
    return good[k], bad[k], tokenizer.decode(good[:k])


def first_token_critic(engine, items):
    """The first-token critic: softmax over the first tokens where the two verdicts differ."""
    good, bad, prefix = verdict_token_ids(engine.tokenizer)
    prompts = [engine.chat(deliberate.critic_prompt(ex, s)) + prefix for ex, s in items]
    return torch.softmax(engine.next_token_logprobs(prompts, [good, bad]), -1)[:, 0].tolist()


def main(cfg):
    split = cfg.split or ("test" if cfg.task.startswith("arith") else "all")
    examples = data.load_task(cfg.task, path=cfg.path or None, split=split, n=cfg.n, seed=cfg.seed)
    team = make_engine(cfg, cfg.agents, 0)
    engine = as_team(team).first
    game = GameConfig(
        agents=cfg.agents,
        temperature=cfg.temperature,
        max_new_tokens=cfg.max_new_tokens,
        seed=cfg.seed,
    )
    calls = solve_calls(examples, game)
    solutions = [s for s, _ in run_llm(team, calls, game)]
    items = [(ex, s) for (ex, *_), s in zip(calls, solutions)]
    labels = [data.is_correct(s.answer, ex.answer, ex.task) for ex, s in items]
    scores = {"critic_first_token": first_token_critic(engine, items)}
    critic_tokens = deliberate.run_critic(engine, items)
    scores["critic_sequence"] = [s.critic for s in solutions]
    for name in CONFIDENCE_SIGNALS:
        scores[name] = [s.signals[name] for s in solutions]
    result = {
        "config": dataclasses.asdict(cfg),
        "solutions": len(items),
        "right": sum(labels),
        "critic_prompt_tokens_per_solution": sum(critic_tokens) / len(items),
        "completion_tokens_per_solution": sum(s.completion_tokens for s in solutions) / len(items),
        "auroc": {name: auroc(values, labels) for name, values in scores.items()},
    }
    return write_result(result, cfg.out)


if __name__ == "__main__":
    main(parse_config(Config, description=__doc__.split("\n\n")[0]))
