"""The documents' result tables, written from the committed files in results/ (never typed by hand).

    python -m experiments.report            # print every table
    python -m experiments.report --write    # replace each <!-- report:NAME --> ...
                                            # <!-- /report:NAME --> block of README.md and
                                            # results/README.md with its table

README.md holds the headline (`headline`); results/README.md every table and study (tables.py,
studies.py, team_tables.py, revision_tables.py, speed_tables.py, dtype_tables.py), and the
headline's other studies in a sentence each (`headline-studies`).

A table whose files are not all in results/ yet says which pieces are missing (experiments/run.py
makes them).
"""

import argparse
import re
import sys
from pathlib import Path

from deliberate import ACTION_KINDS
from experiments.checked_steps import checked_table
from experiments.demo_tables import committed_figure
from experiments.dtype_tables import dtype_accuracy_table, dtype_bench_table
from experiments.onpolicy_pieces import ALGOS as ONPOLICY_ALGOS
from experiments.onpolicy_pieces import ONPOLICY_PARTS
from experiments.revision_tables import revision_skill_table
from experiments.reward_tables import reward_rule_table
from experiments.rule_pieces import LOSSES, loss_seeds
from experiments.rule_tables import (
    blind_table,
    frontier_table,
    learned,
    losses_table,
    onpolicy_table,
    rules_target_table,
)
from experiments.speed_tables import bench_table, cache_table, profile_table
from experiments.split_pieces import JOINT_FLAGS, TEXT_SFT, VIEW_FLAGS, VIEW_SFT
from experiments.split_pieces import PREFIX as SPLIT_PREFIX
from experiments.split_pieces import TRAINED as SPLIT_TRAINED
from experiments.split_tables import (
    split_agents_table,
    split_cost_table,
    split_revision_table,
    split_target_table,
    split_team_table,
)
from experiments.studies import after_table, llm_curves, lora_table, study_table, temperature_table
from experiments.tables import (
    auroc_table,
    by_seed,
    corpus_table,
    load,
    mean,
    missing,
    mutation_table,
    pooled,
    protocol_table,
    reward_scale_table,
    scaling_table,
    seeds_table,
    summary_of,
    weight_gap,
)
from experiments.team_tables import (
    action_value_table,
    competent_team_table,
    debate_training_sentence,
    refine_table,
    refine_value_table,
    target_table,
    team_change,
    team_fixed_protocols,
    team_sentence,
)
from experiments.teams import TEAMS, team_rl_algos
from stats import format_paired, paired_difference, sample_std

ROOT = Path(__file__).resolve().parents[1]

DOCUMENTS = ("README.md", "results/README.md")
# the seeds whose checked-steps file is made (experiments/checked_steps.py: debate's games read,
# or checked stop played live), and the policies that read the check, set against it
CHECKED_SEEDS = (0, 1, 2)
CHECKED_POLICIES = ("sft-text", "softrank-cost0-text")
# the same on arith with team varied (checked stop played live), beside its earlier policies
VARIED_CHECKED_SEEDS = (0, 1, 2)
VARIED_CHECKED_POLICIES = ("sft", "softrank-cost0", "sft-text")
HEADLINE = {  # table a's protocols, in the headline's order: file part -> what the reader calls it
    "softrank": "SoftRankPO (learned)",
    "grpo": "GRPO (learned, the same loss on z-scored rewards)",
    "sc": "self-consistency (12 samples, debate's budget)",
    "vanilla": "one greedy answer",
    "persist": "the team's vote after round 0",
    "ppo": "PPO (learned)",
    "sft": "SFT, stage 1 alone (learned)",
    "debate": "debate (every agent REFINEs every round)",
}


def action_shares(summary):
    """persist/refine/concede shares of an eval.py summary (or a part of it), "" without actions."""
    if "actions" not in summary:
        return ""
    return "/".join(f"{summary['actions'][k]:.2f}" for k in ACTION_KINDS)


def eval_table(run, regime):
    """A demo's eval.py JSON (with a reference) as a table: each protocol's accuracy, cost,
    actions, its paired difference with the reference, and its committed full-size figure
    (experiments/demo_tables.py) in the demo's `regime`."""
    protocols = {k: s for k, s in run.items() if isinstance(s, dict) and "accuracy" in s}
    reference = run["config"]["reference"]
    lines = [
        "| protocol | accuracy ± s.e. | tokens/q | actions p/r/c | "
        f"vs {reference} [95% CI] (disagree) | committed: mean ± std (seeds × questions) |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in protocols.items():
        paired = "" if name == reference else format_paired(s["vs_reference"])
        lines.append(
            f"| `{name}` | {s['accuracy']:.3f} ± {s['stderr']:.3f} | "
            f"{s['tokens_per_question']:.0f} | {action_shares(s)} | {paired} | "
            f"{committed_figure(regime, name)} |"
        )
        # task split: the questions dealt among the agents and the shared ones, each on its row
        for part, p in s.get("parts", {}).items():
            lines.append(
                f"| ↳ {part} questions ({p['n']}) | {p['accuracy']:.3f} | "
                f"{p['tokens_per_question']:.0f} | {action_shares(p)} |  |  |"
            )
    n = next(iter(protocols.values()))["n"]
    config = run["config"]
    return "\n".join(lines) + (
        f"\n\n{n} `{config.get('task', 'arith')}` test questions (seed {config['seed']}), "
        f"{config['agents']} agents, {config['rounds']} rounds"
    )


def demo_table():
    """The last `make demo`'s tables (results/demo/make-demo.json: eval.py's JSONs and the run's
    time): the untrained backbone's, then the competent team's and the split task's where the demo
    played them."""
    run = load("demo/make-demo.json")
    if run is None or not run["config"].get("reference"):  # none, or the demo before its reference
        return missing("demo/make-demo.json").replace("experiments.run", "experiments.make_demo")
    timing = run["make_demo"]
    text = eval_table(run, "arith") + (
        f". `make demo` took {timing['seconds']:.0f} s in a fresh clone with a cold generation "
        f"cache, at commit {timing['commit']} ({run['machine']}; `make setup model` before it: "
        f"{timing['setup_seconds']:.0f} s)."
    )
    if "competent" in run:
        team = run["competent"]["config"]["models"]
        text += (
            "\n\nThe competent regime, the same run: team `varied` "
            f"(`--models {team}`).\n\n" + eval_table(run["competent"], "competent") + "."
        )
    if "split" in run:
        team = run["split"]["config"]["models"]
        text += (
            "\n\nWhere the facts are split, the same run: team `split` "
            f"(`--models {team}`), each part of the questions on its row.\n\n"
            + eval_table(run["split"], "split")
            + "."
        )
    return text


def headline():
    """README's results: table a compact, paired against SoftRankPO."""
    runs = {part: by_seed("arith300", part) for part in HEADLINE}
    if not all(len(r) == 3 for r in runs.values()):
        return missing(*(f"tables/arith300-seed*-{p}.json" for p, r in runs.items() if len(r) < 3))
    ours = pooled(runs["softrank"])
    lines = [
        "| protocol (3 agents, 3 rounds; 300 arith test questions × 3 seeds) | accuracy, mean ± "
        "sample std | tokens/q | SoftRankPO − protocol, 900 pairs [95% CI] (disagree) |",
        "|---|---|---|---|",
    ]
    for part, label in HEADLINE.items():
        accuracy = [s["accuracy"] for s in runs[part].values()]
        tokens = mean([s["tokens_per_question"] for s in runs[part].values()])
        paired = (
            "" if part == "softrank" else format_paired(paired_difference(ours, pooled(runs[part])))
        )
        lines.append(
            f"| {label} | {mean(accuracy):.3f} ± {sample_std(accuracy):.3f} | {tokens:.0f} | "
            f"{paired} |"
        )
    return "\n".join(lines)


def headline_studies():
    """results/README.md's summary of the other studies: one sentence each."""
    return "\n".join(f"- {s}" for s in headline_sentences())


def headline_sentences():
    """One sentence each on transfer, scaling, reward scale, MAGRPO and MLPO, from their files."""
    sentences = []
    mawps = {p: by_seed("mawps300", p) for p in ("vanilla", "persist", "softrank-arith")}
    if all(len(r) == 3 for r in mawps.values()):
        arith_policy = pooled(mawps["softrank-arith"])
        acc = {p: mean([s["accuracy"] for s in r.values()]) for p, r in mawps.items()}
        vs = {p: format_paired(paired_difference(arith_policy, pooled(mawps[p]))) for p in mawps}
        sentences.append(
            "**Transfer** (300 mawps questions × 3 seeds): the arith policy "
            f"{acc['softrank-arith']:.3f} against the team's vote {acc['persist']:.3f} "
            f"({vs['persist']}) and one greedy answer {acc['vanilla']:.3f} ({vs['vanilla']})."
        )
    agents = [summary_of(load(f"tables/scaling-a{a}-r3-{p}.json")) for a in (2, 5) for p in
              ("persist", "softrank")]  # fmt: skip
    rounds = [summary_of(load(f"tables/scaling-a3-r{r}-softrank.json")) for r in (1, 5)]
    if all(agents) and all(rounds):
        sentences.append(
            "**Scaling** (seed 0): from 2 to 5 agents the policy goes "
            f"{agents[1]['accuracy']:.3f} → {agents[3]['accuracy']:.3f} (the team's vote "
            f"{agents[0]['accuracy']:.3f} → {agents[2]['accuracy']:.3f}); from 1 to 5 rounds "
            f"{rounds[0]['accuracy']:.3f} → {rounds[1]['accuracy']:.3f}."
        )
    gaps = {
        algo: [weight_gap(algo, v) for v in ("x0.1", "x10", "exp")] for algo in ("softrank", "grpo")
    }
    if "–" not in gaps["softrank"] + gaps["grpo"]:
        sentences.append(
            "**Reward scale** (rewards × 0.1, × 10, exp): SoftRankPO's final weights move by at "
            f"most {max(map(float, gaps['softrank'])):.1e} from the unscaled run's (it sees only "
            f"ranks), GRPO's by up to {max(map(float, gaps['grpo'])):.2f}."
        )
    magrpo = after_differences("magrpo-L1-seed{}-parallel", "mpdf-persist", "untrained-parallel")
    debates = [
        summary_of(load(f"after/magrpo-L1-seed{s}-debate.json"), "debate") for s in (0, 1, 2)
    ]
    if magrpo and all(debates):
        vote = [mean([d["accuracy_per_round"][t] for d in debates]) for t in (0, 1)]
        sentences.append(
            "**MAGRPO** (the agents' weights, trained on parallel answers, 24 steps): the team's "
            f"vote {mean(magrpo):+.3f} (sample std {sample_std(magrpo):.3f} over {len(magrpo)} "
            "seeds) against the untrained agents' on 300 test questions; one REFINE round of the "
            f"trained agents takes their vote from {vote[0]:.3f} to {vote[1]:.3f} (mean of the "
            "seeds)."
        )
    adapters = after_differences(
        "magrpo-lora-lr5e-4-L1-seed{}-parallel", "mpdf-persist", "magrpo-sum-L1-seed{}-parallel"
    )
    if adapters:
        sentences.append(
            "**Adapters** (the same MAGRPO preset, rank-4 LoRA at lr 5e-4, each team a 5 MB file): "
            f"the team's vote {mean(adapters):+.3f} (sample std {sample_std(adapters):.3f} over "
            f"{len(adapters)} seeds, paired) against full fine-tuning of the same seed."
        )
    mlpo = after_differences("mlpo-L1-seed{}-leader", None, None)
    if mlpo:
        sentences.append(
            f"**MLPO** (a trained leader over 3 untrained peers, 24 steps): the leader's answer "
            f"{mean(mlpo):+.3f} (sample std {sample_std(mlpo):.3f} over {len(mlpo)} seeds) against "
            "its peers' own vote on the same questions."
        )
    debate_training = debate_training_sentence()
    teams = [text for team in TEAMS if (text := team_sentence(team))]
    return sentences + ([debate_training] if debate_training else []) + teams


def after_differences(name, protocol, untrained):
    """Per seed, a trained run's accuracy minus the untrained one's (results/after/) on the same
    questions; untrained None: minus the peers' vote recorded with the leader's answers."""
    diffs = []
    for seed in (0, 1, 2):
        mine = summary_of(load(f"after/{name.format(seed)}.json"), protocol)
        if mine is None:
            return []
        if untrained is None:
            theirs = {"question_ids": mine["question_ids"], "correct": mine["peer_vote_correct"]}
        else:  # the untrained run, or a reference run of the same seed
            theirs = summary_of(load(f"after/{untrained.format(seed)}.json"), protocol)
            if theirs is None:
                return []
        diffs.append(paired_difference(mine, theirs)["diff"])
    return diffs


NO_PNG = "(no PNG: `pip install matplotlib`, then rerun `python -m experiments.report --write`)"


# the learned policies of the rules' frontier: the split team's (stage 2 and on-policy) and team
# varied's on arith
SPLIT_LEARNED = (*SPLIT_TRAINED, *ONPOLICY_PARTS)
VARIED_LEARNED = ("sft", *team_rl_algos("varied"), *TEXT_SFT)
# the policies read on the slices where a rule is blind: the best of stage 2, joint credit and the
# state that reads what the texts say is missing
BLIND_LEARNED = ("softrank-cost0", *JOINT_FLAGS, *VIEW_SFT, *VIEW_FLAGS, *TEXT_SFT)


def checked_files(prefix, seeds):
    """The checked-steps study's file of each seed, in order."""
    return [ROOT / f"results/study/checked-steps/{prefix}-seed{k}.json" for k in seeds]


def policy_files(prefix, seeds, names):
    """Each policy's table per seed, in order: {name: [path, ...]}."""
    return {
        name: [ROOT / f"results/tables/{prefix}-seed{k}-{name}.json" for k in seeds]
        for name in names
    }


TABLES = {
    "headline": headline,
    "headline-studies": headline_studies,
    "demo": demo_table,
    "study-temperature": temperature_table,
    "study-levers": study_table,
    "bench": bench_table,
    "cache-bench": cache_table,
    "profile": profile_table,
    "dtype-bench": dtype_bench_table,
    "dtype-accuracy": dtype_accuracy_table,
    "auroc": auroc_table,
    "mutation": mutation_table,
    "table-arith200-demo": lambda: protocol_table(
        "arith200-demo-seed0",
        ["vanilla", "sc", "debate", "persist", "sft", "grpo", "softrank"],
        "softrank",
    ),
    "table-a": lambda: seeds_table(
        "arith300",
        ["vanilla", "cot", "sc", "debate", "persist", "sft", "ppo", "grpo", "softrank"],
        "softrank",
        pictures=True,
    ),
    "table-b": lambda: seeds_table(
        "mawps300",
        ["vanilla", "persist", "debate", "softrank-arith", "softrank-mawps"],
        "softrank-mawps",
    ),
    "table-c": reward_scale_table,
    "table-d": lambda: scaling_table(
        [(agents, 3) for agents in (2, 3, 4, 5)] + [(3, rounds) for rounds in (1, 2, 4, 5)]
    ),
    # a competent team's seed-0 policy trained at 3 rounds, played at 1-5 (3: its table)
    **{
        f"scaling-{team}": lambda team=team: scaling_table(
            [(3, rounds) for rounds in (1, 2, 3, 4, 5)],
            file=lambda agents, rounds, p: (
                f"tables/arith300-team-{team}-seed0-{p}.json"
                if rounds == 3
                else f"tables/scaling-{team}-a{agents}-r{rounds}-{p}.json"
            ),
        )
        for team in ("worked", "varied")
    },
    "llm-magrpo": lambda: llm_curves("magrpo-L1", "MAGRPO run"),
    "llm-mlpo": lambda: llm_curves("mlpo-L1", "MLPO run"),
    "llm-after": after_table,
    "llm-magrpo-sum": lambda: llm_curves("magrpo-sum-L1", "MAGRPO run, --loss-agg sum"),
    "llm-lora-curves": lambda: llm_curves("magrpo-lora-lr", "MAGRPO run, LoRA rank 4"),
    "llm-lora": lora_table,
    "refine": refine_table,
    "action-values": lambda: action_value_table(
        {team: f"arith-team-{team}" for team in TEAMS} | {"split": SPLIT_PREFIX}
    ),
    "refine-value": lambda: refine_value_table(TEAMS),
    "revision-varied": lambda: revision_skill_table("arith300-team-varied"),
    "revision-varied-trained": lambda: revision_skill_table(
        "arith300-trained-varied", before="arith300-team-varied"
    ),
    "revision-varied-trained-lr1e-4": lambda: revision_skill_table(
        "arith300-trained-varied-lr1e-4", before="arith300-team-varied"
    ),
    "llm-magrpo-revision": lambda: llm_curves("magrpo-revision-varied", "MAGRPO revision run"),
    "reward-rules": reward_rule_table,
    "split-agents": split_agents_table,
    "split-revision": split_revision_table,
    "split-team": split_team_table,
    "split-target": split_target_table,
    "split-cost": split_cost_table,
    "split-checked": lambda: checked_table(
        checked_files(SPLIT_PREFIX, CHECKED_SEEDS),
        [ROOT / f"results/slices/{SPLIT_PREFIX}-seed{k}.json" for k in CHECKED_SEEDS],
        {
            **policy_files(SPLIT_PREFIX, CHECKED_SEEDS, CHECKED_POLICIES),
            # the text policy's own games answered by the checked vote
            "sft-text, the checked vote": [
                ROOT / f"results/study/checked-steps/{SPLIT_PREFIX}-seed{k}-sft-text.json"
                for k in CHECKED_SEEDS
            ],
        },
    ),
    "rules-split": lambda: frontier_table(
        SPLIT_PREFIX, learned(SPLIT_LEARNED), {"oracle": "the oracle (reads the gold answer)"}
    ),
    "rules-target-split": lambda: rules_target_table(
        SPLIT_PREFIX, SPLIT_LEARNED, debate_budget=0.5
    ),
    "rules-target-varied": lambda: rules_target_table("arith300-team-varied", VARIED_LEARNED),
    "blind-split": lambda: blind_table(SPLIT_PREFIX, learned(BLIND_LEARNED)),
    **{
        f"losses-{prefix}-{algo}-{rule}": lambda p=prefix, a=algo, r=rule: losses_table(
            p, a, r, loss_seeds(a)
        )
        for prefix, pairs in LOSSES.items()
        for algo, rule in pairs
    },
    **{
        f"onpolicy-{algo}": lambda algo=algo: onpolicy_table(SPLIT_PREFIX, algo)
        for algo in ONPOLICY_ALGOS
    },
    "rules-varied": lambda: frontier_table("arith300-team-varied", learned(VARIED_LEARNED)),
    "varied-checked": lambda: checked_table(
        checked_files("arith300-team-varied", VARIED_CHECKED_SEEDS),
        policies=policy_files(
            "arith300-team-varied", VARIED_CHECKED_SEEDS, VARIED_CHECKED_POLICIES
        ),
    ),
    **{
        f"team-{team}": lambda team=team: competent_team_table(team)
        for team in TEAMS
        if team not in ("revisers", "mixed")
    },
    "team-revised-vs-varied": lambda: team_change("varied", "revised"),
    **{
        f"target-{team}": lambda team=team: target_table(team)
        for team in ("worked", "varied", "revised")
    },
    **{
        f"team-{team}": lambda team=team: seeds_table(
            f"arith300-team-{team}",
            [*team_fixed_protocols(team), "sft", "grpo", "softrank-cost0", "softrank"],
            "softrank",
            pictures=True,
        )
        for team in ("revisers", "mixed")
    },
    "corpus-arith-demo": lambda: corpus_table(
        ["arith-demo-sft", "arith-demo-grpo", "arith-demo-softrank", "arith-demo-softrank-long"]
    ),
}


def fill(document, tables):
    """The document with each of its report blocks replaced by its table; image links relative to
    it."""
    path = ROOT / document
    text = path.read_text()
    for name, table in tables.items():
        block = re.compile(
            rf"<!-- report:{re.escape(name)} -->.*?<!-- /report:{re.escape(name)} -->", re.S
        )
        if document != "README.md":  # results/README.md: its links start inside results/
            table = table.replace("](results/", "](")
        text = block.sub(
            lambda _: f"<!-- report:{name} -->\n{table}\n<!-- /report:{name} -->", text
        )
    return text


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the documents' report blocks")
    args = parser.parse_args()
    tables = {name: make() for name, make in TABLES.items()}
    if not args.write:
        for name, text in tables.items():
            print(f"<!-- report:{name} -->\n{text}\n<!-- /report:{name} -->\n")
        return
    texts = {document: fill(document, tables) for document in DOCUMENTS}
    for name in tables:
        if not any(f"<!-- report:{name} -->" in text for text in texts.values()):
            print(f"no document has a block for {name!r}", file=sys.stderr)
    for document, text in texts.items():
        (ROOT / document).write_text(text)


if __name__ == "__main__":
    main()
