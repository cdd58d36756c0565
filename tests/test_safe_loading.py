"""Reading a file back never runs code: policies, checkpoints and corpora are read by
common.load_file (tensors and plain data only). A crafted file whose unpickling would create a
marker file is refused, from the loaders and from the scripts; the round trips stay exact; every
committed policy loads."""

import dataclasses
import json
import os
import pickle
import random
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch

import common
import deliberate as D

ROOT = Path(__file__).resolve().parents[1]


class Payload:
    """What an attacker pickles: unpickling it calls `call(*args)`."""

    def __init__(self, call, args):
        self.call, self.args = call, args

    def __reduce__(self):
        return self.call, self.args


def payloads(marker):
    """Two ways to create `marker` when unpickled: Python's open, and a shell command."""
    return {
        "open": Payload(open, (str(marker), "w")),
        "os.system": Payload(os.system, (f"touch {marker}",)),
    }


def crafted(kind, tmp_path, how):
    """A policy, checkpoint or corpus file, saved with a plain torch.save, with a payload inside
    where the real file holds plain data. Returns (its path, the marker its payload creates)."""
    marker = tmp_path / "marker"
    payload = payloads(marker)[how]
    if kind == "policy":
        path, content = tmp_path / "policy.pt", {"config": payload, "state_dict": {}}
    elif kind == "checkpoint":
        path = tmp_path / "checkpoint.pt"
        content = {"model": {}, "optimizer": {}, "counters": {"step": 1}, "rng": payload}
    else:
        path, content = tmp_path / "corpus.pt", [{"key": ("q", 1, 0), "own": payload}]
    torch.save(content, path)
    return path, marker


@dataclasses.dataclass
class TinyConfig:
    seed: int = 0
    crash_at_step: int = 0


def load(kind, path):
    """The project's own loader of each kind of file."""
    if kind == "policy":
        return D.load_policy(path)
    if kind == "checkpoint":
        model = torch.nn.Linear(2, 2)
        optimizer = torch.optim.AdamW(model.parameters())
        return common.load_checkpoint(path.parent, model, optimizer, 0, TinyConfig())
    return common.load_made_under(path, {"seed": 0}, "corpus")


@pytest.mark.parametrize("how", ["open", "os.system"])
def test_the_payload_is_live(tmp_path, how):
    """The crafted files are a real threat: plain unpickling creates the marker."""
    marker = tmp_path / "marker"
    pickle.loads(pickle.dumps(payloads(marker)[how]))
    assert marker.exists()


@pytest.mark.parametrize("how", ["open", "os.system"])
@pytest.mark.parametrize("kind", ["policy", "checkpoint", "corpus"])
def test_a_crafted_file_is_refused_and_runs_nothing(tmp_path, kind, how):
    path, marker = crafted(kind, tmp_path, how)
    with pytest.raises(common.FileRefused, match="would run code") as refused:
        load(kind, path)
    message = str(refused.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    assert not marker.exists()


def test_a_missing_or_broken_file_is_refused_in_one_line(tmp_path):
    torch.save({"x": torch.ones(100)}, tmp_path / "good.pt")
    (tmp_path / "truncated.pt").write_bytes((tmp_path / "good.pt").read_bytes()[:200])
    (tmp_path / "text.pt").write_text("not a torch file")
    (tmp_path / "empty.pt").write_bytes(b"")
    for name in ("truncated.pt", "text.pt", "empty.pt", "missing.pt"):
        with pytest.raises(common.FileRefused) as refused:
            common.load_file(tmp_path / name, "policy")
        assert str(refused.value).startswith(f"{tmp_path / name}: ")
        assert "\n" not in str(refused.value)


def test_each_refusal_says_why(tmp_path, monkeypatch):
    """The reason in a refusal: the OS's, the instruction the unpickler stopped at (a pickle of
    another protocol, whose note from torch is silenced), the kind of error torch raised, or "not
    plain data" when torch says no more."""
    torch.save({"x": torch.ones(100)}, tmp_path / "good.pt")
    (tmp_path / "truncated.pt").write_bytes((tmp_path / "good.pt").read_bytes()[:200])
    (tmp_path / "text.pt").write_text("not a torch file")
    with open(tmp_path / "set.pt", "wb") as f:
        pickle.dump({"a": {1, 2}}, f, protocol=4)
    reasons = {
        "missing.pt": "cannot read the policy file (No such file or directory)",
        "text.pt": "not a plain-data policy file (Unsupported operand 110); refused",
        "set.pt": "not a plain-data policy file (Unsupported operand 149); refused",
        "truncated.pt": "not a policy file torch can read (RuntimeError); refused",
    }
    for name, reason in reasons.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(common.FileRefused) as refused:
                common.load_file(tmp_path / name, "policy")
        assert str(refused.value) == f"{tmp_path / name}: {reason}" and caught == []

    def unpickler_says_no_more(path, **kwargs):
        raise pickle.UnpicklingError("bad")

    monkeypatch.setattr(common.torch, "load", unpickler_says_no_more)
    with pytest.raises(common.FileRefused, match=r"policy file \(not plain data\); refused$"):
        common.load_file(tmp_path / "good.pt", "policy")


def test_a_file_is_read_onto_the_cpu_as_weights_only_and_other_warnings_pass(tmp_path, monkeypatch):
    """Weights only and onto the CPU asked for in so many words (not left to torch's defaults: a
    checkpoint written on a GPU then loads on a machine without one); only the pickle-protocol note
    is silenced."""
    calls = []

    def load(path, **kwargs):
        calls.append(kwargs)
        warnings.warn("something else")
        return {}

    monkeypatch.setattr(common.torch, "load", load)
    with pytest.warns(UserWarning, match="something else"):
        assert common.load_file(tmp_path / "p.pt", "policy") == {}
    assert calls == [{"map_location": "cpu", "weights_only": True}]


# ---------------------------------------------------------------- the round trips stay exact
def test_policy_round_trip(tmp_path):
    """A policy is a safetensors file of its tensors beside a JSON of its settings; a .pt of the
    older layout (a config and a state dict) loads into the same policy."""
    policy = D.MetaPolicy(agents=3, hidden=16, heads=2, separate=True, features="paper")
    path = tmp_path / "p.safetensors"
    D.save_policy(policy, path, summary={"accuracy": 0.5, "curve": [0.1, None]})
    old = tmp_path / "old.pt"
    torch.save({"config": policy.config, "state_dict": policy.state_dict()}, old)
    for loaded in (D.load_policy(path), D.load_policy(old)):
        assert loaded.config == policy.config
        a, b = policy.state_dict(), loaded.state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads(path.with_suffix(".json").read_text())["summary"]["curve"] == [0.1, None]
    assert safetensors.torch.load_file(path).keys() == policy.state_dict().keys()
    with pytest.raises(ValueError, match="named NAME.safetensors"):
        D.save_policy(policy, tmp_path / "p.pt")


def test_a_policy_file_with_other_tensors_or_settings_is_refused_in_one_line(tmp_path):
    """Tensors missing, extra or of another shape than the settings' policy, settings that build
    no policy, a file that is not safetensors: each refused, in one line naming the file."""
    policy = D.MetaPolicy(agents=3, hidden=16)
    tensors = policy.state_dict()
    first = next(iter(tensors))
    cases = {
        "missing": ({k: v for k, v in tensors.items() if k != first}, f"{first!r} missing"),
        "extra": ({**tensors, "planted": torch.ones(1)}, "'planted' unexpected"),
        "shape": ({**tensors, first: torch.ones(2, 2)}, f"size mismatch for {first}"),
    }
    for name, (state, says) in cases.items():
        path = tmp_path / f"{name}.safetensors"
        common.save_tensors(state, {"config": policy.config}, path)
        with pytest.raises(common.FileRefused, match=re.escape(says)) as refused:
            D.load_policy(path)
        assert str(refused.value).startswith(f"{path}: ") and "\n" not in str(refused.value)
    settings = {"config": {**policy.config, "hops": 2}}
    common.save_tensors(tensors, settings, tmp_path / "c.safetensors")
    with pytest.raises(common.FileRefused, match="not a policy this code can build .*hops"):
        D.load_policy(tmp_path / "c.safetensors")
    (tmp_path / "text.safetensors").write_text("not safetensors")
    (tmp_path / "text.json").write_text("{}")
    with pytest.raises(common.FileRefused, match="cannot read the policy file and its settings"):
        D.load_policy(tmp_path / "text.safetensors")
    # an older .pt: its settings are everything but the state dict; one without is refused
    torch.save({"config": policy.config, "state_dict": tensors}, tmp_path / "old.pt")
    _, settings = common.load_tensors(tmp_path / "old.pt", "policy")
    assert settings == {"config": policy.config}
    for name, stored in (("list", [1, 2]), ("bare", {"config": policy.config})):
        torch.save(stored, tmp_path / f"{name}.pt")
        said = f"{tmp_path / name}.pt: not a policy file (no state_dict)"
        with pytest.raises(common.FileRefused, match=f"^{re.escape(said)}$"):
            common.load_tensors(tmp_path / f"{name}.pt", "policy")
    (tmp_path / "torn.pt").write_bytes(b"not a pickle")
    with pytest.raises(common.FileRefused, match="not a plain-data policy file"):
        common.load_tensors(tmp_path / "torn.pt", "policy")


def seed_everything(seed):
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def test_checkpoint_round_trip_continues_every_rng_exactly(tmp_path):
    seed_everything(1)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    np.random.randn()  # both leave a cached Gaussian in their state: it must come back too
    random.gauss(0, 1)
    common.save_checkpoint(tmp_path, model, optimizer, {"step": 3}, TinyConfig(), rank=0)

    def draws():
        return (
            torch.rand(5),
            np.random.rand(5),
            np.random.randn(),
            random.random(),
            random.gauss(0, 1),
        )

    expected = draws()
    seed_everything(9)  # the checkpoint, not this, must decide what comes next
    again = torch.nn.Linear(3, 2)
    again_optimizer = torch.optim.AdamW(again.parameters(), lr=0.1)
    assert common.load_checkpoint(tmp_path, again, again_optimizer, 0, TinyConfig()) == {"step": 3}
    got = draws()
    assert torch.equal(got[0], expected[0]) and np.array_equal(got[1], expected[1])
    assert got[2:] == expected[2:]
    a, b = model.state_dict(), again.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    a, b = optimizer.state_dict(), again_optimizer.state_dict()
    assert a["param_groups"] == b["param_groups"]
    assert all(
        torch.equal(a["state"][p][k], b["state"][p][k]) for p in a["state"] for k in a["state"][p]
    )


def test_corpus_round_trip(tmp_path):
    rows = [
        {
            "key": ("arith/7", 1, a),
            "own": [0.5] * len(D.OWN_FEATURES),
            "peers": [[0.25] * len(D.PEER_FEATURES)] * 2,
            "agent": a,
            "action": 2,
            "label": 0,
            "rewards": [1.0, 0.0, -0.5, 0.25] if a else None,
            "old_logits": [0.1, 0.2, 0.3, 0.4],
        }
        for a in range(3)
    ]
    common.save_made_under(rows, tmp_path / "corpus.pt", {"seed": 0}, 0)
    loaded = common.load_made_under(tmp_path / "corpus.pt", {"seed": 0}, "corpus")
    assert loaded == rows and all(type(r["key"]) is tuple for r in loaded)


# ---------------------------------------------------------------- the scripts refuse in one line
SCRIPT_RUNS = {
    "eval.py": ("policy", lambda path, out: ["--protocols", f"mpdf={path}", "--n", "1"]),
    "train_rl.py": ("policy", lambda path, out: ["--init", str(path), "--out-dir", str(out)]),
    "sft.py": ("checkpoint", lambda path, out: ["--out-dir", str(path.parent)]),
}


@pytest.mark.parametrize("script", SCRIPT_RUNS)
def test_a_script_refuses_a_crafted_file_with_status_2_and_one_line(tmp_path, script):
    kind, args = SCRIPT_RUNS[script]
    path, marker = crafted(kind, tmp_path, "os.system")
    proc = subprocess.run(
        [sys.executable, str(ROOT / script), *args(path, tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1"),
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().count("\n") == 0 and str(path) in proc.stderr, proc.stderr
    assert not marker.exists()


# ---------------------------------------------------------------- the committed policies
@pytest.mark.parametrize(
    "path",
    sorted(p for p in (ROOT / "results" / "policies").iterdir() if p.suffix != ".json"),
    ids=lambda path: path.name,
)
def test_every_committed_policy_loads(path):
    """A policy file of results/policies/ (a .pt, or safetensors and their JSON) plays; each
    weight is committed once: no .pt beside its safetensors copy."""
    policy = D.load_policy(path)
    if path.suffix == ".safetensors":
        assert not path.with_suffix(".pt").exists()
    own, peers = torch.zeros(2, len(D.OWN_FEATURES)), torch.zeros(2, 2, len(D.PEER_FEATURES))
    assert policy(own, peers, torch.zeros(2, dtype=torch.long)).shape == (2, 4)


def test_an_old_policy_file_plays_and_saves_as_the_same_safetensors(tmp_path):
    """A policy of the project's older layout (the fixture: a .pt of a random MetaPolicy, hidden 8,
    its config, state_dict, training config and summary) loads as data and plays; saved again it is
    safetensors plus its settings' JSON, the same tensors and settings, the same logits."""
    old_path = ROOT / "tests" / "fixtures" / "old-policy.pt"
    stored = common.load_file(old_path, "policy")
    policy = D.load_policy(old_path)
    assert policy.config == stored["config"] == {**policy.config, "hidden": 8, "heads": 2}
    D.save_policy(
        policy, tmp_path / "p.safetensors", **{k: stored[k] for k in ("train_config", "summary")}
    )
    again = D.load_policy(tmp_path / "p.safetensors")
    a, b = stored["state_dict"], again.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    settings = json.loads((tmp_path / "p.json").read_text())
    assert {k: settings[k] for k in ("train_config", "summary")} == {
        "train_config": {"seed": 0, "algo": "softrank"},
        "summary": {"val_accuracy": 0.5},
    }
    own, peers = torch.randn(2, len(D.OWN_FEATURES)), torch.randn(2, 2, len(D.PEER_FEATURES))
    agent = torch.zeros(2, dtype=torch.long)
    with torch.no_grad():
        assert torch.equal(policy(own, peers, agent), again(own, peers, agent))
