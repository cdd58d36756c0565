"""The pieces of on-policy stage 2 on the split task: the committed stage 2 learns from one corpus,
the SFT policy's games, while the trained policy meets other states. train_rl.py --iterations
collects the corpus again before each update, from fresh training questions played by the policy
of the iteration before; these runs go one and two iterations beyond the committed one (its first
iteration is theirs), from the same SFT policy, 3 seeds, each played on the seed's 300 test
questions. experiments/pieces.py holds them with every other piece."""

from experiments.piece_kit import TABLE_SEEDS, merged, table, trained
from experiments.split_pieces import ADAPTERS, PREFIX, SPLIT_GAME, SPLIT_TASK, TEAM, TRAIN_FLAGS

# the corpora collected again beyond the first, each a run of its own (a run of n+1 iterations
# repeats the first n's games from the generation cache)
AGAIN = (1, 2)
# SoftRankPO with REFINE free of its cost, the split table's most accurate policy: the one whose
# losses to freeze the corpus might explain (at its default cost the policy REFINEs less still)
ALGOS = ("softrank-cost0",)


def onpolicy_part(algo, again):
    """A run's part of its table's name: the algorithm and how often its corpus was collected
    again."""
    return f"{algo}-onpolicy{again}"


# every on-policy run's part, as the split team's tables name them
ONPOLICY_PARTS = tuple(onpolicy_part(algo, again) for algo in ALGOS for again in AGAIN)


def onpolicy_name(seed, algo, again):
    """A run's name: the seed's table prefix and its part."""
    return f"{PREFIX}-seed{seed}-{onpolicy_part(algo, again)}"


def onpolicy_pieces(seed, algo):
    """One seed and algorithm: for each count in AGAIN, the policy trained on that many corpora
    collected again after the first, and its table."""
    base = [*SPLIT_TASK, *SPLIT_GAME, "--models", TEAM, "--seed", str(seed)]
    test = ["--split", "test", "--n", "300", "--seed", str(seed)]
    sft = f"results/policies/{PREFIX}-seed{seed}-sft.safetensors"
    pieces = {}
    for again in AGAIN:
        name = onpolicy_name(seed, algo, again)
        policy = f"results/policies/{name}.safetensors"
        flags = [*base, *TRAIN_FLAGS[algo], "--iterations", str(again + 1), "--init", sft]
        pieces[f"train-{name}"] = {
            **trained(name, "train_rl.py", flags, policy),
            "needs": [sft, *ADAPTERS],
        }
        pieces[f"table-{name}"] = {
            **table(name, [*base, *test, "--protocols", f"mpdf={policy}"]),
            "needs": [policy, *ADAPTERS],
        }
    return pieces


ONPOLICY_PIECES = merged(onpolicy_pieces(seed, algo) for algo in ALGOS for seed in TABLE_SEEDS)
