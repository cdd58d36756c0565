"""The pieces of the LLM-weight runs (train_magrpo.py, train_mlpo.py, train_solver.py; adapters)
and of their evaluations after training; experiments/pieces.py holds them with every other piece
(the same dict form: "command", "outputs" or "copies", "needs")."""

import sys
from pathlib import Path

PY = sys.executable
RUNS = Path("runs/results")
# The committed runs of the presets below predate the reward rules (train_magrpo.py's --help):
# their reward read answers as the evaluation does and paid a completion cut off at the token
# budget as any other; today's scripts read only the `Answer:` field and pay a cut-off rollout 0
# (--truncated zero, the default), so a rerun of these pieces trains under the rules
# (team_pieces.STRICT names the runs made under them).
# the MAGRPO preset: parallel answers of 3 agents (one shared set of weights), easy arith,
# G = 8 joint rollouts at T = 0.7 (about half the groups are flat there:
# results/llm/flat_groups-L1-a3-T0.7.json), arith answers need far fewer than 192 tokens; the team's
# greedy vote on 100 held-out questions every 6 steps (a preset: the script, then its flags)
MAGRPO_PRESET = (
    "train_magrpo.py --algo magrpo --protocol parallel --agents 3 --task arith --level 1 --group "
    "8 --questions-per-step 4 --rollout-temperature 0.7 --max-new-tokens 96 --lr 1e-5 --steps 24 "
    "--eval-every 6 --val-n 100 --save-every 6 --lora-rank 0"
).split()
# the same with rank-4 LoRA adapters (the base frozen); the learning rate from seed 0's
# validation curves (1e-4 first: about 10x the full-weight rate, "LoRA Without Regret"; its
# validation vote did not rise, so the sweep went up: 5e-4 reached 0.40 at step 24, 1e-4 0.21),
# the chosen one (LORA_LR) for seeds 1 and 2
LORA_LRS, LORA_LR = ("1e-4", "5e-4"), "5e-4"
MAGRPO_LORA = [*MAGRPO_PRESET, "--lora-rank", "4"]
LORA_RUNS = [(f"magrpo-lora-lr{lr}-L1-seed0", 0, lr) for lr in LORA_LRS] + [
    (f"magrpo-lora-lr{LORA_LR}-L1-seed{seed}", seed, LORA_LR) for seed in (1, 2)
]
# the MLPO preset: one leader over 3 frozen peers (the untrained backbone at the agents'
# T = 0.5) on easy arith, the peers' solutions to 256 candidate questions generated once, questions
# all 3 peers get right dropped; G = 8 leader samples at T = 0.7 (two thirds of the groups are flat
# there: flat_groups-leader-L1-T0.7.json, so 8 questions per step); the leader's greedy answer over
# its peers on 100 held-out questions every 6 steps
MLPO_PRESET = (
    "train_mlpo.py --algo magrpo --agents 3 --task arith --level 1 --questions 256 --group 8 "
    "--questions-per-step 8 --rollout-temperature 0.7 --max-new-tokens 96 --lr 1e-5 --steps 24 "
    "--eval-every 6 --val-n 100 --save-every 6 --lora-rank 0"
).split()
# the evaluations after training: 300 arith test questions (the same for every run), 3 agents, the
# training's 96-token budget; debate = round 0 + one REFINE round; MLPO's leader decides once over
# round 0 (as trained)
AFTER_GAME = "--task arith --split test --n 300 --seed 0 --agents 3 --max-new-tokens 96".split()
# what each evaluation after training plays: the parallel vote (with one greedy answer), debate
AFTER_PARTS = {
    "parallel": ["--rounds", "1", "--protocols", "vanilla,mpdf-persist"],
    "debate": ["--rounds", "1", "--protocols", "debate"],
}


# weights committed first as a .pt file, then in the ecosystem's format (a PEFT folder; a
# safetensors policy beside its settings' JSON), the one copy kept: the pieces write and read that
CONVERTED = {
    **{
        f"results/agents/{name}.pt": f"results/agents/{name}"
        for name in ("worked-L1-r8-seed0", "worked-L1-r4-seed0", "worked-refine-L1-r8-seed0")
    },
    **{
        f"results/policies/{name}.pt": f"results/policies/{name}.safetensors"
        for name in ("arith-seed0-softrank", "arith-team-varied-seed0-ranks")
    },
}


def committed(path):
    """Where the weights a piece once named `path` are committed (CONVERTED, else `path`)."""
    return CONVERTED.get(str(path), str(path))


def parallel_adapter(seed):
    """The seed's adapter trained on parallel answers at the chosen learning rate (committed)."""
    return f"results/agents/magrpo-lora-lr{LORA_LR}-L1-seed{seed}.pt"


def llm_run(name, args, adapter=False, agents=0):
    """An LLM-weights run (`args`: train_magrpo.py, train_mlpo.py or train_solver.py, then its
    flags): its metrics (training reward or loss, held-out accuracy every --eval-every steps, wall
    time, tokens) go to results/llm/; whole weights stay out of git, a shared LoRA `adapter` (a
    few MB) goes to results/agents/, or each of `agents` adapters (--separate-agents) as its PEFT
    folder, results/agents/<name>/agent<i>."""
    out = RUNS / name
    kept = {out / "adapter": committed(f"results/agents/{name}.pt")} if adapter else {}
    kept |= {out / f"agent{i}": f"results/agents/{name}/agent{i}" for i in range(agents)}
    return {
        "command": [PY, *args, "--out-dir", str(out)],
        "copies": {out / "metrics.jsonl": f"results/llm/{name}.metrics.jsonl", **kept},
    }


def after(name, args, model="", leader="", adapter=""):
    """An evaluation of LLM weights after training: eval.py's summary JSON in
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


def flat_groups(name, args):
    out = f"results/llm/flat_groups-{name}.json"
    return {"command": [PY, "-m", "experiments.flat_groups", *args, "--out", out], "outputs": [out]}


LLM_PIECES = {
    # how many MAGRPO groups are flat (all rollouts the same reward) on the untrained model
    "llm-flat-L1-a3-T1.0": flat_groups(
        "L1-a3-T1.0", ["--level", "1", "--agents", "3", "--temperature", "1.0"]
    ),
    "llm-flat-L1-a3-T0.7": flat_groups(
        "L1-a3-T0.7", ["--level", "1", "--agents", "3", "--temperature", "0.7"]
    ),
    "llm-flat-leader-L1-T0.7": flat_groups(
        "leader-L1-T0.7", ["--target", "leader", "--n", "64", "--temperature", "0.7"]
    ),
    # MAGRPO learning curves, one piece per seed, under the aggregation they were computed with
    # (token, the default then)
    **{
        f"llm-magrpo-L1-seed{seed}": llm_run(
            f"magrpo-L1-seed{seed}", MAGRPO_PRESET + ["--seed", str(seed), "--loss-agg", "token"]
        )
        for seed in (0, 1, 2)
    },
    # the same preset under today's default aggregation, sum (CoMLRL's MAGRPO loss)
    **{
        f"llm-magrpo-sum-L1-seed{seed}": llm_run(
            f"magrpo-sum-L1-seed{seed}", MAGRPO_PRESET + ["--seed", str(seed)]
        )
        for seed in (0, 1, 2)
    },
    # adapters against full fine-tuning (the sum run above), the learning rate on seed 0
    **{
        f"llm-{run}": llm_run(run, [*MAGRPO_LORA, "--seed", str(seed), "--lr", lr], adapter=True)
        for run, seed, lr in LORA_RUNS
    },
    # the chosen learning rate's runs also play debate (does a REFINE of agents trained on parallel
    # answers help?)
    **{
        f"after-{run}-{part}": after(
            f"{run}-{part}", AFTER_PARTS[part], adapter=f"results/agents/{run}.pt"
        )
        for run, _, lr in LORA_RUNS
        for part in (AFTER_PARTS if lr == LORA_LR else ["parallel"])
    },
    # how far an AdamW step moves adapters and whole weights, on a supervised batch
    "lora-step-size": {
        "command": [
            PY,
            "-m",
            "experiments.lora_step_size",
            "--out",
            "results/llm/lora-step-size.json",
        ],
        "outputs": ["results/llm/lora-step-size.json"],
    },
    # seconds per step and peak memory, full fine-tuning against adapters, 3 steps each
    # (run the two one after the other on a quiet machine: they are timings)
    **{
        f"llm-cost-{kind}": llm_run(f"cost-{kind}-L1", [*args, "--steps", "3", "--eval-every", "0"])
        for kind, args in (("full", MAGRPO_PRESET), ("lora", MAGRPO_LORA))
    },
    # agents trained to revise: MAGRPO on debate (round 0 + one REFINE; the reward is the
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
    # the same from the seed's parallel-trained adapter (agents that answer first, then revise):
    # from the base model seed 0's debate rollouts were mostly all wrong (flat groups, rewards
    # near 0)
    **{
        f"llm-magrpo-debate-warm-L1-seed{seed}": {
            **llm_run(
                f"magrpo-debate-warm-L1-seed{seed}",
                [*MAGRPO_LORA, "--protocol", "debate", "--rounds", "1", "--seed", str(seed)]
                + ["--lr", LORA_LR, "--init-adapter", parallel_adapter(seed)],
                adapter=True,
            ),
            "needs": [parallel_adapter(seed)],
        }
        for seed in (0, 1, 2)
    },
    **{
        f"after-magrpo-debate{warm}-L1-seed{seed}-{part}": after(
            f"magrpo-debate{warm}-L1-seed{seed}-{part}",
            AFTER_PARTS[part],
            adapter=f"results/agents/magrpo-debate{warm}-L1-seed{seed}.pt",
        )
        for warm in ("", "-warm")
        for seed in (0, 1, 2)
        for part in AFTER_PARTS
    },
    **{
        f"after-magrpo-sum-L1-seed{seed}-parallel": after(
            f"magrpo-sum-L1-seed{seed}-parallel",
            AFTER_PARTS["parallel"],
            model=f"{RUNS}/magrpo-sum-L1-seed{seed}/model",
        )
        for seed in (0, 1, 2)
    },
    # MLPO learning curves, one piece per seed
    **{
        f"llm-mlpo-L1-seed{seed}": llm_run(
            f"mlpo-L1-seed{seed}", MLPO_PRESET + ["--seed", str(seed)]
        )
        for seed in (0, 1, 2)
    },
    # the evaluations after training, paired on the same 300 test questions: the untrained team
    # (one greedy answer, the parallel vote, debate; the untrained backbone leading its peers),
    # then each trained run
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
}

# agents trained on the task's own worked solutions (train_solver.py --solutions worked,
# adapters): a small sweep of the adapters' rank and layers on easy arith, and
# the chosen adapter's settings trained on harder levels (members of a team that differ in skill)
WORKED_SFT = (
    "train_solver.py --solutions worked --task arith --questions 1024 --batch-size 32 "
    "--micro-batch 16 --epochs 1 --eval-every 8 --val-n 64 --save-every 4 --max-new-tokens 96"
).split()
WORKED_SWEEP = {"r8": ["--lora-rank", "8"], "r4": ["--lora-rank", "4"],
                "r16-attn": ["--lora-rank", "16", "--lora-targets", "self_attn"]}  # fmt: skip
WORKED_RUNS = [(1, name) for name in WORKED_SWEEP] + [(2, "r8"), (3, "r8")]


def worked_adapter(level, name):
    return committed(f"results/agents/worked-L{level}-{name}-seed0.pt")


LLM_PIECES |= {
    **{
        f"llm-worked-L{level}-{name}-seed0": llm_run(
            f"worked-L{level}-{name}-seed0",
            [*WORKED_SFT, "--level", str(level), *WORKED_SWEEP[name], "--seed", "0"],
            adapter=True,
        )
        for level, name in WORKED_RUNS
    },
    # each adapter's greedy answer (vanilla: agent 0 of a team of the adapter) on 300 test
    # questions of every level
    **{
        f"after-worked-L{level}-{name}-seed0-level{test}": after(
            f"worked-L{level}-{name}-seed0-level{test}",
            ["--level", str(test), "--rounds", "1", "--protocols", "vanilla"],
            adapter=worked_adapter(level, name),
        )
        for level, name in WORKED_RUNS
        for test in (1, 2, 3, 4)
    },
}
# the easy-arith adapter trained on, besides fresh worked solutions, one REFINE example per question
# (its own sampled solution and two peers' answers, the worked solution as target), from itself;
# then one REFINE round's effect on the vote of a team of each adapter
WORKED_REFINE = "worked-refine-L1-r8-seed0"
LLM_PIECES |= {
    f"llm-{WORKED_REFINE}": {
        **llm_run(
            WORKED_REFINE,
            [*WORKED_SFT, "--level", "1", *WORKED_SWEEP["r8"], "--seed", "1"]
            + ["--init-adapter", worked_adapter(1, "r8")]
            + ["--refine-contexts", worked_adapter(1, "r8")]
            # at the fresh adapter's 2e-3 the continued one lost its solo accuracy (results/)
            + ["--lr", "5e-4"],
            adapter=True,
        ),
        "needs": [worked_adapter(1, "r8")],
    },
    **{
        f"after-{run}-{part}": after(
            f"{run}-{part}", AFTER_PARTS[part], adapter=committed(f"results/agents/{run}.pt")
        )
        for run in ("worked-L1-r8-seed0", WORKED_REFINE)
        for part in AFTER_PARTS
    },
    # the sweep's other adapters in the game's round 0 (its solve prompt, not vanilla's)
    **{
        f"after-worked-L1-{name}-seed0-parallel": after(
            f"worked-L1-{name}-seed0-parallel",
            AFTER_PARTS["parallel"],
            adapter=worked_adapter(1, name),
        )
        for name in ("r4", "r16-attn")
    },
}
