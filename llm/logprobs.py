"""An LLM's log-probs of its own completions: what the LLM-weight losses (llm/training.py) train
on."""

import torch


def completion_batch(sequences, pad_id, device):
    """(input_ids, attention_mask, loss_mask) from (prompt_ids, completion_ids) pairs: prompts
    left-padded to the longest prompt, completions right-padded after them, so every completion
    starts at the same column and the LM head only has to run on the last columns (token_logprobs).
    loss_mask is 1 exactly on the completion tokens, never on the prompt or the padding."""
    prompt_width = max(len(p) for p, _ in sequences)
    width = prompt_width + max(len(c) for _, c in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention = torch.zeros(len(sequences), width, dtype=torch.long)
    loss_mask = torch.zeros(len(sequences), width, dtype=torch.long)
    for b, (p, c) in enumerate(sequences):
        start, end = prompt_width - len(p), prompt_width + len(c)
        ids[b, start:end] = torch.tensor(p + c)
        attention[b, start:end] = 1
        loss_mask[b, prompt_width:end] = 1
    return ids.to(device), attention.to(device), loss_mask.to(device)


def token_logprobs(model, ids, attention, temperature=1.0, last=None):
    """log p(ids[:, t] | ids[:, :t]) of the `last` final columns (default: every t >= 1), aligned
    with ids[:, -last:], under `temperature`: a policy gradient must score the tokens with the
    distribution they were sampled from. The LM head and the softmax run on those columns only
    (the vocabulary is most of the memory), and position ids skip the left padding, as in
    generation."""
    last = last or ids.shape[1] - 1
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    out = model(
        input_ids=ids, attention_mask=attention, position_ids=positions, logits_to_keep=last + 1
    )
    logits = out.logits[:, :-1].float() / temperature
    return logits.gather(-1, ids[:, -last:, None])[..., 0] - torch.logsumexp(logits, -1)


def completion_logprobs(model, batch, temperature=1.0):
    """(log-probs, loss mask) over the completion columns of a completion_batch."""
    ids, attention, loss_mask = batch
    last = ids.shape[1] - int(loss_mask.any(0).nonzero()[0])
    return token_logprobs(model, ids, attention, temperature, last), loss_mask[:, -last:]


def without_dropout(model):
    """The model with every dropout off, whatever its mode: a policy gradient must score the sampled
    tokens with the distribution that drew them (the sampler runs in eval mode), and train mode
    otherwise turns dropout on in families that have it (GPT-2: up to 0.19 nats apart). Train mode
    stays, for gradient checkpointing."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for name in ("attention_dropout", "attn_dropout", "dropout", "resid_dropout"):
            if isinstance(getattr(module, name, None), float):
                setattr(module, name, 0.0)
    return model
