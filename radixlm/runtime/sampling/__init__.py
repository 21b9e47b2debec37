"""radixlm.runtime.sampling: logits -> next tokens (sampler, penalties, logprobs); used by the scheduler's output side."""
