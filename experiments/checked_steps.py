"""A signal no rule reads yet: whether a solution's written steps check. The agents write each step
on a line of its own (`21 - 6 = 15`); recomputing them is free, needs no LLM call, and catches a
slip of arithmetic. How well does it tell a right solution from a wrong one, round by round, on
split and shared questions; and what do rules that read it gain, played exactly on debate's games?

Every team-wide rule of when to stop is debate stopped at some round: until it stops, every agent
has REFINEd every round, so the team holds debate's solutions of that round, and its tokens are
those of debate played for that many rounds (the tables persist, debate1, debate2, debate). Freeze
is debate stopped at the first unanimous round. Played here, it must give its own table's outcome
on every question; if it does not, the games are refused.

    python -m experiments.checked_steps --tables results/tables/split300-team-split-seed0 \
        --games runs/study/checked/debate-seed0.json \
        --out results/study/checked-steps/split300-team-split-seed0.json -- $SPLIT --seed 0 ...

--games: eval.py's JSON of protocol debate with its transcripts (the table pieces keep none). If it
is missing, eval.py plays it first with the flags after `--` (the table's questions: --split test
--n 300 --seed k); its generations are the debate table's, so they come from the cache when that
table was made here. The report pools the seeds' files (`checked_table`).
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

from common import FileRefused, machine, user_errors
from experiments.blind_slices import read_json, slice_figures, slice_table
from experiments.tables import summary_of
from solutions import steps_check
from stats import format_paired, paired_difference, pooled, sample_std

ROOT = Path(__file__).resolve().parents[1]
# the table of debate stopped after r rounds, r = 0..3
STOPPED_AT = ("persist", "debate1", "debate2", "debate")
MISSING = "Not known:"
PARTS = (("split", True), ("shared", False))


class Team:
    """One round of one game as eval.py's transcript keeps it: each agent's text, answer,
    correctness and vote confidence."""

    def __init__(self, record):
        self.texts, self.answers = record["texts"], record["answers"]
        self.right, self.confidence = record["agent_correct"], record["confidence"]
        self.vote_right = record["correct"]

    def unanimous(self):
        return self.answers[0] is not None and len(set(self.answers)) == 1

    def checked(self):
        return [steps_check(t) for t in self.texts]

    def says_missing(self):
        return any(MISSING in t for t in self.texts)

    def checked_vote_right(self):
        """Right if the vote over the solutions that check (the game's vote: most agents, then
        the higher confidence, then the lower index) is right; the plain vote where none checks."""
        keep = [i for i, ok in enumerate(self.checked()) if ok and self.answers[i] is not None]
        if not keep:
            return self.vote_right

        def strength(i):
            holders = [j for j in keep if self.answers[j] == self.answers[i]]
            return len(holders), max(self.confidence[j] for j in holders), -min(holders)

        return self.right[max(keep, key=strength)]


def games_of(path):
    """question id -> its teams, round 0 to the last."""
    table = read_json(path)
    details = table.get("details", {}).get("debate")
    if not details:
        raise FileRefused(f"{path}: no transcripts of protocol debate (eval.py --protocols debate)")
    return {g["id"]: [Team(r) for r in g["rounds"]] for g in details}


# A rule: from a game's teams, (the round it stops at, whether its answer is right).
def freeze(teams):
    r = next((r for r, team in enumerate(teams) if team.unanimous()), len(teams) - 1)
    return r, teams[r].vote_right


def freeze_checked_vote(teams):
    r, _ = freeze(teams)
    return r, teams[r].checked_vote_right()


def checked_stop(teams):
    """REFINE until a solution checks and none says a value is missing; answer the checked vote."""
    r = next(
        (r for r, t in enumerate(teams) if any(t.checked()) and not t.says_missing()),
        len(teams) - 1,
    )
    return r, teams[r].checked_vote_right()


def debate_checked_vote(teams):
    return len(teams) - 1, teams[-1].checked_vote_right()


RULES = {
    "freeze": freeze,
    "freeze, the checked vote": freeze_checked_vote,
    "checked stop": checked_stop,
    "debate, the checked vote": debate_checked_vote,
}


def signal_counts(games, dealt):
    """Per part and round: how many solutions check and fail, each split by right and wrong;
    `dealt`: question id -> whether its values were dealt (a split question)."""
    counts = {}
    for part, split in PARTS:
        for r in range(len(STOPPED_AT)):
            n = {"checks_right": 0, "checks_wrong": 0, "fails_right": 0, "fails_wrong": 0}
            for q, teams in games.items():
                if dealt[q] == split and r < len(teams):
                    for ok, right in zip(teams[r].checked(), teams[r].right):
                        n[f"{'checks' if ok else 'fails'}_{'right' if right else 'wrong'}"] += 1
            counts[f"{part} {r}"] = n
    return counts


def play_rules(games, tables):
    """Each rule's per-question outcome and tokens on the questions of the tables, and whether each
    question's values were dealt (freeze's table says); refuses the games if freeze played on them
    differs from freeze's own table anywhere."""
    stopped = [summary_of(read_json(f"{tables}-{name}.json")) for name in STOPPED_AT]
    tokens = [dict(zip(s["question_ids"], s["question_tokens"])) for s in stopped]
    reference = summary_of(read_json(f"{tables}-freeze.json"))
    ids = reference["question_ids"]
    if set(ids) != set(games):
        raise FileRefused(f"the games and {tables}-freeze.json hold different questions")
    results = {}
    for name, rule in RULES.items():
        outcome = [rule(games[q]) for q in ids]
        results[name] = {
            "question_ids": ids,
            "correct": [ok for _, ok in outcome],
            "question_tokens": [tokens[r][q] for (r, _), q in zip(outcome, ids)],
            "stopped_at": [r for r, _ in outcome],
        }
    if results["freeze"]["correct"] != reference["correct"]:
        raise FileRefused(f"freeze played on these games is not {tables}-freeze.json: other games")
    return results, dict(zip(ids, reference["question_dealt"]))


def seed_result(games_path, tables):
    games = games_of(games_path)
    rules, dealt = play_rules(games, tables)
    return {
        "games": str(games_path),
        "tables": tables,
        "machine": machine(),
        "dealt": dealt,
        "signal": signal_counts(games, dealt),
        "rules": rules,
    }


def play_debate(games_path, eval_flags):
    """eval.py's debate games with their transcripts, at `games_path`."""
    command = [sys.executable, str(ROOT / "eval.py"), *eval_flags]
    command += ["--protocols", "debate", "--out", str(games_path)]
    subprocess.run(command, check=True)


# --------------------------------------------------------------------------------------------------
# The report's table: the seeds pooled
# --------------------------------------------------------------------------------------------------
def auroc_of(n):
    """The AUROC of a yes/no signal from its counts: (1 + TPR - FPR) / 2; None without both
    classes."""
    right, wrong = n["checks_right"] + n["fails_right"], n["checks_wrong"] + n["fails_wrong"]
    if not right or not wrong:
        return None
    return (1 + n["checks_right"] / right - n["checks_wrong"] / wrong) / 2


def share(a, b):
    return f"{a / (a + b):.3f}" if a + b else "–"


def checked_table(paths, slices=()):
    """Markdown: the signal per part and round, then each rule against freeze, the seeds pooled;
    with `slices` (experiments/blind_slices.py's files of the same seeds, in order), each rule on
    the questions where a rule is blind."""
    missing = [p for p in paths if not Path(p).is_file()]
    if missing or not paths:
        return f"missing: {', '.join(map(str, missing))} (python -m experiments.checked_steps)"
    seeds = [read_json(p) for p in paths]
    lines = [
        f"{len(seeds)} seed{'s' if len(seeds) > 1 else ''}, pooled "
        f"({', '.join(Path(p).stem for p in paths)}).",
        "",
        "| part, round | solutions | share that check | right if it checks | right if not "
        "| AUROC |",
        "|---|---|---|---|---|---|",
    ]
    for key in seeds[0]["signal"]:
        n = {k: sum(s["signal"][key][k] for s in seeds) for k in seeds[0]["signal"][key]}
        checked, failed = n["checks_right"] + n["checks_wrong"], n["fails_right"] + n["fails_wrong"]
        auroc = auroc_of(n)
        lines.append(
            f"| {key} | {checked + failed} | {share(checked, failed)} | "
            f"{share(n['checks_right'], n['checks_wrong'])} | "
            f"{share(n['fails_right'], n['fails_wrong'])} | "
            f"{'–' if auroc is None else f'{auroc:.3f}'} |"
        )
    lines += [
        "",
        "| rule, played on debate's games | accuracy ± sample std | split q. | shared q. | "
        "tokens/q | vs freeze [95% CI] (differ) |",
        "|---|---|---|---|---|---|",
    ]
    freeze_runs = {k: s["rules"]["freeze"] for k, s in enumerate(seeds)}
    for name in seeds[0]["rules"]:
        runs = {k: s["rules"][name] for k, s in enumerate(seeds)}
        per_seed = [sum(r["correct"]) / len(r["correct"]) for r in runs.values()]
        mine = pooled(runs)
        dealt = [s["dealt"][q] for s, r in zip(seeds, runs.values()) for q in r["question_ids"]]
        parts = [
            sum(ok for ok, d in zip(mine["correct"], dealt) if d == want) / dealt.count(want)
            for _, want in PARTS
        ]
        tokens = [t for r in runs.values() for t in r["question_tokens"]]
        versus = (
            "" if name == "freeze" else format_paired(paired_difference(mine, pooled(freeze_runs)))
        )
        lines.append(
            f"| {name} | {sum(per_seed) / len(per_seed):.3f} ± {sample_std(per_seed):.3f} | "
            f"{parts[0]:.3f} | {parts[1]:.3f} | {sum(tokens) / len(tokens):,.0f} | {versus} |"
        )
    if slices:
        named = [read_json(p) | {"path": str(p)} for p in slices]
        pairs = [(n, [(p, s["rules"])]) for n, p, s in zip(named, paths, seeds, strict=True)]
        lines += ["", slice_table(slice_figures(pairs))]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tables", required=True, help="the seed's tables' path before -freeze.json"
    )
    parser.add_argument("--games", required=True, help="debate's transcripts (played if missing)")
    parser.add_argument("--out", required=True, help="the seed's JSON")
    parser.add_argument("eval_flags", nargs="*", help="eval.py's flags for the games, after --")
    args = parser.parse_args(argv)
    games = Path(args.games)
    if not games.is_file():
        if not args.eval_flags:
            raise FileRefused(f"{games}: missing, and no eval.py flags after -- to play it")
        play_debate(games, args.eval_flags)
    result = seed_result(games, args.tables)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(checked_table([args.out]))


if __name__ == "__main__":
    with user_errors():
        main()
