"""A CPU whose bf16 matmuls run MPDF_TEST_BF16_SPEED times as fast as its fp32 ones, simulated for
`--dtype auto`'s probe (llm/backbone.py: probe_matmuls) in every Python process of a test run.

`MPDF_TEST_BF16_SPEED=0.167 make test` runs the suite as on an AVX2-only EPYC (bf16 emulated, the
probe stops early and auto picks fp32); `=3` as on a CPU with native bf16 (auto picks bf16).
tests/conftest.py installs it in pytest's processes and puts this folder on PYTHONPATH, where
Python imports this file at the start of each subprocess a test starts. The probe still runs its
fp32 matmuls; its clocks count each bf16 call as the fp32 call before it (same shape) divided by
the speed, and the bf16 call itself is skipped. The figures go to a probe file of their own, so
that the model folders' real dtype-probe.json stays this machine's."""

import importlib.abc
import importlib.util
import os
import sys
import time
from types import SimpleNamespace

SPEED = os.environ.get("MPDF_TEST_BF16_SPEED")


def simulate(backbone, speed):
    """Replaces backbone.probe_matmuls and backbone.PROBE_FILE; the originals stay as
    `probe_matmuls.real` and `probe_matmuls.real_file` for tests that plant a CPU of their own.
    Once per process (pytest-xdist's workers import this file at start and again in conftest.py)."""
    import torch

    if hasattr(backbone.probe_matmuls, "real"):
        return

    real = backbone.probe_matmuls

    def probe_matmuls(shapes, rows, *args, **kwargs):
        clock = SimpleNamespace(now=0.0, fp32=0.0)
        functional, mkldnn = torch.nn.functional, torch.ops.mkldnn
        saved = backbone.time, functional.linear, mkldnn._linear_pointwise

        def timed(kernel):
            def run(x, w, *rest):
                if x.dtype == torch.bfloat16:
                    clock.now += clock.fp32 / speed
                    return None
                began = time.perf_counter()
                out = kernel(x, w, *rest)
                clock.fp32 = time.perf_counter() - began
                clock.now += clock.fp32
                return out

            return run

        backbone.time = SimpleNamespace(
            perf_counter=lambda: clock.now, process_time=lambda: clock.now
        )
        functional.linear, mkldnn._linear_pointwise = timed(saved[1]), timed(saved[2])
        try:
            return real(shapes, rows, *args, **kwargs)
        finally:
            backbone.time, functional.linear, mkldnn._linear_pointwise = saved

    probe_matmuls.real, probe_matmuls.real_file = real, backbone.PROBE_FILE
    backbone.probe_matmuls = probe_matmuls
    backbone.PROBE_FILE = f"dtype-probe-bf16-at-{speed:g}x.json"


class SimulateOnImport(importlib.abc.MetaPathFinder):
    """Simulates the CPU in llm.backbone as soon as a process imports it (torch is not imported
    before then: a subprocess that never loads a model pays nothing)."""

    def __init__(self, speed):
        self.speed = speed

    def find_spec(self, name, path, target=None):
        if name != "llm.backbone":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            simulate(module, self.speed)

        spec.loader.exec_module = exec_module
        return spec


def install(speed):
    if "llm.backbone" in sys.modules:
        simulate(sys.modules["llm.backbone"], speed)
    else:
        sys.meta_path.insert(0, SimulateOnImport(speed))


if SPEED:
    install(float(SPEED))
