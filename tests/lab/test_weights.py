"""The lab's weights out of the tree, none lost (experiments/weights.py): a weight leaves with a
manifest row, comes back from git history with its sha256 checked, or in a shallow clone by running
its piece; the runner counts a weight that left as done and restores a piece's needs first; and the
tree keeps no weight without a reason (the demo, the report, a pending piece)."""

import hashlib
import io
import json
import os
import subprocess
import sys

import pytest
import torch

import common
from common import UsageError, machine
from experiments import run as runner
from experiments import weights
from llm import lora

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


def test_keep_writes_each_kind_of_weight_in_its_target_s_form(tmp_path):
    """An adapter folder or a safetensors policy kept as a .pt target is rewritten as that form
    (the adapter's dict; the policy's settings beside its state_dict; a policy without its
    settings refused as a policy file); a safetensors policy kept as
    safetensors is copied with its settings' JSON; a folder into a folder that exists; a log file
    byte for byte."""
    tensors = {"layer.A": torch.arange(8.0).reshape(2, 4), "layer.B": torch.ones(4, 2)}
    state = {
        "format": lora.FORMAT,
        "base": "tiny",
        "rank": 2,
        "alpha": 4.0,
        "targets": ["layer"],
        "base_fingerprint": "f",
        "tensors": tensors,
    }
    folder = lora.write_peft(state, tmp_path / "run" / "agent0")
    weights.keep(folder, tmp_path / "agent0.pt")
    kept = torch.load(tmp_path / "agent0.pt", weights_only=True)
    assert kept["rank"] == 2 and kept["base_fingerprint"] == "f"
    assert all(torch.equal(kept["tensors"][k], v) for k, v in tensors.items())

    policy = tmp_path / "run" / "policy.safetensors"
    common.save_tensors({"w": torch.arange(3.0)}, {"config": {"hidden": 3}}, policy)
    weights.keep(policy, tmp_path / "p.pt")
    kept = torch.load(tmp_path / "p.pt", weights_only=True)
    assert sorted(kept) == ["config", "state_dict"] and kept["config"] == {"hidden": 3}
    assert torch.equal(kept["state_dict"]["w"], torch.arange(3.0))
    policy.with_suffix(".json").rename(tmp_path / "settings.json")
    with pytest.raises(common.FileRefused, match="policy.safetensors: cannot read the policy file"):
        weights.keep(policy, tmp_path / "p.pt")
    (tmp_path / "settings.json").rename(policy.with_suffix(".json"))
    weights.keep(policy, tmp_path / "q.safetensors")
    assert (tmp_path / "q.safetensors").read_bytes() == policy.read_bytes()
    assert (tmp_path / "q.json").read_text() == policy.with_suffix(".json").read_text()

    (tmp_path / "into").mkdir()
    weights.keep(folder, tmp_path / "into")
    assert sorted(p.name for p in (tmp_path / "into").iterdir()) == sorted(
        p.name for p in folder.iterdir()
    )
    assert (tmp_path / "into" / lora.PEFT_WEIGHTS).read_bytes() == (
        folder / lora.PEFT_WEIGHTS
    ).read_bytes()
    (tmp_path / "run" / "m.jsonl").write_text("log")
    weights.keep(tmp_path / "run" / "m.jsonl", tmp_path / "m.jsonl")
    assert (tmp_path / "m.jsonl").read_text() == "log"


def test_a_rerun_copies_a_file_its_own_way(lab):
    """rerun_file: a .pt target of its own goes through keep (a safetensors run file rewritten),
    any other target of its own is copied as it is, a file below a folder target is copied alone;
    a path the run does not write is refused by name."""
    run = lab / "runs" / "x"
    run.mkdir(parents=True)
    common.save_tensors({"w": torch.ones(2)}, {"config": {}}, run / "policy.safetensors")
    (run / "log.jsonl").write_text("L")
    copies = {
        "runs/x/log.jsonl": "results/x/log.jsonl",
        "runs/x/policy.safetensors": "results/x/p.pt",
        "runs/x": "results/x/all",
    }
    (lab / "results/x/all").mkdir(parents=True)
    weights.rerun_file("results/x/p.pt", copies)
    assert torch.load(lab / "results/x/p.pt", weights_only=True)["config"] == {}
    weights.rerun_file("results/x/log.jsonl", copies)
    assert (lab / "results/x/log.jsonl").read_text() == "L"
    weights.rerun_file("results/x/all/log.jsonl", copies)
    assert (lab / "results/x/all/log.jsonl").read_text() == "L"
    copied = {"runs/x/policy.safetensors": "results/x/q.safetensors"}
    weights.rerun_file("results/x/q.safetensors", copied)
    assert (lab / "results/x/q.safetensors").read_bytes() == (
        run / "policy.safetensors"
    ).read_bytes()
    with pytest.raises(UsageError, match=r"^results/x/z.pt: its piece's run writes no such file$"):
        weights.rerun_file("results/x/z.pt", copies)


def test_a_piece_rerun_restores_its_needs_says_what_it_runs_and_stops_when_it_fails(
    lab, monkeypatch, capfd, tmp_path
):
    """by_piece restores the piece's needs first, says the command before the piece's own output
    (flushed: a log shows them in order), runs it in the repository from wherever it is called,
    says per file whether the sha256 is the manifest's and on which CPU each was made, and stops
    on a piece that fails; a piece that copies nothing out of its run is refused by name."""
    run_table_and_retire(lab)
    pieces = dict(weights.PIECES)
    command = writer({"runs/p/policy.safetensors": "P" * 500})
    command[2] = "print('training', flush=True)\n" + command[2]
    pieces["train-p"] = dict(pieces["train-p"], command=command, needs=[ADAPTER])
    pieces["broken"] = {"command": [sys.executable, "-c", "raise SystemExit(3)"], "outputs": []}
    pieces["nothing"] = {"command": [sys.executable, "-c", "pass"], "outputs": [POLICY]}
    monkeypatch.setattr(weights, "PIECES", pieces)
    monkeypatch.chdir(tmp_path)
    row = {"path": POLICY, "sha256": "ab" * 32, "machine": "cpu: Z"}
    out = io.TextIOWrapper(io.FileIO(os.dup(1), "w"), encoding="utf-8")
    monkeypatch.setattr(sys, "stdout", out)
    weights.by_piece("train-p", [row, {"path": POLICY, "sha256": "ab" * 32}])
    out.flush()
    said = capfd.readouterr().out
    assert (lab / ADAPTER / "adapter_model.safetensors").read_text() == "A" * 1000
    announced = f"== train-p: {' '.join(map(str, command))}\n"
    assert said.index(announced) < said.index("training\n")
    mine = hashlib.sha256(b"P" * 500).hexdigest()
    verdict = (
        f"{POLICY}: restored by running train-p on {machine()}: sha256 differs (here "
        f"{mine[:12]}) to the manifest's {'ab' * 6} (made on "
    )
    assert said.endswith(f"{verdict}cpu: Z)\n{verdict}an unrecorded CPU)\n")
    with pytest.raises(subprocess.CalledProcessError):
        weights.by_piece("broken", [])
    with pytest.raises(UsageError, match="its piece's run writes no such file"):
        weights.by_piece("nothing", [row])


def test_restore_prefers_history_and_says_what_it_refuses(lab, capsys):
    """A file whose commit is here comes back from history alone (its piece does not run); the
    refusals name the file and the commit as the user would look them up."""
    first = git(lab, "rev-parse", "HEAD").strip()
    run_table_and_retire(lab)
    row = weights.manifest()[f"{ADAPTER}/adapter_model.safetensors"]
    assert weights.from_history(row) is True
    assert "restored by running" not in capsys.readouterr().out
    wrong = dict(row, sha256="0" * 64)
    expected = f"^{row['path']}: the bytes in {first[:12]} are not the manifest's$"
    with pytest.raises(UsageError, match=expected):
        weights.from_history(wrong)
    expected = f"^results/nothing: neither in the tree nor in {weights.MANIFEST}$"
    with pytest.raises(UsageError, match=expected):
        weights.restore("results/nothing")
    with pytest.raises(subprocess.CalledProcessError):
        weights.git("rev-parse", "--verify", "no-such-ref")


def test_the_manifest_and_the_pieces_log_read_past_blank_lines_and_name_the_cpu(lab):
    """A retired file's row names the CPU its piece's last committed run was made on (the pieces'
    log), and the commit that last changed it; blank or spaces-only lines in either file are
    skipped."""
    log = lab / "results" / "pieces.jsonl"
    log.write_text(
        json.dumps({"piece": "train-team", "machine": "cpu: A"})
        + "\n   \n"
        + json.dumps({"piece": "train-team", "machine": "cpu: B"})
        + "\n"
    )
    assert weights.piece_machines() == {"train-team": "cpu: B"}
    (lab / ADAPTER / "adapter_config.json").write_text('{"r": 2}')
    commit(lab, "the adapter's config again")
    second = git(lab, "rev-parse", "HEAD").strip()
    run_table_and_retire(lab)
    rows = weights.manifest()
    assert rows[f"{ADAPTER}/adapter_config.json"]["commit"] == second
    assert {row["machine"] for row in rows.values()} == {"cpu: B"}
    manifest = lab / weights.MANIFEST
    manifest.write_text(manifest.read_text() + "  \n")
    assert weights.manifest() == rows


def test_retire_refuses_by_name_leaves_other_changes_alone_and_stages_the_manifest(lab):
    """A weight no piece trains, or with uncommitted changes, is refused in one line naming it; an
    uncommitted change elsewhere does not stop a retire; the manifest is staged with the removal;
    a path named as an option to git is read as a path."""
    stray = "results/policies/stray.safetensors"
    (lab / stray).write_text("S")
    commit(lab, "a weight no piece trains")
    with pytest.raises(UsageError, match=f"^{stray}: no piece trains it, so a clone could not"):
        weights.retire([stray])
    (lab / TABLE).parent.mkdir(parents=True)
    (lab / TABLE).write_text("{}")
    commit(lab, "the table")
    (lab / ADAPTER / "adapter_config.json").write_text("changed")
    with pytest.raises(UsageError, match="adapter_config.json: has uncommitted changes; commit"):
        weights.retire([ADAPTER])
    git(lab, "checkout", "--", ADAPTER)
    (lab / "results/llm/t.jsonl").write_text("changed elsewhere")
    weights.retire([ADAPTER])
    staged = git(lab, "diff", "--cached", "--name-only").split()
    assert weights.MANIFEST in staged and f"{ADAPTER}/adapter_model.safetensors" in staged
    (lab / "--cached").write_text("a file named as an option")
    commit(lab, "a file named as an option")
    assert weights.tracked_files("--cached") == ["--cached"]


def test_why_the_tree_keeps_a_weight_and_which_piece_made_it(lab, monkeypatch):
    """The report's weights are kept for the report; producer names the piece whose outputs hold a
    file or a folder above it; tree_weights counts only results/; relative leaves a path outside
    the repository as it is; a pending piece without needs keeps nothing."""
    monkeypatch.setattr(weights, "REPORT_READS", ("results/policies/r.safetensors",))
    reasons = weights.keeping()
    assert weights.reason_kept("results/policies/r.safetensors", reasons) == "report"
    assert weights.producer(POLICY) == "train-p"
    assert weights.producer(f"{ADAPTER}/adapter_model.safetensors") == "train-team"
    assert weights.producer("results/llm/t.jsonl") == "train-team"
    assert weights.producer("results/other/x.pt") is None
    (lab / "scratch").mkdir()
    (lab / "scratch" / "w.pt").write_text("w")
    commit(lab, "a weight outside results/")
    assert weights.tree_weights() == [f"{ADAPTER}/adapter_model.safetensors", POLICY]
    assert weights.relative("/elsewhere/x.pt") == "/elsewhere/x.pt"
    assert weights.relative(lab / POLICY) == POLICY
    pieces = dict(weights.PIECES, later={"command": ["true"], "outputs": ["results/later.json"]})
    monkeypatch.setattr(weights, "PIECES", pieces)
    assert weights.pending_needs() == {ADAPTER}


def test_the_command_line_lists_retires_and_explains_itself(lab, capsys):
    """--help shows the module's first line, the four commands and what the paths are; retire
    says how many files left; list shows each weight in the tree with its reason and each that
    left with whether it is here."""
    with pytest.raises(SystemExit):
        weights.main(["--help"])
    helped = capsys.readouterr().out
    assert "The lab's weights out of the tree, none lost." in helped
    assert "A clone is for reading" not in helped
    assert "{list,restore,retire,check}" in helped
    assert " paths for restore and retire: files or folders " in " ".join(helped.split()) + " "
    with pytest.raises(SystemExit) as done:
        weights.main(["retire"])
    assert done.value.code == 2
    assert capsys.readouterr().err == "error: retire: name the files or folders\n"
    (lab / TABLE).parent.mkdir(parents=True)
    (lab / TABLE).write_text("{}")
    commit(lab, "the table")
    weights.main(["retire", ADAPTER])
    assert capsys.readouterr().out == (
        f"2 files left the tree (their rows in {weights.MANIFEST}); commit both\n"
    )
    commit(lab, "the adapter leaves")
    stray = "results/policies/stray.pt"
    (lab / stray).write_text("S")
    commit(lab, "a weight nothing loads")
    weights.main(["restore", f"{ADAPTER}/adapter_config.json"])
    capsys.readouterr()
    weights.main(["list"])
    assert capsys.readouterr().out.splitlines() == [
        f"tree      {POLICY} (demo)",
        f"tree      {stray} (no reason)",
        f"left,here {ADAPTER}/adapter_config.json (2 bytes; piece train-team)",
        f"left,gone {ADAPTER}/adapter_model.safetensors (1,000 bytes; piece train-team)",
    ]


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
