"""Stock SGLang frontend programs, run by test_sglang_frontend.py with the Python of a separate venv that
has `sglang==0.5.2` (frontend only, no torch). Prints one JSON object with every program's result.
Usage: python sglang_programs.py URL API_KEY
"""

import json
import sys

import sglang as sgl


@sgl.function
def gen_prog(s, prompt):
    s += prompt
    s += sgl.gen("out", max_tokens=8, temperature=0)


@sgl.function
def select_prog(s):
    # Not "Paris is": with the tiny tokenizer its token at L-2 ("is") is a suffix of the text, which sends
    # the stock frontend into its token-healing branch, where it subtracts the first input logprob, which
    # SGLang (and we, per wire-protocol.md) report as null: a TypeError in the stock frontend itself.
    s += "The capital of France is"
    s += sgl.select("choice", choices=[" Paris", " a fox", " blue"])


@sgl.function
def fork_prog(s):
    s += "The quick brown fox"
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += f" {i}" + sgl.gen("x", max_tokens=4, temperature=0)
    forks.join()
    s += " done"
    return [f["x"] for f in forks]


@sgl.function
def regex_prog(s):
    s += "Number:"
    s += sgl.gen("num", max_tokens=6, regex="[0-9]+", temperature=0)


def main() -> None:
    url, key = sys.argv[1], sys.argv[2]
    sgl.set_default_backend(sgl.RuntimeEndpoint(url, api_key=key))
    out = {"gen": gen_prog.run(prompt="The quick brown fox")["out"]}
    state = gen_prog.run(prompt="The quick brown fox", stream=True)
    out["stream"] = "".join(state.text_iter("out"))
    states = gen_prog.run_batch([{"prompt": p} for p in ("Paris is the capital of", "def main():")])
    out["batch"] = [st["out"] for st in states]
    st = select_prog.run()
    out["select"] = st["choice"]
    st = fork_prog.run()
    out["fork"], out["fork_text"] = st.ret_value, st.text()
    out["regex"] = regex_prog.run()["num"]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
