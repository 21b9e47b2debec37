"""Tiny model and tokenizer factories for tests and examples (shipped, so users can reproduce bugs).

Everything here is built locally in a second: a byte-level BPE tokenizer trained with `tokenizers`
on a small text, and random-weight transformers checkpoints (Llama, Qwen2, Qwen3, Mistral, Phi-3,
Gemma-3 text) saved as safetensors. Nothing is downloaded.
"""

from __future__ import annotations

import os
from pathlib import Path

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_CORPUS = """The quick brown fox jumps over the lazy dog. A radix tree shares every common prefix.
Paris is the capital of France. Berlin is the capital of Germany. Rome is the capital of Italy.
Question: What is two plus two? Answer: four. Question: What color is the sky? Answer: blue.
{"name": "Alice", "age": 30, "tags": ["a", "b"], "ok": true, "score": 1.5, "city": null}
def main():\n    print("hello world")\n    return 0\n
1234567890 2024-01-31 192.168.0.1 alice@example.com +1-555-0100 yes no maybe
Once upon a time there was a small language model that loved to answer questions politely.
"""


def build_tokenizer(out_dir: str | os.PathLike, vocab_size: int = 384):
    """Train a byte-level BPE tokenizer and save it (with a ChatML template) as a HF fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(str(out_dir))
    return fast


def _config(arch: str, vocab_size: int, eos_id: int, bos_id: int, **overrides):
    import transformers

    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
    )
    common.update(_ARCH_DEFAULTS.get(arch, {}))
    common.update(overrides)
    cls = {
        "llama": transformers.LlamaConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
        "mistral": transformers.MistralConfig,
        "phi3": transformers.Phi3Config,
        "gemma3": transformers.Gemma3TextConfig,
    }[arch]
    if arch in ("qwen3", "gemma3"):
        common.setdefault("head_dim", common["hidden_size"] // common["num_attention_heads"])
    return cls(**common)


# What the tiny checkpoints of these architectures set beyond the common sizes: Gemma-3's attention scale
# differs from head_dim ** -0.5, its sliding layers have their own rotary base and both layer types occur.
_ARCH_DEFAULTS: dict[str, dict] = {
    "phi3": {"pad_token_id": None},
    "gemma3": {"query_pre_attn_scalar": 24, "rope_local_base_freq": 100.0, "sliding_window": 128,
               "layer_types": ["sliding_attention", "full_attention"], "tie_word_embeddings": True},
}
# Architectures whose tiny checkpoints get random norm weights too (Gemma's scale by 1 + weight would
# otherwise go untested; the older architectures keep their checkpoints as they were).
_RANDOM_NORM_ARCHS = ("phi3", "gemma3")
# Gemma multiplies the embeddings by sqrt(hidden_size): at std 1 they would drown every layer's output
# and each step would repeat the token whose (tied) embedding is nearest.
_EMBED_STD = {"gemma3": 0.03}


def build_tiny_model(out_dir: str | os.PathLike, arch: str = "llama", seed: int = 0, **config_overrides) -> Path:
    """Save a random-weight checkpoint of `arch` plus the tiny tokenizer into out_dir; return the path.

    Weights are scaled up from transformers' tiny init so greedy argmaxes are well separated and
    parity tests compare real decisions, not float noise between near-tied logits.
    """
    import torch
    import transformers

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out)
    config = _config(arch, len(tok), tok.eos_token_id, tok.bos_token_id, **config_overrides)
    torch.manual_seed(seed)
    model_cls = {
        "llama": transformers.LlamaForCausalLM,
        "qwen2": transformers.Qwen2ForCausalLM,
        "qwen3": transformers.Qwen3ForCausalLM,
        "mistral": transformers.MistralForCausalLM,
        "phi3": transformers.Phi3ForCausalLM,
        "gemma3": transformers.Gemma3ForCausalLM,
    }[arch]
    model = model_cls(config).to(torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.08 if "embed" not in name else _EMBED_STD.get(arch, 1.0))
            elif "bias" in name:
                p.normal_(0.0, 0.05)
            elif "norm" in name and arch in _RANDOM_NORM_ARCHS:
                p.add_(torch.randn_like(p), alpha=0.2)  # around their init (1, Gemma's 0)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(str(out), safe_serialization=True)
    return out


def hf_last_token_embeddings(model_dir: str | os.PathLike, prompts: list[list[int]]) -> list[list[float]]:
    """The embeddings reference: transformers (fp32, one prompt at a time), the last token's final hidden state
    (hidden_states[-1], after the final norm: the LM head applied to it gives the logits), L2-normalized."""
    import torch
    import torch.nn.functional as F
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    head = model.get_output_embeddings()
    outs = []
    with torch.no_grad():
        for ids in prompts:
            res = model(torch.tensor([ids]), output_hidden_states=True)
            last = res.hidden_states[-1][0, -1]
            assert torch.allclose(head(last), res.logits[0, -1], atol=1e-4), "hidden_states[-1] is not the normed state"
            outs.append(F.normalize(last, dim=-1).tolist())
    return outs


def hf_greedy_ids(model_dir: str | os.PathLike, prompts: list[str], max_new_tokens: int) -> list[list[int]]:
    """The reference: transformers `generate` (greedy, fp32, one prompt at a time) -> new token ids."""
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    outs = []
    for prompt in prompts:
        ids = tok(prompt, return_tensors="pt").input_ids
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False, pad_token_id=tok.pad_token_id)
        outs.append(gen[0, ids.shape[1]:].tolist())
    return outs
