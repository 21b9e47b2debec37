"""stop_regex: matched on the detokenized output like stop strings (the scheduler stops, the output side
trims, streaming holds back a tail that may still become a match). The shared search functions, then the
Engine end to end."""

from __future__ import annotations

import re

import pytest

from radixlm.errors import InvalidRequestError
from radixlm.runtime.engine import Engine
from radixlm.runtime.incremental_detok import find_stop_regex, regex_holdback_len

PROMPT = "Once upon a time there was a small language model"


def test_find_stop_regex_takes_the_earliest_new_non_empty_match():
    assert find_stop_regex("ab. cd. ef", [r"\."], 0) == (r"\.", 2)
    assert find_stop_regex("ab. cd. ef", [r"\."], 3) == (r"\.", 6)  # the first one was scanned already
    assert find_stop_regex("x12 y", [r"y", r"\d+"], 0) == (r"\d+", 1)  # earliest over every pattern
    assert find_stop_regex("abc", [r"z*"], 0) is None  # empty matches never stop
    assert find_stop_regex("ab1", [r"[a-z]\d"], 2) == (r"[a-z]\d", 1)  # straddles old and new text


def test_holdback_is_the_tail_that_may_still_become_a_match():
    assert regex_holdback_len("hello wor", [r"world\b"]) == 3
    assert regex_holdback_len("hello", [r"\d{3}"]) == 0
    assert regex_holdback_len("pay 12", [r"\d+ USD", r"y"]) == 2
    assert regex_holdback_len("anything", []) == 0


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    with Engine(str(tiny_llama_dir), max_total_tokens=2048) as eng:
        yield eng


def greedy(engine, stream: bool = False, **extra):
    return engine.generate(PROMPT, {"max_new_tokens": 24, "temperature": 0, **extra}, stream=stream)


def _pattern(text: str) -> str:
    """A regex (not a plain string: a character class) that first matches 4 characters mid-text."""
    return re.escape(text[8:11]) + "."


def test_stop_regex_stops_and_trims_like_a_stop_string(engine):
    full = greedy(engine)
    pattern = _pattern(full["text"])
    first = re.search(pattern, full["text"])
    res = greedy(engine, stop_regex=[pattern])
    assert res["meta_info"]["finish_reason"] == {"type": "stop", "matched": pattern}
    assert res["text"] == full["text"][: first.start()]
    assert res["output_ids"] == full["output_ids"][: len(res["output_ids"])]
    assert len(res["output_ids"]) < len(full["output_ids"])
    kept = greedy(engine, stop_regex=pattern, no_stop_trim=True)  # a single string is accepted too
    assert kept["text"].startswith(full["text"][: first.end()])
    engine.check_integrity()


def test_streaming_holds_back_a_partial_match_and_ends_like_non_streaming(engine):
    full = greedy(engine)
    pattern = _pattern(full["text"])
    final = greedy(engine, stop_regex=[pattern])["text"]
    chunks = [c["text"] for c in greedy(engine, stream=True, stop_regex=[pattern])]
    assert chunks[-1] == final
    # Never a character of the match on the way: every chunk is a prefix of the trimmed final text.
    assert all(final.startswith(c) for c in chunks), chunks


def test_a_stop_string_still_wins_when_it_comes_first(engine):
    text = greedy(engine)["text"]
    res = greedy(engine, stop=[text[2:4]], stop_regex=[_pattern(text)])
    assert res["meta_info"]["finish_reason"] == {"type": "stop", "matched": text[2:4]}
    assert res["text"] == text[: text.index(text[2:4])]


@pytest.mark.parametrize("bad", [["("], [""], ["a" * 5000], ["x"] * 17, [3]])
def test_invalid_stop_regex_names_the_field(engine, bad):
    with pytest.raises(InvalidRequestError) as info:
        greedy(engine, stop_regex=bad)
    assert info.value.param == "stop_regex"


def test_a_match_may_start_in_text_the_grammar_forced(engine):
    """Jump-forward appends the grammar's forced text between two sampled tokens: the stop search sees it
    (a lookbehind on it, a stop string straddling it), though a match must still end in a sampled token."""
    regex = "[ab]XYZW[a-z]{6}"
    full = greedy(engine, regex=regex)
    assert full["meta_info"]["jump_forward_tokens"] > 0 and full["text"][1:5] == "XYZW"
    res = greedy(engine, regex=regex, stop_regex=[r"(?<=XYZW)[a-z]"])
    assert res["text"] == full["text"][:5] and res["meta_info"]["finish_reason"]["type"] == "stop"
    res = greedy(engine, regex=regex, stop=["W" + full["text"][5]])
    assert res["text"] == full["text"][:4]
    engine.check_integrity()
