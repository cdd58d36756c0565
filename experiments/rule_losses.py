"""Where a learned policy loses to a rule: both played on the same questions and seeds (eval.py,
transcripts kept under runs/rules/), so round 0 is the same game; each question's round-0 state put
in a class (how the team's answers split, whether the vote and any agent are right, whether the
question's facts were dealt), and per class how often each is right where the other is wrong, with
the actions each took in round 1 and the first round in which the two act apart. One JSON
(results/rules/NAME.json).

    python -m experiments.rule_losses --policy results/policies/P.safetensors --rule freeze \\
        --out results/rules/losses-NAME.json -- --task split --split test --n 300 --seed 0 ...
"""

import argparse
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

from common import machine
from deliberate import action_kind

GAMES = Path("runs/rules")


def split_of(answers):
    """How a team's round-0 answers split: unanimous, a majority (2-1 for three agents), or all
    different; an unparsed answer agrees with no one."""
    parsed = [a for a in answers if a is not None]
    largest = max(Counter(parsed).values(), default=0)
    if largest == len(answers):
        return "unanimous"
    return "majority" if largest > 1 else "all different"


def state_class(game):
    """The round-0 state of one transcript: the split of the answers, whether the vote is right,
    and if not whether some agent is; and whether the question's facts were dealt (its agents were
    shown different views; a shared question shows each the same)."""
    first = game["rounds"][0]
    vote = (
        "vote right"
        if first["correct"]
        else ("vote wrong, an agent right" if any(first["agent_correct"]) else "no agent right")
    )
    return {
        "split": split_of(first["answers"]),
        "vote": vote,
        "facts": "dealt" if len(set(game.get("views", []))) > 1 else "shared",
    }


def round1_actions(game):
    """The kinds of the actions taken in round 1 (none: the game had no round 1)."""
    if len(game["rounds"]) < 2:
        return Counter()
    return Counter(action_kind(a) for a in game["rounds"][1]["actions"])


def first_apart(mine, theirs):
    """The first decision round (1: round 1) in which two games of one question act differently,
    a round that one plays and the other does not included; 0 when they act alike throughout."""
    decisions = [[r["actions"] for r in game["rounds"][1:]] for game in (mine, theirs)]
    for t in range(max(map(len, decisions))):
        a, b = (d[t] if t < len(d) else None for d in decisions)
        if a != b:
            return t + 1
    return 0


def compare(policy_games, rule_games):
    """Per round-0 class: questions, how often the policy alone and the rule alone are right,
    the round-1 action counts of each where the rule alone is right, and where either alone is
    right, the first round in which the two act apart (first_apart)."""
    classes = {}
    for mine, theirs in zip(policy_games, rule_games, strict=True):
        if mine["id"] != theirs["id"]:
            raise ValueError(f"the games differ in their questions: {mine['id']} {theirs['id']}")
        state = state_class(mine)
        row = classes.setdefault(
            tuple(state.values()),
            {
                **state,
                "questions": 0,
                "policy_only_right": 0,
                "rule_only_right": 0,
                "policy_tokens": 0,
                "rule_tokens": 0,
                "policy_actions_where_rule_only": Counter(),
                "rule_actions_where_rule_only": Counter(),
                "rule_only_ids": [],
                "policy_only_apart": Counter(),
                "rule_only_apart": Counter(),
            },
        )
        row["questions"] += 1
        row["policy_tokens"] += mine["tokens"]
        row["rule_tokens"] += theirs["tokens"]
        if mine["correct"] and not theirs["correct"]:
            row["policy_only_right"] += 1
            row["policy_only_apart"][str(first_apart(mine, theirs))] += 1
        if theirs["correct"] and not mine["correct"]:
            row["rule_only_right"] += 1
            row["policy_actions_where_rule_only"] += round1_actions(mine)
            row["rule_actions_where_rule_only"] += round1_actions(theirs)
            row["rule_only_ids"].append(mine["id"])
            row["rule_only_apart"][str(first_apart(mine, theirs))] += 1
    ordered = sorted(classes.values(), key=lambda r: r["policy_only_right"] - r["rule_only_right"])
    return [{k: dict(v) if isinstance(v, Counter) else v for k, v in r.items()} for r in ordered]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", required=True, help="the learned policy (a .safetensors)")
    parser.add_argument("--rule", required=True, help="the rule, as eval.py's protocol names it")
    parser.add_argument("--out", required=True, help="the comparison's JSON")
    parser.add_argument("eval_flags", nargs=argparse.REMAINDER, help="-- then eval.py's flags")
    args = parser.parse_args(argv)
    flags = args.eval_flags[1:] if args.eval_flags[:1] == ["--"] else args.eval_flags
    games = GAMES / f"{Path(args.out).stem}-games.json"
    mine = f"mpdf={args.policy}"
    protocols = ["--protocols", f"{mine},{args.rule}"]
    subprocess.run([sys.executable, "eval.py", *flags, *protocols, "--out", str(games)], check=True)
    details = json.loads(games.read_text())["details"]
    classes = compare(details[mine], details[args.rule])
    out = {
        "policy": args.policy,
        "rule": args.rule,
        "questions": sum(c["questions"] for c in classes),
        "policy_only_right": sum(c["policy_only_right"] for c in classes),
        "rule_only_right": sum(c["rule_only_right"] for c in classes),
        "classes": classes,
        "eval_flags": flags,
        "machine": machine(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: out[k] for k in ("questions", "policy_only_right", "rule_only_right")}))


if __name__ == "__main__":
    main()
