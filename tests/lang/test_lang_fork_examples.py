"""SGLang's documented fork idioms run unchanged: the Parallelism example of SGLang's frontend docs
(`for i, f in enumerate(forks): f += ...`, then `forks[i]["var"]`), the indexed form `forks[0] += ...`,
and both join modes. On the scripted backend (replies depend only on the prompt)."""

from __future__ import annotations

import pytest

import radixlm as sgl


@sgl.function
def tip_suggestion(s):
    # The "Parallelism" example of SGLang's frontend docs.
    s += (
        "Here are two tips for staying healthy: "
        "1. Balanced Diet. 2. Regular Exercise.\n\n"
    )

    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += f"Now, expand tip {i+1} into a paragraph:\n"
        f += sgl.gen(f"detailed_tip", max_tokens=256, stop="\n\n")

    s += "Tip 1:" + forks[0]["detailed_tip"] + "\n"
    s += "Tip 2:" + forks[1]["detailed_tip"] + "\n"
    s += "In summary" + sgl.gen("summary")


def test_the_docs_parallelism_example(scripted):
    backend = scripted()
    state = tip_suggestion.run(backend=backend)
    head = "Here are two tips for staying healthy: 1. Balanced Diet. 2. Regular Exercise.\n\n"
    tips = [f"<{len(head + f'Now, expand tip {i} into a paragraph:' + chr(10))}>" for i in (1, 2)]
    assert state.text().startswith(head + f"Tip 1:{tips[0]}\nTip 2:{tips[1]}\nIn summary")
    assert state["summary"] == f"<{len(head + f'Tip 1:{tips[0]}' + chr(10) + f'Tip 2:{tips[1]}' + chr(10) + 'In summary')}>"


@sgl.function
def indexed_forks(s):
    s += "Question: is the sky blue?\n"
    forks = s.fork(2)
    forks[0] += "Argue yes: " + sgl.gen("yes", max_tokens=16)
    forks[1] += "Argue no: "
    forks[1] += sgl.gen("no", max_tokens=16)
    forks.join()
    s += "Verdict:" + sgl.gen("verdict", max_tokens=8)


def test_indexed_fork_assignment_like_stock_sglang(scripted):
    backend = scripted()
    state = indexed_forks.run(backend=backend)
    q = "Question: is the sky blue?\n"
    assert state["yes"] == [f"<{len(q + 'Argue yes: ')}>"] and state["no"] == [f"<{len(q + 'Argue no: ')}>"]
    assert state.text() == q + "Verdict:" + state["verdict"]


@sgl.function
def concat_forks(s):
    s += "Facts:"
    forks = s.fork(2)
    for i in range(2):
        forks[i] += f" fact {i}=" + sgl.gen("fact", max_tokens=4)
    forks.join("concate_and_append")
    s += " Done."


def test_concate_and_append_join_with_indexed_forks(scripted):
    state = concat_forks.run(backend=scripted())
    facts = [f" fact {i}=<{len('Facts:' + f' fact {i}=')}>" for i in range(2)]
    assert state.text() == "Facts:" + "".join(facts) + " Done."


def test_a_branch_cannot_be_replaced(scripted):
    @sgl.function
    def replace(s):
        forks = s.fork(2)
        forks[0] = forks[1]

    with pytest.raises(TypeError, match="extended in place"):
        replace.run(backend=scripted())
