"""The pieces behind results/ (experiments/run.py runs them): every reported number's command and
files.

A piece is a dict: "command" (argv, run from the repository root), "outputs" (files the command
writes in results/) or "copies" (files under runs/results/ copied into results/ when the command is
done), and "needs" (files that must exist first: a policy trained by another piece, LLM weights out
of git).
"""

from experiments.bench_pieces import BENCH_PIECES
from experiments.llm_pieces import LLM_PIECES, LORA_LR, MAGRPO_LORA, PY, RUNS, llm_run
from experiments.mutation import MODULES as MUTATION_MODULES

MAWPS = "../shared/data/mawps_asdiv/train.csv"

# The demo's budget (Makefile): 3 agents, 2 rounds, 32 training questions, 8 for validation; the
# agents at T = 0.7, the default when these pieces were computed (now 0.5: the temperature study)
DEMO_GAME = ["--task", "arith", "--agents", "3", "--rounds", "2", "--temperature", "0.7"]
DEMO_TRAIN = DEMO_GAME + ["--questions", "32", "--val-n", "8"]
# issue 18's study: 200 validation questions of the arith training pool (seed 0), 3 agents
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
# issue 18's tables: every script with its defaults (the settings the study chose), 3 agents, 3
# rounds; each seed trains its own policies on the task's training split and is scored on 300 test
# questions of that seed
TABLE_SEEDS = (0, 1, 2)
TABLE_GAME = ["--agents", "3", "--rounds", "3"]
TABLE_RL_ALGOS = ("softrank", "grpo", "ppo")
TABLE_TASKS = {"arith": ["--task", "arith"], "mawps": ["--task", "mawps", "--path", MAWPS]}
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
# issue 35: teams whose agents were trained (adapters on the default base, committed by the LLM
# pieces): three agents trained to revise (MAGRPO on debate, seed 0), and a mixed team of the
# untrained backbone, a parallel-trained agent and a debate-trained one; each with the meta-policy
# of every algorithm below and every fixed protocol, table a's game and questions
TEAMS = {
    "revisers": ",".join(["default+results/agents/magrpo-debate-L1-seed0.pt"] * 3),
    "mixed": f"default,default+results/agents/magrpo-lora-lr{LORA_LR}-L1-seed0.pt,"
    "default+results/agents/magrpo-debate-L1-seed0.pt",
    # issue 54: three copies of the adapter trained on easy arith's worked solutions (llm_pieces)
    "worked": ",".join(["default+results/agents/worked-L1-r8-seed0.pt"] * 3),
    # and three members that differ in skill and specialty: the adapter continued on REFINE
    # examples, the worked-solution adapter, and the sweep's rank-4 adapter
    "varied": ",".join(
        f"default+results/agents/{run}.pt"
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
# train_rl.py flags of each RL policy name
RL_FLAGS = {
    **{algo: ["--algo", algo] for algo in ("softrank", "grpo", "ppo", "ranks", "loo")},
    "softrank-cost0": ["--algo", "softrank", "--refine-cost", "0"],
}


def team_rl_algos(team):
    """The RL algorithms of a team's table: issue 35's teams of weak agents, or a competent one."""
    return TEAM_RL_ALGOS if team in ("revisers", "mixed") else COMPETENT_RL_ALGOS


def team_protocols(team):
    """A team's table protocols: the vote, each learned policy, self-consistency and debate."""
    return {
        "persist": "mpdf-persist",
        **{algo: f"mpdf={{arith-{algo}}}" for algo in ("sft", *team_rl_algos(team))},
        "sc": "sc",
        "debate": "debate",
    }


def scaling_protocols(agents):
    """Table d's protocols for a team of `agents`: debate only for 3 agents, where the 1-5 round
    runs extend one another through the generation cache (a 5-agent debate alone would take about 2
    h of the two cores)."""
    return {
        "persist": "mpdf-persist",
        "softrank": "mpdf={arith-softrank}",
        **({"debate": "debate"} if agents == 3 else {}),
    }


def trained(name, script, args):
    """A training piece: the script writes runs/results/<name>; policy, summary and metrics go to
    results/."""
    out = RUNS / name
    return {
        "command": [PY, script, *args, "--out-dir", str(out)],
        "copies": {
            out / "policy.safetensors": f"results/policies/{name}.pt",
            out / "summary.json": f"results/training/{name}.json",
            out / "metrics.jsonl": f"results/training/{name}.metrics.jsonl",
        },
    }


def merged(dicts):
    """One dict of the pieces of several seeds or settings."""
    return {name: piece for d in dicts for name, piece in d.items()}


def team_flags(team):
    """A team of issue 35 (TEAMS) as eval/sft/train_rl flags, with the game flags it plays with;
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


def run_prefix(task, seed, team=""):
    return f"{task}-team-{team}-seed{seed}" if team else f"{task}-seed{seed}"


def table_policy(task, algo, seed, team=""):
    return f"results/policies/{run_prefix(task, seed, team)}-{algo}.pt"


def policy_pieces(task, seed, algos, team=""):
    """The seed's SFT policy, then each RL algorithm of `algos` from it (pi_ref = the SFT
    policy), for the default team or a TEAMS one."""
    base = [*TABLE_TASKS[task], *TABLE_GAME, "--seed", str(seed), *team_flags(team)]
    prefix = run_prefix(task, seed, team)
    sft = table_policy(task, "sft", seed, team)
    return {
        f"train-{prefix}-sft": {
            **trained(f"{prefix}-sft", "sft.py", base),
            "needs": team_adapters(team),
        },
        **{
            f"train-{prefix}-{algo}": {
                **trained(
                    f"{prefix}-{algo}", "train_rl.py", [*base, *RL_FLAGS[algo], "--init", sft]
                ),
                "needs": [sft, *team_adapters(team)],
            }
            for algo in algos
        },
    }


def table_pieces(name, task, seed, protocols, game=TABLE_GAME, team=""):
    """One eval.py piece per protocol on 300 test questions of `task` (seed `seed`);
    {trained_on-algo} in a protocol is the seed's policy of that algorithm trained on that task
    (by the same team), which the piece needs."""
    pieces = {}
    for short, protocol in protocols.items():
        needs = team_adapters(team)
        if "{" in protocol:
            key = protocol[protocol.index("{") + 1 : -1]
            needs = [table_policy(*key.split("-", 1), seed, team), *needs]
            protocol = protocol.replace("{" + key + "}", needs[0])
        test = ["--split", "test", "--n", "300", "--seed", str(seed), "--protocols", protocol]
        pieces[f"table-{name}-{short}"] = {
            **table(name + "-" + short, [*TABLE_TASKS[task], *game, *team_flags(team), *test]),
            "needs": needs,
        }
    return pieces


def team_pieces(team, seed):
    """Issue 35's table for one team and seed: its SFT, SoftRankPO and GRPO policies, every fixed
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
# MLPO's preset, the leader a rank-8 adapter continued from the worked-solution one
LEADER_FLAGS = (
    "train_mlpo.py --algo magrpo --agents 3 --task arith --level 1 --questions 256 --group 8 "
    "--questions-per-step 8 --rollout-temperature 0.7 --max-new-tokens 96 --steps 24 "
    "--eval-every 6 --val-n 100 --save-every 6 --lora-rank 8 --lr 5e-4 "
    "--init-adapter results/agents/worked-L1-r8-seed0.pt"
).split()


def leader_pieces(team, seed):
    """A competent team's MLPO leader of one seed (its adapter committed), then its answer over
    the team's round-0 solutions on the seed's 300 test questions (the table's `leader` row)."""
    run = f"mlpo-team-{team}-seed{seed}"
    adapter = f"results/agents/{run}.pt"
    name = f"arith300-team-{team}-seed{seed}-leader"
    test = ["--split", "test", "--n", "300", "--seed", str(seed)]
    return {
        f"llm-{run}": {
            **llm_run(
                run,
                [*LEADER_FLAGS, "--peers", TEAMS[team], *TEAM_GAME.get(team, [])]
                + ["--seed", str(seed)],
                True,
            ),
            "needs": team_adapters(team),
        },
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


def aggregator_pieces(seed):
    """The aggregator leader of one seed (its PEFT folder committed), then its answer over team
    varied's round-0 whole solutions on the seed's 300 test questions."""
    run = f"mlpo-aggregator-varied-seed{seed}"
    adapter = f"results/agents/{run}"
    name = f"arith300-team-varied-seed{seed}-aggregator"
    test = ["--split", "test", "--n", "300", "--seed", str(seed), "--whole-solutions"]
    training = llm_run(run, [*AGGREGATOR_FLAGS, "--peers", TEAMS["varied"], "--seed", str(seed)])
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
    variant = "" if lr == LORA_LR else f"-lr{lr}"
    run = f"magrpo-revision-varied{variant}-seed{seed}"
    flags = [*REVISION_FLAGS, *(["--lr", lr] if variant else []), "--seed", str(seed)]
    training = llm_run(run, flags, agents=3)
    return {
        f"llm-{run}": {**training, "needs": team_adapters("varied")},
        **revision_pieces(seed, trained=run),
    }


def dtype_piece(seed, dtype):
    """Table a's game on the seed's 300 test questions with the engine in `dtype`: vanilla, the
    team's vote and the seed's SoftRankPO policy in one eval.py JSON (results/dtype/)."""
    out = f"results/dtype/arith300-seed{seed}-{dtype}.json"
    protocols = f"vanilla,mpdf-persist,mpdf={table_policy('arith', 'softrank', seed)}"
    test = ["--split", "test", "--n", "300", "--seed", str(seed), "--protocols", protocols]
    flags = [*TABLE_TASKS["arith"], *TABLE_GAME, *test, "--dtype", dtype, "--no-details"]
    return {"command": [PY, "eval.py", *flags, "--out", out], "outputs": [out]}


def table(name, args):
    """An evaluation piece: eval.py's summary JSON (per-question outcomes, no transcripts)."""
    return {
        "command": [PY, "eval.py", *args, "--no-details", "--out", f"results/tables/{name}.json"],
        "outputs": [f"results/tables/{name}.json"],
    }


def study(name, args):
    """A lever of issue 18's study: eval.py on the validation questions (--split val), never the
    test ones."""
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
# issue 17's SoftRankPO demo run, 20x longer
DEMO_RL_LONG = ["--epochs", "1000", "--batch-size", "64"]
# the issue-17 table, cheapest first: file name -> eval.py protocol
DEMO_PROTOCOLS = {
    "vanilla": "vanilla",
    "persist": "mpdf-persist",
    **{algo: f"mpdf={path}" for algo, path in reversed(DEMO_POLICIES.items())},
    "sc": "sc",
    "debate": "debate",
}
PIECES = {
    # the engine's speed (issues 16, 36, 40)
    **BENCH_PIECES,
    # issue 17: which confidence signal tells right
    # from wrong (200 round-0 questions x 3 agents each)
    "auroc-arith": auroc("arith", ["--task", "arith", "--n", "200"]),
    "auroc-mawps": auroc("mawps", ["--task", "mawps", "--path", MAWPS, "--n", "200"]),
    # issue 54: the same signals on each competent team's agents, at the game's temperature
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
    # issue 17: the demo-budget policies under the bounded
    # objective, then the protocols on 200 arith questions
    "train-arith-demo-sft": trained("arith-demo-sft", "sft.py", DEMO_TRAIN),
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
    # issue 17: the same run 20x longer, to see where the
    # bounded loss levels off against its analytic minimum
    "train-arith-demo-softrank-long": trained(
        "arith-demo-softrank-long",
        "train_rl.py",
        DEMO_TRAIN + DEMO_RL_LONG + ["--algo", "softrank", "--init", DEMO_POLICIES["sft"]],
    ),
    # issues 19, 40, 35: the LLM weights (MAGRPO, MLPO, adapters) and their evaluations
    **LLM_PIECES,
    # issue 18's study, lever 1: the agents' sampling temperature (round 0 of 3 agents and their
    # vote; the share of questions some agent gets right is what a perfect selector could reach
    # before any REFINE)
    "study-temperature-greedy": study("temperature-greedy", ["--protocols", "vanilla"]),
    **{
        f"study-temperature-T{t}": study(
            f"temperature-T{t}", ["--temperature", t, "--protocols", "mpdf-persist"]
        )
        for t in STUDY_TEMPERATURES
    },
    # issue 18's study, the fixed protocols on the validation questions at the default T = 0.5
    **{
        f"study-baseline-{protocol}": study(f"baseline-{protocol}", ["--protocols", protocol])
        for protocol in ("debate", "sc")
    },
    # issue 18's study, the policy levers: a training piece (its policy in
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
    # issue 18's tables a-d with the defaults the study set. Policies: one per task, seed, algorithm
    **merged(policy_pieces("arith", seed, TABLE_RL_ALGOS) for seed in TABLE_SEEDS),
    **merged(policy_pieces("mawps", seed, ("softrank",)) for seed in TABLE_SEEDS),
    # a: 300 arith test questions x 3 seeds
    **merged(
        table_pieces(f"arith300-seed{seed}", "arith", seed, TABLE_PROTOCOLS) for seed in TABLE_SEEDS
    ),
    # b: 300 mawps questions x 3 seeds, the arith policies and the mawps ones ({mawps-softrank})
    **merged(
        table_pieces(f"mawps300-seed{seed}", "mawps", seed, TRANSFER_PROTOCOLS)
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
        )
        for a, r in SCALING
    ),  # fmt: skip
    # issue 54: the paper's scaling claim on each competent team: its seed-0 SoftRankPO policy
    # (trained at 3 rounds), its vote and debate at 1, 2, 4 and 5 rounds (3 rounds: its table)
    **merged(
        table_pieces(
            f"scaling-{team}-a3-r{rounds}",
            "arith",
            0,
            scaling_protocols(3),
            game=["--agents", "3", "--rounds", str(rounds)],
            team=team,
        )
        for team in ("worked", "varied")
        for rounds in (1, 2, 4, 5)
    ),
    # issue 35: a table per team, seed by seed (a seed's policies, then its protocols)
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
    **merged(aggregator_pieces(seed) for seed in TABLE_SEEDS),
    # issue 36: bf16 against fp32 on table a's games and questions (vanilla, the team's vote, the
    # seed's SoftRankPO policy), both dtypes on the machine that runs it (the file says which)
    **{
        f"dtype-arith300-seed{seed}-{dtype}": dtype_piece(seed, dtype)
        for dtype in ("bfloat16", "float32")
        for seed in TABLE_SEEDS
    },
    # issue 43: mutation testing, one module of the method or of its plumbing at a time (mutmut, a
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

# every committed piece before issue 36 ran its engine in float32, the default then; the scripts'
# default is now --dtype auto (bf16 on a CPU with native bf16), so the pieces pin float32 and give
# the same files on any machine
for _piece in PIECES.values():
    if _piece["command"][1] in ("eval.py", "sft.py", "train_rl.py"):
        if "--dtype" not in _piece["command"]:
            _piece["command"] += ["--dtype", "float32"]
