"""The pieces of the rules that decide when to talk (rules.py) beside the learned policies, on the
accuracy-token frontier: for `arith` with team varied and `split` with team split, seed by seed, the
gate and the trigger fitted on 200 validation questions (experiments/talk_rules.py), then debate of
1 and 2 rounds and each rule on the seed's 300 test questions, the questions of the teams'
committed tables (the vote, debate of 3 rounds, every learned policy); and on split the oracle, the
headroom of these actions. experiments/pieces.py holds them with every other piece."""

from experiments.llm_pieces import PY
from experiments.onpolicy_pieces import onpolicy_part
from experiments.piece_kit import TABLE_GAME, TABLE_SEEDS, TABLE_TASKS, merged, table
from experiments.split_pieces import ADAPTERS, PREFIX, SPLIT_GAME, SPLIT_TASK, TEAM, plays
from experiments.teams import team_adapters, team_flags

# a table's name prefix -> its game (task, team, rounds) and the adapters its team loads
GAMES = {
    "arith300-team-varied": (
        [*TABLE_TASKS["arith"], *TABLE_GAME, *team_flags("varied")],
        team_adapters("varied"),
    ),
    PREFIX: ([*SPLIT_TASK, *SPLIT_GAME, "--models", TEAM], ADAPTERS),
}
# the rules that need no fitting, by table name
FIXED_RULES = {
    "debate1": "debate-1",
    "debate2": "debate-2",
    "freeze": "freeze",
    "minority": "minority",
}
VALIDATION_QUESTIONS = "200"


def rule_pieces(prefix, seed):
    """One seed of a team's rules: the gate and the trigger fitted on its validation questions,
    then every rule's table on its test questions."""
    game, adapters = GAMES[prefix]
    name = f"{prefix}-seed{seed}"
    fitted = f"results/rules/{name}.json"
    validation = ["--split", "val", "--n", VALIDATION_QUESTIONS, "--seed", str(seed)]
    test = ["--split", "test", "--n", "300", "--seed", str(seed)]
    pieces = {
        f"rules-{name}": {
            "command": [PY, "-m", "experiments.talk_rules", "--out", fitted, "--"]
            + [*game, *validation, "--dtype", "float32"],
            "outputs": [fitted],
            "needs": adapters,
        }
    }
    protocols = {**FIXED_RULES, "gate": f"gate={fitted}", "trigger": f"trigger={fitted}"}
    if prefix == PREFIX:
        protocols["oracle"] = "mpdf-oracle"
    for short, protocol in protocols.items():
        needs = [fitted] if "=" in protocol else []
        pieces[f"table-{name}-{short}"] = {
            **table(f"{name}-{short}", [*game, *test, "--protocols", protocol]),
            "needs": needs + adapters,
        }
    return pieces


# where a learned policy loses to a rule (experiments/rule_losses.py): on split, the policy that
# matched debate against the rule that REFINEs while the team disagrees, and the same policy
# trained on its own games (experiments/onpolicy_pieces.py), to see whether the states where it
# loses were the ones a corpus of the SFT policy's games left out, and the policies whose REFINE
# wins its ties, everywhere or while the team disagrees (split_pieces.REFINE_COSTS, TIES_FLAGS), and
# the policies that learn of the vote's later gain (split_pieces.LATER_FLAGS)
LOSSES = {
    PREFIX: [
        ("softrank-cost0", "freeze"),
        (onpolicy_part("softrank-cost0", 2), "freeze"),
        ("softrank-cost-0.1", "freeze"),
        ("softrank-cost0-disagree0.1", "freeze"),
        ("softrank-cost0.1-disagree0.3", "freeze"),
        ("softrank-cost0-later0.5", "freeze"),
        ("softrank-cost0-later0.5-rollouts", "freeze"),
    ]
}


def loss_seeds(algo):
    """The seeds a policy's losses are measured on: those its table plays, and seed 0 alone for the
    one that plays freeze game for game on every seed."""
    if algo == "softrank-cost0.1-disagree0.3":
        return (0,)
    return tuple(seed for seed in TABLE_SEEDS if plays(algo, seed))


def loss_pieces(prefix, seed):
    """One seed's comparisons of a learned policy and a rule on the test questions' games."""
    game, adapters = GAMES[prefix]
    name = f"{prefix}-seed{seed}"
    test = ["--split", "test", "--n", "300", "--seed", str(seed), "--dtype", "float32"]
    pieces = {}
    for algo, rule in LOSSES.get(prefix, []):
        if seed not in loss_seeds(algo):
            continue
        policy = f"results/policies/{name}-{algo}.safetensors"
        out = f"results/rules/losses-{name}-{algo}-{rule}.json"
        pieces[f"losses-{name}-{algo}-{rule}"] = {
            "command": [PY, "-m", "experiments.rule_losses", "--policy", policy, "--rule", rule]
            + ["--out", out, "--", *game, *test],
            "outputs": [out],
            "needs": [policy, *adapters],
        }
    return pieces


# split first: where REFINE pays, the rules have the most to decide
RULE_PIECES = merged(
    {**rule_pieces(prefix, seed), **loss_pieces(prefix, seed)}
    for prefix in (PREFIX, "arith300-team-varied")
    for seed in TABLE_SEEDS
)
