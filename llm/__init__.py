"""The LLM machinery: model loading (backbone), the KV-cache sampler (engine, with prefill, cache
and kvcache), completion log-probs (logprobs), LoRA adapters (lora), teams of engines and the engine
of a script's flags (team). Only rollouts.py, the episodes train_llm.py learns from, knows the
deliberation game."""
