"""`radixlm showcase`: the CLI wiring (fast), and the showcase's main() on the real default model (slow)."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from radixlm import showcase
from radixlm.runtime.cli import build_parser


def test_cli_showcase_subcommand_takes_engine_flags(monkeypatch):
    args = build_parser().parse_args(["showcase", "--num-threads", "1", "--disable-radix-cache"])
    seen = []
    monkeypatch.setattr(showcase, "cmd_showcase", lambda a: seen.append(a) or 0)
    assert args.func(args) == 0 and seen == [args]  # the subcommand runs showcase.cmd_showcase
    assert args.num_threads == 1 and args.disable_radix_cache is True


@pytest.mark.slow
def test_showcase_prints_answers_and_a_cache_hit_rate(smol_engine, capsys):
    assert showcase.main([], engine=smol_engine) == 0
    out = capsys.readouterr().out
    # few-shot select: one line per animal, each a valid class
    picked = dict(re.findall(r"^ +(\w+) -> (\w+)$", out, re.M))
    assert list(picked) == showcase.ANIMALS and set(picked.values()) <= set(showcase.CLASSES)
    assert picked["shark"] == "fish" and picked["dolphin"] == "mammal"
    # fork/join: one non-empty explanation per tip
    for tip in showcase.TIPS:
        assert re.search(rf"^   {re.escape(tip)}: \S", out, re.M), tip
    # JSON schema: the printed object validates
    line = next(l.strip() for l in out.splitlines() if l.strip().startswith("{"))
    jsonschema.validate(json.loads(line), showcase.CHARACTER_SCHEMA)
    assert "(valid against the schema)" in out
    # multi-turn chat: every turn and a reply to each
    assert [q for q in showcase.CHAT_TURNS if f"user: {q}" in out] == showcase.CHAT_TURNS
    assert len(re.findall(r"^ +assistant: \S", out, re.M)) == len(showcase.CHAT_TURNS)
    assert "Paris" in out
    # the runtime's hit rate over these programs (fork branches, batch items and chat turns share prefixes)
    requests, prompt_tokens, cached = map(int, re.search(
        r"^(\d+) requests, (\d+) prompt tokens, (\d+) served from the radix cache$", out, re.M).groups())
    rate = float(re.search(r"^cache hit rate: ([\d.]+)%", out, re.M).group(1))
    assert requests > 0 and 0 < cached <= prompt_tokens
    assert rate == pytest.approx(100 * cached / prompt_tokens, abs=0.06) and rate > 0
