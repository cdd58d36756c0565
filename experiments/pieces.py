"""The pieces behind results/ (experiments/run.py runs them): every reported number's command and
files.

A piece is a dict: "command" (argv, run from the repository root), "outputs" (files the command
writes in results/) or "copies" (files under runs/results/ copied into results/ when the command is
done), and "needs" (files that must exist first: a policy trained by another piece, LLM weights out
of git).
"""

from experiments.bench_pieces import BENCH_PIECES
from experiments.llm_pieces import LLM_PIECES, PY
from experiments.mutation_modules import MODULES as MUTATION_MODULES
from experiments.onpolicy_pieces import ONPOLICY_PIECES
from experiments.piece_kit import (
    MAWPS,
    SFT_STATE,
    TABLE_GAME,
    TABLE_RL_ALGOS,
    TABLE_SEEDS,
    TABLE_TASKS,
    flags_once,
    merged,
    policy_pieces,
    table,
    table_pieces,
    table_policy,
    trained,
)
from experiments.rule_pieces import RULE_PIECES
from experiments.split_pieces import SPLIT_PIECES, STUDY_SCRIPTS
from experiments.team_pieces import TEAM_PIECES
from experiments.teams import team_adapters, team_flags

# The demo's budget (Makefile): 3 agents, 2 rounds, 32 training questions, 8 for validation; the
# agents at T = 0.7, the default when these pieces were computed (now 0.5: the temperature study)
DEMO_GAME = ["--task", "arith", "--agents", "3", "--rounds", "2", "--temperature", "0.7"]
DEMO_TRAIN = DEMO_GAME + ["--questions", "32", "--val-n", "8"]
# the study that chose the defaults: 200 validation questions of the arith training pool
# (seed 0), 3 agents
STUDY_GAME = "--task arith --split val --n 200 --seed 0 --agents 3 --rounds 2".split()
STUDY_TEMPERATURES = ("0.3", "0.5", "0.7", "1.0")
# the study's training runs: 128 training questions after the 200 validation ones (--val-n 200 keeps
# them out), the same game; the base run is SoftRankPO with train_rl.py's defaults when the study
# ran (spelled out here, so the pieces keep their meaning when the defaults change), each lever
# changes one setting; "defaults": the defaults the study chose, all at once
STUDY_TRAIN = "--task arith --seed 0 --agents 3 --rounds 2 --val-n 200 --questions 128".split()
STUDY_BASE = (
    "--algo softrank --objective expected --tau 0.5 --beta 0.05 --lam 0.01 --refine-cost 0 "
    "--iterations 1"
).split()
STUDY_RL = STUDY_TRAIN + ["--epochs", "50", "--batch-size", "64"]
STUDY_LEVERS = {  # name -> train_rl.py flags on top of the base run (init: the base SFT policy)
    "softrank": [],
    "grpo": ["--algo", "grpo"],
    "eq4": ["--objective", "eq4"],
    "tau0.2": ["--tau", "0.2"],
    "tau0.8": ["--tau", "0.8"],
    "beta0.01": ["--beta", "0.01"],
    "beta0.5": ["--beta", "0.5"],
    "lam0": ["--lam", "0"],
    "lam0.1": ["--lam", "0.1"],
    "cost0.5": ["--refine-cost", "0.5"],
    "cost2": ["--refine-cost", "2"],
    "q32": ["--questions", "32"],
    "q64": ["--questions", "64"],
    "iter3": ["--iterations", "3"],
    # the best measured value of four levers at once
    "combo": ["--objective", "eq4", "--tau", "0.2", "--lam", "0.1", "--refine-cost", "0.5"],
}
# their own SFT and SoftRankPO runs (the base reads every feature)
STUDY_FEATURES = ("paper", "confidence")
# about 150 steps on the demo corpus: the loss levels off
DEMO_RL = "--epochs 50 --batch-size 64".split()
# table a, cheapest first: file name -> eval.py protocol
# ({task-algo}: the seed's policy trained on that task)
TABLE_PROTOCOLS = {
    "vanilla": "vanilla",
    "cot": "cot",
    "persist": "mpdf-persist",
    **{algo: f"mpdf={{arith-{algo}}}" for algo in ("sft", *TABLE_RL_ALGOS)},
    "sc": "sc",
    "debate": "debate",
}
# table b: mawps questions, the fixed protocols and the policies trained on arith and on mawps
TRANSFER_PROTOCOLS = {
    "vanilla": "vanilla",
    "persist": "mpdf-persist",
    "softrank-arith": "mpdf={arith-softrank}",
    "softrank-mawps": "mpdf={mawps-softrank}",
    "debate": "debate",
}
# table c: the rewards' scale and transform (train_rl.py --reward-scale, --reward-transform), seed 0
REWARD_VARIANTS = {
    "x0.1": ["--reward-scale", "0.1"],
    "x1": [],
    "x10": ["--reward-scale", "10"],
    "exp": ["--reward-transform", "exp"],
}
# table d: the seed-0 SoftRankPO policy with 2-5 agents (3 rounds) and 1-5 rounds (3 agents), next
# to the team's vote and debate of the same team (the policy network is permutation-equivariant over
# peers)
SCALING = [(agents, 3) for agents in (2, 3, 4, 5)] + [(3, rounds) for rounds in (1, 2, 4, 5)]


def scaling_protocols(agents):
    """Table d's protocols for a team of `agents`: debate only for 3 agents, where the 1-5 round
    runs extend one another through the generation cache (a 5-agent debate alone would take about 2
    h of the two cores)."""
    return {
        "persist": "mpdf-persist",
        "softrank": "mpdf={arith-softrank}",
        **({"debate": "debate"} if agents == 3 else {}),
    }


def dtype_piece(seed, dtype):
    """Table a's game on the seed's 300 test questions with the engine in `dtype`: vanilla, the
    team's vote and the seed's SoftRankPO policy in one eval.py JSON (results/dtype/)."""
    out = f"results/dtype/arith300-seed{seed}-{dtype}.json"
    protocols = f"vanilla,mpdf-persist,mpdf={table_policy('arith', 'softrank', seed)}"
    test = ["--split", "test", "--n", "300", "--seed", str(seed), "--protocols", protocols]
    flags = [*TABLE_TASKS["arith"], *TABLE_GAME, *test, "--dtype", dtype, "--no-details"]
    return {"command": [PY, "eval.py", *flags, "--out", out], "outputs": [out]}


def study(name, args):
    """A lever of the study that chose the defaults: eval.py on the validation questions (--split
    val), never the test ones."""
    out = f"results/study/{name}.json"
    return {
        "command": [PY, "eval.py", *STUDY_GAME, *args, "--no-details", "--out", out],
        "outputs": [out],
    }


def auroc(name, args):
    out = f"results/auroc/{name}.json"
    return {
        "command": [PY, "-m", "experiments.confidence_auroc", *args, "--out", out],
        "outputs": [out],
    }


DEMO_POLICIES = {
    algo: f"results/policies/arith-demo-{algo}.pt" for algo in ("sft", "grpo", "softrank")
}
# the demo-budget SoftRankPO run, 20x longer
DEMO_RL_LONG = ["--epochs", "1000", "--batch-size", "64"]
# the demo-budget table on 200 arith test questions, cheapest first: file name -> eval.py protocol
DEMO_PROTOCOLS = {
    "vanilla": "vanilla",
    "persist": "mpdf-persist",
    **{algo: f"mpdf={path}" for algo, path in reversed(DEMO_POLICIES.items())},
    "sc": "sc",
    "debate": "debate",
}
PIECES = {
    # the engine's speed and the generation cache's
    **BENCH_PIECES,
    # which confidence signal tells right from wrong (200 round-0 questions x 3 agents each)
    "auroc-arith": auroc("arith", ["--task", "arith", "--n", "200"]),
    "auroc-mawps": auroc("mawps", ["--task", "mawps", "--path", MAWPS, "--n", "200"]),
    # the same signals on each competent team's agents, at the game's temperature
    **{
        f"auroc-arith-team-{team}": {
            **auroc(
                f"arith-team-{team}",
                ["--task", "arith", "--n", "200", *team_flags(team), "--temperature", "0.5"],
            ),
            "needs": team_adapters(team),
        }
        for team in ("worked", "varied")
    },
    # the demo-budget policies under the bounded objective, then the protocols on 200 arith
    # questions
    "train-arith-demo-sft": trained("arith-demo-sft", "sft.py", DEMO_TRAIN + SFT_STATE),
    "train-arith-demo-grpo": trained(
        "arith-demo-grpo",
        "train_rl.py",
        DEMO_TRAIN + DEMO_RL + ["--algo", "grpo", "--init", DEMO_POLICIES["sft"]],
    ),
    "train-arith-demo-softrank": trained(
        "arith-demo-softrank",
        "train_rl.py",
        DEMO_TRAIN + DEMO_RL + ["--algo", "softrank", "--init", DEMO_POLICIES["sft"]],
    ),
    # the same run 20x longer, to see where the bounded loss levels off against its analytic
    # minimum
    "train-arith-demo-softrank-long": trained(
        "arith-demo-softrank-long",
        "train_rl.py",
        DEMO_TRAIN + DEMO_RL_LONG + ["--algo", "softrank", "--init", DEMO_POLICIES["sft"]],
    ),
    # the LLM weights (MAGRPO, MLPO, adapters) and their evaluations
    **LLM_PIECES,
    # the study's lever 1: the agents' sampling temperature (round 0 of 3 agents and their
    # vote; the share of questions some agent gets right is what a perfect selector could reach
    # before any REFINE)
    "study-temperature-greedy": study("temperature-greedy", ["--protocols", "vanilla"]),
    **{
        f"study-temperature-T{t}": study(
            f"temperature-T{t}", ["--temperature", t, "--protocols", "mpdf-persist"]
        )
        for t in STUDY_TEMPERATURES
    },
    # the study's fixed protocols on the validation questions at the default T = 0.5
    **{
        f"study-baseline-{protocol}": study(f"baseline-{protocol}", ["--protocols", protocol])
        for protocol in ("debate", "sc")
    },
    # the study's policy levers: a training piece (its policy in
    # results/policies/study-*.pt), then the policy's games on the validation questions
    "study-train-sft": trained("study-sft", "sft.py", STUDY_TRAIN + ["--features", "all"]),
    **{
        f"study-train-{lever}": trained(
            f"study-{lever}",
            "train_rl.py",
            STUDY_RL + ["--init", "results/policies/study-sft.pt", *STUDY_BASE, *flags],
        )
        for lever, flags in STUDY_LEVERS.items()
    },
    "study-train-defaults": trained(
        "study-defaults", "train_rl.py", STUDY_RL + ["--init", "results/policies/study-sft.pt"]
    ),
    **{
        f"study-train-features-{f}": trained(
            f"study-sft-{f}", "sft.py", STUDY_TRAIN + ["--features", f]
        )
        for f in STUDY_FEATURES
    },
    **{
        f"study-train-features-{f}-softrank": trained(
            f"study-softrank-{f}",
            "train_rl.py",
            STUDY_RL + ["--init", f"results/policies/study-sft-{f}.pt", *STUDY_BASE],
        )
        for f in STUDY_FEATURES
    },
    **{
        f"study-policy-{name}": {
            **study(f"policy-{name}", ["--protocols", f"mpdf=results/policies/study-{name}.pt"]),
            "needs": [f"results/policies/study-{name}.pt"],
        }
        for name in ["sft", *STUDY_LEVERS, "defaults"]
        + [f"{run}-{f}" for run in ("sft", "softrank") for f in STUDY_FEATURES]
    },
    # tables a-d with the defaults the study set. Policies: one per task, seed, algorithm
    **merged(policy_pieces("arith", seed, TABLE_RL_ALGOS) for seed in TABLE_SEEDS),
    **merged(policy_pieces("mawps", seed, ("softrank",)) for seed in TABLE_SEEDS),
    # a: 300 arith test questions x 3 seeds
    **merged(
        table_pieces(f"arith300-seed{seed}", "arith", seed, TABLE_PROTOCOLS) for seed in TABLE_SEEDS
    ),
    # b: 300 mawps questions x 3 seeds, the arith policies and the mawps ones ({mawps-softrank})
    **merged(
        table_pieces(f"mawps300-seed{seed}", "mawps", seed, TRANSFER_PROTOCOLS, any_game=True)
        for seed in TABLE_SEEDS
    ),
    # c: SoftRankPO and GRPO under scaled / transformed
    # rewards, seed 0, validation accuracy every 20 steps
    **{
        f"train-scale-{algo}-{variant}": {
            **trained(
                f"arith-seed0-{algo}-{variant}",
                "train_rl.py",
                [*TABLE_TASKS["arith"], *TABLE_GAME, "--seed", "0", "--algo", algo]
                + ["--init", table_policy("arith", "sft", 0), "--eval-every", "20", *flags],
            ),
            "needs": [table_policy("arith", "sft", 0)],
        }
        for algo in ("softrank", "grpo")
        for variant, flags in REWARD_VARIANTS.items()
    },
    # d: team size and rounds, 300 arith test questions of seed 0
    **merged(
        table_pieces(
            f"scaling-a{a}-r{r}",
            "arith",
            0,
            scaling_protocols(a),
            game=["--agents", str(a), "--rounds", str(r)],
            any_game=True,
        )
        for a, r in SCALING
    ),  # fmt: skip
    # the paper's scaling claim on each competent team: its seed-0 SoftRankPO policy
    # (trained at 3 rounds), its vote and debate at 1, 2, 4 and 5 rounds (3 rounds: its table)
    **merged(
        table_pieces(
            f"scaling-{team}-a3-r{rounds}",
            "arith",
            0,
            scaling_protocols(3),
            game=["--agents", "3", "--rounds", str(rounds)],
            team=team,
            any_game=True,
        )
        for team in ("worked", "varied")
        for rounds in (1, 2, 4, 5)
    ),
    # the trained teams: their tables, leaders, revision turn and aggregators
    **TEAM_PIECES,
    # the split-information task: its agents, their team's table, leader and debaters
    **SPLIT_PIECES,
    # the rules that decide when to talk, beside the learned policies: fitted on validation
    # questions, then on the tables' test questions; the oracle's headroom on split
    **RULE_PIECES,
    # stage 2 on its own games: the corpus collected again from the trained policy, on split
    **ONPOLICY_PIECES,
    # bf16 against fp32 on table a's games and questions (vanilla, the team's vote, the
    # seed's SoftRankPO policy), both dtypes on the machine that runs it (the file says which)
    **{
        f"dtype-arith300-seed{seed}-{dtype}": dtype_piece(seed, dtype)
        for dtype in ("bfloat16", "float32")
        for seed in TABLE_SEEDS
    },
    # mutation testing, one module of the method or of its plumbing at a time (mutmut, a
    # development tool outside requirements.txt: pip install mutmut==3.3.1); survivors, score,
    # tool and machine
    **{
        f"mutation-{module}": {
            "command": [PY, "-m", "experiments.mutation", module],
            "outputs": [f"results/mutation/{module}.json"],
        }
        for module in MUTATION_MODULES
    },
    # one file per protocol, so each is committed as soon
    # as it is done (report.py pairs them by question)
    **{
        f"table-arith200-demo-seed0-{short}": table(
            f"arith200-demo-seed0-{short}",
            DEMO_GAME + ["--split", "test", "--n", "200", "--seed", "0", "--protocols", protocol],
        )
        for short, protocol in DEMO_PROTOCOLS.items()
    },
}

# the scripts that run the engine at --dtype auto: the stage scripts and their studies in the lab
ENGINE_SCRIPTS = ("eval.py", "sft.py", "train_rl.py", *STUDY_SCRIPTS.values())


def script_of(command):
    """The script a piece's command runs: its file, or its lab module (python -m NAME)."""
    return command[2] if command[1] == "-m" else command[1]


# the pieces that name no --dtype were computed with the engine in float32; the scripts' default
# is --dtype auto (bf16 on a CPU with native bf16), so those pieces pin float32 and give the same
# files on any machine
for _piece in PIECES.values():
    if script_of(_piece["command"]) in ENGINE_SCRIPTS:
        if "--dtype" not in _piece["command"]:
            _piece["command"] += ["--dtype", "float32"]
    _piece["command"] = flags_once(_piece["command"])
