"""`python -m radixlm.router --worker-urls URL [URL ...]`: run the router process (uvicorn + FastAPI)."""

from __future__ import annotations

import argparse
import sys

from radixlm.router.policy import RouterConfig


def build_parser() -> argparse.ArgumentParser:
    d = RouterConfig(worker_urls=())
    p = argparse.ArgumentParser(prog="python -m radixlm.router", description=__doc__)
    p.add_argument("--worker-urls", nargs="+", required=True, help="base URLs of the radixlm serve replicas")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--policy", default=d.policy, choices=["cache_aware", "round_robin"])
    p.add_argument("--cache-threshold", type=float, default=d.cache_threshold)
    p.add_argument("--balance-abs-threshold", type=int, default=d.balance_abs_threshold)
    p.add_argument("--balance-rel-threshold", type=float, default=d.balance_rel_threshold)
    p.add_argument("--max-tree-chars", type=int, default=d.max_tree_chars)
    p.add_argument("--health-interval", type=float, default=d.health_interval_s)
    p.add_argument("--log-level", default="info")
    return p


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    from radixlm.router.app import create_app

    a = build_parser().parse_args(argv)
    config = RouterConfig(tuple(a.worker_urls), a.policy, a.cache_threshold, a.balance_abs_threshold,
                          a.balance_rel_threshold, a.max_tree_chars, a.health_interval)
    uvicorn.run(create_app(config), host=a.host, port=a.port, log_level=a.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
