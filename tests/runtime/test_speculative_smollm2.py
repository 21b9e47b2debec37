"""Speculative decoding on the real default model (SmolLM2-135M-Instruct): greedy outputs token-identical
with NGRAM on and off on prompts whose answers copy from the prompt, and the model drafting for itself
(STANDALONE) accepts every draft: a check of the draft's KV pool and rollback, not a speed claim."""

from __future__ import annotations

import pytest
import transformers

from radixlm.runtime.engine import Engine

FEW_SHOT = ('Record: Full name: Bob Stone. Email: bob.3@example.com. City: Leeds. Account: ACC-1111.\n'
            'JSON: {"name": "Bob Stone", "email": "bob.3@example.com", "city": "Leeds", "account": "ACC-1111"}\n'
            'Record: Full name: Alice Johnson. Email: alice.7@example.com. City: Lisbon. Account: ACC-1259.\nJSON:')
CHAT = ("Here is a sentence: the quick brown fox jumps over the lazy dog near the old river bank. "
        "Repeat the sentence exactly.")
PARAMS = {"max_new_tokens": 40, "temperature": 0}


@pytest.fixture(scope="module")
def setup():
    from radixlm.runtime.model.loader import resolve_model_path

    model_dir = resolve_model_path(None)
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    prompts = [FEW_SHOT, tok.apply_chat_template([{"role": "user", "content": CHAT}], tokenize=False,
                                                 add_generation_prompt=True)]
    with Engine(str(model_dir)) as eng:
        want = [r["output_ids"] for r in eng.generate(prompts, PARAMS)]
    return model_dir, prompts, want


def test_ngram_greedy_identical_and_accepts_copied_text(setup):
    model_dir, prompts, want = setup
    with Engine(str(model_dir), speculative_algorithm="NGRAM") as eng:
        out = eng.generate(prompts, PARAMS)
        assert [r["output_ids"] for r in out] == want
        assert out[0]["meta_info"]["spec_accepted_tokens"] >= 10  # the JSON values are copied from the record
        eng.check_integrity()


def test_smollm2_drafting_for_itself_accepts_everything(setup):
    model_dir, prompts, want = setup
    with Engine(str(model_dir), speculative_algorithm="STANDALONE", speculative_draft_model_path=str(model_dir),
                max_total_tokens=4096) as eng:
        out = eng.generate(prompts, PARAMS)
        assert [r["output_ids"] for r in out] == want
        stats = eng.scheduler.spec.stats
        # Draft and target compute the same model with different row shapes: rare near-ties may differ.
        assert stats.num_accepted >= 0.9 * stats.num_proposed > 0
        eng.check_integrity()
