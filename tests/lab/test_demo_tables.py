"""`make demo`'s tables beside the committed figures (experiments/demo_tables.py): each demo
protocol read against the same protocol's full-size tables, over the seeds found."""

import json

from experiments import demo_tables, tables


def write(root, name, accuracy, n=300):
    path = root / "tables" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"p": {"accuracy": accuracy, "n": n}}))


def test_each_demo_protocol_beside_its_committed_figure(tmp_path, monkeypatch):
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    for seed, accuracy in enumerate((0.2, 0.3, 0.4)):
        write(tmp_path, f"arith300-seed{seed}-softrank", accuracy)
    write(tmp_path, "split300-team-split-seed0-alone-m0", 0.5, n=100)
    policy = "mpdf=results/policies/arith-seed0-softrank.safetensors"
    # mean and sample std of the three seeds, with their count and size
    assert demo_tables.committed_figure("arith", policy) == "0.300 ± 0.100 (3 × 300)"
    assert demo_tables.committed_figure("split", "alone") == "0.500 (1 × 100)"
    assert demo_tables.committed_figure("arith", "sc") == "not computed"
    own = "mpdf=runs/demo/rl/policy.safetensors"
    assert demo_tables.committed_figure("arith", own) == "none: no full-size table"
    run = {"config": {}, policy: {"accuracy": 0.25, "n": 32}, own: {"accuracy": 0.125, "n": 32}}
    rows = demo_tables.table(run, "arith").splitlines()
    assert "demo, 32 q." in rows[0]
    assert rows[1].split()[1:] == ["0.250", "0.300", "±", "0.100", "(3", "×", "300)"]
    assert rows[2].split()[1:] == ["0.125", "none:", "no", "full-size", "table"]
