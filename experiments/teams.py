"""The trained teams the tables retest (adapters on the default base, committed by the LLM
pieces), and the flags that make each one: their pieces are built in experiments/team_pieces.py,
their tables read in experiments/team_tables.py."""

from experiments.llm_pieces import LORA_LR, committed

# teams whose agents were trained (adapters on the default base, committed by the LLM
# pieces): three agents trained to revise (MAGRPO on debate, seed 0), and a mixed team of the
# untrained backbone, a parallel-trained agent and a debate-trained one; each with the meta-policy
# of every algorithm below and every fixed protocol, table a's game and questions
TEAMS = {
    "revisers": ",".join(["default+results/agents/magrpo-debate-L1-seed0.pt"] * 3),
    "mixed": f"default,default+results/agents/magrpo-lora-lr{LORA_LR}-L1-seed0.pt,"
    "default+results/agents/magrpo-debate-L1-seed0.pt",
    # three copies of the adapter trained on easy arith's worked solutions (llm_pieces)
    "worked": ",".join(["default+" + committed("results/agents/worked-L1-r8-seed0.pt")] * 3),
    # and three members that differ in skill and specialty: the adapter continued on REFINE
    # examples, the worked-solution adapter, and the sweep's rank-4 adapter
    "varied": ",".join(
        "default+" + committed(f"results/agents/{run}.pt")
        for run in ("worked-refine-L1-r8-seed0", "worked-L1-r8-seed0", "worked-L1-r4-seed0")
    ),
    # team varied's three agents after MAGRPO with the revision reward (seed 0's run at lr 1e-4,
    # the one whose held-out vote held), retested with the meta-policies as team varied was
    "revised": ",".join(
        f"default+results/agents/magrpo-revision-varied-lr1e-4-seed0/agent{i}" for i in range(3)
    ),
}
# the game flags a team plays with beyond the table's: the revised team was trained with REFINE
# and the leader reading whole solutions
TEAM_GAME = {"revised": ["--whole-solutions"]}
# softrank-cost0: SoftRankPO with REFINE free of its token cost (the study's base run; the default
# 0.5 per 1000 tokens makes a REFINE pay only where it changes the outcome): does a policy free to
# REFINE find the states where it pays?
TEAM_RL_ALGOS = ("softrank", "grpo", "softrank-cost0")
# the competent teams' tables add plain ranks (GOPO) and a leave-one-out baseline (C3), each on the
# same corpus
COMPETENT_RL_ALGOS = (*TEAM_RL_ALGOS, "ranks", "loo")


def team_rl_algos(team):
    """The RL algorithms of a team's table: a team of weak agents, or a competent one."""
    return TEAM_RL_ALGOS if team in ("revisers", "mixed") else COMPETENT_RL_ALGOS


def team_flags(team):
    """A trained team (TEAMS) as eval/sft/train_rl flags, with the game flags it plays with;
    "": the default homogeneous team."""
    return ["--models", TEAMS[team], *TEAM_GAME.get(team, [])] if team else []


def team_members(team):
    """A TEAMS team's distinct members, in order (a team of 3 copies has one)."""
    return list(dict.fromkeys(TEAMS[team].split(",")))


def team_adapters(team):
    """The committed adapter files a team's pieces need (written by the LLM pieces)."""
    return (
        [entry.partition("+")[2] for entry in TEAMS[team].split(",") if "+" in entry]
        if team
        else []
    )
