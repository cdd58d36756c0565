"""experiments/cache_bench.py as users run it, on a small cache."""

import json
import subprocess

from conftest import lab_command


def test_cache_bench_reports_every_figure(tmp_path):
    """experiments/cache_bench.py on a small cache: both caches measured, each in its own process,
    and every figure there."""
    argv, env = lab_command("cache_bench")
    proc = subprocess.run(
        [
            *argv,
            "--sizes",
            "300",
            "--lookups",
            "50",
            "--inserts",
            "50",
            "--call",
            "10",
            "--out",
            str(tmp_path / "cache.json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    size = json.loads((tmp_path / "cache.json").read_text())["sizes"]["300"]
    assert size["entries"] == 300 and 1800 < size["jsonl_bytes_per_entry"] < 2300
    assert size["import"]["open_s"] > 0 and size["sqlite_mb"] < size["jsonl_mb"]
    figures = {
        "open_s",
        "open_peak_rss_mb",
        "rss_before_open_mb",
        "lookups_per_s",
        "lookups_per_s_engine_call",
        "inserts_per_s",
        "inserts_per_s_engine_call",
        "peak_rss_mb",
    }
    for kind in ("sqlite", "jsonl"):
        assert set(size[kind]) == figures and all(size[kind][f] > 0 for f in figures)
        # no torch in the measuring process: its memory is the cache's
        assert size[kind]["rss_before_open_mb"] < 100
