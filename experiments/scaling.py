"""Scaling study (issue 4): one trained policy with 2-5 agents (3 rounds) and 1-5 rounds (3 agents), next to
debate and majority vote of the same team (mpdf-persist), on the same questions.

    python experiments/scaling.py --protocols debate,mpdf-persist,mpdf=runs/exp/rl/policy.pt --n 50 \
        --out runs/scaling.json

Any eval.py flag works; --agents and --rounds are swept. The policy network is permutation-equivariant over
peers, so one trained on 3 agents runs on any team size.
"""
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import eval as evaluation  # noqa: E402

SWEEP = [(agents, 3) for agents in (2, 3, 4, 5)] + [(3, rounds) for rounds in (1, 2, 4, 5)]

if __name__ == "__main__":
    base = evaluation.parse_config(evaluation.Config)
    table = {}
    for agents, rounds in SWEEP:
        summaries = evaluation.main(dataclasses.replace(base, agents=agents, rounds=rounds, out=""))
        table[f"{agents} agents, {rounds} rounds"] = {
            p: {k: s[k] for k in ("accuracy", "stderr", "tokens_per_question", "calls_per_question")}
            for p, s in summaries.items()}
    protocols = list(next(iter(table.values())))
    print("\n" + f"{'team':<22}" + "".join(f"{p[-30:]:>32}" for p in protocols))
    for setting, row in table.items():
        print(f"{setting:<22}" + "".join(f"{row[p]['accuracy']:>17.3f} ({row[p]['tokens_per_question']:>6.0f} tok)"
                                         for p in protocols))
    if base.out:
        Path(base.out).parent.mkdir(parents=True, exist_ok=True)
        Path(base.out).write_text(json.dumps({"config": dataclasses.asdict(base), **table}, indent=1))
