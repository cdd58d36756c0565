"""Compares two experiments/same_behaviour.sh outputs: policy weights bit for bit, each run's
metrics.jsonl, its corpus (every state's key, observation and action, and the oracle label of a
stage-1 corpus, the counterfactual reward vector and behaviour logits of a stage-2 one), the eval
tables, and the LLM-weight runs' metrics and saved adapters.

python -m experiments.same_behaviour /tmp/check-before /tmp/check-after
"""

import hashlib
import json
import re
import sys
from pathlib import Path

import torch

from common import load_file, load_tensors
from llm.team import read_adapter


def table(folder):
    """eval.out's table with the folder name, the policy files' suffix (an older run's .pt, a newer
    one's .safetensors) and the column padding taken out."""
    text = (Path(folder) / "eval.out").read_text().replace(str(Path(folder).resolve()), "OUT")
    text = re.sub(r"policy\.(pt|safetensors)", "policy", text)
    return [re.sub(r"[ -]+", " ", line).strip() for line in text.splitlines()]


def policy_tensors(folder):
    """The tensors of the policy a run saved (policy.safetensors, or an older run's policy.pt)."""
    new = folder / "policy.safetensors"
    return load_tensors(new if new.exists() else folder / "policy.pt", "policy")[0]


def saved_adapter(folder):
    """The sha256 of the adapter's tensors an LLM-weight run saved (a PEFT folder, or an older run's
    adapter.pt), and their sum."""
    tensors = read_adapter(
        folder / "adapter" if (folder / "adapter").is_dir() else folder / "adapter.pt"
    )["tensors"]
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode() + tensors[name].contiguous().numpy().tobytes())
    return {
        "adapter_sha256": digest.hexdigest()[:16],
        "adapter_sum": sum(float(t.double().sum()) for t in tensors.values()),
    }


def llm_step(folder):
    """A MAGRPO or MLPO step: its logged loss, grad norm and reward (not its timings), and the
    adapter it saved."""
    [record] = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    kept = {k: record[k] for k in ("loss", "kl", "grad_norm", "mean_reward", "tokens")}
    return {**kept, **saved_adapter(folder)}


def solver_run(folder):
    """train_solver.py's run: every logged line (losses, grad norms, the greedy validation's
    accuracy; not its timings and memory) and the adapter it saved."""
    lines = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    measured = ("step_s", "peak_memory_mb")
    metrics = [{k: v for k, v in line.items() if k not in measured} for line in lines]
    return {"metrics": metrics, **saved_adapter(folder)}


def corpus_rows(path):
    """What a corpus holds of each state (a stage-2 corpus once kept oracle labels too: the
    comparison reads the fields both files store)."""
    fields = ("key", "own", "peers", "agent", "action", "label", "rewards", "old_logits")
    rows = load_file(path, "corpus")["rows"]
    return [{k: r[k] for k in fields if r.get(k) is not None} for r in rows]


if __name__ == "__main__":
    before, after = sys.argv[1:3]
    same = True
    for run in ("sft-py", "sft-tr", "rl-py", "rl-tr"):
        a, b = (policy_tensors(Path(d) / run) for d in (before, after))
        identical = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        same &= identical
        print(f"{run}/policy: {'bit-identical' if identical else 'DIFFERENT'} ({len(a)} tensors)")
        metrics = [(Path(d) / run / "metrics.jsonl").read_text() for d in (before, after)]
        same &= metrics[0] == metrics[1]
        print(f"{run}/metrics.jsonl: {'identical' if metrics[0] == metrics[1] else 'DIFFERENT'}")
        name = "corpus.pt" if run.startswith("sft") else "corpus-0.pt"
        rows = [corpus_rows(Path(d) / run / name) for d in (before, after)]
        fields = [k for k in rows[0][0] if k in rows[1][0]]
        rows = [[{k: r[k] for k in fields} for r in version] for version in rows]
        same &= rows[0] == rows[1]
        verdict = "identical" if rows[0] == rows[1] else "DIFFERENT"
        print(f"{run}/{name}: {verdict} ({len(rows[0])} states: {', '.join(fields)})")
    for run in ("magrpo", "mlpo"):
        steps = [llm_step(Path(d) / run) for d in (before, after)]
        same &= steps[0] == steps[1]
        verdict = "identical" if steps[0] == steps[1] else "DIFFERENT"
        print(f"{run}: loss, grad norm, reward and saved adapter {verdict}: {steps[1]}")
    runs = [solver_run(Path(d) / "solver") for d in (before, after)]
    same &= runs[0] == runs[1]
    verdict = "identical" if runs[0] == runs[1] else "DIFFERENT"
    print(f"solver: metrics.jsonl and saved adapter {verdict}: {runs[1]['adapter_sha256']}")
    tables = table(before) == table(after)
    print(f"eval table: {'identical' if tables else 'DIFFERENT'}")
    sys.exit(0 if same and tables else 1)
