"""The LLM machinery: model loading (backbone), the KV-cache sampler (engine, with prefill, cache
and kvcache), completion log-probs (logprobs), LoRA adapters (lora), teams of engines and the engine
of a script's flags (team), and what the LLM-weight trainers share (training: the trained weights,
the policy-gradient step, resume). Nothing here knows the deliberation game."""
