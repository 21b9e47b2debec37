"""Embeddings from the causal LM: last-token pooling, L2-normalized (what SGLang and vLLM serve for decoder-only
embedding models). Runs in the scheduler process, on the hidden states the model kept (CausalLM.forward's
keep_hidden: after the final norm).

A vector crosses processes as little-endian float32 bytes (4 bytes a dimension, OpenAI's base64 payload
decoded), not as a msgpack float list (9 bytes a dimension).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def pool_last_token(hidden: torch.Tensor) -> list[bytes]:
    """hidden [N, H]: each row a request's last prompt token after the final norm -> N unit vectors, in fp32."""
    unit = F.normalize(hidden.float(), p=2.0, dim=-1)  # a zero row stays zero (eps), never NaN
    rows = unit.cpu().numpy().astype("<f4", copy=False)
    return [row.tobytes() for row in rows]
