"""Tests of engine.py: the sampling loop against HF `generate`, seeds, stop strings,
token counts, the on-disk GenerationCache and pick_next_tokens. Public behaviour only.

Most tests run on the tiny random model from conftest.py (milliseconds per call); the greedy
comparison with HF `generate` also runs once on the default backbone.
Run: python -m pytest -q tests/engine/test_engine.py
"""

import json
import math
from contextlib import nullcontext

import pytest
import torch
from scipy.stats import chi2

from llm.cache import GenerationCache
from llm.engine import Completion, Engine, Sample
from llm.prefill import common_prefix_length, padded_chunks, prefix_groups
from llm.sampling import pick_next_tokens


def tiny_prompts(engine):
    """Eight prompts of very different lengths (1 to ~60 tokens), raw and chat-formatted."""
    return [
        "Hi",
        "The",
        engine.chat("What is 2+3?"),
        "word " * 60,
        engine.chat("Tell me a story about dragons and a castle. " * 3, system="Be brief."),
        "x = 1 + 2",
        "1, 2, 3, 4, 5, 6, 7, 8, 9, 10",
        "Once upon a time",
    ]


@pytest.fixture
def tiny_engine(tiny_model):
    model, tokenizer = tiny_model
    return Engine(model=model, tokenizer=tokenizer)


def hf_greedy(model, tokenizer, prompts, max_new_tokens, eos_ids):
    """HF generate, greedy, left padding; each row cut before its first EOS."""
    from transformers import AutoTokenizer

    # a copy: the engine's stays untouched
    tok = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    batch = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.inference_mode():
        out = model.generate(
            **batch,
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=sorted(eos_ids),
            pad_token_id=tok.pad_token_id,
        )
    return [cut_at_eos(row, eos_ids) for row in out[:, batch["input_ids"].shape[1] :].tolist()]


def cut_at_eos(tokens, eos_ids):
    for i, t in enumerate(tokens):
        if t in eos_ids:
            return tokens[:i]
    return list(tokens)


def check_against_hf(engine, prompts, max_new_tokens):
    """engine.sample (greedy) == HF generate token for token, with the right finish reason and
    count."""
    ids = [engine.encode(p) for p in prompts]
    expected = hf_greedy(engine.model, engine.tokenizer, prompts, max_new_tokens, engine.eos_ids)
    got = engine.sample(
        ids, seeds=list(range(len(prompts))), max_new_tokens=max_new_tokens, temperature=0
    )
    for row, ((tokens, finish, n, _), want) in enumerate(zip(got, expected)):
        assert tokens == want, f"row {row}: engine {tokens} != HF {want}"
        if len(want) < max_new_tokens:  # HF stopped on an EOS
            assert (finish, n) == ("eos", len(want) + 1), row
        else:
            assert (finish, n) == ("length", max_new_tokens), row
    return expected, got


# --------------------------------------------------------------------------------------------------
# greedy decoding == HF generate (fp32, left padding)


def set_prefill_chunk(engine, tokens):
    """Force the chunked prefill (several chunks per batch) where the engine has one."""
    if tokens is not None:
        if not hasattr(engine, "prefill_tokens"):
            pytest.skip("this engine has no chunked prefill")
        engine.prefill_tokens = tokens


@pytest.mark.parametrize("prefill_tokens", [None, 64])
def test_greedy_matches_hf_generate_tiny(tiny_engine, prefill_tokens):
    set_prefill_chunk(tiny_engine, prefill_tokens)
    prompts = tiny_prompts(tiny_engine)
    lengths = [len(tiny_engine.encode(p)) for p in prompts]
    assert min(lengths) == 1 and max(lengths) > 40  # really different lengths: heavy left padding
    expected, _ = check_against_hf(tiny_engine, prompts, 32)
    completions = tiny_engine.generate(
        prompts, seeds=[0] * len(prompts), max_new_tokens=32, temperature=0
    )
    for c, want, n_prompt in zip(completions, expected, lengths):
        assert c.text == tiny_engine.tokenizer.decode(want, skip_special_tokens=True)
        assert c.prompt_tokens == n_prompt
        assert not c.cached


@pytest.mark.parametrize("prefill_tokens", [None, 64])
def test_greedy_matches_hf_generate_when_rows_finish_at_different_times(
    tiny_engine, prefill_tokens
):
    """Rows that hit an EOS leave the batch (and its KV cache); the rows that remain must not
    notice."""
    set_prefill_chunk(tiny_engine, prefill_tokens)
    prompts = tiny_prompts(tiny_engine)
    # the random model never stops by itself: first get the free-running text
    tiny_engine.eos_ids = set()
    free = [
        s.tokens
        for s in tiny_engine.sample(
            [tiny_engine.encode(p) for p in prompts], [0] * 8, max_new_tokens=32, temperature=0
        )
    ]
    # make three rows stop early, at different steps, by declaring some of their tokens EOS
    eos = {free[0][3], free[2][10], free[5][20]}
    tiny_engine.eos_ids = eos
    expected = [cut_at_eos(row, eos) for row in free]
    stop_steps = sorted(len(e) for e in expected)
    assert len(set(stop_steps)) >= 4 and stop_steps[0] <= 3 and stop_steps[-1] == 32
    got_hf, got = check_against_hf(tiny_engine, prompts, 32)
    assert got_hf == expected
    completions = tiny_engine.generate(prompts, seeds=[0] * 8, max_new_tokens=32, temperature=0)
    for c, want in zip(completions, expected):
        assert c.text == tiny_engine.tokenizer.decode(want, skip_special_tokens=True)
        assert c.finish == ("eos" if len(want) < 32 else "length")
        assert c.completion_tokens == (len(want) + 1 if len(want) < 32 else 32)


@pytest.mark.slow
def test_greedy_matches_hf_generate_default_backbone(default_engine):
    e = default_engine
    prompts = [
        e.chat("What is 2+3?"),
        e.chat("Say hello."),
        e.chat("Write one sentence about the sea and the moon, with many words."),
        e.chat(
            "Tom has 3 apples and buys 4 more. How many apples does he have?",
            system="Answer with a number.",
        ),
    ]
    expected, got = check_against_hf(e, prompts, 24)
    assert any(s.finish == "eos" for s in got)  # the real model does stop by itself
    assert any(toks for toks in expected)


def test_greedy_matches_hf_generate_sliding_window_model(tiny_model):
    """A sliding-window model (its KV cache is not a plain DynamicLayer) takes the engine's other
    path."""
    from transformers import MistralConfig, MistralForCausalLM

    _, tokenizer = tiny_model
    torch.manual_seed(0)
    config = MistralConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        sliding_window=8,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    engine = Engine(model=MistralForCausalLM(config).eval(), tokenizer=tokenizer)
    check_against_hf(engine, ["Hi", "word " * 30, "Once upon a time there was"], 20)


# --------------------------------------------------------------------------------------------------
# seeds

SAMPLING = dict(max_new_tokens=16, temperature=0.8, top_p=0.9)


def test_same_seeds_same_text_different_seeds_different_text(tiny_engine):
    prompts = [tiny_prompts(tiny_engine)[i] for i in (0, 3, 4, 7)]
    a = tiny_engine.generate(prompts, seeds=[0, 1, 2, 3], **SAMPLING)
    b = tiny_engine.generate(prompts, seeds=[0, 1, 2, 3], **SAMPLING)
    c = tiny_engine.generate(prompts, seeds=[100, 101, 102, 103], **SAMPLING)
    assert [x.text for x in a] == [x.text for x in b]
    assert all(x.text != y.text for x, y in zip(a, c))
    # the same prompt with different seeds in one batch: different samples
    d = tiny_engine.generate(["Once upon a time"] * 4, seeds=[1, 2, 3, 4], **SAMPLING)
    assert len({x.text for x in d}) == 4


def test_row_sample_is_independent_of_the_batch_float64(tiny_model):
    """Same prompt + seed alone, or inside a batch with other prompts (other padding, other batch
    size, rows leaving at other times): identical tokens. float64 weights make the forward pass
    insensitive to the batch's shape, so this checks the sampler's logic exactly."""
    model, tokenizer = tiny_model
    model64 = type(model)(model.config).eval()
    model64.load_state_dict(model.state_dict())
    engine = Engine(model=model64.double(), tokenizer=tokenizer)
    ids = [engine.encode(p) for p in tiny_prompts(engine)]
    seeds = [11, 12, 13, 14, 15, 16, 17, 11]
    batch = engine.sample(ids, seeds, max_new_tokens=16, temperature=0.8, top_p=0.9)
    for row in (0, 3, 4, 7):
        alone = engine.sample(
            [ids[row]], [seeds[row]], max_new_tokens=16, temperature=0.8, top_p=0.9
        )
        assert alone[0] == batch[row], row
    # duplicates inside one batch: same seed -> same sample
    dup = engine.sample([ids[2]] * 3, [5, 5, 6], max_new_tokens=16, temperature=0.8, top_p=0.9)
    assert dup[0] == dup[1] != dup[2]


# --------------------------------------------------------------------------------------------------
# stop strings, budgets, token counts, ordering


def test_stop_string_ends_the_text_before_it(tiny_engine):
    prompt = tiny_prompts(tiny_engine)[0]
    tokenizer = tiny_engine.tokenizer
    tiny_engine.eos_ids = set()
    free = tiny_engine.sample([tiny_engine.encode(prompt)], [0], max_new_tokens=32, temperature=0)[
        0
    ][0]
    full_text = tokenizer.decode(free)
    # a plain word the greedy text emits somewhere after its start
    k, stop = next(
        (k, tokenizer.decode([t]))
        for k, t in enumerate(free)
        if k >= 4
        and tokenizer.decode([t]).strip().isascii()
        and tokenizer.decode([t]).strip().isalpha()
        and len(tokenizer.decode([t]).strip()) >= 4
    )
    n_expected = next(n for n in range(1, 33) if stop in tokenizer.decode(free[:n]))
    assert n_expected <= k + 1
    c = tiny_engine.generate(
        [prompt], [0], max_new_tokens=32, temperature=0, stop=["@@never@@", stop]
    )[0]
    assert c.finish == "stop"
    assert c.text == full_text.split(stop)[0]
    assert stop not in c.text and full_text.startswith(c.text)
    # it stopped at the token that completed the stop string
    assert c.completion_tokens == n_expected
    # a stop string that never appears changes nothing
    c = tiny_engine.generate([prompt], [0], max_new_tokens=32, temperature=0, stop=["@@never@@"])[0]
    assert (c.text, c.finish, c.completion_tokens) == (
        tokenizer.decode(free, skip_special_tokens=True),
        "length",
        32,
    )


def test_max_new_tokens_gives_finish_length(tiny_engine):
    tiny_engine.eos_ids = set()
    prompts = tiny_prompts(tiny_engine)
    for n in (1, 5):
        for c in tiny_engine.generate(
            prompts, seeds=list(range(8)), max_new_tokens=n, temperature=0.8
        ):
            assert c.finish == "length" and c.completion_tokens == n


def test_token_counts_and_stats(tiny_engine):
    prompts = tiny_prompts(tiny_engine)
    before = dict(tiny_engine.stats)
    out = tiny_engine.generate(prompts, seeds=list(range(8)), max_new_tokens=7, temperature=0.8)
    assert [c.prompt_tokens for c in out] == [len(tiny_engine.encode(p)) for p in prompts]
    assert all(isinstance(c, Completion) for c in out)
    stats = tiny_engine.stats
    assert stats["calls"] - before["calls"] == 8
    assert stats["prompt_tokens"] - before["prompt_tokens"] == sum(c.prompt_tokens for c in out)
    assert stats["completion_tokens"] - before["completion_tokens"] == sum(
        c.completion_tokens for c in out
    )
    assert stats["cache_hits"] == before["cache_hits"] == 0
    # the prompts were prefilled: their time is counted
    assert stats["prefill_s"] > before["prefill_s"]


def test_an_empty_prompt_is_refused_clearly(tiny_engine):
    for prompts in ([""], ["", "Hi"]):
        with pytest.raises(ValueError, match="prompt 0 is empty"):
            tiny_engine.generate(prompts, [0] * len(prompts), max_new_tokens=4, temperature=0.7)


def test_seeds_must_match_prompts(tiny_engine):
    with pytest.raises(ValueError, match="seeds"):
        tiny_engine.generate(["a", "b"], seeds=[0])


def test_small_batch_size_keeps_the_original_order(tiny_model):
    model, tokenizer = tiny_model
    big, small = (
        Engine(model=model, tokenizer=tokenizer),
        Engine(model=model, tokenizer=tokenizer, batch_size=3),
    )
    prompts = tiny_prompts(big)
    seeds = list(range(8))
    want = big.generate(prompts, seeds, max_new_tokens=12, temperature=0)
    got = small.generate(prompts, seeds, max_new_tokens=12, temperature=0)
    assert [c.prompt_tokens for c in got] == [len(small.encode(p)) for p in prompts]
    assert [c.text for c in got] == [c.text for c in want]
    # and each one equals the prompt generated on its own
    for i in (0, 3, 4):
        assert (
            small.generate([prompts[i]], [seeds[i]], max_new_tokens=12, temperature=0)[0].text
            == got[i].text
        )


def test_chat_formats(tiny_engine):
    prompt = tiny_engine.chat("Hello there", system="Be terse.")
    assert "Hello there" in prompt and "Be terse." in prompt
    assert prompt.index("Be terse.") < prompt.index("Hello there")
    assert prompt.rstrip().endswith("assistant")  # ends with the generation prompt
    tokenizer = type(tiny_engine.tokenizer).from_pretrained(tiny_engine.tokenizer.name_or_path)
    tokenizer.chat_template = None
    plain = Engine(model=tiny_engine.model, tokenizer=tokenizer)
    assert plain.chat("Hello there") == "Hello there\n"
    assert plain.chat("Hello there", system="Be terse.") == "Be terse.\n\nHello there\n"


# --------------------------------------------------------------------------------------------------
# the on-disk GenerationCache


def test_cache_second_call_makes_no_llm_call(tiny_model_dir, tmp_path):
    engine = Engine(model_path=tiny_model_dir, cache_dir=tmp_path)
    prompts = tiny_prompts(engine)[:4]
    first = engine.generate(prompts, seeds=[1, 2, 3, 4], **SAMPLING)
    assert engine.stats["calls"] == 4 and not any(c.cached for c in first)
    second = engine.generate(prompts, seeds=[1, 2, 3, 4], **SAMPLING)
    assert engine.stats["calls"] == 4 and engine.stats["cache_hits"] == 4
    assert all(c.cached for c in second)
    strip = lambda c: (c.text, c.prompt_tokens, c.completion_tokens, c.finish)  # noqa: E731
    assert [strip(c) for c in second] == [strip(c) for c in first]

    # a new Engine (a new process, say) on the same folder reuses it
    again = Engine(model_path=tiny_model_dir, cache_dir=tmp_path)
    third = again.generate(prompts, seeds=[1, 2, 3, 4], **SAMPLING)
    assert again.stats["calls"] == 0 and all(c.cached for c in third)
    assert [strip(c) for c in third] == [strip(c) for c in first]
    # a mixed call computes only what is missing, and keeps the order
    mixed = again.generate([prompts[0], "A brand new prompt"], seeds=[1, 1], **SAMPLING)
    assert [c.cached for c in mixed] == [True, False] and again.stats["calls"] == 1
    assert mixed[0].text == first[0].text


def test_sampled_tokens_asked_for_bypass_the_cache(tiny_model_dir, tmp_path):
    """return_tokens (the LLM-weight trainers' rollouts): never a cached completion, which has no
    token ids, and nothing stored."""
    engine = Engine(model_path=tiny_model_dir, cache_dir=tmp_path)
    prompts = tiny_prompts(engine)[:2]
    stored = engine.generate(prompts, seeds=[1, 2], **SAMPLING)
    again = engine.generate(prompts, seeds=[1, 2], **SAMPLING, return_tokens=True)
    assert engine.stats["calls"] == 4 and engine.stats["cache_hits"] == 0
    assert all(not c.cached and c.token_ids for c in again)
    assert [c.text for c in again] == [c.text for c in stored]


def test_the_text_leaves_out_special_tokens(tiny_engine, monkeypatch):
    """A special token the model samples (a chat marker, say) is not part of the answer's text."""
    tokenizer = tiny_engine.tokenizer
    special = tokenizer.convert_tokens_to_ids("<|im_start|>")
    word = tiny_engine.encode(" seven")

    def sample(batch_ids, seeds, on_finish, **kwargs):
        for i in range(len(batch_ids)):
            on_finish(i, Sample([special, *word], "eos", len(word) + 2, [0.0] * (len(word) + 2)))

    monkeypatch.setattr(tiny_engine, "sample", sample)
    [completion] = tiny_engine.generate(["Hi"], [0], max_new_tokens=8)
    assert completion.text == " seven" and completion.completion_tokens == len(word) + 2


class JsonlCache:
    """The cache's earlier form as the engine wrote it: a line {"key", "value"} per put to
    gen-rank<r>.jsonl (logprobs=False: as before the engine kept log-probs), read by nobody."""

    def __init__(self, path, logprobs=True):
        self.path, self.logprobs = path, logprobs

    def get_many(self, keys):
        return [None] * len(keys)

    def batch(self):
        return nullcontext()

    def put(self, key, value):
        if not self.logprobs:
            value = {k: v for k, v in value.items() if k != "token_logprobs"}
        with open(self.path, "a") as f:
            f.write(json.dumps({"key": key, "value": value}) + "\n")


def test_an_old_jsonl_cache_is_imported_once_with_the_same_hits(tiny_model_dir, tmp_path):
    engine = Engine(model_path=tiny_model_dir)
    prompts = tiny_prompts(engine)[:4]
    engine.cache = JsonlCache(tmp_path / "gen-rank0.jsonl")
    first = engine.generate(prompts[:2], seeds=[0, 1], **SAMPLING)
    engine.cache = JsonlCache(tmp_path / "gen-rank1.jsonl")
    first += engine.generate(prompts[2:], seeds=[2, 3], **SAMPLING)
    line = (tmp_path / "gen-rank0.jsonl").read_text().splitlines()[0]
    with open(tmp_path / "gen-rank0.jsonl", "a") as f:  # a process killed mid-write, then a new one
        f.write(line[: len(line) // 2] + "\n\n")

    strip = lambda c: (c.text, c.completion_tokens, c.finish, c.token_logprobs)  # noqa: E731
    for _ in range(2):  # imported, then read from the database alone
        again = Engine(model_path=tiny_model_dir, cache_dir=tmp_path)
        assert again.cache.skipped == 1
        hits = again.generate(prompts, seeds=[0, 1, 2, 3], **SAMPLING)
        assert all(c.cached for c in hits) and again.stats["calls"] == 0
        assert [strip(c) for c in hits] == [strip(c) for c in first]
    # a file that grew since (an older checkout still writing it) is imported again
    engine.generate(["Something else"], seeds=[9], **SAMPLING)
    new = Engine(model_path=tiny_model_dir, cache_dir=tmp_path)
    assert new.generate(["Something else"], seeds=[9], **SAMPLING)[0].cached


def test_cache_keys_depend_on_every_sampling_parameter(tiny_model_dir, tmp_path):
    engine = Engine(model_path=tiny_model_dir, cache_dir=tmp_path)
    prompts, seeds = ["Hi", "Once upon a time"], [3, 4]
    base = dict(max_new_tokens=8, temperature=0.8, top_p=0.9, stop=())
    engine.generate(prompts, seeds, **base)
    variants = [
        dict(base, temperature=0.7),
        dict(base, top_p=0.95),
        dict(base, max_new_tokens=9),
        dict(base, stop=["zzz"]),
    ]
    for i, params in enumerate(variants):
        out = engine.generate(prompts, seeds, **params)
        assert not any(c.cached for c in out), params
        assert engine.stats["calls"] == 2 * (i + 2)
    out = engine.generate(prompts, [5, 6], **base)  # other seeds
    assert not any(c.cached for c in out)
    out = engine.generate(["Hi!", "Once upon a time."], seeds, **base)  # other prompts
    assert not any(c.cached for c in out)
    out = engine.generate(prompts, seeds, **base)  # the original call is still cached
    assert all(c.cached for c in out)
    # another dtype is another model
    bf16 = Engine(model_path=tiny_model_dir, dtype="bfloat16", cache_dir=tmp_path)
    assert not any(c.cached for c in bf16.generate(prompts, seeds, **base))

    key = GenerationCache.key
    k = key("m", "p", base, 1)
    assert k == key("m", "p", dict(base), 1)
    keys = {k, key("m2", "p", base, 1), key("m", "p2", base, 1), key("m", "p", base, 2)}
    assert len(keys | {key("m", "p", dict(base, top_p=0.5), 1)}) == 5


def test_cache_does_not_mix_models_with_the_same_path(tiny_model, tmp_path):
    model, tokenizer = tiny_model
    e1 = Engine(model=model, tokenizer=tokenizer, cache_dir=tmp_path)
    t1 = e1.generate(["Hi"], [0], max_new_tokens=8, temperature=0)[0]
    torch.manual_seed(123)
    changed = type(model)(model.config).eval()  # other weights; name_or_path is still the tiny dir
    assert changed.name_or_path == model.name_or_path
    e2 = Engine(model=changed, tokenizer=tokenizer, cache_dir=tmp_path)
    fresh = Engine(model=changed, tokenizer=tokenizer).generate(
        ["Hi"], [0], max_new_tokens=8, temperature=0
    )[0]
    assert fresh.text != t1.text
    t2 = e2.generate(["Hi"], [0], max_new_tokens=8, temperature=0)[0]
    assert not t2.cached and t2.text == fresh.text
    # scored continuations too: the other weights' own log-probs, not the first model's
    first = e1.continuation_logprobs(["Hi"], ["Correct"])
    other = e2.continuation_logprobs(["Hi"], ["Correct"])
    assert e2.stats["cache_hits"] == 0 and not torch.equal(first, other)


def test_cache_keys_name_the_dtype_of_a_model_passed_in(tiny_model, tmp_path):
    model, tokenizer = tiny_model
    e32 = Engine(model=model, tokenizer=tokenizer, cache_dir=tmp_path)
    e32.generate(["Once upon a time"], [0], max_new_tokens=8, temperature=0.8)
    bf16 = type(model)(model.config).eval()
    bf16.load_state_dict(model.state_dict())
    e16 = Engine(model=bf16.to(torch.bfloat16), tokenizer=tokenizer, cache_dir=tmp_path)
    out = e16.generate(["Once upon a time"], [0], max_new_tokens=8, temperature=0.8)[0]
    assert not out.cached


# --------------------------------------------------------------------------------------------------
# next_token_logprobs (the critic's one forward pass)


@pytest.mark.parametrize("prefill_tokens", [None, 64])
def test_next_token_logprobs_match_a_plain_forward(tiny_engine, prefill_tokens):
    if not hasattr(tiny_engine, "next_token_logprobs"):
        pytest.skip("no next_token_logprobs in this version")
    set_prefill_chunk(tiny_engine, prefill_tokens)
    prompts = tiny_prompts(tiny_engine)
    token_ids = [2, 17, 1000, 40000]
    got = tiny_engine.next_token_logprobs(prompts, token_ids)
    assert got.shape == (len(prompts), len(token_ids))
    with torch.inference_mode():
        for row, prompt in enumerate(prompts):  # one prompt at a time: no padding at all
            logits = tiny_engine.model(torch.tensor([tiny_engine.encode(prompt)])).logits[0, -1]
            want = torch.log_softmax(logits.float(), -1)[token_ids]
            torch.testing.assert_close(got[row].float(), want, atol=1e-4, rtol=1e-4)


# --------------------------------------------------------------------------------------------------
# pick_next_tokens


def generators(seeds):
    return [torch.Generator().manual_seed(s) for s in seeds]


def test_pick_temperature_zero_is_argmax():
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0))
    assert torch.equal(pick_next_tokens(logits, generators(range(6)), 0, 1.0), logits.argmax(-1))
    assert torch.equal(pick_next_tokens(logits, generators(range(6)), 0.0, 0.3), logits.argmax(-1))


def test_pick_tiny_top_p_is_argmax():
    logits = torch.randn(8, 50, generator=torch.Generator().manual_seed(1))
    for seed in range(20):
        got = pick_next_tokens(logits, generators(range(seed * 8, seed * 8 + 8)), 1.5, 1e-6)
        assert torch.equal(got, logits.argmax(-1))


PROBS = torch.tensor([0.40, 0.25, 0.15, 0.10, 0.06, 0.04])


def draw(logits_row, n, temperature, top_p, seed=0):
    """n draws from one row: one generator per draw (a batch of n identical rows)."""
    logits = logits_row.expand(n, -1).clone()
    return pick_next_tokens(logits, generators(range(seed, seed + n)), temperature, top_p)


def chi_square(counts, probs):
    n = counts.sum().item()
    expected = probs * n
    return (((counts - expected) ** 2) / expected).sum().item()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_pick_frequencies_follow_softmax(temperature):
    logits = PROBS.log() * temperature  # softmax(logits / T) == PROBS
    n = 2000
    tokens = draw(logits, n, temperature, 1.0)
    counts = torch.bincount(tokens, minlength=len(PROBS)).double()
    assert chi_square(counts, PROBS.double()) < chi2.ppf(0.999, df=len(PROBS) - 1)
    # one generator drawing repeatedly (a row's successive steps) follows the same law
    g = generators([7])
    seq = torch.stack(
        [pick_next_tokens(logits[None], g, temperature, 1.0) for _ in range(n)]
    ).flatten()
    counts = torch.bincount(seq, minlength=len(PROBS)).double()
    assert chi_square(counts, PROBS.double()) < chi2.ppf(0.999, df=len(PROBS) - 1)


def test_pick_never_draws_outside_the_nucleus():
    # shuffle the vocabulary so that the nucleus is not simply the first ids
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    logits = torch.empty(6)
    logits[perm] = PROBS.log()
    # top_p 0.6: 0.40 (mass before 0) and 0.25 (mass
    # before 0.40 < 0.6) are kept; 0.15 has 0.65 before it
    tokens = draw(logits, 3000, 1.0, 0.6)
    assert set(tokens.tolist()) == {perm[0].item(), perm[1].item()}
    share = (tokens == perm[0]).double().mean().item()
    assert abs(share - 0.40 / 0.65) < 4 * math.sqrt(0.25 / 3000)
    # top_p 0.85: four tokens (the 5th has 0.90 >= 0.85 before it)
    tokens = draw(logits, 3000, 1.0, 0.85)
    assert set(tokens.tolist()) == set(perm[:4].tolist())


def test_pick_rows_are_independent():
    logits = torch.randn(5, 200, generator=torch.Generator().manual_seed(2))
    seeds = [10, 20, 30, 40, 50]
    batch = pick_next_tokens(logits, generators(seeds), 0.9, 0.8)
    alone = [
        pick_next_tokens(logits[i : i + 1], generators([seeds[i]]), 0.9, 0.8).item()
        for i in range(5)
    ]
    assert batch.tolist() == alone
    reordered = pick_next_tokens(logits[[4, 2, 0]], generators([50, 30, 10]), 0.9, 0.8)
    assert reordered.tolist() == [alone[4], alone[2], alone[0]]


@pytest.mark.parametrize("prefill_tokens", [None, 64])
def test_shared_prefix_matches_hf_generate(tiny_engine, prefill_tokens):
    """Prompts with a long common prefix (instructions + worked example): the prefix runs once and
    its keys/values are copied to every row ([prefix | padding | suffix]); the text is HF
    generate's."""
    set_prefill_chunk(tiny_engine, prefill_tokens)
    head = "Solve the problem. Show short steps. Example: 3 * 4 = 12. 12 - 2 = 10. Answer: 10\n" * 2
    prompts = [
        tiny_engine.chat(head + tail)
        for tail in (
            "Problem: 2 + 2?",
            "Problem: What is 17 * 3 - 5?",
            "Hi",
            "Problem: " + "one two " * 12,
        )
    ]
    ids = [tiny_engine.encode(p) for p in prompts]
    assert common_prefix_length(ids) > 40
    check_against_hf(tiny_engine, prompts, 24)
    tiny_engine.share_prefix = False
    try:
        unshared = tiny_engine.sample(ids, [0] * 4, max_new_tokens=24, temperature=0)
    finally:
        tiny_engine.share_prefix = True
    shared = tiny_engine.sample(ids, [0] * 4, max_new_tokens=24, temperature=0)
    assert [s.tokens for s in shared] == [s.tokens for s in unshared]


def test_common_prefix_length():
    assert common_prefix_length([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert common_prefix_length([[5], [6]]) == 0
    assert common_prefix_length([[1, 2], [1, 2]]) == 2


def test_padded_chunks_are_the_cheapest_split_within_the_budget():
    def cost(chunks, lengths, overhead):
        return sum((stop - start) * lengths[stop - 1] + overhead for start, stop in chunks)

    def every_split(n):  # every way to cut range(n) into consecutive chunks
        for mask in range(2 ** (n - 1)):
            cuts = [0] + [k + 1 for k in range(n - 1) if mask >> k & 1] + [n]
            yield list(zip(cuts, cuts[1:]))

    budget = 60

    def within_budget(chunks, lengths):  # a chunk over the budget only when it is a single row
        return all(
            (stop - start) * lengths[stop - 1] <= budget or stop - start == 1
            for start, stop in chunks
        )

    rng = torch.Generator().manual_seed(0)
    for trial in range(40):
        n, overhead = 1 + trial % 9, [0, 8, 64][trial % 3]
        lengths = sorted(torch.randint(1, 40, (n,), generator=rng).tolist())
        chunks = padded_chunks(lengths, budget, overhead)
        assert [k for start, stop in chunks for k in range(start, stop)] == list(range(n))
        assert within_budget(chunks, lengths)
        allowed = [s for s in every_split(n) if within_budget(s, lengths)]
        assert cost(chunks, lengths, overhead) == min(cost(s, lengths, overhead) for s in allowed)
    # short rows are not padded to the long ones that
    # follow them, and a row over the budget runs alone
    assert padded_chunks([10] * 4 + [50] * 4, 400, overhead=16) == [(0, 4), (4, 8)]
    assert padded_chunks([5, 500, 600], 100) == [(0, 1), (1, 2), (2, 3)]


def test_prefix_groups():
    template = list(range(100, 140))
    team_a = [template + [1] * 50 + [k] for k in range(3)]  # share 90 tokens
    team_b = [template + [2] * 50 + [k] for k in range(3)]
    groups = prefix_groups(team_a + team_b + [[7, 8]])
    assert groups == [(0, 3, 90), (3, 6, 90), (6, 7, 0)]
    assert prefix_groups([template + [1], template + [2]]) == [(0, 2, 40)]
    assert prefix_groups([[1] * 5 + [2], [1] * 5 + [3]]) == [(0, 2, 0)]  # too short to share


def test_grouped_prefixes_match_hf_generate(tiny_engine):
    """Two teams of refine-like prompts in one batch: two prefix groups, and HF generate's text."""
    head = "Problem: {}. Agent 1: 3 * 4 = 12. Agent 2: 12 - 2 = 10. Agent 3: 10 + 1 = 11. " * 2
    prompts = [
        tiny_engine.chat(head.replace("{}", q) + f"You are Agent {i}.")
        for q in ("apples", "pears")
        for i in (1, 2, 3)
    ]
    ids = sorted(tiny_engine.encode(p) for p in prompts)
    assert len([g for g in prefix_groups(ids) if g[2]]) == 2
    check_against_hf(tiny_engine, [tiny_engine.tokenizer.decode(x) for x in ids], 16)


# --------------------------------------------------------------------------------------------------
# continuous batching: a row's output never depends on its batch-mates or on when it joined the
# batch


def many_prompts(engine):
    """Twelve prompts: the tiny ones, plus two teams of three that share a long prefix."""
    head = "Problem: {}. Agent 1: 3 * 4 = 12. Agent 2: 12 - 2 = 10. Agent 3: 10 + 1 = 11. " * 2
    return tiny_prompts(engine)[:6] + [
        engine.chat(head.replace("{}", q) + f"You are Agent {i}.")
        for q in ("apples", "pears")
        for i in (1, 2, 3)
    ]


def stop_early(engine, prompts, max_new_tokens):
    """Declare EOS some tokens the greedy texts emit, so rows finish at many different steps."""
    engine.eos_ids = set()
    free = [
        s.tokens
        for s in engine.sample(
            [engine.encode(p) for p in prompts],
            [0] * len(prompts),
            max_new_tokens=max_new_tokens,
            temperature=0,
        )
    ]
    engine.eos_ids = {free[0][3], free[2][9], free[7][5]}
    return [cut_at_eos(row, engine.eos_ids) for row in free]


@pytest.mark.parametrize("batch_size", [2, 5])
def test_continuous_batching_greedy_matches_one_prompt_at_a_time(tiny_model, batch_size):
    """Few slots, many prompts: rows leave at different steps, the queue refills their slots, and
    the KV window slides back to the start of its buffer; each row is still what it is alone, and
    HF's."""
    model, tokenizer = tiny_model
    engine = Engine(model=model, tokenizer=tokenizer, batch_size=batch_size)
    prompts = many_prompts(engine)
    expected = stop_early(engine, prompts, 24)
    assert len({len(e) for e in expected}) >= 3
    got = engine.sample(
        [engine.encode(p) for p in prompts], list(range(12)), max_new_tokens=24, temperature=0
    )
    assert [s.tokens for s in got] == expected
    for i in (0, 2, 7, 11):
        alone = engine.sample([engine.encode(prompts[i])], [i], max_new_tokens=24, temperature=0)[0]
        assert alone.tokens == got[i].tokens, i
    assert hf_greedy(model, tokenizer, prompts, 24, engine.eos_ids) == expected


def test_continuous_batching_sampling_float64_matches_one_prompt_at_a_time(tiny_model):
    model, tokenizer = tiny_model
    model64 = type(model)(model.config).eval()
    model64.load_state_dict(model.state_dict())
    engine = Engine(model=model64.double(), tokenizer=tokenizer, batch_size=3)
    prompts = many_prompts(engine)
    # the random model's samples end at random steps
    engine.eos_ids = set(range(0, len(tokenizer), 9))
    ids, seeds = [engine.encode(p) for p in prompts], [100 + k for k in range(12)]
    for top_p in (1.0, 0.9):
        batch = engine.sample(ids, seeds, max_new_tokens=20, temperature=0.8, top_p=top_p)
        assert len({s.n_generated for s in batch}) >= 3
        for i in range(12):
            assert (
                engine.sample(
                    [ids[i]], [seeds[i]], max_new_tokens=20, temperature=0.8, top_p=top_p
                )[0]
                == batch[i]
            )


def test_sample_calls_on_finish_once_per_prompt(tiny_engine):
    seen = []
    ids = [tiny_engine.encode(p) for p in tiny_prompts(tiny_engine)]
    out = tiny_engine.sample(
        ids, [0] * 8, max_new_tokens=6, temperature=0.7, on_finish=lambda i, s: seen.append((i, s))
    )
    assert sorted(i for i, _ in seen) == list(range(8)) and all(out[i] == s for i, s in seen)


# --------------------------------------------------------------------------------------------------
# token log-probs (the generation's confidence)


def teacher_forced_logprobs(model, prompt_ids, completion_ids):
    with torch.inference_mode():
        logits = model(torch.tensor([prompt_ids + completion_ids])).logits[0].float()
    logprobs = torch.log_softmax(logits[len(prompt_ids) - 1 : -1], -1)
    return logprobs.gather(-1, torch.tensor(completion_ids)[:, None]).squeeze(-1)


@pytest.mark.parametrize("temperature", [0.0, 1.3])
def test_token_logprobs_match_a_teacher_forced_forward(tiny_model, temperature):
    """Untempered log p of each sampled token, the EOS included, whatever the sampling
    temperature."""
    model, tokenizer = tiny_model
    engine = Engine(model=model, tokenizer=tokenizer, batch_size=3)
    prompts = many_prompts(engine)
    stop_early(engine, prompts, 16)
    if temperature:  # the random model's samples end at random steps
        engine.eos_ids = set(range(0, len(tokenizer), 17))
    out = engine.generate(
        prompts,
        seeds=list(range(12)),
        max_new_tokens=16,
        temperature=temperature,
        return_tokens=True,
    )
    assert any(c.finish == "eos" for c in out) and any(c.finish == "length" for c in out)
    for prompt, c in zip(prompts, out):
        assert len(c.token_logprobs) == c.completion_tokens == len(c.token_ids)
        want = teacher_forced_logprobs(model, engine.encode(prompt), c.token_ids)
        torch.testing.assert_close(torch.tensor(c.token_logprobs), want, atol=1e-4, rtol=1e-4)


def test_cache_returns_the_logprobs_it_stored_and_old_entries_are_misses(tiny_model_dir, tmp_path):
    engine = Engine(model_path=tiny_model_dir, cache_dir=tmp_path)
    prompts = tiny_prompts(engine)[:4]
    first = engine.generate(prompts, seeds=[1, 2, 3, 4], **SAMPLING)
    assert all(len(c.token_logprobs) == c.completion_tokens for c in first)
    again = Engine(model_path=tiny_model_dir, cache_dir=tmp_path)
    second = again.generate(prompts, seeds=[1, 2, 3, 4], **SAMPLING)
    assert all(c.cached for c in second) and again.stats["calls"] == 0
    assert [c.token_logprobs for c in second] == [c.token_logprobs for c in first]
    # an entry from before the engine kept log-probs is recomputed, never returned without them,
    # and replaced
    (tmp_path / "old").mkdir()
    engine.cache = JsonlCache(tmp_path / "old" / "gen-rank0.jsonl", logprobs=False)
    engine.generate(prompts, seeds=[1, 2, 3, 4], **SAMPLING)
    old = Engine(model_path=tiny_model_dir, cache_dir=tmp_path / "old")
    third = old.generate(prompts, seeds=[1, 2, 3, 4], **SAMPLING)
    assert not any(c.cached for c in third) and old.stats["calls"] == 4
    assert [c.token_logprobs for c in third] == [c.token_logprobs for c in first]
    fourth = Engine(model_path=tiny_model_dir, cache_dir=tmp_path / "old")
    assert all(c.cached for c in fourth.generate(prompts, seeds=[1, 2, 3, 4], **SAMPLING))


# --------------------------------------------------------------------------------------------------
# continuation_logprobs (a verdict scored by its whole token sequence)


@pytest.mark.parametrize("prefill_tokens", [None, 64])
def test_continuation_logprobs_match_a_plain_forward(tiny_engine, prefill_tokens):
    set_prefill_chunk(tiny_engine, prefill_tokens)
    prompts = many_prompts(tiny_engine)
    continuations = ["Correct", "Incorrect", [17], [17, 40000, 5]]
    got = tiny_engine.continuation_logprobs(prompts, continuations)
    assert got.shape == (12, 4)
    assert len(tiny_engine.encode("Incorrect")) == 2  # the case this method exists for
    for row, prompt in enumerate(prompts):
        ids = tiny_engine.encode(prompt)
        for col, c in enumerate(continuations):
            c = tiny_engine.encode(c) if isinstance(c, str) else c
            want = teacher_forced_logprobs(tiny_engine.model, ids, c).sum()
            torch.testing.assert_close(got[row, col], want, atol=1e-4, rtol=1e-4)
    # one-token continuations are next_token_logprobs
    torch.testing.assert_close(tiny_engine.next_token_logprobs(prompts, [17]), got[:, 2:3])


def test_continuation_logprobs_are_cached_and_counted(tiny_model_dir, tmp_path):
    engine = Engine(model_path=tiny_model_dir, cache_dir=tmp_path)
    prompts = tiny_prompts(engine)[:3]
    first = engine.continuation_logprobs(prompts, ["Correct", "Incorrect"])
    assert engine.stats["calls"] == 3 and engine.stats["prompt_tokens"] == sum(
        len(engine.encode(p)) for p in prompts
    )
    again = Engine(model_path=tiny_model_dir, cache_dir=tmp_path)
    assert torch.equal(again.continuation_logprobs(prompts, ["Correct", "Incorrect"]), first)
    assert again.stats["calls"] == 0 and again.stats["cache_hits"] == 3
    again.continuation_logprobs(prompts, ["Correct", "Wrong"])  # other continuations: other keys
    assert again.stats["calls"] == 3
    with pytest.raises(ValueError, match="^an empty continuation has no log-probability to score$"):
        engine.continuation_logprobs(prompts, ["Correct", []])


def test_pick_temperature_zero_breaks_ties_to_the_first_index_like_argmax():
    """bf16 logits tie often (8 bits of mantissa): greedy must still take argmax's token, the first
    of the equal maxima, in float32 and bfloat16."""
    logits = torch.randn(5, 300, generator=torch.Generator().manual_seed(3))
    for row, (first, second) in enumerate([(7, 250), (0, 299), (100, 101), (42, 43), (5, 6)]):
        logits[row, first] = logits[row, second] = logits[row].max() + 1
    for dtype in (torch.float32, torch.bfloat16):
        got = pick_next_tokens(logits.to(dtype), generators(range(5)), 0, 1.0)
        assert got.tolist() == [7, 0, 100, 42, 5] == logits.argmax(-1).tolist()


def test_bf16_engine_greedy_against_hf_generate_in_bf16_and_fp32(tiny_model_dir):
    """The bf16 engine's greedy rows against HF generate in bf16 (the same model object) and in
    fp32. Exact identity is not promised across kernels (attention over another padding width
    rounds differently), so this pins a floor on the share of identical rows, and the engine's own
    dtype and log-probs: taken in fp32 from the bf16 logits, within 0.02 of fp32's on the same
    tokens (a bf16 log-softmax would be off by up to its spacing, 0.06 at -10)."""
    bf16 = Engine(model_path=tiny_model_dir, dtype="bfloat16")
    fp32 = Engine(model_path=tiny_model_dir, dtype="float32")
    assert bf16.model.dtype == torch.bfloat16 and bf16.dtype == "bfloat16"
    prompts = tiny_prompts(bf16)
    ids = [bf16.encode(p) for p in prompts]
    got = bf16.sample(ids, [0] * len(ids), max_new_tokens=16, temperature=0, keep_eos=True)
    same_bf16 = hf_greedy(bf16.model, bf16.tokenizer, prompts, 16, bf16.eos_ids)
    same_fp32 = hf_greedy(fp32.model, fp32.tokenizer, prompts, 16, fp32.eos_ids)
    rows = [s.tokens for s in got]
    assert sum(a == b for a, b in zip(rows, same_bf16)) >= len(prompts) - 2
    assert sum(a == b for a, b in zip(rows, same_fp32)) >= len(prompts) // 2
    # the log-probs of the bf16 engine's own tokens, against fp32's teacher-forced ones
    for prompt_ids, sample in zip(ids, got):
        full = torch.tensor([prompt_ids + sample.tokens])
        with torch.inference_mode():
            logp = torch.log_softmax(fp32.model(full).logits[0].float(), -1)
        want = logp[len(prompt_ids) - 1 : -1].gather(-1, full[0, len(prompt_ids) :, None])[:, 0]
        assert all(math.isfinite(x) for x in sample.logprobs)
        torch.testing.assert_close(torch.tensor(sample.logprobs), want, atol=0.02, rtol=0)
