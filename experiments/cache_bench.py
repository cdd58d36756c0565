"""The generation cache, old against new: the append-only JSONL files read whole into a dict at
start (JsonlCache, the engine's cache until it moved to SQLite, copied here to be measured) and the
SQLite database of llm/cache.py, on synthetic entries of the demo's size (a completion's text, its
counts and its token log-probs: about 2 KB of JSON each).

    python -m experiments.cache_bench --out results/bench/cache.json

For each size (entries), each cache in a fresh process that imports no torch, so that its peak
resident memory (VmHWM) is the cache's: the time and peak memory to open it; lookups per second of
entries that are there, one at a time and per engine call (the keys of one call together, as the
engine asks for them); inserts per second, one put at a time and per engine call (the puts of one
call, in one transaction for SQLite). The SQLite database is made by importing the JSONL files, as
an old cache folder is: that time and its peak memory too.
"""

import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from array import array
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from llm.cache import GenerationCache

ROOT = Path(__file__).resolve().parents[1]

PARAMS = {"max_new_tokens": 256, "temperature": 0.7, "top_p": 1.0, "stop": []}
WORDS = "the of to and a in is it you that he was for on are with as I his they be at one have this"


@dataclass
class Config:
    sizes: str = "10000,100000,1000000"
    """the cache sizes measured (entries), comma-separated"""
    lookups: int = 20000
    """lookups timed per cache (at most its size)"""
    inserts: int = 20000
    """puts timed per cache in engine calls; a tenth of that one put at a time"""
    call: int = 100
    """the keys of one engine call (a round of 100 questions x 1 agent, say)"""
    workdir: str = ""
    """where the caches are written (empty: a temporary folder, deleted at the end)"""
    out: str = ""
    """the JSON result file (empty: printed only)"""


class JsonlCache:
    """The generation cache before SQLite, as it was: append-only JSONL files of generations keyed
    by (model, prompt, sampling parameters, seed), one per rank, every one read at start."""

    def __init__(self, folder, rank=0):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = self.folder / f"gen-rank{rank}.jsonl"
        self.entries, self.skipped = {}, 0
        for path in sorted(self.folder.glob("gen-rank*.jsonl")):
            with open(path, encoding="utf-8") as f:
                for line in f:
                    try:
                        entry = json.loads(line)
                        self.entries[entry["key"]] = entry["value"]
                    except (json.JSONDecodeError, KeyError, TypeError):
                        self.skipped += 1
        self._file = None

    def get(self, key):
        return self.entries.get(key)

    def put(self, key, value):
        self.entries[key] = value
        if self._file is None:
            self._file = open(self.path, "a", encoding="utf-8")
            if self._file.tell() > 0:  # start on a fresh line in case the last write was torn
                self._file.write("\n")
        self._file.write(json.dumps({"key": key, "value": value}) + "\n")
        self._file.flush()


def entry_key(i):
    return GenerationCache.key("bench-model:float32:0123456789abcdef", f"prompt {i}", PARAMS, i)


def entry_value(i):
    """A completion as the engine stores it: about 500 characters of text and 64 token log-probs
    (float32 values, as the engine computes them)."""
    rng = random.Random(i)
    words = WORDS.split()
    text = " ".join(rng.choice(words) for _ in range(150))[:480] + f"\nAnswer: {rng.randint(9, 99)}"
    logprobs = array("f", (-rng.expovariate(2.0) for _ in range(64))).tolist()
    return {"text": text, "prompt_tokens": rng.randint(150, 400), "completion_tokens": 64,
            "finish": rng.choice(["eos", "length"]), "token_logprobs": logprobs}  # fmt: skip


def write_jsonl(folder, n, pool=4096):
    """gen-rank0.jsonl with n entries, byte for byte as JsonlCache.put writes them (the values
    repeat every `pool` entries, their keys never)."""
    values = [json.dumps(entry_value(i)) for i in range(pool)]
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "gen-rank0.jsonl", "w", encoding="utf-8") as f:
        for i in range(n):
            f.write(f'{{"key": {json.dumps(entry_key(i))}, "value": {values[i % pool]}}}\n')


def memory_mb(field):
    """VmRSS (now) or VmHWM (the peak so far) of this process, in MB."""
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith(field + ":"))
    return int(line.split()[1]) / 1024


def best_per_s(run, count, repeats=3):
    """Operations per second of run() (count operations), the best of `repeats` runs."""
    times = []
    for k in range(repeats):
        start = time.perf_counter()
        run(k)
        times.append(time.perf_counter() - start)
    return round(count / min(times))


def measure(kind, folder, n, lookups, inserts, call):
    """Opens one cache in this process and times it; kind: jsonl, sqlite or import (the SQLite
    cache opened on a folder of JSONL files: the import, timed alone)."""
    before = memory_mb("VmRSS")
    start = time.perf_counter()
    cache = JsonlCache(folder) if kind == "jsonl" else GenerationCache(folder)
    # to the microsecond: a small cache opens in under a millisecond, which milliseconds call 0
    result = {"open_s": round(time.perf_counter() - start, 6),
              "open_peak_rss_mb": round(memory_mb("VmHWM"), 1),
              "rss_before_open_mb": round(before, 1)}  # fmt: skip
    if kind == "import":
        # closed: the database file holds every entry, none left in its WAL file
        cache.db.close()
        return result
    # the engine's way with each cache: SQLite answers a call's keys in one query, and writes its
    # puts in one transaction
    sqlite = kind == "sqlite"
    ask = cache.get_many if sqlite else lambda keys: [cache.get(key) for key in keys]
    keys = [entry_key(i) for i in random.Random(0).sample(range(n), min(n, lookups))]
    calls = [keys[k : k + call] for k in range(0, len(keys), call)]
    assert None not in ask(keys[:call])

    def look_up(one_at_a_time):
        # the values dropped as they come, as the engine drops them after its call
        for c in calls:
            if one_at_a_time:
                for key in c:
                    cache.get(key)
            else:
                ask(c)

    result["lookups_per_s"] = best_per_s(lambda _: look_up(True), len(keys))
    result["lookups_per_s_engine_call"] = best_per_s(lambda _: look_up(False), len(keys))
    values = [entry_value(i) for i in range(call)]

    def put(k, count, per_call):
        for start in range(0, count, per_call):
            with cache.batch() if sqlite and per_call > 1 else nullcontext():
                for i in range(start, start + per_call):
                    cache.put(f"new-{per_call}-{k}-{i}", values[i % call])

    result["inserts_per_s"] = best_per_s(lambda k: put(k, inserts // 10, 1), inserts // 10)
    result["inserts_per_s_engine_call"] = best_per_s(lambda k: put(k, inserts, call), inserts)
    result["peak_rss_mb"] = round(memory_mb("VmHWM"), 1)
    return result


def in_fresh_process(*args):
    """measure(*args) in a new python process (one that imports no torch)."""
    proc = subprocess.run([sys.executable, __file__, "--measure", *map(str, args)],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return json.loads(proc.stdout)


def main(cfg):
    from common import machine, write_result

    work = Path(cfg.workdir or tempfile.mkdtemp(prefix="cache-bench-"))
    result = {"config": vars(cfg), "machine": machine(), "cpus": os.cpu_count(),
              "python": sys.version.split()[0], "sqlite": sqlite3.sqlite_version,
              "load_average_before": os.getloadavg()[0], "sizes": {}}  # fmt: skip
    try:
        for n in map(int, cfg.sizes.split(",")):
            folder = work / f"{n}"
            shutil.rmtree(folder, ignore_errors=True)
            write_jsonl(folder / "jsonl", n)
            jsonl_bytes = (folder / "jsonl" / "gen-rank0.jsonl").stat().st_size
            # the SQLite cache: the JSONL folder imported, then the database moved to a folder
            # of its own
            imported = in_fresh_process("import", folder / "jsonl", n, 0, 0, 0)
            (folder / "sqlite").mkdir()
            shutil.move(folder / "jsonl" / GenerationCache.FILE, folder / "sqlite")
            size = {"entries": n, "jsonl_mb": round(jsonl_bytes / 2**20, 1),
                    "jsonl_bytes_per_entry": round(jsonl_bytes / n),
                    "sqlite_mb": round((folder / "sqlite" / GenerationCache.FILE).stat().st_size
                                       / 2**20, 1),
                    "import": imported}  # fmt: skip
            for kind in ("sqlite", "jsonl"):
                args = (folder / kind, n, cfg.lookups, cfg.inserts, cfg.call)
                size[kind] = in_fresh_process(kind, *args)
                print(n, kind, size[kind], file=sys.stderr, flush=True)
            result["sizes"][n] = size
            shutil.rmtree(folder)
    finally:
        if not cfg.workdir:
            shutil.rmtree(work, ignore_errors=True)
    result["load_average_after"] = os.getloadavg()[0]
    return write_result(result, cfg.out)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--measure"]:
        kind, folder, *numbers = sys.argv[2:]
        print(json.dumps(measure(kind, Path(folder), *map(int, numbers))))
    else:
        # common imports torch: only this process, which measures nothing
        from common import parse_config

        main(parse_config(Config, description=__doc__.split("\n\n")[0]))
