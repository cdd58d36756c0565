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

--live: checked stop alone, played as a game of its own (its rule, `CheckedStop`, handed to
eval.py's game): only the rounds it plays, about a third of debate's calls, and the same calls as
debate's rounds until it stops, so on the same questions it gives exactly what the replay gives.
The seed's file then holds freeze (from its table) and checked stop, and no signal counts.

    python -m experiments.checked_steps --live --tables ... \
        --games runs/study/checked/live-seed1.json --out ... -- $SPLIT --seed 1 --split test ...

--policy NAME: a learned policy of the seed (results/policies/<tables' name>-NAME.safetensors)
played with its transcripts, its outcome checked against its table, and answered also by the
checked vote over its last round: whether what a policy loses to checked stop is where it stops
or how its team votes.
"""

import argparse
import dataclasses
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

import eval
from common import FileRefused, UsageError, machine, parse_config, user_errors
from deliberate import PERSIST, REFINE
from experiments.blind_slices import read_json, slice_figures, slice_table
from experiments.tables import missing as missing_files
from experiments.tables import summary_of
from llm.team import make_engine, resolve_engine_dtype
from solutions import GameConfig, steps_check
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

    def stops(self):
        return stops(self.texts)

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


def stops(texts):
    """Checked stop's test of a round: some solution's steps check and none says a value is
    missing."""
    return any(steps_check(t) for t in texts) and not any(MISSING in t for t in texts)


@dataclass
class Config(eval.Config):
    """eval.py's flags: checked stop's own games are eval.py's game with the rule CheckedStop handed
    to it (`--live`)."""


class CheckedStop:
    """Checked stop as a rule of the game (deliberate.decide asks it for the team's actions): every
    agent REFINEs until the team's solutions pass `stops`, then all PERSIST, which ends the game.
    Its answer is the checked vote over the last round (`checked_stop` on the transcript)."""

    reads_critic = False

    def team_actions(self, solutions, t):
        return [PERSIST if stops([s.text for s in solutions]) else REFINE] * len(solutions)


# A rule: from a game's teams, (the round it stops at, whether its answer is right).
def freeze(teams):
    r = next((r for r, team in enumerate(teams) if team.unanimous()), len(teams) - 1)
    return r, teams[r].vote_right


def freeze_checked_vote(teams):
    r, _ = freeze(teams)
    return r, teams[r].checked_vote_right()


def checked_stop(teams):
    """REFINE until a solution checks and none says a value is missing; answer the checked vote."""
    r = next((r for r, t in enumerate(teams) if t.stops()), len(teams) - 1)
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


def play_eval(games_path, eval_flags, protocol="debate"):
    """eval.py's games of `protocol` with their transcripts, at `games_path`."""
    command = [sys.executable, str(ROOT / "eval.py"), *eval_flags]
    command += ["--protocols", protocol, "--out", str(games_path)]
    subprocess.run(command, check=True)


def policy_file(tables, name):
    """The seed's policy `name`, as the pieces name it beside the seed's tables."""
    return f"results/policies/{Path(tables).name}-{name}.safetensors"


def policy_result(games_path, tables, name):
    """A learned policy's own games, answered by the game's vote (its table's outcome, else the
    games are refused) and by the checked vote over its last round."""
    protocol = f"mpdf={policy_file(tables, name)}"
    details = read_json(games_path).get("details", {}).get(protocol)
    if not details:
        raise FileRefused(f"{games_path}: no transcripts of {protocol}")
    table = summary_of(read_json(f"{tables}-{name}.json"))
    ids, tokens = [g["id"] for g in details], [g["tokens"] for g in details]
    plain = {"question_ids": ids, "correct": [g["correct"] for g in details]}
    if ids != table["question_ids"] or plain["correct"] != table["correct"]:
        raise FileRefused(f"{games_path}: not the games of {tables}-{name}.json")
    checked = [Team(g["rounds"][-1]).checked_vote_right() for g in details]
    return {
        "games": str(games_path),
        "tables": tables,
        "policy": name,
        "machine": machine(),
        "plain": plain | {"question_tokens": tokens},
        "checked vote": {"question_ids": ids, "correct": checked, "question_tokens": tokens},
    }


LIVE = "checked stop"


def play_live(games_path, eval_flags):
    """Checked stop's own games, CheckedStop handed to eval.py's game, with their transcripts at
    `games_path` (eval.py's JSON, protocol LIVE)."""
    cfg = parse_config(Config, eval_flags)
    cfg = dataclasses.replace(cfg, protocols="debate")
    eval.check(cfg)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg, _ = resolve_engine_dtype(cfg, device)
    examples = eval.load_examples(cfg)
    engine = make_engine(cfg, cfg.agents, 0, device)
    played = eval.games(engine, examples, CheckedStop(), GameConfig.of(cfg))
    record = {"config": dataclasses.asdict(cfg), "machine": machine(), "details": {LIVE: played}}
    Path(games_path).parent.mkdir(parents=True, exist_ok=True)
    Path(games_path).write_text(json.dumps(record) + "\n")


def live_result(games_path, tables):
    """The seed's file from checked stop's own games: freeze as its table played it, checked stop
    from the games. Refused where a game did not stop where the rule says (other games)."""
    details = read_json(games_path).get("details", {}).get(LIVE)
    if not details:
        raise FileRefused(f"{games_path}: no transcripts of {LIVE} (checked_steps --live)")
    played = {g["id"]: g for g in details}
    freeze_table = summary_of(read_json(f"{tables}-freeze.json"))
    ids = freeze_table["question_ids"]
    if set(ids) != set(played):
        raise FileRefused(f"the games and {tables}-freeze.json hold different questions")
    outcome = []
    for q in ids:
        rounds = played[q]["rounds"]
        r, right = checked_stop([Team(record) for record in rounds])
        # a round of all PERSIST is recorded after the last one played
        ended = next((k - 1 for k, rec in enumerate(rounds) if rec.get("stopped")), len(rounds) - 1)
        if ended != r:
            raise FileRefused(f"{games_path}: {q} stopped after round {ended}, the rule at {r}")
        outcome.append((r, right, played[q]["tokens"]))
    keep = ("question_ids", "correct", "question_tokens")
    return {
        "games": str(games_path),
        "tables": tables,
        "machine": machine(),
        # a task whose values are never dealt (arith) has only shared questions
        "dealt": dict(zip(ids, freeze_table.get("question_dealt", [False] * len(ids)))),
        "signal": None,
        "rules": {
            "freeze": {k: freeze_table[k] for k in keep},
            LIVE: {
                "question_ids": ids,
                "correct": [right for _, right, _ in outcome],
                "question_tokens": [tokens for _, _, tokens in outcome],
                "stopped_at": [r for r, _, _ in outcome],
            },
        },
    }


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


def checked_table(paths, slices=(), policies=None):
    """Markdown: the signal per part and round (the seeds that played debate), then each rule
    against freeze, the seeds pooled (each rule over the seeds that played it); with `slices`
    (experiments/blind_slices.py's files of the same seeds, in order), each rule on the questions
    where a rule is blind; with `policies` ({name: per seed, in order, its table or its
    checked-vote file}), each policy against checked stop and freeze on the same questions."""
    absent = [p for p in paths if not Path(p).is_file()]
    if absent or not paths:
        return missing_files(*map(under_results, absent))
    seeds = [read_json(p) for p in paths]
    counted = [s for s in seeds if s["signal"]]
    lines = [f"{len(seeds)} seed{'s' if len(seeds) > 1 else ''} ({', '.join(map(stem, paths))})."]
    if counted:
        lines += [
            "",
            f"The signal on debate's games, {seeds_said(counted, seeds, paths)}:",
            "",
            "| part, round | solutions | share that check | right if it checks | right if not "
            "| AUROC |",
            "|---|---|---|---|---|---|",
        ]
    for key in counted[0]["signal"] if counted else ():
        n = {k: sum(s["signal"][key][k] for s in counted) for k in counted[0]["signal"][key]}
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
        "| rule (seeds) | accuracy ± sample std | split q. | shared q. | tokens/q "
        "| vs freeze [95% CI] (differ) |",
        "|---|---|---|---|---|---|",
    ]
    names = max((s["rules"] for s in seeds), key=len)
    for name in names:
        runs = {k: s["rules"][name] for k, s in enumerate(seeds) if name in s["rules"]}
        freeze_runs = {k: seeds[k]["rules"]["freeze"] for k in runs}
        per_seed = [sum(r["correct"]) / len(r["correct"]) for r in runs.values()]
        mine = pooled(runs)
        dealt = [seeds[k]["dealt"][q] for k, r in runs.items() for q in r["question_ids"]]
        parts = [part_accuracy(mine["correct"], dealt, want) for _, want in PARTS]
        tokens = [t for r in runs.values() for t in r["question_tokens"]]
        versus = (
            "" if name == "freeze" else format_paired(paired_difference(mine, pooled(freeze_runs)))
        )
        lines.append(
            f"| {name} ({', '.join(stem(paths[k]).rsplit('-', 1)[-1] for k in runs)}) | "
            f"{sum(per_seed) / len(per_seed):.3f} ± {sample_std(per_seed):.3f} | "
            f"{parts[0]} | {parts[1]} | {sum(tokens) / len(tokens):,.0f} | {versus} |"
        )
    if policies:
        lines += ["", policy_table(seeds, paths, policies)]
    if slices:
        named = [read_json(p) | {"path": str(p)} for p in slices]
        pairs = [
            (n, [(p, s["rules"] | seed_policies(policies or {}, k))])
            for k, (n, p, s) in enumerate(zip(named, paths, seeds, strict=True))
        ]
        lines += ["", slice_table(slice_figures(pairs))]
    return "\n".join(lines)


def under_results(path):
    """A path as tables.missing names it: from results/ where it lies there."""
    path = Path(path).resolve()
    return path.relative_to(ROOT / "results") if path.is_relative_to(ROOT / "results") else path


def part_accuracy(correct, dealt, want):
    """The accuracy on the questions of one part (dealt or not), "–" where it has none."""
    mine = [ok for ok, d in zip(correct, dealt) if d == want]
    return f"{sum(mine) / len(mine):.3f}" if mine else "–"


def stem(path):
    return Path(path).stem


def seeds_said(some, seeds, paths):
    if len(some) == len(seeds):
        return "every seed"
    return ", ".join(stem(paths[seeds.index(s)]).rsplit("-", 1)[-1] for s in some)


def seed_policies(policies, k):
    """{name: per-question outcome} of the policies whose file of seed k is there."""
    return {
        name: policy_outcome(read_json(files[k]))
        for name, files in policies.items()
        if Path(files[k]).is_file()
    }


def policy_outcome(played):
    """A policy's per-question outcome: from its eval.py table, or the checked vote of its games
    (`policy_result`)."""
    return played["checked vote"] if "checked vote" in played else summary_of(played)


def mean_tokens(runs):
    """Tokens per question over the runs' questions (an older table keeps only its mean)."""
    total = sum(
        sum(r["question_tokens"])
        if "question_tokens" in r
        else r["tokens_per_question"] * len(r["correct"])
        for r in runs
    )
    return total / sum(len(r["correct"]) for r in runs)


def policy_table(seeds, paths, policies):
    """Markdown: each policy against checked stop and freeze, pooled over the seeds whose file of
    the policy is there (named in its row)."""
    lines = [
        "| policy (seeds) | accuracy | tokens/q | vs checked stop [95% CI] (differ) "
        "| vs freeze [95% CI] (differ) |",
        "|---|---|---|---|---|",
    ]
    for name, tables in policies.items():
        have = [k for k, t in enumerate(tables) if Path(t).is_file()]
        if not have:
            continue
        runs = {k: policy_outcome(read_json(tables[k])) for k in have}
        mine = pooled(runs)
        against = [pooled({k: seeds[k]["rules"][rule] for k in have}) for rule in (LIVE, "freeze")]
        lines.append(
            f"| {name} ({', '.join(stem(paths[k]).rsplit('-', 1)[-1] for k in have)}) | "
            f"{sum(mine['correct']) / len(mine['correct']):.3f} | "
            f"{mean_tokens(runs.values()):,.0f} | "
            + " | ".join(format_paired(paired_difference(mine, other)) for other in against)
            + " |"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tables", required=True, help="the seed's tables' path before -freeze.json"
    )
    parser.add_argument("--games", required=True, help="the transcripts (played if missing)")
    parser.add_argument(
        "--live", action="store_true", help="checked stop played alone, not debate replayed"
    )
    parser.add_argument(
        "--policy",
        default="",
        help="a learned policy of the seed (results/policies/<tables' name>-POLICY.safetensors) "
        "played and answered by the checked vote, not a rule",
    )
    parser.add_argument("--out", required=True, help="the seed's JSON")
    parser.add_argument("eval_flags", nargs="*", help="eval.py's flags for the games, after --")
    args = parser.parse_args(argv)
    if args.live and args.policy:
        raise UsageError("--live and --policy: one at a time")
    games = Path(args.games)
    if not games.is_file():
        if not args.eval_flags:
            raise FileRefused(f"{games}: missing, and no eval.py flags after -- to play it")
        if args.policy:
            play_eval(games, args.eval_flags, f"mpdf={policy_file(args.tables, args.policy)}")
        else:
            (play_live if args.live else play_eval)(games, args.eval_flags)
    if args.policy:
        result = policy_result(games, args.tables, args.policy)
    else:
        result = (live_result if args.live else seed_result)(games, args.tables)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    if not args.policy:
        print(checked_table([args.out]))


if __name__ == "__main__":
    with user_errors():
        main()
