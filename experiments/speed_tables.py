"""The engine's speed tables: the benchmarks against HF generate, the decode profile and the
generation cache (experiments/bench.py, profile_decode.py, cache_bench.py); each from the committed
files in results/."""

from experiments.tables import load, missing


def bench_table():
    """The engine against HF generate: --bench generate and --bench round, one row each; --bench
    slots in a note."""
    gen, rnd, slots = (
        load("bench/generate.json"),
        load("bench/round.json"),
        load("bench/slots.json"),
    )
    if not gen and not rnd:
        return missing("bench/generate.json", "bench/round.json")
    lines = [
        "| benchmark | HF generate tok/s | engine fp32 tok/s | ratio | outputs match | "
        "roofline (fp32) |",
        "|---|---|---|---|---|---|",
    ]
    if gen:
        lines.append(
            f"| generate: {gen['prompts']} fixed prompts, 128 tokens | {gen['hf_tok_s']:.1f} | "
            f"{gen['engine_float32_tok_s']:.1f} | {gen['ratio_fp32']:.2f} | {gen['outputs_match']} "
            f"({gen['rows_matching']}/{gen['prompts']}) | {gen['roofline_frac_fp32']:.2f} |"
        )
    if rnd:
        lines.append(
            f"| round: {rnd['questions']} questions × {rnd['agents']} agents, round 0 + REFINE "
            f"({rnd['generations']} generations; engine {rnd.get('engine_slots', 64)} slots, HF "
            f"batches of {rnd.get('hf_batch_size', 64)}) | {rnd['hf_tok_s']:.1f} | "
            f"{rnd['engine_tok_s']:.1f} | {rnd['ratio']:.2f} | {rnd['outputs_match']} "
            f"({rnd['rows_matching']}/{rnd['generations']}) | {rnd['roofline_frac']:.2f} |"
        )
    notes = [
        f"`generate`: each side's fastest of {gen.get('repeats', 1)} alternating turns (all, "
        "tok/s: "
        + "; ".join(f"{side} {turns}" for side, turns in gen.get("all_tok_s", {}).items())
        + "). "
        f"int8 engine (lossy, not the default): {gen['engine_int8_tok_s']:.1f} tok/s; "
        f"{gen['machine']}."
        if gen
        else "",
        "The fp32 engine's fastest turn spent "
        f"{gen['engine_float32_prefill_share']:.0%} of its time prefilling the prompts "
        f"({gen['engine_float32_prompt_tokens_run']} prompt tokens run, "
        f"{gen['generated_tokens']} generated)."
        if gen and "engine_float32_prefill_share" in gen
        else "",
        f"Round wall time: HF {rnd['hf_s']:.0f} s, engine {rnd['engine_s']:.0f} s." if rnd else "",
        "The engine's own batch size (`--bench slots`, {prompts} prompts, greedy): {sizes}; "
        "{ratio:.2f}x, outputs identical: {outputs_match}.".format(
            **slots,
            sizes=", ".join(
                f"{size} slots {tok_s:.1f} tok/s" for size, tok_s in slots["tok_s"].items()
            ),
        )
        if slots
        else "",
        missing(*(f"bench/{n}.json" for n, r in (("generate", gen), ("round", rnd)) if not r))
        if not (gen and rnd)
        else "",
    ]
    return "\n".join(lines) + "\n\n" + " ".join(n for n in notes if n)


def profile_table():
    """One decode step at batch 64 before (the static-batch engine) and after, by bucket."""
    run = load("bench/profile.json")
    if run is None:
        return missing("bench/profile.json")
    before, after = run["before"], run["after"]
    buckets = list(dict.fromkeys([*before["buckets_ms"], *after["buckets_ms"]]))
    lines = [
        f"| one decode step, {run['rows']} rows, T = {run['temperature']} | before (ms) | "
        "after (ms) |",
        "|---|---|---|",
    ]
    lines += [
        f"| {b} | {before['buckets_ms'].get(b, 0):.1f} | {after['buckets_ms'].get(b, 0):.1f} |"
        for b in buckets
    ]
    lines.append(
        f"| **whole step** | **{before['decode_step_ms']:.1f}** | "
        f"**{after['decode_step_ms']:.1f}** |"
    )
    lines.append(f"| tokens/s | {before['tokens_per_s']:.0f} | {after['tokens_per_s']:.0f} |")
    lines.append(
        f"\nBefore: engine.py at `{run['before_rev']}`; each the fastest of {run['repeats']} "
        f"alternating turns (all: before {before['all_step_ms']} ms, after "
        f"{after['all_step_ms']} ms); {run['mean_prompt_tokens']:.0f} prompt tokens per row; "
        f"{run['machine']}."
    )
    onednn = load("bench/profile-onednn.json")
    # the oneDNN Linear layers alone: the engine just before them against the engine with them
    if onednn:
        b, a = onednn["before"], onednn["after"]
        lines.append(
            "\nThe oneDNN Linear layers alone (`profile-onednn`, engine.py at "
            f"`{onednn['before_rev']}` against this one, the same way): whole step "
            f"{b['decode_step_ms']:.1f} → {a['decode_step_ms']:.1f} ms ({onednn['speedup']:.2f}×; "
            f"all turns {b['all_step_ms']} and {a['all_step_ms']} ms); LM head "
            f"{b['buckets_ms']['LM head']:.1f} → {a['buckets_ms']['LM head']:.1f} ms, the body's "
            f"matmuls {b['buckets_ms']['matmuls (transformer body)']:.1f} → "
            f"{a['buckets_ms']['matmuls (transformer body)']:.1f} ms (each bucket from one "
            "profiled turn: noisier than the whole step)."
        )
    return "\n".join(lines)


def cache_table():
    """The generation cache, the JSONL files read whole at start against the SQLite database
    (experiments/cache_bench.py): per size, the time and peak memory to open, lookups and inserts
    per second (per engine call), and the lookups a process must make before the open time the
    database saves is spent on its slower lookups."""
    bench = load("bench/cache.json")
    if not bench:
        return missing("bench/cache.json")
    lines = [
        "| entries | open s: JSONL / SQLite | peak MB at open: JSONL / SQLite | lookups/s per "
        "engine call: JSONL / SQLite | inserts/s per engine call: JSONL / SQLite | break-even "
        "lookups |",
        "|---|---|---|---|---|---|",
    ]
    for n, size in bench["sizes"].items():
        old, new = size["jsonl"], size["sqlite"]
        lookup = "lookups_per_s_engine_call"
        saved = old["open_s"] - new["open_s"]
        break_even = saved / (1 / new[lookup] - 1 / old[lookup])
        lines.append(
            f"| {int(n):,} | {old['open_s']:.2f} / {new['open_s']:.3f} | "
            f"{old['open_peak_rss_mb']:.0f} / {new['open_peak_rss_mb']:.0f} | "
            f"{old[lookup]:,} / {new[lookup]:,} | {old['inserts_per_s_engine_call']:,} / "
            f"{new['inserts_per_s_engine_call']:,} | {break_even:,.0f} |"
        )
    entry = next(iter(bench["sizes"].values()))["jsonl_bytes_per_entry"]
    return (
        "\n".join(lines) + f"\n\nSynthetic entries of {entry} bytes of JSON, engine calls of "
        f"{bench['config']['call']} keys; {bench['machine']}, load average "
        f"{bench['load_average_before']:.1f} before the run."
    )
