"""The engine's on-disk cache of generations, and the seeds and keys that make a generation
reproducible.

  GenerationCache      - append-only JSONL files of generations keyed by model, prompt, params, seed
  call_seed            - a reproducible seed for one LLM call (or any other draw)
  weights_fingerprint  - a short hash of the weights, part of every cache key
"""

import hashlib
import json
from pathlib import Path

import torch


class GenerationCache:
    """Append-only JSONL files of generations keyed by (model, prompt, sampling parameters, seed).

    Each process appends to its own file (no interleaved writes under torchrun) and reads every file
    in the folder. A line torn by a killed process is skipped, not fatal."""

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

    @staticmethod
    def key(*parts):
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()

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


def call_seed(*parts):
    """A reproducible 63-bit seed for one LLM call (or any other draw), from anything
    JSON-serializable."""
    return int(hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:15], 16)


def weights_fingerprint(model):
    """A short hash of the weights (every parameter's name, shape, dtype and sum): a model changed
    in memory (fine-tuned, re-initialised) gets new cache keys. Call again after changing the
    weights."""
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, p in model.named_parameters():
            digest.update(f"{name}{tuple(p.shape)}{p.dtype}{p.double().sum().item():.10e}".encode())
    return digest.hexdigest()[:16]
