"""The pieces of the trained teams (experiments/teams.py): each team's table seed by seed, the
MLPO leader over a competent team, the revision turn measured and trained, and the leader as an
aggregator; experiments/pieces.py holds them with every other piece."""

from experiments.llm_pieces import LORA_LR, MAGRPO_LORA, PY, RUNS, committed, llm_run
from experiments.piece_kit import (
    TABLE_GAME,
    TABLE_SEEDS,
    TABLE_TASKS,
    merged,
    policy_pieces,
    table,
    table_pieces,
    table_policy,
)
from experiments.teams import (
    COMPETENT_RL_ALGOS,
    TEAM_GAME,
    TEAMS,
    team_adapters,
    team_flags,
    team_members,
    team_rl_algos,
)


def team_protocols(team):
    """A team's table protocols: the vote, each learned policy, self-consistency and debate."""
    return {
        "persist": "mpdf-persist",
        **{algo: f"mpdf={{arith-{algo}}}" for algo in ("sft", *team_rl_algos(team))},
        "sc": "sc",
        "debate": "debate",
    }


def team_pieces(team, seed):
    """A trained team's table for one seed: its SFT, SoftRankPO and GRPO policies, every fixed
    protocol of the same team and one greedy answer of each distinct member (a team of 3 copies of
    it: vanilla is agent 0's answer), on table a's 300 arith test questions."""
    name = f"arith300-team-{team}-seed{seed}"
    members = team_members(team)
    vanilla = {
        f"table-{name}-vanilla-m{j}": {
            **table(
                f"{name}-vanilla-m{j}",
                [*TABLE_TASKS["arith"], *TABLE_GAME, "--models", ",".join([member] * 3)]
                + ["--split", "test", "--n", "300", "--seed", str(seed), "--protocols", "vanilla"],
            ),
            "needs": team_adapters(team),
        }
        for j, member in enumerate(members)
    }
    # what each learned policy's REFINEs and CONCEDEs gain over PERSIST in its test games
    values = {
        f"refine-value-{name}-{algo}": {
            "command": [PY, "-m", "experiments.refine_value", *TABLE_TASKS["arith"], *TABLE_GAME]
            + [*team_flags(team), "--n", "300", "--seed", str(seed)]
            + ["--policy", table_policy("arith", algo, seed, team)]
            + ["--out", f"results/refine/{name}-{algo}.json"],
            "outputs": [f"results/refine/{name}-{algo}.json"],
            "needs": [table_policy("arith", algo, seed, team), *team_adapters(team)],
        }
        for algo in ("sft", *team_rl_algos(team))
    }
    return {
        **policy_pieces("arith", seed, team_rl_algos(team), team),
        **vanilla,
        **table_pieces(name, "arith", seed, team_protocols(team), team=team),
        **values,
    }


# the MLPO leader over a competent team as its frozen peers (train_mlpo.py --peers):
# MLPO's preset, the leader a rank-8 adapter continued from the worked-solution one (each
# piece names its number of candidate questions)
LEADER_FLAGS = (
    "train_mlpo.py --algo magrpo --agents 3 --task arith --level 1 --group 8 "
    "--questions-per-step 8 --rollout-temperature 0.7 --max-new-tokens 96 --steps 24 "
    "--eval-every 6 --val-n 100 --save-every 6 --lora-rank 8 --lr 5e-4"
).split() + ["--init-adapter", committed("results/agents/worked-L1-r8-seed0.pt")]


def leader_pieces(team, seed, strict=False):
    """A competent team's MLPO leader of one seed (its adapter committed), then its answer over
    the team's round-0 solutions on the seed's 300 test questions (the table's `leader` row); with
    `strict`, the same trained under the reward rules (STRICT), its PEFT folder committed."""
    variant, rule = STRICT if strict else ("", [])
    run = f"mlpo-team-{team}{variant}-seed{seed}"
    adapter = f"results/agents/{run}" if strict else f"results/agents/{run}.pt"
    name = f"arith300-team-{team}-seed{seed}-leader{variant}"
    test = ["--split", "test", "--n", "300", "--seed", str(seed)]
    flags = [*LEADER_FLAGS, *rule, "--questions", "256", "--peers", TEAMS[team]]
    training = llm_run(run, flags + [*TEAM_GAME.get(team, []), "--seed", str(seed)], not strict)
    if strict:
        training["copies"][RUNS / run / "adapter"] = adapter
    return {
        f"llm-{run}": {**training, "needs": team_adapters(team)},
        f"table-{name}": {
            **table(
                name,
                [*TABLE_TASKS["arith"], "--agents", "3", "--rounds", "0", *team_flags(team)]
                + [*test, "--protocols", f"leader=default+{adapter}"],
            ),
            "needs": [adapter, *team_adapters(team)],
        },
    }


# the leader as an aggregator (docs/design.md §8): the same preset over team varied's whole
# solutions, its training questions balanced between those the team's vote gets right and those it
# gets wrong (the easy ones kept for that), from twice the candidates since the vote fails on few
AGGREGATOR_FLAGS = [
    *LEADER_FLAGS,
    *("--whole-solutions", "--filter-easy", "0", "--balance-vote", "--questions", "512"),
]


# the reward rules (train_mlpo.py's --help): the reward reads only the one `Answer:` field, and a
# rollout with a completion cut off at the token budget earns 0. The runs without a `-strict` in
# their name predate them: their reward read answers as the evaluation does (the last number of the
# text when no answer line parses) and paid a cut-off completion as any other.
STRICT = ("-strict", ["--truncated", "zero"])


def at_rate(lr):
    """(name suffix, flags) of a run at learning rate `lr`: nothing at the preset's, else the rate
    in the run's name and its --lr (flags_once puts it in the preset's place)."""
    return ("", []) if lr == LORA_LR else (f"-lr{lr}", ["--lr", lr])


def aggregator_pieces(seed, lr=LORA_LR, strict=False):
    """The aggregator leader of one seed (its PEFT folder committed), then its answer over team
    varied's round-0 whole solutions on the seed's 300 test questions; at another learning rate
    than the preset's, or under the reward rules (`strict`), a run and a table named by it."""
    variant, rate = at_rate(lr)
    rule_name, rule = STRICT if strict else ("", [])
    variant += rule_name
    run = f"mlpo-aggregator-varied{variant}-seed{seed}"
    adapter = f"results/agents/{run}"
    name = f"arith300-team-varied-seed{seed}-aggregator{variant}"
    test = ["--split", "test", "--n", "300", "--seed", str(seed), "--whole-solutions"]
    flags = [*AGGREGATOR_FLAGS, *rate, *rule, "--peers", TEAMS["varied"], "--seed", str(seed)]
    training = llm_run(run, flags)
    training["copies"][RUNS / run / "adapter"] = adapter
    return {
        f"llm-{run}": {**training, "needs": team_adapters("varied")},
        f"table-{name}": {
            **table(
                name,
                [*TABLE_TASKS["arith"], "--agents", "3", "--rounds", "0", *team_flags("varied")]
                + [*test, "--protocols", f"leader=default+{adapter}"],
            ),
            "needs": [adapter, *team_adapters("varied")],
        },
    }


# what REFINE reads: peers' final answers (the game's default) or every solution whole
REFINE_VIEWS = {"answers": [], "whole": ["--whole-solutions"]}


def revision_pieces(seed, trained=""):
    """The revision skill of team varied's agents at the first decision of the seed's 300 test
    games, REFINE under each view against PERSIST and the CONCEDE of the seed's plain-ranks policy
    (experiments/revision_skill.py); with `trained`, of the agents that run trained instead (its
    agent<i> adapter folders)."""
    # a trained run's files are named by its setting: magrpo-revision-<setting>-seed<k>
    setting = trained.removeprefix("magrpo-revision-").removesuffix(f"-seed{seed}")
    name = f"arith300-{'trained-' + setting if trained else 'team-varied'}-seed{seed}"
    policy = table_policy("arith", "ranks", seed, "varied")
    if trained:
        adapters = [f"results/agents/{trained}/agent{i}" for i in range(3)]
        models = ["--models", ",".join(f"default+{a}" for a in adapters)]
    else:
        adapters, models = team_adapters("varied"), team_flags("varied")
    return {
        f"revision-{name}-{view}": {
            "command": [PY, "-m", "experiments.revision_skill", *TABLE_TASKS["arith"], *TABLE_GAME]
            + [*models, "--n", "300", "--seed", str(seed), "--policy", policy, *flags]
            + ["--out", f"results/revision/{name}-{view}.json"],
            "outputs": [f"results/revision/{name}-{view}.json"],
            "needs": [policy, *adapters],
        }
        for view, flags in REFINE_VIEWS.items()
    }


# the revision turn trained on-policy (docs/design.md §8): MAGRPO on debate from team varied's three
# adapters, one adapter per agent, each rewarded for its own revision (--reward revision), REFINE
# reading whole solutions; MAGRPO's LoRA preset and learning rate
REVISION_FLAGS = [
    *MAGRPO_LORA,
    *("--protocol", "debate", "--rounds", "1", "--separate-agents", "--reward", "revision"),
    *("--whole-solutions", "--lora-rank", "8", "--lr", LORA_LR),
    *("--init-adapter", ",".join(team_adapters("varied"))),
]


def revision_training_pieces(seed, lr=LORA_LR):
    """MAGRPO with the revision reward from team varied (its three adapter folders committed),
    then the trained team's revision skill under both views; at another learning rate than the
    preset's, a run named by it."""
    variant, rate = at_rate(lr)
    run = f"magrpo-revision-varied{variant}-seed{seed}"
    flags = [*REVISION_FLAGS, *rate, "--seed", str(seed)]
    training = llm_run(run, flags, agents=3)
    return {
        f"llm-{run}": {**training, "needs": team_adapters("varied")},
        **revision_pieces(seed, trained=run),
    }


TEAM_PIECES = {
    # a table per team, seed by seed (a seed's policies, then its protocols)
    **merged(team_pieces(team, seed) for seed in TABLE_SEEDS for team in TEAMS),
    **merged(
        leader_pieces(team, seed)
        for seed in TABLE_SEEDS
        for team in TEAMS
        if team_rl_algos(team) == COMPETENT_RL_ALGOS
    ),
    # the revision turn measured directly, before any training of it
    **merged(revision_pieces(seed) for seed in TABLE_SEEDS),
    # the revision turn trained, seed by seed
    **merged(revision_training_pieces(seed) for seed in TABLE_SEEDS),
    # seed 0's held-out vote fell at the preset's rate: the same at a fifth of it
    **merged(revision_training_pieces(seed, lr="1e-4") for seed in TABLE_SEEDS),
    # the aggregator at the preset's rate lost its answer line after its first step (seed 0), so
    # the seeds run at a fifth of it
    **aggregator_pieces(0),
    **merged(aggregator_pieces(seed, lr="1e-4") for seed in TABLE_SEEDS),
    # under the reward rules: the run that collapsed (the aggregator at the preset's rate, seed 0)
    # and team varied's MLPO leader, whose seed 0 fell the same way at step 2 and recovered; then
    # the aggregator at the rate that held, seed by seed
    **aggregator_pieces(0, strict=True),
    **leader_pieces("varied", 0, strict=True),
    **merged(aggregator_pieces(seed, lr="1e-4", strict=True) for seed in TABLE_SEEDS),
}
