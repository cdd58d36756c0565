"""A committed MAGRPO run's validation replayed from results/: the team's greedy vote after its
protocol (train_magrpo.py's validation, vote_rollouts), for the adapters the run started from and
those it saved, on the run's own validation questions and on the seed's first test questions.

    python -m experiments.magrpo_replay magrpo-debate-split-seed0 \
        --out results/llm/magrpo-debate-split-seed0.replay.json

Why: a run's validation curve and its test table can disagree. The replay plays both question sets
through one code path with the adapters read back from their committed folders, so a loading
mistake (the validation replayed unlike the run's metrics log) is told apart from a difference
between the question sets. The run's flags are its piece's (experiments/pieces.py).
"""

import argparse
import dataclasses
import json
from pathlib import Path

import torch

import data
import train_magrpo
from common import machine, parse_config, write_result
from experiments.pieces import PIECES
from llm.training import init_adapters, trained_team, unseen_pool
from stats import paired_difference


def run_config(run):
    """The run's train_magrpo.py Config, parsed from its piece's command."""
    command = list(map(str, PIECES[f"llm-{run}"]["command"]))
    return parse_config(train_magrpo.Config, command[command.index("train_magrpo.py") + 1 :])


def saved_adapters(run):
    """The run's committed adapter folders, agent by agent (its piece's copies)."""
    targets = PIECES[f"llm-{run}"]["copies"].values()
    return sorted(t for t in targets if t.startswith(f"results/agents/{run}/"))


def logged_validation(run):
    """{step: held-out accuracy} as the run's committed metrics log holds it: what the replay of
    the validation questions should give, the starting team at step 0, the trained at the last."""
    log = next(t for t in PIECES[f"llm-{run}"]["copies"].values() if t.endswith(".jsonl"))
    records = [json.loads(line) for line in Path(log).read_text().splitlines() if line.strip()]
    return {r["step"]: r["val_accuracy"] for r in records if "val_accuracy" in r}


def question_sets(cfg, n_test):
    """The run's validation questions (as train_magrpo.py takes them) and the seed's test ones."""
    test = data.load_task(cfg.task, split="test", n=n_test, seed=cfg.seed, **data.task_options(cfg))
    return {"validation": unseen_pool(cfg, init_adapters(cfg))[: cfg.val_n], "test": test}


def greedy_votes(cfg, adapters, questions):
    """{question_ids, correct}: the team with `adapters`, played as the validation plays it."""
    greedy = dataclasses.replace(
        cfg, group=1, rollout_temperature=0.0, format_reward=0.0, init_adapter=",".join(adapters)
    )
    models, team = trained_team(greedy, cfg.agents if cfg.separate_agents else 1, "cpu")
    for m in models:
        m.eval()
    with torch.no_grad():
        right = train_magrpo.vote_rollouts(team, questions, greedy, 0)[1]
    return {"question_ids": [q.id for q in questions], "correct": [bool(r) for r in right.tolist()]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="a MAGRPO piece's run name, e.g. magrpo-debate-split-seed0")
    parser.add_argument("--n-test", type=int, default=100, help="the seed's first test questions")
    parser.add_argument("--out", required=True, help="the JSON to write")
    args = parser.parse_args()
    cfg = run_config(args.run)
    teams = {"starting": init_adapters(cfg), "trained": saved_adapters(args.run)}
    result = {
        "run": args.run,
        "machine": machine(),
        "teams": teams,
        "logged_validation": logged_validation(args.run),
    }
    for name, questions in question_sets(cfg, args.n_test).items():
        votes = {team: greedy_votes(cfg, adapters, questions) for team, adapters in teams.items()}
        result[name] = {
            **{f"{team}_accuracy": sum(v["correct"]) / len(questions) for team, v in votes.items()},
            "trained_minus_starting": paired_difference(votes["trained"], votes["starting"]),
            "votes": votes,
        }
        print(
            f"{name}: {result[name]['starting_accuracy']:.3f} -> "
            f"{result[name]['trained_accuracy']:.3f}",
            flush=True,
        )
    write_result(result, args.out)


if __name__ == "__main__":
    main()
