"""The engine's decode step at static shapes (llm/graphs.py), on CPU: what a CUDA graph replays
there runs here without capture, reading the same kept buffers, so these tests check the data flow
that a graph depends on: the static step's tokens equal the eager step's row for row (rows joining
and leaving, mixed LoRA adapters, the window sliding), the bucket choice, no slot or weight read
stale, and no operation in the step that would wait for the GPU (illegal while a graph is
captured)."""

import pytest
import torch
from test_engine import many_prompts, stop_early
from test_lora import adapted
from torch.utils._python_dispatch import TorchDispatchMode

from llm import graphs, lora
from llm.engine import Engine


def engines(model, tokenizer, batch_size):
    return [
        Engine(model=model, tokenizer=tokenizer, batch_size=batch_size, decode=decode)
        for decode in ("eager", "static")
    ]


@pytest.fixture
def small_buckets(monkeypatch):
    """Widths in steps of 8 columns and a cache grown in steps of 16: the tiny prompts cross
    several width buckets and the kept cache grows between calls."""
    monkeypatch.setattr(graphs, "WIDTH_STEP", 8)
    monkeypatch.setattr(graphs, "CAPACITY_STEP", 16)


@pytest.mark.parametrize("with_adapters", [False, True])
def test_static_step_gives_the_eager_steps_tokens_row_for_row(
    tiny_model, small_buckets, with_adapters
):
    """12 prompts over 4 slots, rows ending at different steps (some tokens declared EOS): rows
    leave, the last rows move into their slots, new rows join, the window slides back; with
    adapters, rows of adapters 0, 1, 2 and the base mixed in one batch."""
    model = adapted(tiny_model, adapters=3) if with_adapters else tiny_model[0]
    eager, static = engines(model, tiny_model[1], batch_size=4)
    prompts = many_prompts(eager)
    adapters = [k % 3 if k % 4 else None for k in range(12)] if with_adapters else None
    expected = stop_early(eager, prompts, 24) if not with_adapters else None
    if with_adapters:
        free = eager.sample([eager.encode(p) for p in prompts], [0] * 12, 24, 0, adapters=adapters)
        eager.eos_ids = {free[1].tokens[2], free[6].tokens[7], free[11].tokens[11]}
    static.eos_ids = eager.eos_ids
    ids = [eager.encode(p) for p in prompts]
    want = eager.sample(ids, list(range(12)), 24, 0, adapters=adapters)
    got = static.sample(ids, list(range(12)), 24, 0, adapters=adapters)
    assert len({s.n_generated for s in want}) >= 3  # rows left at different steps
    if expected is not None:
        assert [s.tokens for s in want] == expected
    for k, (a, b) in enumerate(zip(want, got)):
        assert (a.tokens, a.finish, a.n_generated) == (b.tokens, b.finish, b.n_generated), k
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4), k
    # several row and width buckets served the call
    assert len({rows for rows, _ in static.static.graphs}) >= 2
    assert len({width for _, width in static.static.graphs}) >= 3
    if with_adapters:  # the adapters change the tokens (else the comparison proves little)
        base = Engine(model=tiny_model[0], tokenizer=tiny_model[1], decode="static")
        base.eos_ids = eager.eos_ids
        plain = base.sample(ids, list(range(12)), 24, 0)
        assert sum(p.tokens != g.tokens for p, g in zip(plain, got)) >= 6


def test_sampling_through_the_static_step_repeats_the_eager_samples(tiny_model, small_buckets):
    """Temperature and top-p draw outside the step from each row's own generator: the same seeds
    give the same samples through either step (float64, where a row's logits do not depend on its
    batch)."""
    model64 = type(tiny_model[0])(tiny_model[0].config).eval()
    model64.load_state_dict(tiny_model[0].state_dict())
    eager, static = engines(model64.double(), tiny_model[1], batch_size=3)
    prompts = many_prompts(eager)
    eager.eos_ids = static.eos_ids = set(range(0, len(tiny_model[1]), 9))
    ids, seeds = [eager.encode(p) for p in prompts], [100 + k for k in range(12)]
    want = eager.sample(ids, seeds, max_new_tokens=20, temperature=0.8, top_p=0.9)
    got = static.sample(ids, seeds, max_new_tokens=20, temperature=0.8, top_p=0.9)
    assert len({s.n_generated for s in want}) >= 3
    assert [s.tokens for s in got] == [s.tokens for s in want]


def test_row_buckets():
    assert graphs.row_buckets(1) == [1]
    assert graphs.row_buckets(2) == [1, 2]
    assert graphs.row_buckets(5) == [1, 2, 4, 5]
    assert graphs.row_buckets(8) == [1, 2, 4, 8]
    assert graphs.row_buckets(48) == [1, 2, 4, 8, 16, 32, 48]


def test_each_step_runs_the_smallest_bucket_that_holds_its_rows_and_columns(
    tiny_model, small_buckets, monkeypatch
):
    """Rows leave one by one (EOS at different steps): each step runs in the smallest row bucket
    >= its live rows, over the smallest multiple of WIDTH_STEP columns past the written one."""
    eager, static = engines(tiny_model[0], tiny_model[1], batch_size=5)
    prompts = many_prompts(eager)[:5]
    eager.eos_ids = set()
    free = eager.sample([eager.encode(p) for p in prompts], [0] * 5, 20, 0)
    static.eos_ids = {free[0].tokens[2], free[1].tokens[6], free[3].tokens[12]}
    seen, prepare = [], static.static._prepare

    def spy(rows, width):
        seen.append((rows, width))
        return prepare(rows, width)

    calls = []
    step = static.static.step

    def spy_step(tokens, end):
        calls.append((len(tokens), end))
        return step(tokens, end)

    monkeypatch.setattr(static.static, "_prepare", spy)
    monkeypatch.setattr(static.static, "step", spy_step)
    out = static.sample([eager.encode(p) for p in prompts], [0] * 5, 20, 0)
    live = sorted({n for n, _ in calls})
    assert len(live) >= 3  # rows left at different steps
    for n, end in calls:
        rows = min(b for b in (1, 2, 4, 5) if b >= n)
        width = -(-(end + 1) // 8) * 8
        assert (rows, width) in static.static.graphs
    # each bucket prepared once, then replayed
    assert len(seen) == len(set(seen)) == len(static.static.graphs)
    assert len(calls) > len(seen)
    assert {rows for rows, _ in seen} <= {1, 2, 4, 5}
    assert len({s.n_generated for s in out}) >= 3


def test_a_bucket_replayed_after_rows_move_reads_their_new_slots(tiny_model, small_buckets):
    """One bucket's step, prepared once, then run again after the slots' rows were permuted (as
    when rows leave): each row's logits are its own, not those of the row that held its slot."""
    model = adapted(tiny_model, adapters=2)
    eager, static = engines(model, tiny_model[1], batch_size=4)
    prompts = many_prompts(eager)[:4]
    ids = [eager.encode(p) for p in prompts]
    adapters = [0, 1, None, 1]
    # the same call twice: the second replays the buckets the first prepared
    first = static.sample(ids, [0] * 4, 6, 0, adapters=adapters)
    prepared = dict(static.static.graphs)
    order = [2, 0, 3, 1]
    second = static.sample(
        [ids[k] for k in order], [0] * 4, 6, 0, adapters=[adapters[k] for k in order]
    )
    assert static.static.graphs == prepared  # nothing prepared anew
    assert [s.tokens for s in second] == [first[k].tokens for k in order]
    moved = [adapters[k] for k in order]
    want = eager.sample([ids[k] for k in order], [0] * 4, 6, 0, adapters=moved)
    assert [s.tokens for s in second] == [s.tokens for s in want]


def test_trained_adapters_reach_the_kept_step_in_place(tiny_model):
    """A graph reads each LoRA layer's stacked A and B where they were at capture: an optimizer
    step changes the parameters in place, and the next engine call must copy them into those same
    tensors (not new ones); a new adapter (new shapes) drops every graph."""
    model = adapted(tiny_model, adapters=2)
    _, static = engines(model, tiny_model[1], batch_size=4)
    ids = [static.encode(p) for p in many_prompts(static)[:4]]
    before = static.sample(ids, [0] * 4, 8, 0, adapters=[0, 1, 0, 1])
    layer = next(iter(lora.lora_layers(model).values()))
    with torch.no_grad():
        kept = [t.data_ptr() for t in layer.stacked()]
    assert static.static.graphs
    with torch.no_grad():
        for b in layer.lora_B:
            b.add_(torch.randn(b.shape) * 2.0)
    after = static.sample(ids, [0] * 4, 8, 0, adapters=[0, 1, 0, 1])
    with torch.no_grad():
        assert [t.data_ptr() for t in layer.stacked()] == kept
        assert torch.equal(layer.stacked()[1], torch.cat(list(layer.lora_B), dim=1))
    assert [s.tokens for s in after] != [s.tokens for s in before]
    fresh = Engine(model=model, tokenizer=tiny_model[1], decode="eager")
    want = fresh.sample(ids, [0] * 4, 8, 0, adapters=[0, 1, 0, 1])
    assert [s.tokens for s in after] == [s.tokens for s in want]
    # one more adapter: new weights, so no graph of the old ones survives the next call
    lora.new_adapter(model)
    graphs_before = set(static.static.graphs)
    with torch.inference_mode():
        static.static.begin(4, 8)
    assert not static.static.graphs and graphs_before


def test_graphs_dropped_together_leave_their_pool_and_the_next_ones_take_a_fresh_one(
    tiny_model, small_buckets, monkeypatch
):
    """CUDA's allocator takes no capture into a pool whose graphs are all gone while a tensor it
    handed out (a dropped graph's logits) lives on: when the cache grows or the weights move,
    every graph goes and the next ones are captured into a new pool; calls that keep the graphs
    keep their pool."""
    handles = iter(range(100))
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: (0, next(handles)))
    static = graphs.StaticDecoder(tiny_model[0], "cpu", n_layers=2, capture=True)
    pools = [static.pool]
    with torch.inference_mode():
        static.begin(2, 8)
        static.graphs[(2, 8)] = "a graph"
        pools.append(static.pool)
        static.begin(2, 8)
        assert static.graphs and static.pool == pools[-1]
        static.begin(4, 40)
        assert not static.graphs
        pools.append(static.pool)
        static.graphs[(4, 40)] = "a graph"
        weight = tiny_model[0].get_input_embeddings().weight
        moved = weight.data
        weight.data = moved.clone()
        try:
            static.begin(4, 40)
        finally:
            weight.data = moved
        assert not static.graphs
        pools.append(static.pool)
    assert len(set(pools)) == len(pools) == 4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_on_a_gpu_graphs_are_captured_again_after_the_cache_grows(tiny_model):
    """On a GPU: a call whose prompts outgrow the kept cache captures its graphs anew while the
    last call's outputs are still held, and its tokens are the eager step's."""
    model = tiny_model[0].to("cuda")
    try:
        eager, static = engines(model, tiny_model[1], batch_size=4)
        prompts = many_prompts(static)
        short = [static.encode(p) for p in prompts[:2]]
        long = [static.encode(p * 6) for p in prompts[2:6]]
        held = static.sample(short, [0] * 2, 8, 0)
        got = static.sample(long, [0] * 4, 8, 0)
        want = eager.sample(long, [0] * 4, 8, 0)
        assert held and [s.tokens for s in got] == [s.tokens for s in want]
    finally:
        tiny_model[0].to("cpu")


class HostSyncs(TorchDispatchMode):
    """Records the operations that make the host wait for the device (or whose output shape
    depends on the data): each would break a CUDA graph's capture."""

    WAITS = ("_local_scalar_dense", "nonzero", "is_nonzero", "item", "equal", "masked_select")

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name in self.WAITS or "repeat_interleave.Tensor" in str(func) or "unique" in name:
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("with_adapters", [False, True])
def test_the_static_step_never_waits_for_the_device(tiny_model, small_buckets, with_adapters):
    model = adapted(tiny_model, adapters=2) if with_adapters else tiny_model[0]
    _, static = engines(model, tiny_model[1], batch_size=4)
    ids = [static.encode(p) for p in many_prompts(static)[:4]]
    static.sample(ids, [0] * 4, 4, 0, adapters=[0, 1, None, 1] if with_adapters else None)
    (rows, width), run = next(iter(static.static.graphs.items()))
    with torch.inference_mode(), HostSyncs() as syncs:
        run()
    assert syncs.seen == []
    # the check sees what it looks for: the eager step's adapter choice asks the device
    with torch.inference_mode(), HostSyncs() as syncs:
        with lora.selecting(model, torch.tensor([0, 0])):
            pass
    assert ("aten.is_nonzero.default" in syncs.seen) == with_adapters


def test_fold_attention_is_sdpa_with_the_kv_heads_repeated():
    """One query token per row, 8 query heads over 2 KV heads, an additive mask: the folded
    attention equals SDPA over the keys repeated per query head."""
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(3, 8, 1, 16, generator=generator)
    key, value = (torch.randn(3, 2, 10, 16, generator=generator) for _ in range(2))
    mask = torch.zeros(3, 1, 1, 10)
    mask[0, ..., :4] = torch.finfo(torch.float32).min
    out, _ = graphs.fold_attention(None, query, key, value, mask, scaling=0.25)
    want = torch.nn.functional.scaled_dot_product_attention(
        query, key.repeat_interleave(4, 1), value.repeat_interleave(4, 1), mask, scale=0.25
    ).transpose(1, 2)
    assert out.shape == (3, 1, 8, 16)
    torch.testing.assert_close(out, want)


def test_decode_settings_are_checked(tiny_model):
    with pytest.raises(ValueError, match="decode must be one of auto, eager, static, compiled"):
        Engine(model=tiny_model[0], tokenizer=tiny_model[1], decode="graphs")
    # auto: eager on CPU, static on a GPU
    assert Engine(model=tiny_model[0], tokenizer=tiny_model[1]).static is None
    from llm.engine import check_decode

    assert check_decode("auto", "cuda:0") == "static"
    assert check_decode("auto", "cpu") == "eager"
