"""The dtype study (docs/design.md §11): bf16 against fp32 on one machine, accuracy and speed, from
results/dtype/ and results/bench/*-dtypes.json (experiments/report.py puts them in the documents).

  dtype_accuracy_table - vanilla, the team's vote and the seeds' SoftRankPO policies on table a's
                         300 test questions x 3 seeds, in both dtypes, paired by question
  dtype_bench_table    - `--bench generate` and `--bench round` in both dtypes against HF generate
"""

from experiments.tables import load, mean, missing, pooled, summary_of
from stats import format_paired, paired_difference, sample_std

SEEDS = (0, 1, 2)
# table a's file part -> (the protocol's key in an eval.py JSON of the dtype pieces, its name)
PROTOCOLS = {
    "vanilla": ("vanilla", "one greedy answer"),
    "persist": ("mpdf-persist", "the team's vote after round 0"),
    "softrank": ("mpdf=results/policies/arith-seed{seed}-softrank.pt", "SoftRankPO (committed)"),
}


def dtype_runs(dtype):
    """{part: {seed: summary}} of the dtype pieces of `dtype` that exist."""
    files = {seed: load(f"dtype/arith300-seed{seed}-{dtype}.json") for seed in SEEDS}
    return {
        part: {seed: summary_of(run, key.format(seed=seed)) for seed, run in files.items() if run}
        for part, (key, _) in PROTOCOLS.items()
    }


def spread(by_seed):
    accuracy = [s["accuracy"] for s in by_seed.values()]
    return f"{mean(accuracy):.3f} ± {sample_std(accuracy):.3f}" if accuracy else "–"


def paired(ours, theirs):
    """ours - theirs, pooled over the seeds both have, or '–'."""
    shared = [seed for seed in ours if seed in theirs]
    if not shared:
        return "–"
    return format_paired(
        paired_difference(
            pooled({k: ours[k] for k in shared}), pooled({k: theirs[k] for k in shared})
        )
    )


def dtype_accuracy_table():
    bf16, fp32 = dtype_runs("bfloat16"), dtype_runs("float32")
    committed = {  # table a: fp32 on the machine that computed it
        part: {
            seed: summary_of(run)
            for seed in SEEDS
            if (run := load(f"tables/arith300-seed{seed}-{part}.json"))
        }
        for part in PROTOCOLS
    }
    absent = [
        f"dtype/arith300-seed{seed}-{dtype}.json"
        for dtype, runs in (("bfloat16", bf16), ("float32", fp32))
        for seed in SEEDS
        if seed not in runs["vanilla"]
    ]
    if len(absent) == 2 * len(SEEDS):
        return missing(*absent)
    lines = [
        "| protocol | bf16 | fp32 | bf16 − fp32, pooled [95% CI] (disagree) | tokens/q bf16 / fp32 "
        "| table a's fp32 (its machine) | fp32 − table a's fp32 |",
        "|---|---|---|---|---|---|---|",
    ]
    for part, (_, name) in PROTOCOLS.items():
        tokens = [
            f"{mean([s['tokens_per_question'] for s in runs[part].values()]):.0f}"
            if runs[part]
            else "–"
            for runs in (bf16, fp32)
        ]
        lines.append(
            f"| {name} | {spread(bf16[part])} | {spread(fp32[part])} | "
            f"{paired(bf16[part], fp32[part])} | {' / '.join(tokens)} | "
            f"{spread(committed[part])} | {paired(fp32[part], committed[part])} |"
        )
    machines = sorted(
        {
            run["machine"]
            for dtype in ("bfloat16", "float32")
            for seed in SEEDS
            if (run := load(f"dtype/arith300-seed{seed}-{dtype}.json"))
        }
    )
    text = (
        "\n".join(lines)
        + "\n\nAccuracy mean ± sample std over seeds "
        + ", ".join(map(str, SEEDS))
        + " (300 test questions each); paired differences pooled over the 900 (seed, question) "
        "pairs. Both dtypes on: " + "; ".join(machines) + "."
    )
    return text + ("\n\n" + missing(*absent) if absent else "")


def dtype_bench_table():
    gen, rnd = load("bench/generate-dtypes.json"), load("bench/round-dtypes.json")
    if not (gen or rnd):
        return missing("bench/generate-dtypes.json", "bench/round-dtypes.json")
    lines = [
        "| benchmark | HF fp32 | HF bf16 | engine fp32 | engine bf16 | engine fp32 / HF fp32 | "
        "engine bf16 / HF bf16 | engine bf16 / HF fp32 | identical rows: fp32 engine = HF fp32; "
        "bf16 engine = HF bf16; = HF fp32 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    if gen and "hf_bfloat16_tok_s" in gen:
        n = gen["prompts"]
        lines.append(
            f"| generate: {n} fixed prompts, 128 tokens (tok/s) | {gen['hf_tok_s']:.1f} | "
            f"{gen['hf_bfloat16_tok_s']:.1f} | {gen['engine_float32_tok_s']:.1f} | "
            f"{gen['engine_bfloat16_tok_s']:.1f} | {gen['ratio_fp32']:.2f} | "
            f"{gen['ratio_bf16']:.2f} | **{gen['ratio_bf16_vs_hf_fp32']:.2f}** | "
            f"{gen['rows_matching']}/{n}; {gen['rows_matching_bf16']}/{n}; "
            f"{gen['rows_matching_bf16_vs_hf_fp32']}/{n} |"
        )
    if rnd and "bfloat16" in rnd:
        b, n = rnd["bfloat16"], rnd["generations"]
        lines.append(
            f"| round: {rnd['questions']} questions × {rnd['agents']} agents, round 0 + REFINE "
            f"({n} generations) (tok/s) | {rnd['hf_tok_s']:.1f} | {b['hf_tok_s']:.1f} | "
            f"{rnd['engine_tok_s']:.1f} | {b['engine_tok_s']:.1f} | {rnd['ratio']:.2f} | "
            f"{b['ratio']:.2f} | **{b['ratio_vs_hf_fp32']:.2f}** | {rnd['rows_matching']}/{n}; "
            f"{b['rows_matching']}/{n}; {b['rows_matching_hf_fp32']}/{n} |"
        )
    notes = []
    if gen and "hf_bfloat16_tok_s" in gen:
        notes.append(
            f"`generate`: each side's fastest of {gen['repeats']} alternating turns (all, tok/s: "
            + "; ".join(f"{side} {turns}" for side, turns in gen["all_tok_s"].items())
            + f"); int8 engine {gen['engine_int8_tok_s']:.1f} tok/s; roofline fp32 "
            f"{gen['roofline_frac_fp32']:.2f} of {gen['peak_flops_fp32'] / 1e9:.0f} GFLOP/s, bf16 "
            f"{gen['roofline_frac_bf16']:.2f} of {gen['peak_flops_bf16'] / 1e9:.0f} GFLOP/s; "
            f"{gen['machine']}."
        )
    if rnd and "bfloat16" in rnd:
        notes.append(
            f"`round`: one turn per side; wall time HF fp32 {rnd['hf_s']:.0f} s, HF bf16 "
            f"{rnd['bfloat16']['hf_s']:.0f} s, engine fp32 {rnd['engine_s']:.0f} s, engine bf16 "
            f"{rnd['bfloat16']['engine_s']:.0f} s; {rnd['machine']}."
        )
    profile = load("bench/profile-bf16.json")
    if profile:
        before, after = profile["before"], profile["after"]
        notes.append(
            f"One decode step of {profile['rows']} rows (`profile-bf16`: "
            "`experiments/profile_decode.py --bf16`, the fastest of "
            f"{profile['repeats']} alternating turns, all: fp32 {before['all_step_ms']} ms, bf16 "
            f"{after['all_step_ms']} ms): fp32 {before['decode_step_ms']:.0f} ms ("
            + ", ".join(f"{k} {v:.0f}" for k, v in before["buckets_ms"].items())
            + f"), bf16 {after['decode_step_ms']:.0f} ms ("
            + ", ".join(f"{k} {v:.0f}" for k, v in after["buckets_ms"].items())
            + f"), {profile['speedup']:.2f}×."
        )
    absent = [
        f"bench/{name}-dtypes.json" for name, run in (("generate", gen), ("round", rnd)) if not run
    ]
    return (
        "\n".join(lines) + "\n\n" + " ".join(notes) + ("\n\n" + missing(*absent) if absent else "")
    )
