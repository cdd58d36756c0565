"""The model families the field uses, each as a tiny random model of its own architecture over the
default tokenizer: the engine's greedy tokens equal HF generate's (eager and static decode), its
completion log-probs equal those of HF's own forward of each sequence alone, an adapter trained by
one MAGRPO step (llm_step.policy_step) is read back by PEFT to the same logits; and an architecture
the engine cannot run (an encoder-decoder, a vision-language model) is refused in one line naming
the model."""

import copy
import json

import pytest
import torch
import transformers
from conftest import TINY_CONFIG
from engine.test_engine import check_against_hf
from handmade import magrpo_step
from peft import PeftModel

import train_magrpo
from common import UsageError
from llm import lora
from llm.engine import Engine
from llm.logprobs import completion_batch, completion_logprobs
from llm.team import check_model
from llm_step import Sequence

# family -> (its config class, its causal-LM class, what its tiny config sets beyond TINY_CONFIG)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"head_dim": 16}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"head_dim": 16, "sliding_window": 8}),
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {"head_dim": 16, "sliding_window": 8, "sliding_window_pattern": 2},
    ),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 8}),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),
    "granite": ("GraniteConfig", "GraniteForCausalLM", {}),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", {}),
}
PROMPTS = ["Hi", "Once upon a time there was", "word " * 12]


def tiny(family, tokenizer):
    config_class, model_class, extra = FAMILIES[family]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **TINY_CONFIG,
        **extra,
    )
    return getattr(transformers, model_class)(config).eval()


@pytest.mark.parametrize("family", FAMILIES)
def test_the_engine_equals_hf_on_each_family(family, tiny_model):
    """Greedy tokens token for token, eager and static decode; the completion log-probs of a
    padded batch equal HF's forward of each sequence alone."""
    tokenizer = tiny_model[1]
    model = tiny(family, tokenizer)
    for decode in ("eager", "static"):
        engine = Engine(model=model, tokenizer=tokenizer, decode=decode)
        check_against_hf(engine, [engine.chat(p) for p in PROMPTS], 12)
    pairs = [([5, 6, 7, 30], [8, 9]), ([5], [10, 11, 12, 13]), ([40, 41], [42])]
    with torch.no_grad():
        logp, mask = completion_logprobs(model, completion_batch(pairs, 0, "cpu"))
        for b, (prompt, completion) in enumerate(pairs):
            logits = model(input_ids=torch.tensor([prompt + completion])).logits[0].float()
            alone = torch.log_softmax(logits[:-1], -1)[-len(completion) :]
            expected = alone.gather(-1, torch.tensor(completion)[:, None])[:, 0]
            torch.testing.assert_close(logp[b, : len(completion)], expected, rtol=1e-4, atol=1e-5)
            assert mask[b].sum() == len(completion)


class Keep:
    """An optimizer that steps by plain SGD at lr 0.5 (the adapter moves far enough to tell)."""

    def __init__(self, parameters):
        self.sgd = torch.optim.SGD(parameters, lr=0.5)

    def step(self):
        self.sgd.step()

    def zero_grad(self, set_to_none=True):
        self.sgd.zero_grad(set_to_none=set_to_none)


@pytest.mark.parametrize("family", FAMILIES)
def test_an_adapter_trained_by_one_magrpo_step_reads_back_in_peft(family, tiny_model, tmp_path):
    """One MAGRPO step (two rollouts of one question, advantages +1 and -1) on a rank-2 adapter
    over every linear layer of the family's model moves it off the base; written as a PEFT folder,
    PEFT's LoRA over the same base gives the engine's logits."""
    tokenizer, pad = tiny_model[1], tiny_model[1].pad_token_id
    base = tiny(family, tokenizer)
    model = lora.add_lora(copy.deepcopy(base), 2, 4.0, 1, 0)
    sequences = [Sequence(0, k, 0, [5, 6, 7], [8 + k, 9, 10 + k]) for k in range(2)]
    parameters = lora.adapter_parameters(model, 0)
    cfg = train_magrpo.Config(micro_batch=2, max_new_tokens=8)
    advantages = torch.tensor([[1.0, -1.0]])
    stats = magrpo_step([model.train()], Keep(parameters), sequences, advantages, cfg, pad)
    assert stats["grad_norm"] > 0 and stats["trained"] == 2
    folder = lora.write_peft(lora.adapter_state(model, 0, family), tmp_path / "adapter")
    peft = PeftModel.from_pretrained(copy.deepcopy(base), folder).eval()
    ids = torch.tensor([[1, 5, 9, 200, 31, 7]])
    with torch.no_grad(), lora.selecting(model.eval(), 0):
        ours = model(input_ids=ids).logits
        theirs = peft(input_ids=ids).logits
        assert not torch.allclose(ours, base(input_ids=ids).logits, atol=1e-4)
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-5)


def saved_config(tmp_path, name, settings):
    """A model directory holding a config.json and the tokenizer files check_model looks for."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(settings))
    (folder / "tokenizer.json").write_text("{}")
    return str(folder)


def test_an_architecture_the_engine_cannot_run_is_refused_in_one_line(tmp_path):
    t5 = transformers.T5Config(d_model=32, num_layers=1, num_heads=2, d_ff=64).to_dict()
    t5 |= {"architectures": ["T5ForConditionalGeneration"]}
    llava = transformers.LlavaConfig().to_dict() | {
        "architectures": ["LlavaForConditionalGeneration"]
    }
    for name, settings, kind in (
        ("t5", t5, "an encoder-decoder model"),
        ("llava", llava, "a vision-language model"),
    ):
        path = saved_config(tmp_path, name, settings)
        with pytest.raises(UsageError) as refused:
            check_model("--model", path, 64)
        arch = settings["architectures"][0]
        assert str(refused.value) == (
            f"--model {path!r}: {arch} is {kind}; the engine runs decoder-only causal LMs of text"
        )
