"""experiments/bench.py as users run it, on the tiny random model: every benchmark's figures."""

import json
import subprocess

import pytest
import torch
from conftest import lab_command


def test_bench_unknown_benchmark_is_refused(tmp_path):
    argv, env = lab_command("bench", "--bench", "nonsense")
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert proc.returncode == 2 and "unknown --bench 'nonsense'" in proc.stderr


def run_bench(tmp_path, *flags):
    """experiments/bench.py --bench ... on the tiny model; its last stdout line is the JSON
    result."""
    argv, env = lab_command("bench", *flags)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_bench_generate_reports_every_figure(tmp_path, tiny_model_dir):
    result = run_bench(
        tmp_path,
        "--bench",
        "generate",
        "--n",
        "6",
        "--model",
        tiny_model_dir,
        "--dtypes",
        "float32,bfloat16",
        "--max-new-tokens",
        "32",
    )
    assert result["prompts"] == 6 and result["dtypes"] == ["float32", "bfloat16"]
    # the engine in fp32 is HF generate token for token, greedy, on every row
    assert result["outputs_match"] is True and result["rows_matching"] == 6
    assert result["fastest"] in ("float32", "bfloat16", "int8")
    assert result["engine_tok_s"] == result[f"engine_{result['fastest']}_tok_s"]
    assert result["ratio"] == pytest.approx(result["engine_tok_s"] / result["hf_tok_s"])
    assert result["ratio"] >= result["ratio_fp32"] > 0 and 0 < result["roofline_frac"]
    assert 0 < result["roofline_frac_fp32"] and 0 < result["roofline_frac_bf16"]
    # bf16 against HF in bf16 and against HF fp32, with the share of identical rows
    assert result["ratio_bf16"] == pytest.approx(
        result["engine_bfloat16_tok_s"] / result["hf_bfloat16_tok_s"]
    )
    assert result["ratio_bf16_vs_hf_fp32"] == pytest.approx(
        result["engine_bfloat16_tok_s"] / result["hf_tok_s"]
    )
    assert 0 <= result["rows_matching_bf16_vs_hf_fp32"] <= 6
    assert 3 <= result["rows_matching_bf16"] <= 6
    # the sides took turns twice; each reports its fastest turn
    assert set(result["all_tok_s"]) == {"hf", "hf_bfloat16", "float32", "bfloat16", "int8"}
    assert result["repeats"] == 2
    assert result["hf_tok_s"] == pytest.approx(max(result["all_tok_s"]["hf"]), abs=0.1)
    only_fp32 = run_bench(
        tmp_path,
        "--bench",
        "generate",
        "--n",
        "2",
        "--model",
        tiny_model_dir,
        "--dtypes",
        "float32",
        "--max-new-tokens",
        "8",
    )
    assert set(only_fp32["all_tok_s"]) == {"hf", "float32", "int8"}
    assert "ratio_bf16" not in only_fp32


def test_bench_round_reports_every_figure(tmp_path, tiny_model_dir):
    """One greedy deliberation round (round 0, then REFINE) through HF generate and the engine."""
    result = run_bench(
        tmp_path,
        "--bench",
        "round",
        "--n",
        "5",
        "--agents",
        "3",
        "--max-new-tokens",
        "8",
        "--engine-batch-size",
        "4",
        "--hf-batch-size",
        "6",
        "--model",
        tiny_model_dir,
        "--dtypes",
        "float32,bfloat16",
    )
    assert (result["questions"], result["agents"], result["generations"]) == (5, 3, 30)
    assert (result["engine_slots"], result["hf_batch_size"]) == (4, 6)
    # continuous batching (4 slots for 15 prompts per round) gives HF generate's tokens (batches of
    # 6) on every row
    assert result["outputs_match"] is True and result["rows_matching"] == 30
    assert result["ratio"] == pytest.approx(result["engine_tok_s"] / result["hf_tok_s"])
    assert result["generated_tokens"] > 0 and 0 < result["roofline_frac"]
    assert (
        result["engine_s"] == pytest.approx(sum(result["engine_round_s"]))
        and len(result["hf_round_s"]) == 2
    )
    bf16 = result["bfloat16"]  # the same round in bf16: HF bf16, then the engine
    assert bf16["ratio"] == pytest.approx(bf16["engine_tok_s"] / bf16["hf_tok_s"])
    assert bf16["ratio_vs_hf_fp32"] == pytest.approx(bf16["engine_tok_s"] / result["hf_tok_s"])
    assert 0 <= bf16["rows_matching_hf_fp32"] <= 30 and bf16["generated_tokens"] > 0
    assert len(bf16["engine_round_s"]) == 2 and 0 < bf16["roofline_frac"]


def test_bench_debate_times_both_ways(tmp_path, tiny_model_dir):
    result = run_bench(
        tmp_path,
        "--bench",
        "debate",
        "--n",
        "2",
        "--agents",
        "2",
        "--rounds",
        "1",
        "--max-new-tokens",
        "6",
        "--model",
        tiny_model_dir,
    )
    assert (result["questions"], result["agents"], result["rounds"]) == (2, 2, 1)
    assert result["engine_s"] > 0 and result["usual_s"] > 0
    assert result["ratio"] == pytest.approx(result["usual_s"] / result["engine_s"])


def test_bench_slots_compares_two_batch_sizes_on_the_same_outputs(tmp_path, tiny_model_dir):
    result = run_bench(
        tmp_path,
        "--bench",
        "slots",
        "--n",
        "10",
        "--engine-batch-size",
        "4",
        "--max-new-tokens",
        "6",
        "--model",
        tiny_model_dir,
    )
    # 10 prompts through 2 and 4 slots: rows come and
    # go differently, greedy fp32 tokens may not change
    assert set(result["tok_s"]) == {"2", "4"} and result["outputs_match"] is True
    assert result["ratio"] == pytest.approx(result["tok_s"]["4"] / result["tok_s"]["2"])
    assert all(len(turns) == 2 for turns in result["all_tok_s"].values())


def test_the_peak_rate_is_measured_on_smaller_matrices_where_one_matmul_is_slow(monkeypatch):
    """Where one 2048 x 2048 matmul would take more than a second (bf16 emulated), the peak is
    measured on 512 x 512 matrices, else on 2048 x 2048 ones; either way a positive rate."""
    from experiments import bench_common

    sizes = []
    randn = torch.randn

    def spy(*shape, **kwargs):
        sizes.append(shape)
        return randn(*shape, **kwargs)

    monkeypatch.setattr(torch, "randn", spy)
    for seconds, size in ((1.0 / 64 + 1e-6, 512), (1.0 / 64, 2048)):
        monkeypatch.setattr(bench_common, "_matmul_seconds", lambda dtype, n, s=seconds: s)
        sizes.clear()
        assert bench_common.matmul_peak_flops("float32") > 0
        assert sizes == [(size, size)] * 2
