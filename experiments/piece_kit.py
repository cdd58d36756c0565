"""What pieces are made of (experiments/pieces.py, experiments/team_pieces.py): a training run,
an evaluation table, a seed's policies and their tables, for the default team or a trained one
(experiments/teams.py)."""

from pathlib import Path

from experiments.llm_pieces import PY, RUNS, committed
from experiments.teams import team_adapters, team_flags

# the state the committed SFT policies read, sft.py's default when they were computed (now text)
SFT_STATE = ["--features", "all"]

MAWPS = "../shared/data/mawps_asdiv/train.csv"


def outputs(piece):
    """The files a piece leaves in results/: what its command writes, and what is copied from its
    run (a safetensors file with its settings' JSON beside it, without which it does not load)."""
    copied = [Path(p) for p in piece.get("copies", {}).values()]
    settings = [p.with_suffix(".json") for p in copied if p.suffix == ".safetensors"]
    return [Path(p) for p in piece.get("outputs", [])] + copied + settings


def flags_once(command):
    """The command with each --flag once: a preset's flags followed by a piece's changes read as
    one command, a later value taking the earlier one's place (argparse would take the last)."""
    parts, where = [], {}
    i = 0
    while i < len(command):
        token = str(command[i])
        valued = i + 1 < len(command) and not str(command[i + 1]).startswith("--")
        part = command[i : i + 2] if token.startswith("--") and valued else command[i : i + 1]
        if token.startswith("--") and token in where:
            parts[where[token]] = part
        else:
            where[token] = len(parts)
            parts.append(part)
        i += len(part)
    return [t for part in parts for t in part]


# the full-size tables (a-d): every script with its defaults (the settings the study chose), 3
# agents, 3 rounds; each seed trains its own policies on the task's training split and is scored on
# 300 test questions of that seed
TABLE_SEEDS = (0, 1, 2)
TABLE_GAME = ["--agents", "3", "--rounds", "3"]
TABLE_RL_ALGOS = ("softrank", "grpo", "ppo")
TABLE_TASKS = {"arith": ["--task", "arith"], "mawps": ["--task", "mawps", "--path", MAWPS]}
# train_rl.py flags of each RL policy name
RL_FLAGS = {
    **{algo: ["--algo", algo] for algo in ("softrank", "grpo", "ppo", "ranks", "loo")},
    "softrank-cost0": ["--algo", "softrank", "--refine-cost", "0"],
}


def script_command(script):
    """How a piece runs a script: a stage script by its file (train_rl.py), a lab module with -m
    (experiments.rl_later_credit)."""
    return [PY, script] if script.endswith(".py") else [PY, "-m", script]


def trained(name, script, args, policy=""):
    """A training piece: the script writes runs/results/<name>; policy (as `policy` names it, by
    default the .pt the earlier pieces wrote), summary and metrics go to results/."""
    out = RUNS / name
    return {
        "command": [*script_command(script), *args, "--out-dir", str(out)],
        "copies": {
            out / "policy.safetensors": policy or committed(f"results/policies/{name}.pt"),
            out / "summary.json": f"results/training/{name}.json",
            out / "metrics.jsonl": f"results/training/{name}.metrics.jsonl",
        },
    }


def merged(dicts):
    """One dict of the pieces of several seeds or settings."""
    return {name: piece for d in dicts for name, piece in d.items()}


def table(name, args):
    """An evaluation piece: eval.py's summary JSON (per-question outcomes, no transcripts)."""
    return {
        "command": [PY, "eval.py", *args, "--no-details", "--out", f"results/tables/{name}.json"],
        "outputs": [f"results/tables/{name}.json"],
    }


def run_prefix(task, seed, team=""):
    return f"{task}-team-{team}-seed{seed}" if team else f"{task}-seed{seed}"


def table_policy(task, algo, seed, team=""):
    return committed(f"results/policies/{run_prefix(task, seed, team)}-{algo}.pt")


def policy_pieces(task, seed, algos, team=""):
    """The seed's SFT policy, then each RL algorithm of `algos` from it (pi_ref = the SFT
    policy), for the default team or a TEAMS one."""
    base = [*TABLE_TASKS[task], *TABLE_GAME, "--seed", str(seed), *team_flags(team)]
    prefix = run_prefix(task, seed, team)
    sft = table_policy(task, "sft", seed, team)
    return {
        f"train-{prefix}-sft": {
            **trained(f"{prefix}-sft", "sft.py", [*base, *SFT_STATE]),
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


def table_pieces(name, task, seed, protocols, game=TABLE_GAME, team="", any_game=False):
    """One eval.py piece per protocol on 300 test questions of `task` (seed `seed`);
    {trained_on-algo} in a protocol is the seed's policy of that algorithm trained on that task
    (by the same team), which the piece needs. any_game: a study of transfer, whose policies play
    another task or team size or number of rounds than they were trained in (eval.py --any-game)."""
    pieces = {}
    for short, protocol in protocols.items():
        needs = team_adapters(team)
        if "{" in protocol:
            key = protocol[protocol.index("{") + 1 : -1]
            needs = [table_policy(*key.split("-", 1), seed, team), *needs]
            protocol = protocol.replace("{" + key + "}", needs[0])
        test = ["--split", "test", "--n", "300", "--seed", str(seed), "--protocols", protocol]
        test += ["--any-game"] if any_game else []
        pieces[f"table-{name}-{short}"] = {
            **table(name + "-" + short, [*TABLE_TASKS[task], *game, *team_flags(team), *test]),
            "needs": needs,
        }
    return pieces
