"""The reward rules' table (docs/design.md §8): each LLM-weight run trained again under them (the
training reward reads only the `Answer:` field; a rollout with a completion cut off at the token
budget earns 0) beside the run it repeats, which read answers as the evaluation does: their curves
(mean reward, truncated share, trained tokens, held-out answer) and their test answer against the
peers' vote on the same 300 questions; and whether the rerun collapsed."""

from experiments.tables import RESULTS, load, missing, pooled, read_metrics, summary_of
from stats import format_paired, paired_difference

# (what the runs are, the lenient run, its rerun under the rules, their tables' file parts), the
# leader's test answer over its peers' round-0 solutions against those peers' vote
PAIRS = (
    ("aggregator, 5e-4, seed 0", "mlpo-aggregator-varied-seed0", "aggregator", 0),
    ("MLPO leader, 5e-4, seed 0", "mlpo-team-varied-seed0", "leader", 0),
    *(
        (
            f"aggregator, 1e-4, seed {s}",
            f"mlpo-aggregator-varied-lr1e-4-seed{s}",
            "aggregator-lr1e-4",
            s,
        )
        for s in (0, 1, 2)
    ),
)


def strict(run):
    """The run's name under the reward rules (experiments/team_pieces.STRICT)."""
    return run.replace("-seed", "-strict-seed")


def curve(run):
    """A run's curve in words, or None where its metrics are not committed."""
    path = RESULTS / "llm" / f"{run}.metrics.jsonl"
    if not path.exists():
        return None
    val, train = read_metrics(path)
    rewards = [r["mean_reward"] for r in train]
    low = min(range(len(rewards)), key=rewards.__getitem__)
    after = [r["truncated"] for r in train[2:] if "truncated" in r]
    return {
        "reward": f"{rewards[0]:.3f} → {rewards[1]:.3f}, least {rewards[low]:.3f} "
        f"(step {low + 1}), last {rewards[-1]:.3f}",
        "truncated": f"{max(after):.0%}" if after else "not logged",
        "tokens": f"{train[0]['tokens']:.0f} → {max(r['tokens'] for r in train):.0f}",
        "held_out": f"{val[0][1]:.2f} → {val[-1][1]:.2f}" if val else "–",
        "collapsed": rewards[low] < rewards[0] / 2 or bool(after and max(after) > 0.05),
    }


def against_the_vote(part, seed):
    """The leader's test answer minus its peers' vote on the same questions, or None."""
    summary = summary_of(load(f"tables/arith300-team-varied-seed{seed}-{part}.json"))
    if summary is None:
        return None, None
    vote = {"question_ids": summary["question_ids"], "correct": summary["peer_vote_correct"]}
    return summary, vote


def reward_rule_table():
    lines = [
        "| run | reward read | mean reward, step 1 → 2, least, last | truncated share after step "
        "2, most | trained tokens, step 1 → most | held-out answer, first → last | test answer "
        "(300), leader − its peers' vote [95% CI] (disagree) | collapsed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    waiting = []
    for what, run, part, seed in PAIRS:
        for rule, name, file_part in (
            ("evaluation's (lenient)", run, part),
            ("`Answer:` field, cut-off pays 0", strict(run), f"{part}-strict"),
        ):
            shape = curve(name)
            summary, vote = against_the_vote(file_part, seed)
            if shape is None:
                waiting.append(name)
                continue
            test = "–"
            if summary:
                test = f"{summary['accuracy']:.3f}, " + format_paired(
                    paired_difference(summary, vote)
                )
            lines.append(
                f"| {what} | {rule} | {shape['reward']} | {shape['truncated']} | "
                f"{shape['tokens']} | {shape['held_out']} | {test} | "
                f"{'yes' if shape['collapsed'] else 'no'} |"
            )
    pooled_lines = []
    for rule, suffix in (("lenient", ""), ("under the rules", "-strict")):
        found = {s: against_the_vote(f"aggregator-lr1e-4{suffix}", s) for s in (0, 1, 2)}
        found = {s: pair for s, pair in found.items() if pair[0]}
        if found:
            leader = pooled({s: pair[0] for s, pair in found.items()})
            vote = pooled({s: pair[1] for s, pair in found.items()})
            seeds = ", ".join(map(str, found))
            pooled_lines.append(
                f"- the aggregator at 1e-4, {rule} (seeds {seeds}), leader − vote: "
                f"{format_paired(paired_difference(leader, vote))}"
            )
    text = "\n".join(lines) + ("\n\n" + "\n".join(pooled_lines) if pooled_lines else "")
    if waiting:
        text += "\n\n" + missing(*(f"llm/{name}.metrics.jsonl" for name in waiting))
    return text
