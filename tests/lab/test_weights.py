"""The lab's weights out of the tree, none lost (experiments/weights.py): a weight leaves with a
manifest row, comes back from git history with its sha256 checked, or in a shallow clone by running
its piece; the runner counts a weight that left as done and restores a piece's needs first; and the
tree keeps no weight without a reason (the demo, the report, a pending piece)."""

import hashlib
import json
import subprocess
import sys

import pytest

from common import UsageError
from experiments import run as runner
from experiments import weights

ADAPTER = "results/agents/team/agent0"
POLICY = "results/policies/p.safetensors"
TABLE = "results/tables/t.json"


def git(root, *args):
    return subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, check=True
    ).stdout


def writer(files):
    """A piece's command: a Python one-liner writing `files` (path -> text) under runs/."""
    return [
        sys.executable,
        "-c",
        "import pathlib\n"
        f"for path, text in {files!r}.items():\n"
        "    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)\n"
        "    pathlib.Path(path).write_text(text)\n",
    ]


def lab_pieces(adapter_bytes="A" * 1000):
    """An adapter's training (weights, config, a metrics log), a policy's, and a table that loads
    the adapter (its command fails without it)."""
    return {
        "train-team": {
            "command": writer(
                {
                    "runs/team/agent0/adapter_model.safetensors": adapter_bytes,
                    "runs/team/agent0/adapter_config.json": "{}",
                    "runs/team/metrics.jsonl": "rerun",
                }
            ),
            "copies": {
                "runs/team/agent0": ADAPTER,
                "runs/team/metrics.jsonl": "results/llm/t.jsonl",
            },
        },
        "train-p": {
            "command": writer({"runs/p/policy.safetensors": "P" * 500}),
            "copies": {"runs/p/policy.safetensors": POLICY},
        },
        "table-t": {
            "command": [
                sys.executable,
                "-c",
                f"import pathlib; assert pathlib.Path({ADAPTER!r}).is_dir(); "
                f"pathlib.Path({TABLE!r}).write_text('{{}}')",
            ],
            "outputs": [TABLE],
            "needs": [ADAPTER],
        },
    }


@pytest.fixture
def lab(tmp_path, monkeypatch):
    """A scratch repository: an adapter folder and a policy committed, a Makefile whose demo loads
    the policy, the pieces that train them, and the table piece still to run (so it keeps the
    adapter)."""
    root = tmp_path / "repo"
    files = {
        f"{ADAPTER}/adapter_model.safetensors": "A" * 1000,
        f"{ADAPTER}/adapter_config.json": "{}",
        POLICY: "P" * 500,
        "results/policies/p.json": "{}",
        "results/llm/t.jsonl": "committed",
        "Makefile": f"demo:\n\tpython eval.py --protocols mpdf={POLICY},vanilla\n",
    }
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    git(root.parent, "init", "-q", str(root))
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "add", ".")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "weights")
    monkeypatch.setattr(weights, "ROOT", root)
    monkeypatch.setattr(weights, "PIECES", lab_pieces())
    monkeypatch.setattr(weights, "REPORT_READS", ())
    monkeypatch.setattr(runner, "PIECES", weights.PIECES)
    monkeypatch.setattr(runner, "ROOT", root)
    monkeypatch.chdir(root)
    return root


def commit(root, message):
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "add", "-A")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message)


def run_table_and_retire(root):
    (root / TABLE).parent.mkdir(parents=True)
    (root / TABLE).write_text("{}")
    commit(root, "the table")
    weights.retire([ADAPTER])
    commit(root, "the adapter leaves")


def test_a_weight_a_pending_piece_or_the_demo_loads_stays(lab, capsys):
    """The table piece has not run: its adapter stays, and so does the demo's policy; `check`
    finds nothing to retire. Once the table is committed, `check` names the adapter (exit 1)."""
    reasons = weights.keeping()
    assert weights.reason_kept(f"{ADAPTER}/adapter_model.safetensors", reasons) == "pending"
    assert weights.reason_kept(POLICY, reasons) == "demo"
    for path, reason in ((ADAPTER, "pending"), (POLICY, "demo")):
        with pytest.raises(UsageError, match=f"keeps it \\({reason}"):
            weights.retire([path])
    assert git(lab, "status", "--porcelain") == ""
    with pytest.raises(SystemExit) as done:
        weights.main(["check"])
    assert done.value.code == 0
    (lab / TABLE).parent.mkdir(parents=True)
    (lab / TABLE).write_text("{}")
    with pytest.raises(SystemExit) as done:
        weights.main(["check"])
    said = capsys.readouterr().out
    assert done.value.code == 1
    unkept = f"{ADAPTER}/adapter_model.safetensors"
    assert said.strip() == f"{unkept}: no demo, report or pending piece loads it: retire it"


def test_a_retired_weight_leaves_with_its_row_and_comes_back_from_history(lab, capsys):
    first = git(lab, "rev-parse", "HEAD").strip()
    run_table_and_retire(lab)
    rows = weights.manifest()
    assert sorted(rows) == [
        f"{ADAPTER}/adapter_config.json",
        f"{ADAPTER}/adapter_model.safetensors",
    ]
    row = rows[f"{ADAPTER}/adapter_model.safetensors"]
    assert row == {
        "path": f"{ADAPTER}/adapter_model.safetensors",
        "sha256": hashlib.sha256(b"A" * 1000).hexdigest(),
        "bytes": 1000,
        "commit": first,
        "piece": "train-team",
        "machine": None,
    }
    assert git(lab, "ls-files", ADAPTER) == "" and not (lab / ADAPTER).exists()
    assert weights.present(ADAPTER) and weights.present(f"{ADAPTER}/adapter_config.json")
    assert not weights.present("results/agents/other")
    assert weights.recorded(lab / ADAPTER / "adapter_model.safetensors", "bytes") == 1000
    assert weights.recorded(POLICY, "sha256") == hashlib.sha256(b"P" * 500).hexdigest()
    assert weights.recorded("results/agents/other.pt", "sha256") is None
    weights.main(["restore", ADAPTER])
    said = capsys.readouterr().out
    assert said.count(f"restored from commit {first[:12]}, sha256 equal") == 2
    assert (lab / ADAPTER / "adapter_model.safetensors").read_text() == "A" * 1000
    weights.main(["restore", ADAPTER])
    assert capsys.readouterr().out == ""
    # bytes in history that are not the manifest's are refused, not written
    (lab / ADAPTER / "adapter_model.safetensors").unlink()
    wrong = dict(row, sha256="0" * 64)
    (lab / weights.MANIFEST).write_text(json.dumps(wrong) + "\n")
    with pytest.raises(UsageError, match="not the manifest's"):
        weights.restore(ADAPTER)
    assert not (lab / ADAPTER / "adapter_model.safetensors").exists()


def test_a_file_standing_at_the_path_with_other_bytes_is_replaced_not_accepted(lab, capsys):
    """Restore judges a file already at the path by its sha256, not by its being there: other
    bytes (a half-copied file, another run's weights) are replaced by the manifest's, and the
    manifest's own bytes are left alone."""
    run_table_and_retire(lab)
    weight = lab / ADAPTER / "adapter_model.safetensors"
    weight.parent.mkdir(parents=True)
    weight.write_text("B" * 1000)
    weights.restore(ADAPTER)
    assert "adapter_model.safetensors: restored from commit" in capsys.readouterr().out
    assert weight.read_text() == "A" * 1000
    weights.restore(ADAPTER)
    assert capsys.readouterr().out == "" and weight.read_text() == "A" * 1000


def test_a_retire_keeps_every_row_the_manifest_held(lab):
    """Retiring one weight adds its rows to those already there: a weight that left before it
    keeps its row, so it can still come back."""
    run_table_and_retire(lab)
    before = weights.manifest()
    (lab / "Makefile").write_text("demo:\n\tpython eval.py --protocols vanilla\n")
    commit(lab, "the demo loads no policy")
    weights.retire([POLICY])
    after = weights.manifest()
    assert {k: after[k] for k in before} == before
    assert set(after) == set(before) | {POLICY}
    assert after[POLICY]["sha256"] == hashlib.sha256(b"P" * 500).hexdigest()


def test_in_a_shallow_clone_a_weight_comes_back_by_running_its_piece(lab, monkeypatch, capsys):
    """The commit that holds the adapter is not in a shallow clone: its piece runs, and only the
    weight's files are copied out of the run (the piece's committed metrics stay); the sha256 is
    compared, and said to differ when the run trains other bytes."""
    run_table_and_retire(lab)
    clone = lab.parent / "clone"
    git(lab.parent, "clone", "-q", "--depth", "1", f"file://{lab}", str(clone))
    assert git(clone, "rev-parse", "--is-shallow-repository").strip() == "true"
    monkeypatch.setattr(weights, "ROOT", clone)
    monkeypatch.chdir(clone)
    weights.restore(f"{ADAPTER}/adapter_model.safetensors")
    said = capsys.readouterr().out
    assert "restored by running train-team" in said and "sha256 equal" in said
    assert (clone / ADAPTER / "adapter_model.safetensors").read_text() == "A" * 1000
    assert not (clone / ADAPTER / "adapter_config.json").exists()
    assert (clone / "results/llm/t.jsonl").read_text() == "committed"
    monkeypatch.setattr(weights, "PIECES", lab_pieces(adapter_bytes="B" * 1000))
    (clone / ADAPTER / "adapter_model.safetensors").unlink()
    weights.restore(ADAPTER)
    said = capsys.readouterr().out
    assert "adapter_model.safetensors: restored by running train-team" in said
    assert "sha256 differs" in said and "adapter_config.json" in said


def test_the_runner_counts_a_weight_that_left_as_done_and_restores_a_need_first(
    lab, monkeypatch, capsys
):
    run_table_and_retire(lab)
    monkeypatch.setattr(sys, "argv", ["run.py", "--list"])
    runner.main()
    listed = capsys.readouterr().out
    assert "done     train-team" in listed and "done     table-t" in listed
    (lab / TABLE).unlink()
    monkeypatch.setattr(sys, "argv", ["run.py", "table-"])
    runner.main()
    assert (lab / TABLE).exists()
    assert (lab / ADAPTER / "adapter_model.safetensors").read_text() == "A" * 1000


def test_the_command_refuses_what_it_cannot_do(lab, capsys):
    for argv in (["restore"], ["restore", "results/agents/nothing"], ["retire", "results/nothing"]):
        with pytest.raises(SystemExit) as done:
            weights.main(argv)
        assert done.value.code == 2
        assert capsys.readouterr().err.count("\n") == 1


# ---------------------------------------------------------------- the repository's own weights
def test_every_weight_that_left_the_tree_can_come_back():
    """Each row names a file that is not in the tree, the piece whose outputs hold it, and its
    bytes and sha256; where this clone has the history, the commit holds those bytes (the sha256
    checked on the smallest weight, the size on every file)."""
    rows = list(weights.manifest().values())
    assert rows, "results/weights.jsonl is empty"
    tracked = set(git(weights.ROOT, "ls-files", "results").split("\n"))
    for row in rows:
        assert set(row) == {"path", "sha256", "bytes", "commit", "piece", "machine"}
        assert row["path"] not in tracked and row["piece"] in weights.PIECES
        assert weights.producer(row["path"]) == row["piece"]
        assert len(row["sha256"]) == 64 and row["bytes"] > 0
    if git(weights.ROOT, "rev-parse", "--is-shallow-repository").strip() == "true":
        pytest.skip("a shallow clone: the weights come back by running their pieces")
    asked = "".join(f"{row['commit']}:{row['path']}\n" for row in rows)
    sizes = subprocess.run(
        ["git", "-C", str(weights.ROOT), "cat-file", "--batch-check=%(objectsize)"],
        input=asked,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert sizes == [str(row["bytes"]) for row in rows]
    smallest = min((r for r in rows if weights.is_weight(r["path"])), key=lambda r: r["bytes"])
    blob = subprocess.run(
        [
            "git",
            "-C",
            str(weights.ROOT),
            "cat-file",
            "blob",
            f"{smallest['commit']}:{smallest['path']}",
        ],
        capture_output=True,
        check=True,
    ).stdout
    assert hashlib.sha256(blob).hexdigest() == smallest["sha256"]


def test_the_tree_keeps_no_weight_without_a_reason():
    """Every committed weight is loaded by the demo, the report or a pending piece; the demo's
    weights are all here."""
    reasons = weights.keeping()
    assert [f for f in weights.tree_weights() if weights.reason_kept(f, reasons) is None] == []
    for path in weights.demo_weights():
        assert weights.tracked_files(path)
