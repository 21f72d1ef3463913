"""Each package README's Python example runs as written, in a fresh process and folder.

A package README is the page a user of that package alone reads first; its example is copied,
not read, so a setting default or a renamed argument must fail here before it fails there.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)
# Examples that need what a test machine has not: their reason.
NEEDS = {"speedtronic-diloco": "a Hugging Face Hub repository it can write to"}
READMES = sorted((ROOT / "packages").glob("*/README.md"))


def test_every_package_readme_is_checked_or_says_why_not():
    names = {path.parent.name for path in READMES}
    assert set(NEEDS) <= names
    assert all(BLOCK.search(path.read_text(encoding="utf-8")) for path in READMES)


@pytest.mark.parametrize("readme", READMES, ids=lambda path: path.parent.name)
def test_package_readme_example_runs(readme, tmp_path):
    if readme.parent.name in NEEDS:
        pytest.skip(f"the example needs {NEEDS[readme.parent.name]}")
    # A README's blocks are one session: a later block may use what an earlier one wrote.
    code = "\n".join(BLOCK.findall(readme.read_text(encoding="utf-8")))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "error::DeprecationWarning"}
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"{readme.relative_to(ROOT)}:\n{done.stderr[-3000:]}"
