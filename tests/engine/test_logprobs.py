"""llm/logprobs.py against its reference, the model's own forward and log-softmax on each sequence
alone, on tiny random models of two families: Llama's rotary positions (the default backbone's)
and GPT-2's learned absolute ones, whose logits change with any shift of the position ids; the
batch's tensors; dropout off in train mode."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from llm.logprobs import completion_batch, completion_logprobs, token_logprobs, without_dropout

# (prompt, completion) pairs of different lengths on both sides
SEQUENCES = [([5, 6, 7, 30], [8, 9]), ([5], [10, 11, 12, 13]), ([40, 41], [42])]


def gpt2(dropout=0.0):
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=2,
        vocab_size=50,
        n_positions=64,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
    )
    return GPT2LMHeadModel(config).eval()


def model_of(family, tiny_model):
    return tiny_model[0] if family == "llama" else gpt2()


def reference_logprobs(model, ids, temperature=1.0):
    """log p(ids[t] | ids[:t]) for t >= 1 from the model's forward on the sequence alone."""
    ids = torch.tensor([ids])
    logits = model(input_ids=ids).logits[0, :-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_completion_logprobs_are_each_sequences_own(tiny_model, family):
    """Left-padded prompts, right-padded completions: each completion's log-probs are those of its
    sequence alone (position ids skipping the padding), at the temperature asked (1 by default)."""
    model = model_of(family, tiny_model)
    batch = completion_batch(SEQUENCES, 0, "cpu")
    with torch.no_grad():
        for temperature, (logp, mask) in (
            (1.0, completion_logprobs(model, batch)),
            (0.7, completion_logprobs(model, batch, 0.7)),
        ):
            for b, (p, c) in enumerate(SEQUENCES):
                alone = reference_logprobs(model, p + c, temperature)[-len(c) :]
                torch.testing.assert_close(logp[b, : len(c)], alone, rtol=1e-4, atol=1e-5)
                assert mask[b].tolist() == [1] * len(c) + [0] * (mask.shape[1] - len(c))


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_token_logprobs_default_to_every_column_at_temperature_one(tiny_model, family):
    model = model_of(family, tiny_model)
    ids = [5, 6, 7, 30, 8, 9]
    with torch.no_grad():
        logp = token_logprobs(model, torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))
        torch.testing.assert_close(logp[0], reference_logprobs(model, ids), rtol=1e-4, atol=1e-5)


def test_completion_batch_builds_long_tensors_on_the_device():
    batch = completion_batch(SEQUENCES, 0, "meta")
    assert [(t.device.type, t.dtype) for t in batch] == [("meta", torch.long)] * 3
    # every completion starts at column 4 (the longest prompt)
    ids, attention, loss_mask = completion_batch(SEQUENCES, 0, "cpu")
    assert loss_mask.sum(1).tolist() == [2, 4, 1] and loss_mask[:, :4].sum() == 0
    assert ids.dtype == attention.dtype == loss_mask.dtype == torch.long


def test_llm_training_scores_tokens_without_dropout():
    """A GPT-2-family model has dropout: in train mode its log-probs are noisy unless it is off."""
    model = gpt2(dropout=0.5)
    ids = torch.randint(0, 50, (2, 12))
    ones = torch.ones_like(ids)
    with torch.no_grad():
        reference = token_logprobs(model.eval(), ids, ones)
        noisy = token_logprobs(model.train(), ids, ones)
        clean = token_logprobs(without_dropout(model.train()), ids, ones)
    assert (noisy - reference).abs().max() > 1e-3 and model.training
    torch.testing.assert_close(clean, reference)


NAMES = ("attention_dropout", "attn_dropout", "dropout", "resid_dropout")


def test_without_dropout_zeroes_every_dropout_module_and_rate():
    """Dropout modules get p = 0; the float rates attention classes pass to their kernels, under
    each name the families use, become 0.0; an attribute of such a name that is not a float (a
    module, a flag) is left as it is; train mode stays."""

    class Attention(torch.nn.Module):
        def __init__(self, value):
            super().__init__()
            for name in NAMES:
                setattr(self, name, value)

    rates, others = Attention(0.25), Attention(True)
    model = torch.nn.ModuleList([torch.nn.Dropout(0.5), rates, others]).train()
    assert without_dropout(model) is model and model.training
    assert model[0].p == 0.0 and type(model[0].p) is float
    assert all(type(getattr(rates, n)) is float and getattr(rates, n) == 0.0 for n in NAMES)
    assert all(getattr(others, n) is True for n in NAMES)
