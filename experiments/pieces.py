"""The pieces behind results/ (experiments/run.py runs them): every reported number's command and
files.

A piece is a dict: "command" (argv, run from the repository root), "outputs" (files the command
writes in results/) or "copies" (files under runs/results/ copied into results/ when the command is
done), and "needs" (files that must exist first: a policy trained by another piece, LLM weights out
of git).
"""

import sys
from pathlib import Path

PY = sys.executable
RUNS = Path("runs/results")
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
# issue 19's MAGRPO preset: parallel answers of 3 agents (one shared set of weights), easy arith,
# G = 8 joint rollouts at T = 0.7 (about half the groups are flat there:
# results/llm/flat_groups-L1-a3-T0.7.json), arith answers need far fewer than 192 tokens; the team's
# greedy vote on 100 held-out questions every 6 steps
MAGRPO_PRESET = (
    "--target agents --algo magrpo --protocol parallel --agents 3 --task arith --level 1 --group "
    "8 --questions-per-step 4 --rollout-temperature 0.7 --max-new-tokens 96 --lr 1e-5 --steps 24 "
    "--eval-every 6 --val-n 100 --save-every 6 --lora-rank 0"
).split()
# issue 40: the same with rank-4 LoRA adapters (the base frozen); the learning rate from seed 0's
# validation curves (1e-4 first: about 10x the full-weight rate, "LoRA Without Regret"; its
# validation vote did not rise, so the sweep went up: 5e-4 reached 0.40 at step 24, 1e-4 0.21),
# the chosen one (LORA_LR) for seeds 1 and 2
LORA_LRS, LORA_LR = ("1e-4", "5e-4", "2e-4"), "5e-4"
MAGRPO_LORA = [*MAGRPO_PRESET, "--lora-rank", "4"]
LORA_RUNS = [(f"magrpo-lora-lr{lr}-L1-seed0", 0, lr) for lr in LORA_LRS] + [
    (f"magrpo-lora-lr{LORA_LR}-L1-seed{seed}", seed, LORA_LR) for seed in (1, 2)
]
# issue 19's MLPO preset: one leader over 3 frozen peers (the untrained backbone at the agents'
# T = 0.5) on easy arith, the peers' solutions to 256 candidate questions generated once, questions
# all 3 peers get right dropped; G = 8 leader samples at T = 0.7 (two thirds of the groups are flat
# there: flat_groups-leader-L1-T0.7.json, so 8 questions per step); the leader's greedy answer over
# its peers on 100 held-out questions every 6 steps
MLPO_PRESET = (
    "--target leader --algo magrpo --agents 3 --task arith --level 1 --questions 256 --group 8 "
    "--questions-per-step 8 --rollout-temperature 0.7 --max-new-tokens 96 --lr 1e-5 --steps 24 "
    "--eval-every 6 --val-n 100 --save-every 6 --lora-rank 0"
).split()
# issue 19 after training: 300 arith test questions (the same for every run), 3 agents, the
# training's 96-token budget; debate = round 0 + one REFINE round; MLPO's leader decides once over
# round 0 (as trained)
AFTER_GAME = "--task arith --split test --n 300 --seed 0 --agents 3 --max-new-tokens 96".split()
# what each evaluation after training plays: the parallel vote (with one greedy answer), debate
AFTER_PARTS = {
    "parallel": ["--rounds", "1", "--protocols", "vanilla,mpdf-persist"],
    "debate": ["--rounds", "1", "--protocols", "debate"],
}
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
            out / "policy.pt": f"results/policies/{name}.pt",
            out / "summary.json": f"results/training/{name}.json",
            out / "metrics.jsonl": f"results/training/{name}.metrics.jsonl",
        },
    }


def llm_run(name, args, adapter=False):
    """An LLM-weights run (train_llm.py --target agents | leader): its metrics (training reward,
    held-out accuracy every --eval-every steps, wall time, tokens) go to results/llm/; whole
    weights stay out of git, a shared LoRA `adapter` (a few MB) goes to results/agents/."""
    out = RUNS / name
    kept = {out / "adapter.pt": f"results/agents/{name}.pt"} if adapter else {}
    return {
        "command": [PY, "train_llm.py", *args, "--out-dir", str(out)],
        "copies": {out / "metrics.jsonl": f"results/llm/{name}.metrics.jsonl", **kept},
    }


def after(name, args, model="", leader="", adapter=""):
    """An evaluation of LLM weights after training (issue 19): eval.py's summary JSON in
    results/after/. `model` (the agents) and `leader` (MLPO's): a trained run's weights,
    runs/results/<run>/model, out of git, so the piece needs them there; `adapter`: a committed
    adapter file every agent runs on the default base."""
    protocols = ["--protocols", f"leader={leader}"] if leader else []
    models = ["--model", model] if model else []
    models += ["--models", ",".join([f"default+{adapter}"] * 3)] if adapter else []
    out = f"results/after/{name}.json"
    flags = [*models, *AFTER_GAME, *args, *protocols, "--no-details"]
    return {
        "command": [PY, "eval.py", *flags, "--out", out],
        "outputs": [out],
        "needs": [p for p in (model, leader, adapter) if p],
    }


def merged(dicts):
    """One dict of the pieces of several seeds or settings."""
    return {name: piece for d in dicts for name, piece in d.items()}


def table_policy(task, algo, seed):
    return f"results/policies/{task}-seed{seed}-{algo}.pt"


def policy_pieces(task, seed, algos):
    """The seed's SFT policy, then each RL algorithm of `algos` from it (pi_ref = the SFT
    policy)."""
    base = [*TABLE_TASKS[task], *TABLE_GAME, "--seed", str(seed)]
    sft = table_policy(task, "sft", seed)
    return {
        f"train-{task}-seed{seed}-sft": trained(f"{task}-seed{seed}-sft", "sft.py", base),
        **{
            f"train-{task}-seed{seed}-{algo}": {
                **trained(
                    f"{task}-seed{seed}-{algo}",
                    "train_rl.py",
                    base + ["--algo", algo, "--init", sft],
                ),
                "needs": [sft],
            }
            for algo in algos
        },
    }


def table_pieces(name, task, seed, protocols, game=TABLE_GAME):
    """One eval.py piece per protocol on 300 test questions of `task` (seed `seed`);
    {trained_on-algo} in a protocol is the seed's policy of that algorithm trained on that task,
    which the piece needs."""
    pieces = {}
    for short, protocol in protocols.items():
        needs = []
        if "{" in protocol:
            key = protocol[protocol.index("{") + 1 : -1]
            needs = [table_policy(*key.split("-"), seed)]
            protocol = protocol.replace("{" + key + "}", needs[0])
        test = ["--split", "test", "--n", "300", "--seed", str(seed), "--protocols", protocol]
        pieces[f"table-{name}-{short}"] = {
            **table(name + "-" + short, [*TABLE_TASKS[task], *game, *test]),
            "needs": needs,
        }
    return pieces


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


def bench(name, args, file=""):
    """An engine speed benchmark (experiments/bench.py): its JSON (results/bench/<file or name>),
    which records the machine it ran on."""
    out = f"results/bench/{file or name}.json"
    return {
        "command": [PY, "experiments/bench.py", "--bench", name, *args, "--out", out],
        "outputs": [out],
    }


def profile(name, args):
    """Where a decoding step's time goes (experiments/profile_decode.py)."""
    out = f"results/bench/{name}.json"
    return {"command": [PY, "experiments/profile_decode.py", *args, "--out", out], "outputs": [out]}


def auroc(name, args):
    out = f"results/auroc/{name}.json"
    return {
        "command": [PY, "experiments/confidence_auroc.py", *args, "--out", out],
        "outputs": [out],
    }


def flat_groups(name, args):
    out = f"results/llm/flat_groups-{name}.json"
    return {"command": [PY, "experiments/flat_groups.py", *args, "--out", out], "outputs": [out]}


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
    # issue 16: the engine against HF generate (run each on a quiet machine: they are timings)
    "bench-generate": bench("generate", []),
    # the setting: HF generate in batches of 64, the engine with eval.py's default slots
    "bench-round": bench("round", ["--hf-batch-size", "64"]),
    # 128 slots against 64
    "bench-slots": bench("slots", ["--engine-batch-size", "128", "--max-new-tokens", "96"]),
    # one LLM-Debate (3 agents, 3 rounds, 32 questions) through the engine vs one generate call per
    # agent per round; T = 0.7, the setting of the README's earlier measurement
    "bench-debate": bench("debate", ["--temperature", "0.7"]),
    # issue 40: round 0 of 64 questions for 3 agents, each its own adapter, in one engine
    "bench-team": bench("team", ["--max-new-tokens", "96"]),
    # issue 36: both dtypes against HF generate in the same dtype and in fp32, on a machine with
    # native bf16 (the file records which); the round on 100 questions (HF fp32 alone takes ~15 min)
    "bench-generate-dtypes": bench("generate", ["--dtypes", "float32,bfloat16"], "generate-dtypes"),
    "bench-round-dtypes": bench(
        "round",
        ["--dtypes", "float32,bfloat16", "--n", "100", "--hf-batch-size", "64"],
        "round-dtypes",
    ),  # fmt: skip
    "profile": profile("profile", []),
    # issue 36: the kernel timings behind the dtype decisions (Linear paths, greedy, attention)
    "bench-kernels": {
        "command": [PY, "experiments/kernels.py", "--out", "results/bench/kernels.json"],
        "outputs": ["results/bench/kernels.json"],
    },
    # issue 36: one decode step in fp32 against bf16 (a machine with native bf16)
    "profile-bf16": profile("profile-bf16", ["--bf16"]),
    # the oneDNN Linear layers alone: the engine just before them against the engine with them
    "profile-onednn": profile("profile-onednn", ["--before", "6989e4b"]),
    # issue 17: which confidence signal tells right
    # from wrong (200 round-0 questions x 3 agents each)
    "auroc-arith": auroc("arith", ["--task", "arith", "--n", "200"]),
    "auroc-mawps": auroc("mawps", ["--task", "mawps", "--path", MAWPS, "--n", "200"]),
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
    # issue 19: how many MAGRPO groups are flat (all
    # rollouts the same reward) on the untrained model
    "llm-flat-L1-a3-T1.0": flat_groups(
        "L1-a3-T1.0", ["--level", "1", "--agents", "3", "--temperature", "1.0"]
    ),
    "llm-flat-L1-a3-T0.7": flat_groups(
        "L1-a3-T0.7", ["--level", "1", "--agents", "3", "--temperature", "0.7"]
    ),
    "llm-flat-leader-L1-T0.7": flat_groups(
        "leader-L1-T0.7", ["--target", "leader", "--n", "64", "--temperature", "0.7"]
    ),
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
    # issue 19: MAGRPO learning curves, one piece per seed, under the aggregation they were computed
    # with (token, the default then)
    **{
        f"llm-magrpo-L1-seed{seed}": llm_run(
            f"magrpo-L1-seed{seed}", MAGRPO_PRESET + ["--seed", str(seed), "--loss-agg", "token"]
        )
        for seed in (0, 1, 2)
    },
    # issue 41: the same preset under today's default aggregation, sum (CoMLRL's MAGRPO loss)
    **{
        f"llm-magrpo-sum-L1-seed{seed}": llm_run(
            f"magrpo-sum-L1-seed{seed}", MAGRPO_PRESET + ["--seed", str(seed)]
        )
        for seed in (0, 1, 2)
    },
    # issue 40: adapters against full fine-tuning (the sum run above), the learning rate on seed 0
    **{
        f"llm-{run}": llm_run(run, [*MAGRPO_LORA, "--seed", str(seed), "--lr", lr], adapter=True)
        for run, seed, lr in LORA_RUNS
    },
    **{
        f"after-{run}-parallel": after(
            f"{run}-parallel", AFTER_PARTS["parallel"], adapter=f"results/agents/{run}.pt"
        )
        for run, _, _ in LORA_RUNS
    },
    # issue 40: how far an AdamW step moves adapters and whole weights, on a supervised batch
    "lora-step-size": {
        "command": [
            PY,
            "experiments/lora_step_size.py",
            "--out",
            "results/llm/lora-step-size.json",
        ],
        "outputs": ["results/llm/lora-step-size.json"],
    },
    # issue 40: seconds per step and peak memory, full fine-tuning against adapters, 3 steps each
    # (run the two one after the other on a quiet machine: they are timings)
    **{
        f"llm-cost-{kind}": llm_run(f"cost-{kind}-L1", [*args, "--steps", "3", "--eval-every", "0"])
        for kind, args in (("full", MAGRPO_PRESET), ("lora", MAGRPO_LORA))
    },
    # issue 35: agents trained to revise: MAGRPO on debate (round 0 + one REFINE; the reward is the
    # team's vote after it), adapters; then the vote before and after the REFINE, test questions
    **{
        f"llm-magrpo-debate-L1-seed{seed}": llm_run(
            f"magrpo-debate-L1-seed{seed}",
            # the adapters' learning rate (the preset's 1e-5 is the whole-weight one)
            [*MAGRPO_LORA, "--protocol", "debate", "--rounds", "1", "--seed", str(seed)]
            + ["--lr", LORA_LR],
            adapter=True,
        )
        for seed in (0, 1, 2)
    },
    **{
        f"after-magrpo-debate-L1-seed{seed}-debate": after(
            f"magrpo-debate-L1-seed{seed}-debate",
            AFTER_PARTS["debate"],
            adapter=f"results/agents/magrpo-debate-L1-seed{seed}.pt",
        )
        for seed in (0, 1, 2)
    },
    **{
        f"after-magrpo-sum-L1-seed{seed}-parallel": after(
            f"magrpo-sum-L1-seed{seed}-parallel",
            AFTER_PARTS["parallel"],
            model=f"{RUNS}/magrpo-sum-L1-seed{seed}/model",
        )
        for seed in (0, 1, 2)
    },
    # issue 19: MLPO learning curves, one piece per seed
    **{
        f"llm-mlpo-L1-seed{seed}": llm_run(
            f"mlpo-L1-seed{seed}", MLPO_PRESET + ["--seed", str(seed)]
        )
        for seed in (0, 1, 2)
    },
    # issue 19 after training, paired on the same 300 test questions: the untrained team (one greedy
    # answer, the parallel vote, debate; the untrained backbone leading its peers), then each
    # trained run
    **{
        f"after-untrained-{part}": after(f"untrained-{part}", args)
        for part, args in AFTER_PARTS.items()
    },
    "after-untrained-leader": after(
        "untrained-leader", ["--rounds", "0", "--protocols", "leader=default"]
    ),
    **{
        f"after-magrpo-L1-seed{seed}-{part}": after(
            f"magrpo-L1-seed{seed}-{part}", args, model=f"{RUNS}/magrpo-L1-seed{seed}/model"
        )
        for seed in (0, 1, 2)
        for part, args in AFTER_PARTS.items()
    },
    **{
        f"after-mlpo-L1-seed{seed}-leader": after(
            f"mlpo-L1-seed{seed}-leader",
            ["--rounds", "0"],
            leader=f"{RUNS}/mlpo-L1-seed{seed}/model",
        )
        for seed in (0, 1, 2)
    },
    **{
        f"after-mlpo-L1-seed{seed}-alone": after(
            f"mlpo-L1-seed{seed}-alone",
            ["--rounds", "0", "--protocols", "vanilla"],
            model=f"{RUNS}/mlpo-L1-seed{seed}/model",
        )
        for seed in (0, 1, 2)
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
    # issue 36: bf16 against fp32 on table a's games and questions (vanilla, the team's vote, the
    # seed's SoftRankPO policy), both dtypes on the machine that runs it (the file says which)
    **{
        f"dtype-arith300-seed{seed}-{dtype}": dtype_piece(seed, dtype)
        for dtype in ("bfloat16", "float32")
        for seed in TABLE_SEEDS
    },
    # issue 43: mutation testing, one module of the method at a time (mutmut, a development tool
    # outside requirements.txt: pip install mutmut==3.3.1); survivors, score, tool and machine
    **{
        f"mutation-{module}": {
            "command": [PY, "experiments/mutation.py", module],
            "outputs": [f"results/mutation/{module}.json"],
        }
        for module in ("softrank", "state", "policy", "deliberate", "corpus", "answers")
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
