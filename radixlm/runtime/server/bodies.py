"""The HTTP request bodies as msgspec Structs, and `decode_body`: the one place a body becomes a Struct and
a msgspec error becomes the 400 envelope (naming the field: "`temperature`: Expected `float`, got `str`").

Runs in the HTTP process. Unknown top-level fields are ignored (SGLang's and OpenAI's clients send many);
unknown `sampling_params` fields are a 400 (SamplingParamsIn). Types are checked here; values (ranges,
grammars, lengths) where every request is validated once, runtime/generate_input.py. The same Structs
describe the bodies in /openapi.json (openapi.py).
"""

from __future__ import annotations

from typing import Any, Optional, TypeVar, Union

import msgspec

from radixlm.errors import from_validation_error
from radixlm.runtime.server.errors import APIError
from radixlm.sampling_params import SamplingParamsIn

T = TypeVar("T")


class GenerateBody(msgspec.Struct):
    """POST /generate (docs/wire-protocol.md). A batch is a list of prompts; list-valued per-prompt fields
    give one value per prompt."""

    text: Union[str, list[str], None] = None
    input_ids: Optional[list[Union[int, list[int]]]] = None
    sampling_params: Union[SamplingParamsIn, list[SamplingParamsIn], None] = None
    return_logprob: Union[bool, list[bool], None] = None
    logprob_start_len: Union[int, list[int], None] = None
    top_logprobs_num: Union[int, list[int], None] = None
    token_ids_logprob: Optional[list[int]] = None
    return_text_in_logprobs: Optional[bool] = None
    rid: Union[str, list[str], None] = None
    stream: Optional[bool] = None

    def fields(self) -> dict[str, Any]:
        """prepare_generate's keywords."""
        return {name: getattr(self, name) for name in self.__struct_fields__ if name != "stream"}


class StreamOptions(msgspec.Struct):
    include_usage: Optional[bool] = None


# The native sampling fields a /v1 body may carry under their own names (docs/wire-protocol.md); their
# types are SamplingParamsIn's (one definition). OpenAI's own spellings are OpenAIBody's fields.
PASSTHROUGH = ("temperature", "top_p", "n", "stop", "presence_penalty", "frequency_penalty", "top_k", "min_p",
               "repetition_penalty", "regex", "json_schema", "ebnf", "stop_token_ids", "stop_regex", "ignore_eos",
               "skip_special_tokens", "no_stop_trim", "spaces_between_special_tokens", "logit_bias")
_SAMPLING_TYPES = {f.name: f.type for f in msgspec.structs.fields(SamplingParamsIn)}
_SamplingFields = msgspec.defstruct("OpenAISamplingFields", [(n, _SAMPLING_TYPES[n], None) for n in PASSTHROUGH],
                                    module=__name__)


class OpenAIBody(_SamplingFields):
    """What /v1/completions and /v1/chat/completions share."""

    model: Optional[str] = None
    stream: Optional[bool] = None
    stream_options: Optional[StreamOptions] = None
    max_tokens: Optional[int] = None
    seed: Optional[int] = None
    min_tokens: Optional[int] = None
    response_format: Optional[dict[str, Any]] = None


class CompletionBody(OpenAIBody):
    """POST /v1/completions. prompt: a string, a list of strings, token ids, or a list of token-id lists."""

    prompt: Union[str, list[Union[str, int, list[int]]], None] = None
    echo: Optional[bool] = None
    logprobs: Optional[int] = None


class ChatBody(OpenAIBody):
    """POST /v1/chat/completions. messages: OpenAI chat messages (text content; tool calls and results)."""

    messages: Optional[list[dict[str, Any]]] = None
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = None
    max_completion_tokens: Optional[int] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Union[str, dict[str, Any], None] = None
    parallel_tool_calls: Optional[bool] = None

    def tool_fields(self) -> dict[str, Any]:
        """The fields radixlm/tools reads (given ones only: absent keeps each field's default)."""
        names = ("tools", "tool_choice", "parallel_tool_calls", "response_format")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}


class EmbeddingBody(msgspec.Struct):
    """POST /v1/embeddings (OpenAI's Embeddings API). input: a string, a list of strings, token ids, or a list
    of token-id lists; dimensions: only the hidden size (no truncation); user: accepted and unused."""

    input: Union[str, list[Union[str, int, list[int]]], None] = None
    model: Optional[str] = None
    encoding_format: Optional[str] = None
    dimensions: Optional[int] = None
    user: Optional[str] = None


class EncodeBody(msgspec.Struct):
    """POST /encode (SGLang's native embeddings route): text or input_ids, one prompt or a batch."""

    text: Union[str, list[str], None] = None
    input_ids: Optional[list[Union[int, list[int]]]] = None
    rid: Union[str, list[str], None] = None


class ResponsesBody(msgspec.Struct):
    """POST /v1/responses (OpenAI's Responses API; server/responses_format.py translates it into a ChatBody).
    input: a string or a list of items (messages, function_call, function_call_output); tools in the
    Responses' flat shape; seed is radixlm's extension, as on /v1/chat/completions."""

    model: Optional[str] = None
    input: Union[str, list[dict[str, Any]], None] = None
    instructions: Optional[str] = None
    previous_response_id: Optional[str] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Union[str, dict[str, Any], None] = None
    parallel_tool_calls: Optional[bool] = None
    text: Optional[dict[str, Any]] = None
    max_output_tokens: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    seed: Optional[int] = None
    metadata: Optional[dict[str, str]] = None
    user: Optional[str] = None
    store: Optional[bool] = None
    stream: Optional[bool] = None
    reasoning: Optional[dict[str, Any]] = None
    truncation: Optional[str] = None
    background: Optional[bool] = None
    conversation: Union[str, dict[str, Any], None] = None
    prompt: Optional[dict[str, Any]] = None


class MessagesCountBody(msgspec.Struct):
    """POST /v1/messages/count_tokens: what of an Anthropic Messages request renders into the prompt
    (server/anthropic_format.py translates it into a ChatBody). `cache_control` on blocks is accepted and
    ignored (the radix cache is automatic); `thinking` is accepted (a --reasoning-parser decides)."""

    messages: list[dict[str, Any]]
    model: Optional[str] = None
    system: Union[str, list[dict[str, Any]], None] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[dict[str, Any]] = None
    thinking: Optional[dict[str, Any]] = None


class MessagesBody(MessagesCountBody, kw_only=True):
    """POST /v1/messages (Anthropic's Messages API); seed is radixlm's extension."""

    max_tokens: int
    stop_sequences: Optional[list[str]] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    seed: Optional[int] = None
    metadata: Optional[dict[str, Any]] = None
    stream: Optional[bool] = None


class TokenizeBody(msgspec.Struct):
    """POST /tokenize (vLLM's shape): a `prompt` string, or chat `messages` rendered with the chat template.
    add_special_tokens defaults to true for a prompt and false for messages (the template adds its own)."""

    model: Optional[str] = None
    prompt: Optional[str] = None
    messages: Optional[list[dict[str, Any]]] = None
    add_special_tokens: Optional[bool] = None
    add_generation_prompt: Optional[bool] = None
    continue_final_message: Optional[bool] = None
    return_token_strs: Optional[bool] = None
    tools: Optional[list[dict[str, Any]]] = None


class DetokenizeBody(msgspec.Struct):
    """POST /detokenize (vLLM's shape): token ids -> their text."""

    tokens: list[int]
    model: Optional[str] = None


BODY_TYPES = (GenerateBody, CompletionBody, ChatBody, EmbeddingBody, EncodeBody, ResponsesBody, MessagesCountBody,
              MessagesBody, TokenizeBody, DetokenizeBody)
SCHEMA_REF = "#/components/schemas/{name}"


def request_body(body_type: type) -> dict[str, Any]:
    """A route's `openapi_extra`: its JSON body is this Struct (openapi.py adds the Structs' schemas)."""
    ref = {"$ref": SCHEMA_REF.format(name=body_type.__name__)}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}
_DECODERS: dict[type, msgspec.json.Decoder] = {t: msgspec.json.Decoder(t) for t in BODY_TYPES}


def decode_body(raw: bytes, body_type: type[T]) -> T:
    """The body as body_type, or the 400 envelope: malformed JSON / UTF-8 (no param), a non-object body,
    or a field of the wrong type (param: the field)."""
    try:
        return _DECODERS[body_type].decode(raw)
    except msgspec.ValidationError as exc:
        if str(exc).startswith("Expected `object`, got") and " - at " not in str(exc):
            raise APIError(400, "the body must be a JSON object", None, "invalid_json") from None
        err = from_validation_error(exc)
        raise APIError(400, str(err), err.param, err.code) from None
    except msgspec.DecodeError as exc:  # after ValidationError, its subclass
        what = "UTF-8" if "UTF-8" in str(exc) else "JSON"
        raise APIError(400, f"the body is not valid {what}", None, "invalid_json") from None
    except RecursionError:  # nesting deeper than msgspec's limit
        raise APIError(400, "the body is nested too deeply", None, "invalid_json") from None
