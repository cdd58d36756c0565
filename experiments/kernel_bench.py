"""The kernel timings behind the engine's dtype decisions (docs/design.md §11), on this machine:

    python -m experiments.kernel_bench --out results/bench/kernels.json

  linear    - a 64-row Linear of each projection shape of the default backbone and its LM head:
              torch's default path and oneDNN's (the engine's fp32 patch), in fp32 and bf16 (ms)
  greedy    - the next token of 64 rows of 49152 logits: argmax against max(-1).indices (ms)
  attention - one layer's decode attention (64 rows, 3 KV heads of 3 queries, 150 columns of a
              larger cache) over a view of the cache window against over a copy of it (ms)
Each the fastest of 3 runs of `repeats` calls.
"""

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from common import machine, parse_config, write_result

# (in, out) of SmolLM2-135M's projections: q/o, k/v, gate/up, down; and the LM head
SHAPES = {"q,o": (576, 576), "k,v": (576, 192), "gate,up": (576, 1536), "down": (1536, 576),
          "lm_head": (576, 49152)}  # fmt: skip


@dataclass
class Config:
    rows: int = 64
    """rows of every product (the engine's decode batch)"""
    repeats: int = 20
    """calls per timed run"""
    out: str = ""
    """the JSON result file (empty: printed only)"""


def ms(run, repeats):
    run()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(repeats):
            run()
        best = min(best, (time.perf_counter() - start) / repeats)
    return round(best * 1e3, 4)


def main(cfg):
    torch.manual_seed(0)
    result = {"rows": cfg.rows, "repeats": cfg.repeats, "linear_ms": {}}
    for name, (fan_in, fan_out) in SHAPES.items():
        for dtype in (torch.float32, torch.bfloat16):
            x, w = (
                torch.randn(cfg.rows, fan_in, dtype=dtype),
                torch.randn(fan_out, fan_in, dtype=dtype),
            )
            onednn = torch.ops.mkldnn._linear_pointwise
            result["linear_ms"][f"{name} {str(dtype)[6:]}"] = {
                "default": ms(lambda: F.linear(x, w), cfg.repeats),
                "onednn": ms(lambda: onednn(x, w, None, "none", [], ""), cfg.repeats),
            }
    logits = torch.randn(cfg.rows, 49152)
    result["greedy_ms"] = {
        str(dtype)[6:]: {
            "argmax": ms(lambda: y.argmax(-1), cfg.repeats),
            "max_indices": ms(lambda: y.max(-1).indices, cfg.repeats),
        }
        for dtype in (torch.float32, torch.bfloat16)
        for y in [logits.to(dtype)]
    }
    result["attention_ms"] = {}
    for dtype in (torch.float32, torch.bfloat16):
        cache = torch.randn(2, cfg.rows, 3, 214, 64, dtype=dtype)
        k, v = cache[0, :, :, :150], cache[1, :, :, :150]  # the window: a view of the buffer
        q = torch.randn(cfg.rows, 3, 3, 64, dtype=dtype)
        mask = torch.ones(cfg.rows, 1, 1, 150, dtype=torch.bool)
        mask[:, :, :, :40] = False
        sdpa = F.scaled_dot_product_attention
        result["attention_ms"][str(dtype)[6:]] = {
            "window_view": ms(lambda: sdpa(q, k, v, attn_mask=mask), cfg.repeats),
            "window_copy": ms(
                lambda: sdpa(q, k.contiguous(), v.contiguous(), attn_mask=mask), cfg.repeats
            ),  # fmt: skip
        }
    return write_result(
        {**result, "threads": torch.get_num_threads(), "machine": machine()}, cfg.out
    )


if __name__ == "__main__":
    main(parse_config(Config, description=__doc__.split("\n\n")[0]))
