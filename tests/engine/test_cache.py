"""The generation cache (llm/cache.py) on its own: values come back exactly, a batch is written in
one transaction, and the database stays whole under two writers at once, a writer killed in the
middle of a transaction and torchrun's ranks. The writers are subprocesses (no torch: quick)."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
from array import array
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import subprocess_env
from launch import run

import llm.cache
from common import call_seed
from llm.cache import GenerationCache, switch_to_wal

ROOT = Path(__file__).resolve().parents[2]


def writer(code, *args):
    """A python process running `code` with the repository importable and `args` as sys.argv[1:]:
    it starts when a line reaches its stdin."""
    script = "import sys\nsys.stdin.readline()\n" + code
    return subprocess.Popen(
        [sys.executable, "-c", script, *map(str, args)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def whole(cache):
    return cache.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_values_come_back_exactly_from_one_file(tmp_path):
    cache = GenerationCache(tmp_path)
    completion = {
        "text": "héllo\n",
        "prompt_tokens": 3,
        "completion_tokens": 3,
        "finish": "eos",
        "token_logprobs": [-0.1, -1e-300, -2.5000000000000004],
    }
    cache.put("a", completion)
    cache.put("b", [0.5, -1.25])  # continuation_logprobs' values: a list
    cache.put("c", {"text": "x", "token_logprobs": None})
    other = GenerationCache(tmp_path)  # another process, say
    assert other.get("a") == completion and other.get("nothing") is None
    assert other.get_many(["b", "x", "c", "a"]) == [[0.5, -1.25], None, cache.get("c"), completion]
    # a put replaces (a stale entry recomputed)
    cache.put("a", dict(completion, text="new"))
    assert other.get("a")["text"] == "new"
    # more keys than one query takes
    keys = [f"k{i}" for i in range(1200)]
    with cache.batch():
        for i, key in enumerate(keys):
            cache.put(key, i)
    assert other.get_many(keys[::-1]) == list(range(1200))[::-1]
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".db"] == ["generations.db"]


def test_the_log_probs_are_kept_apart_as_float64_bytes_beside_compact_json(tmp_path):
    """The table's rows: a completion's JSON text without its token log-probs, in the compact form
    (no blanks after separators), and the log-probs as float64 bytes; any other value (a list, a
    dict whose log-probs are not a list) whole in the text, no bytes."""
    cache = GenerationCache(tmp_path / "made" / "on" / "open")
    cache.put("a", {"text": "hi", "n": 2, "token_logprobs": [-0.5, -1e-300]})
    cache.put("b", [0.5, -1.25])
    cache.put("c", {"text": "x", "token_logprobs": None})
    rows = dict(
        (key, (value, logprobs))
        for key, value, logprobs in sqlite3.connect(cache.path).execute(
            "SELECT key, value, logprobs FROM generations"
        )
    )
    assert rows == {
        "a": ('{"text":"hi","n":2}', array("d", [-0.5, -1e-300]).tobytes()),
        "b": ("[0.5,-1.25]", None),
        "c": ('{"text":"x","token_logprobs":null}', None),
    }


def test_one_query_per_500_keys(tmp_path):
    cache = GenerationCache(tmp_path)
    queries = []
    cache.db.set_trace_callback(queries.append)
    assert cache.get_many([f"k{i}" for i in range(1001)]) == [None] * 1001
    assert len(queries) == 3


def test_a_writer_waits_busy_timeout_for_the_write_lock(tmp_path, monkeypatch):
    """Another process holding the write lock: a put waits BUSY_TIMEOUT_S for it (SQLite's own
    busy timeout on the connection, read back from SQLite), then fails."""
    monkeypatch.setattr(llm.cache, "BUSY_TIMEOUT_S", 0.05)
    cache = GenerationCache(tmp_path)
    assert cache.db.execute("PRAGMA busy_timeout").fetchone() == (50,)
    holder = sqlite3.connect(cache.path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        cache.put("k", 1)
    holder.execute("ROLLBACK")
    cache.put("k", 1)
    assert GenerationCache(tmp_path).get("k") == 1


class FlakyDatabase:
    """Fails its first `failures` statements with `error`, as a fresh file that another process is
    switching to WAL does."""

    def __init__(self, failures, error="database is locked"):
        self.failures, self.error, self.statements = failures, error, []

    def execute(self, sql):
        self.statements.append(sql)
        if len(self.statements) <= self.failures:
            raise sqlite3.OperationalError(self.error)


@pytest.fixture
def clock(monkeypatch):
    """llm.cache's clock made up: time.sleep(s) moves time.monotonic() on by s, at once; `.sleeps`
    lists the sleeps."""
    clock = SimpleNamespace(now=100.0, sleeps=[])

    def sleep(seconds):
        clock.sleeps.append(seconds)
        clock.now += seconds

    monkeypatch.setattr(
        llm.cache, "time", SimpleNamespace(monotonic=lambda: clock.now, sleep=sleep)
    )
    return clock


def test_the_switch_to_wal_tries_again_while_another_process_holds_the_file(monkeypatch, clock):
    """Every poll_s (0.01 s) while the file is locked, until BUSY_TIMEOUT_S has passed."""
    db = FlakyDatabase(failures=3)
    switch_to_wal(db)
    assert db.statements == ["PRAGMA journal_mode=WAL"] * 4 and clock.sleeps == [0.01] * 3
    # any other error is raised at once, and "locked" once the busy timeout has passed
    db, clock.sleeps = FlakyDatabase(failures=1, error="disk I/O error"), []
    with pytest.raises(sqlite3.OperationalError, match="disk I/O"):
        switch_to_wal(db)
    assert len(db.statements) == 1 and clock.sleeps == []
    monkeypatch.setattr(llm.cache, "BUSY_TIMEOUT_S", 0.1)
    db, began = FlakyDatabase(failures=10**9), clock.now
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        switch_to_wal(db, poll_s=0.03)
    # 0.03, 0.06, 0.09 and 0.12 s: the first try past the deadline raises
    assert clock.sleeps == [0.03] * 4 and len(db.statements) == 5
    assert clock.now - began == pytest.approx(0.12)


def test_call_seeds_stay_what_every_cached_generation_was_drawn_with():
    """The seeds are part of every cache key and every committed result: the same parts give the
    same 60-bit seed, on any machine and in any later version."""
    assert call_seed(0, "t/0", 1, 0, "solve") == 1060415685615705040
    assert call_seed(3, "arith/17", 2, 1, "refine") == 744779049638796572
    assert call_seed("x") == 925030826615085545 and call_seed() == 357258652861774496


def test_a_batch_is_written_in_one_transaction_when_it_ends(tmp_path, monkeypatch):
    cache, other = GenerationCache(tmp_path), GenerationCache(tmp_path)
    with cache.batch():
        for i in range(100):
            cache.put(f"k{i}", {"i": i})
        assert cache.get("k99") == {"i": 99}  # its own process sees it at once
        assert other.get_many(["k0", "k99"]) == [None, None]
    assert other.get_many([f"k{i}" for i in range(100)]) == [{"i": i} for i in range(100)]
    # a long batch is also written every SAVE_EVERY_S seconds
    monkeypatch.setattr(llm.cache, "SAVE_EVERY_S", 0)
    with cache.batch():
        cache.put("early", 1)
        assert other.get("early") == 1


WRITE = """
from llm.cache import GenerationCache
folder, first = sys.argv[1], int(sys.argv[2])
cache = GenerationCache(folder)
for start in range(first, first + 2000, 10):
    with cache.batch():
        for i in range(start, start + 10):
            cache.put(f"k{i}", {"i": i, "writer": first})
    cache.put(f"single{first}-{start}", start)
"""


def test_two_writers_at_once_lose_nothing_and_corrupt_nothing(tmp_path):
    # keys 0-1999 and 1000-2999, 200 batches and 200 single puts each, on a fresh folder
    writers = [writer(WRITE, tmp_path, first) for first in (0, 1000)]
    for w in writers:
        w.stdin.write("go\n")
        w.stdin.flush()
    assert [w.wait(timeout=60) for w in writers] == [0, 0]
    cache = GenerationCache(tmp_path)
    values = cache.get_many([f"k{i}" for i in range(3000)])
    assert [v["i"] for v in values] == list(range(3000))
    assert {v["writer"] for v in values[1000:2000]} <= {0, 1000}
    singles = [f"single{first}-{s}" for first in (0, 1000) for s in range(first, first + 2000, 10)]
    assert None not in cache.get_many(singles) and whole(cache)


KILLED = """
import time
from llm.cache import GenerationCache
cache = GenerationCache(sys.argv[1])
with cache.batch():
    for i in range(100):
        cache.put(f"kept{i}", i)
calls = 0


def pause():  # called by SQLite while a statement runs: here, the next batch's inserts
    global calls
    calls += 1
    if calls == 20:
        print("in the transaction", flush=True)
        time.sleep(60)
    return 0


cache.db.set_progress_handler(pause, 100)
with cache.batch():
    for i in range(1000):
        cache.put(f"lost{i}", i)
"""


def test_a_writer_killed_mid_transaction_loses_that_transaction_only(tmp_path):
    w = writer(KILLED, tmp_path)
    w.stdin.write("go\n")
    w.stdin.flush()
    assert w.stdout.readline() == "in the transaction\n"
    os.kill(w.pid, signal.SIGKILL)
    w.wait(timeout=10)
    cache = GenerationCache(tmp_path)
    assert cache.get_many([f"kept{i}" for i in range(100)]) == list(range(100))
    assert cache.get_many([f"lost{i}" for i in range(1000)]) == [None] * 1000
    assert whole(cache)
    cache.put("after", 1)  # the killed writer's lock is gone
    assert GenerationCache(tmp_path).get("after") == 1


RANK = """
import os
from llm.cache import GenerationCache
cache = GenerationCache(sys.argv[1])
rank = int(os.environ["RANK"])
with cache.batch():
    for i in range(500):
        cache.put(f"rank{rank}-{i}", i)
        cache.put(f"shared{i}", i)
"""


def test_torchrun_ranks_share_one_database(tmp_path):
    """Two ranks open one folder at once (the old JSONL file there imported once) and both write
    into its one database."""
    (tmp_path / "cache").mkdir()
    lines = [json.dumps({"key": "old", "value": {"text": "before"}}), '{"key": "torn", "val']
    (tmp_path / "cache" / "gen-rank0.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "rank.py").write_text("import sys\n" + RANK)
    path = {"PYTHONPATH": subprocess_env()["PYTHONPATH"]}  # rank.py imports the repository's llm
    run([tmp_path / "rank.py", tmp_path / "cache"], tmp_path, torchrun=True, env=path)
    cache = GenerationCache(tmp_path / "cache")
    keys = [f"{name}-{i}" for name in ("rank0", "rank1") for i in range(500)]
    assert cache.get_many(keys) == list(range(500)) * 2
    assert cache.get_many([f"shared{i}" for i in range(500)]) == list(range(500))
    assert cache.get("old") == {"text": "before"} and cache.skipped == 1 and whole(cache)
    assert sorted(p.name for p in (tmp_path / "cache").glob("*.db")) == ["generations.db"]
