"""Cache-aware data-parallel router: one HTTP front for several `radixlm serve` replicas (docs/scaling.md).

Runs in its own process: `python -m radixlm.router --worker-urls http://host:30001 http://host:30002`.
"""

from radixlm.router.app import create_app
from radixlm.router.policy import Policy, RouterConfig, route_key

__all__ = ["Policy", "RouterConfig", "create_app", "route_key"]
