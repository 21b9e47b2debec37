"""`ebnf` on every backend: GBNF and Lark inputs, random walks whose outputs are in the grammar's language,
recursion compiled by llguidance / xgrammar and refused by name on outlines."""

from __future__ import annotations

import re

import pytest

from radixlm.constrained import GrammarError, GrammarOptions, make_backend
from radixlm.constrained.ebnf import syntax_of
from radixlm.constrained.simulate import random_walk

BACKENDS = ["outlines", "llguidance", "xgrammar"]

# name -> (GBNF, Lark, a Python regex for the same language)
REGULAR = {
    "greeting": ('root ::= ("hi" | "hello") " " name "!"\nname ::= [A-Z] [a-z]{1,5}\n',
                 'start: ("hi" | "hello") " " NAME "!"\nNAME: /[A-Z][a-z]{1,5}/\n',
                 r"(hi|hello) [A-Z][a-z]{1,5}!"),
    "list": ('# a JSON-ish list\nroot ::= "[" item ("," ws item)* "]"\nitem ::= [0-9]{1,3} | "\\"" [a-z]{0,4} "\\""\n'
             'ws ::= " "?\n',
             'start: "[" item ("," [" "] item)* "]"\n?item: INT | STR\nINT: /[0-9]{1,3}/\nSTR: "\\"" /[a-z]{0,4}/ "\\""\n',
             r'\[([0-9]{1,3}|"[a-z]{0,4}")(, ?([0-9]{1,3}|"[a-z]{0,4}"))*\]'),
    "keyvalue": ('root ::= key "=" value\nkey ::= [a-z_]{1,8}\nvalue ::= "true" | "false" | [0-9]+ ("." [0-9]+)?\n',
                 'start: KEY "=" value\nKEY: /[a-z_]{1,8}/\nvalue: "true" | "false" | /[0-9]+(\\.[0-9]+)?/\n',
                 r"[a-z_]{1,8}=(true|false|[0-9]+(\.[0-9]+)?)"),
}
EXPR_GBNF = 'root ::= expr\nexpr ::= term (("+" | "*") term)*\nterm ::= [0-9] | "(" expr ")"\n'
EXPR_LARK = 'start: expr\nexpr: term (("+" | "*") term)*\nterm: /[0-9]/ | "(" expr ")"\n'
IGNORE_LARK = 'start: WORD ("," WORD)*\n%import common.WORD\n%ignore " "\n'


@pytest.fixture(scope="module")
def made(byte_tokenizer, model_vocab_size):
    def get(name: str):
        if name == "xgrammar":
            pytest.importorskip("xgrammar")
        return make_backend(name, byte_tokenizer, model_vocab_size, GrammarOptions())
    return get


def _is_expr(text: str) -> bool:
    """expr := term (op term)*, term := digit | ( expr ): a recursive-descent check."""
    pos = 0

    def term() -> bool:
        nonlocal pos
        if pos < len(text) and text[pos].isdigit():
            pos += 1
            return True
        if pos < len(text) and text[pos] == "(":
            pos += 1
            if not expr() or pos >= len(text) or text[pos] != ")":
                return False
            pos += 1
            return True
        return False

    def expr() -> bool:
        nonlocal pos
        if not term():
            return False
        while pos < len(text) and text[pos] in "+*":
            pos += 1
            if not term():
                return False
        return True

    return expr() and pos == len(text)


def _walks(grammar, tokenizer, vocab_size, seeds=range(4)):
    for seed in seeds:
        for jump in (True, False):
            res = random_walk(grammar.matcher(), tokenizer, vocab_size, seed=seed, jump_forward=jump)
            assert res.finished, res.text
            yield res.text


def test_syntax_detection():
    assert syntax_of(EXPR_GBNF) == "gbnf" and syntax_of(EXPR_LARK) == "lark"
    assert syntax_of("?start: a\na: \"x\"") == "lark"
    with pytest.raises(GrammarError) as info:
        syntax_of("just some text")
    assert info.value.param == "ebnf" and info.value.code == "invalid_grammar"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(REGULAR))
@pytest.mark.parametrize("syntax", ["gbnf", "lark"])
def test_regular_grammars(made, byte_tokenizer, model_vocab_size, backend, name, syntax):
    gbnf, lark, regex = REGULAR[name]
    grammar = made(backend).compile("ebnf", gbnf if syntax == "gbnf" else lark)
    texts = set(_walks(grammar, byte_tokenizer, model_vocab_size))
    assert all(re.fullmatch(regex, t) for t in texts), texts
    assert len(texts) >= 2


@pytest.mark.parametrize("backend", ["llguidance", "xgrammar"])
@pytest.mark.parametrize("spec", [EXPR_GBNF, EXPR_LARK], ids=["gbnf", "lark"])
def test_recursive_grammar(made, byte_tokenizer, model_vocab_size, backend, spec):
    grammar = made(backend).compile("ebnf", spec)
    texts = set(_walks(grammar, byte_tokenizer, model_vocab_size, seeds=range(6)))
    assert all(_is_expr(t) for t in texts), texts
    assert any("(" in t for t in texts) or len(texts) >= 3


@pytest.mark.parametrize("spec, rule", [(EXPR_GBNF, "expr"), (EXPR_LARK, "expr"),
                                        ('start: a\na: "(" a ")" | "x"\n', "a")])
def test_outlines_refuses_recursion_by_name(made, spec, rule):
    with pytest.raises(GrammarError) as info:
        made("outlines").compile("ebnf", spec)
    err = info.value
    assert (err.param, err.code) == ("ebnf", "invalid_grammar")
    assert f"rule '{rule}' is recursive" in err.message and "llguidance" in err.message and "xgrammar" in err.message


@pytest.mark.parametrize("backend", BACKENDS)
def test_lark_ignore_and_common_imports(made, byte_tokenizer, model_vocab_size, backend):
    grammar = made(backend).compile("ebnf", IGNORE_LARK)
    texts = set(_walks(grammar, byte_tokenizer, model_vocab_size))
    assert all(re.fullmatch(r" *[A-Za-z]+ *(, *[A-Za-z]+ *)*", t) for t in texts), texts


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("spec", ['root ::= ("a"', "start: (", "no rules here", 'start: UNDEFINED_X\n', ""])
def test_bad_grammars_are_clear_errors(made, backend, spec):
    with pytest.raises(GrammarError) as info:
        made(backend).compile("ebnf", spec)
    assert (info.value.param, info.value.code) == ("ebnf", "invalid_grammar"), info.value.to_dict()
    assert "\n" not in info.value.message and ".py" not in info.value.message and ".cc" not in info.value.message


@pytest.mark.parametrize("backend", BACKENDS)
def test_too_large(made, backend):
    spec = 'root ::= "a"\n' + "# " + "x" * (1100 * 1024) + "\n"  # over the 1 MiB limit
    with pytest.raises(GrammarError) as info:
        made(backend).compile("ebnf", spec)
    assert (info.value.param, info.value.code) == ("ebnf", "grammar_too_large")
