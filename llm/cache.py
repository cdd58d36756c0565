"""The engine's on-disk cache of generations, and the keys that make a generation reproducible
(each call's seed is common.call_seed).

  GenerationCache      - generations keyed by model, prompt, params, seed, in one SQLite file
  weights_fingerprint  - a short hash of the weights, part of every cache key
"""

import hashlib
import json
import sqlite3
import time
from array import array
from contextlib import contextmanager
from pathlib import Path

# a writer waits this long for the others' transactions, the one-time import of a large folder of
# old JSONL files among them
BUSY_TIMEOUT_S = 600
# a long batch (an engine call of many generations) is also written this often, so that a process
# killed in the middle of it keeps what it generated until then
SAVE_EVERY_S = 10


def switch_to_wal(db, poll_s=0.01):
    """Puts the database in WAL mode, trying again while another process holds it."""
    # two processes opening one fresh file at once: the switch can fail at once with "locked",
    # without the wait of the connection's busy timeout
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(poll_s)


class GenerationCache:
    """Generations keyed by (model, prompt, sampling parameters, seed), in one SQLite file,
    `folder`/generations.db: one table of key -> value.

    Nothing is read up front: a lookup is one indexed query, so a cache of any size opens at once
    and in constant memory. In WAL mode readers never wait, and writers (torchrun's ranks, two runs
    side by side on one folder) take turns, each write a transaction: a process killed in the
    middle of one loses that transaction and nothing else. The JSONL files of the cache's earlier
    form (gen-rank*.jsonl in the same folder) are imported once; `skipped` counts their torn lines.
    """

    FILE = "generations.db"

    def __init__(self, folder):
        self.path = Path(folder) / self.FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # autocommit: every write below opens its own transaction (_transaction)
        self.db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        switch_to_wal(self.db)
        # a commit reaches the WAL file but not the disk (no fsync): it survives a killed
        # process, not a power cut, and costs a write, not a disk sync
        self.db.execute("PRAGMA synchronous=NORMAL")
        with self._transaction():
            # the token log-probs apart, as float64 bytes: exact, compact and quick to read and
            # write, where their JSON text is long and slow to parse
            self.db.execute(
                "CREATE TABLE IF NOT EXISTS generations "
                "(key TEXT PRIMARY KEY, value TEXT NOT NULL, logprobs BLOB)"
            )
            self.db.execute(
                "CREATE TABLE IF NOT EXISTS imported (file TEXT PRIMARY KEY, size INT, skipped INT)"
            )
            self._import_jsonl()
        (self.skipped,) = self.db.execute(
            "SELECT coalesce(sum(skipped), 0) FROM imported"
        ).fetchone()
        self._pending, self._batching, self._saved = {}, False, time.monotonic()

    @staticmethod
    def key(*parts):
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()

    def get(self, key):
        return self.get_many([key])[0]

    def get_many(self, keys):
        """The value of each key (None where absent), one query per 500 keys."""
        found = {}
        for k in range(0, len(keys), 500):
            chunk = keys[k : k + 500]
            rows = self.db.execute(
                "SELECT key, value, logprobs FROM generations "
                f"WHERE key IN ({','.join('?' * len(chunk))})",
                chunk,
            )
            found |= {key: decode(value, logprobs) for key, value, logprobs in rows}
        # a put not written yet (inside a batch) is already a hit
        found |= {key: decode(*self._pending[key]) for key in keys if key in self._pending}
        return [found.get(key) for key in keys]

    def put(self, key, value):
        """Stores a value (anything JSON-serializable) under a key; inside `batch()` it is written
        with the batch."""
        self._pending[key] = encode(value)
        if not self._batching or time.monotonic() - self._saved > SAVE_EVERY_S:
            self.save()

    @contextmanager
    def batch(self):
        """with cache.batch(): ... -- the block's puts in one transaction when it ends (one write
        of the database for an engine call's generations, not one each), and every SAVE_EVERY_S
        seconds before that."""
        self._batching = True
        try:
            yield self
        finally:
            self._batching = False
            self.save()

    def save(self):
        """Writes the pending puts, in one transaction."""
        if self._pending:
            with self._transaction():
                self.db.executemany(
                    "INSERT OR REPLACE INTO generations VALUES (?, ?, ?)",
                    ((key, *row) for key, row in self._pending.items()),
                )
            self._pending.clear()
        self._saved = time.monotonic()

    @contextmanager
    def _transaction(self):
        # IMMEDIATE takes the write lock at the start (waiting up to BUSY_TIMEOUT_S for it): a
        # transaction that read first and asked for the lock later could fail at once instead
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def _import_jsonl(self):
        """Imports the folder's JSONL files not imported yet, or grown since (an older checkout
        still appending to them): a line {"key": ..., "value": ...} each, a later line of a key
        replacing an earlier one, as the JSONL cache read them. A torn line (a process killed
        mid-write) is skipped and counted."""
        done = dict(self.db.execute("SELECT file, size FROM imported"))
        for path in sorted(self.path.parent.glob("gen-rank*.jsonl")):
            size = path.stat().st_size
            if done.get(path.name) == size:
                continue
            skipped = 0

            def rows(lines):
                nonlocal skipped
                for line in lines:
                    try:
                        entry = json.loads(line)
                        yield entry["key"], *encode(entry["value"])
                    except (json.JSONDecodeError, KeyError, TypeError):
                        # an empty line is where a later process started a fresh line
                        skipped += bool(line.strip())

            with open(path, encoding="utf-8") as f:
                self.db.executemany("INSERT OR REPLACE INTO generations VALUES (?, ?, ?)", rows(f))
            self.db.execute(
                "INSERT OR REPLACE INTO imported VALUES (?, ?, ?)", (path.name, size, skipped)
            )


def encode(value):
    """(JSON text, float64 bytes or None): a value, its token log-probs apart."""
    logprobs = value.get("token_logprobs") if isinstance(value, dict) else None
    if not isinstance(logprobs, list):
        return json.dumps(value, separators=(",", ":")), None
    rest = {k: v for k, v in value.items() if k != "token_logprobs"}
    return json.dumps(rest, separators=(",", ":")), array("d", logprobs).tobytes()


def decode(text, logprobs):
    value = json.loads(text)
    if logprobs is not None:
        value["token_logprobs"] = array("d", logprobs).tolist()
    return value


def weights_fingerprint(model):
    """A short hash of the weights (every parameter's name, shape, dtype and sum): a model changed
    in memory (fine-tuned, re-initialised) gets new cache keys. Call again after changing the
    weights."""
    digest = hashlib.sha256()
    # detached: no autograd graph; and this module needs no torch import (the cache alone
    # opens without it)
    for name, p in model.named_parameters():
        digest.update(
            f"{name}{tuple(p.shape)}{p.dtype}{p.detach().double().sum().item():.10e}".encode()
        )
    return digest.hexdigest()[:16]
