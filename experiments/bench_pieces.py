"""The pieces of the engine's speed measurements (experiments/bench.py, profile_decode.py,
kernel_bench.py) and of the generation cache's (cache_bench.py); experiments/pieces.py holds them
with every other piece (the same dict form: "command", "outputs"). Each is a timing: run it on a
quiet machine; its JSON records the machine."""

from experiments.llm_pieces import PY


def bench(name, args, file=""):
    """An engine speed benchmark (experiments/bench.py): its JSON (results/bench/<file or name>),
    which records the machine it ran on."""
    out = f"results/bench/{file or name}.json"
    return {
        "command": [PY, "-m", "experiments.bench", "--bench", name, *args, "--out", out],
        "outputs": [out],
    }


def profile(name, args):
    """Where a decoding step's time goes (experiments/profile_decode.py)."""
    out = f"results/bench/{name}.json"
    return {
        "command": [PY, "-m", "experiments.profile_decode", *args, "--out", out],
        "outputs": [out],
    }


def static_decode(name, args):
    """A compiled static-shape decode step against the engine's (experiments/static_decode.py)."""
    out = f"results/bench/{name}.json"
    command = [PY, "-m", "experiments.static_decode", *args, "--out", out]
    return {"command": command, "outputs": [out]}


BENCH_PIECES = {
    # the engine against HF generate (run each on a quiet machine: they are timings)
    "bench-generate": bench("generate", []),
    # a real round: HF generate in batches of 64, the engine with eval.py's default slots
    "bench-round": bench("round", ["--hf-batch-size", "64"]),
    # 128 slots against 64
    "bench-slots": bench("slots", ["--engine-batch-size", "128", "--max-new-tokens", "96"]),
    # one LLM-Debate (3 agents, 3 rounds, 32 questions) through the engine vs one generate call per
    # agent per round; T = 0.7, the setting of the README's earlier measurement
    "bench-debate": bench("debate", ["--temperature", "0.7"]),
    # round 0 of 64 questions for 3 agents, each its own adapter, in one engine
    "bench-team": bench("team", ["--max-new-tokens", "96"]),
    # both dtypes against HF generate in the same dtype and in fp32, on a machine with
    # native bf16 (the file records which); the round on 100 questions (HF fp32 alone takes ~15 min)
    "bench-generate-dtypes": bench("generate", ["--dtypes", "float32,bfloat16"], "generate-dtypes"),
    "bench-round-dtypes": bench(
        "round",
        ["--dtypes", "float32,bfloat16", "--n", "100", "--hf-batch-size", "64"],
        "round-dtypes",
    ),  # fmt: skip
    "profile": profile("profile", []),
    # `--dtype auto`'s probe, repeated at three batch sizes (the file records the CPU)
    "bench-dtype-probe": bench("probe", [], "dtype-probe"),
    # a static-shape decode step compiled once against the engine's eager step
    "bench-static-decode": static_decode("static-decode", []),
    "bench-static-decode-1thread": static_decode("static-decode-1thread", ["--threads", "1"]),
    # the kernel timings behind the dtype decisions (Linear paths, greedy, attention)
    "bench-kernels": {
        "command": [PY, "-m", "experiments.kernel_bench", "--out", "results/bench/kernels.json"],
        "outputs": ["results/bench/kernels.json"],
    },
    # one decode step in fp32 against bf16 (a machine with native bf16)
    "profile-bf16": profile("profile-bf16", ["--bf16"]),
    # the oneDNN Linear layers alone: the engine just before them against the engine with them
    "profile-onednn": profile("profile-onednn", ["--before", "6989e4b"]),
    # the generation cache, the JSONL files against the SQLite database, at 10k, 100k
    # and 1M entries (the JSONL cache of 1M entries takes several GB of memory to open)
    "bench-cache": {
        "command": [PY, "-m", "experiments.cache_bench", "--out", "results/bench/cache.json"],
        "outputs": ["results/bench/cache.json"],
    },
}
