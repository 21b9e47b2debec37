"""Chat templates: reduction of jinja templates checked against transformers' own rendering."""

from __future__ import annotations

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

import radixlm as sgl
from radixlm.lang.chat_template import (TemplateReductionError, get_chat_template, get_chat_template_by_model_path,
                                        resolve_chat_template, template_from_jinja)
from radixlm.testing import CHATML_TEMPLATE

QWEN_LIKE = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are Qwen, a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}{%- if not (message.role == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
NO_SYSTEM = (
    "{% for message in messages %}{% if message['role'] == 'system' %}{{ raise_exception('no system') }}{% endif %}"
    "{{ '<turn>' + message['role'] + ': ' + message['content'] + '</turn>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<turn>assistant: ' }}{% endif %}"
)
CONVERSATION = [("user", "What is 2+2?"), ("assistant", "4"), ("user", "And 3+3?"), ("assistant", "6")]


def _reference(template: str, messages: list[dict[str, str]], **special: str) -> str:
    special = {"bos_token": "", "eos_token": "", **special}
    return render_jinja_template([messages], chat_template=template, **special)[0][0]


def _run_conversation(backend, system: str | None) -> tuple[str, list[dict[str, str]]]:
    """Build the conversation with the interpreter (the way programs do) and return text + messages."""
    @sgl.function
    def prog(s):
        if system is not None:
            s += sgl.system(system)
        for role, content in CONVERSATION:
            s += sgl.user(content) if role == "user" else sgl.assistant(content)

    state = prog.run(backend=backend)
    return state.text(), state.messages()


@pytest.mark.parametrize("template, special", [
    (CHATML_TEMPLATE, {}), (QWEN_LIKE, {}), (LLAMA3, {"bos_token": "<|begin_of_text|>"}), (LLAMA3, {}),
])
@pytest.mark.parametrize("system", [None, "Be terse."])
def test_reduced_template_matches_jinja_rendering(scripted, template, special, system):
    reduced = template_from_jinja(template, **special)
    text, messages = _run_conversation(scripted(template=reduced), system)
    assert text == _reference(template, messages, **special)


def test_reduction_finds_known_shapes():
    chatml = template_from_jinja(CHATML_TEMPLATE)
    assert chatml.role_prefix_and_suffix == get_chat_template("chatml").role_prefix_and_suffix
    assert chatml.stop_str == ("<|im_end|>",) and chatml.default_system_prompt is None
    assert template_from_jinja(QWEN_LIKE).default_system_prompt == "You are Qwen, a helpful assistant."
    llama = template_from_jinja(LLAMA3, bos_token="<|begin_of_text|>")
    assert llama.stop_str == ("<|eot_id|>",)
    assert llama.get_prefix_and_suffix("user", []) == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n", "<|eot_id|>")
    assert llama.get_prefix_and_suffix("user", [{"role": "user"}])[0] == "<|start_header_id|>user<|end_header_id|>\n\n"
    assert template_from_jinja(LLAMA3).role_prefix_and_suffix == \
        get_chat_template("llama-3-instruct").role_prefix_and_suffix


def test_template_without_system_role_maps_system_to_user():
    reduced = template_from_jinja(NO_SYSTEM)
    assert reduced.role_prefix_and_suffix["system"] == reduced.role_prefix_and_suffix["user"] == ("<turn>user: ", "</turn>")


def test_unreducible_template_falls_back_to_registry():
    mangling = "{% for m in messages %}{{ m['content'] | upper }}{% endfor %}"
    with pytest.raises(TemplateReductionError):
        template_from_jinja(mangling)
    assert resolve_chat_template("Qwen/Qwen2.5-0.5B-Instruct", mangling).name == "qwen"
    assert resolve_chat_template("/models/foo", None).name == "default"


@pytest.mark.parametrize("path, name", [
    ("meta-llama/Meta-Llama-3.1-8B-Instruct", "llama-3-instruct"),
    ("Qwen/Qwen2-7B-Instruct", "qwen"),
    ("HuggingFaceTB/SmolLM2-360M-Instruct", "chatml"),
    ("gpt2", "default"),
])
def test_registry_matches_model_path(path, name):
    assert get_chat_template_by_model_path(path).name == name
