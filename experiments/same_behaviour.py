"""Compares two experiments/same_behaviour.sh outputs: policy weights bit for bit, and the eval
tables.

python experiments/same_behaviour.py /tmp/check-before /tmp/check-after
"""

import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import load_file  # noqa: E402


def table(folder):
    """eval.out's table with the folder name and the column padding taken out."""
    text = (Path(folder) / "eval.out").read_text().replace(str(Path(folder).resolve()), "OUT")
    return [re.sub(r"[ -]+", " ", line).strip() for line in text.splitlines()]


if __name__ == "__main__":
    before, after = sys.argv[1:3]
    same = True
    for run in ("sft-py", "sft-tr", "rl-py", "rl-tr"):
        a, b = (
            load_file(Path(d) / run / "policy.pt", "policy")["state_dict"] for d in (before, after)
        )
        identical = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        same &= identical
        print(
            f"{run}/policy.pt: {'bit-identical' if identical else 'DIFFERENT'} ({len(a)} tensors)"
        )
    tables = table(before) == table(after)
    print(f"eval table: {'identical' if tables else 'DIFFERENT'}")
    sys.exit(0 if same and tables else 1)
