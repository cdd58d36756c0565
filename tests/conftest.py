"""Shared pytest fixtures: the repo root on sys.path, a tiny random model, and the default backbone.

Fixtures (all generic, for any test file):
  default_model_dir   the converted default backbone (backbone.default_model_path(); converts once
                      if absent)
  tiny_model_dir      a 2-layer random Llama with the default tokenizer, saved with save_pretrained,
                      so that `Engine(model_path=dir)` and `load_model(dir)` work on it (loads in
                      well under a second)
  tiny_model          (model, tokenizer) loaded once from tiny_model_dir; build per-test engines
                      with `Engine(model=..., tokenizer=...)` instead of reloading
  default_engine      Engine() on the default backbone in float32, loaded once per session. Shared:
                      a test that changes its attributes (eos_ids, batch_size, ...) must put them
                      back.

Nothing here downloads: HF_HUB_OFFLINE is set before transformers is imported.

torch runs single-threaded in tests (MPDF_TEST_THREADS=n to change it): the models here are small,
and on a small machine shared with another busy process, two OpenMP threads spin-waiting on each
other made the engine tests about ten times slower.

MPDF_TEST_BF16_SPEED=r runs the suite as on a CPU whose bf16 matmuls run r times as fast as fp32
(0.167: an AVX2-only EPYC; 3: native bf16), in pytest and in every process a test starts
(tests/simulated_cpu/sitecustomize.py); a test that plants a probe of its own asks for `real_probe`.
"""

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repo root, wherever pytest runs from
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
TEST_THREADS = int(os.environ.get("MPDF_TEST_THREADS", "1"))
os.environ["OMP_NUM_THREADS"] = str(TEST_THREADS)  # for subprocesses that tests start

import torch  # noqa: E402

torch.set_num_threads(TEST_THREADS)

# under MPDF_TEST_BF16_SPEED the simulated CPU, here and (on PYTHONPATH) in every subprocess
if os.environ.get("MPDF_TEST_BF16_SPEED"):
    _simulated = ROOT / "tests" / "simulated_cpu"
    _spec = importlib.util.spec_from_file_location("simulated_cpu", _simulated / "sitecustomize.py")
    _spec.loader.exec_module(importlib.util.module_from_spec(_spec))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(_simulated), os.environ.get("PYTHONPATH")])
    )


def subprocess_env(**variables):
    """This process's environment for a subprocess, `variables` set and the repository's root first
    on PYTHONPATH (for `python -m experiments.X` from any folder)."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path, **variables)


def lab_command(module, *args):
    """(argv, env) that run a module of experiments/ as users do, `python -m experiments.MODULE`,
    from any working directory (the repository's root on PYTHONPATH in place of the current
    directory)."""
    return [sys.executable, "-m", f"experiments.{module}", *map(str, args)], subprocess_env()


TINY_CONFIG = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    max_position_embeddings=1024,
    tie_word_embeddings=False,
)


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "slow: loads or runs the real default backbone (seconds); still runs by default, after "
        "the other tests",
    )
    config.addinivalue_line(
        "markers", "xdist_group(name): under pytest-xdist, the tests of one group share a worker"
    )


def pytest_collection_modifyitems(config, items):
    """Tests marked `slow` run after all the others (each group keeps its order): quick failures
    show first, and the subprocesses test_backbone.py starts in the background get the quick tests'
    time to finish. Under pytest-xdist (`make test`: two workers) they run first instead: the
    longest tests start while the other worker takes the quick ones, and the run ends sooner."""
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    quick = [item for item in items if item.get_closest_marker("slow") is None]
    workers = getattr(config.option, "numprocesses", None)
    items[:] = slow + quick if workers else quick + slow


@pytest.fixture(scope="session")
def default_model_dir():
    from llm import backbone

    return backbone.default_model_path()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, default_model_dir):
    """A random 2-layer LlamaForCausalLM (hidden 64, 4 heads, 2 KV heads) over the default
    tokenizer's vocab."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(default_model_dir)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **TINY_CONFIG,
    )
    model = LlamaForCausalLM(config).eval()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    out = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir):
    from llm import backbone

    return backbone.load_model(tiny_model_dir)


@pytest.fixture(scope="session")
def default_engine(default_model_dir):
    from llm.engine import Engine

    return Engine(model_path=default_model_dir, dtype="float32")


@pytest.fixture
def real_probe(monkeypatch):
    """The dtype probe of this CPU (llm/backbone.py), where MPDF_TEST_BF16_SPEED simulates another:
    for tests that plant clocks or a probe of their own."""
    from llm import backbone

    real = getattr(backbone.probe_matmuls, "real", None)
    if real is not None:
        monkeypatch.setattr(backbone, "PROBE_FILE", backbone.probe_matmuls.real_file)
        monkeypatch.setattr(backbone, "probe_matmuls", real)
