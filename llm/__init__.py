"""The LLM machinery: model loading (backbone), the KV-cache sampler (engine, with prefill, cache
and kvcache) and completion log-probs (logprobs). Nothing here knows the deliberation game."""
