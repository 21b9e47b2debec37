"""Where radixlm keeps what it builds or fetches once (models, converted GGUFs, compiled CPU ops), and the
inter-process lock that keeps two processes from building the same thing at once.

Imported by the runtime (models) and by radixlm.kernels.cpu (compiled ops), so it sits below both.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CACHE_ENV = "RADIXLM_CACHE_DIR"


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The radixlm cache: cache_dir if given, else $RADIXLM_CACHE_DIR, else the user cache dir."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("radixlm"))


@contextmanager
def file_lock(lock_path: Path) -> Iterator[None]:
    """Exclusive inter-process lock (fcntl.flock), released on exit or if the holder dies."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
