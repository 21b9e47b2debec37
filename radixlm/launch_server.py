"""`python -m radixlm.launch_server --model-path ...`: SGLang's launch command, same as `radixlm serve`.

Runs in the server's main process (which becomes the HTTP process; see runtime/launch.py).
"""

from __future__ import annotations

import sys

from radixlm.runtime.cli import build_serve_parser, cmd_serve


def main(argv: list[str] | None = None) -> int:
    args = build_serve_parser("python -m radixlm.launch_server").parse_args(argv)
    return cmd_serve(args)


if __name__ == "__main__":
    sys.exit(main())  # cmd_serve ends the process itself with the server's exit code
