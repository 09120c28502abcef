"""What the project writes into the checkout is ignored by git (gpu-out/ once was not): the default
--out of cpkv simulate and cpkv sweep, make demo's outputs, benchmarks/gpu_check.sh's default directory, the
Makefile's virtual environments (a symlinked .venv too) and pip's build directories. Checked with git's own
matcher (``git check-ignore --no-index``) against .gitignore, so a pattern that only looks right fails."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]


def written_paths() -> list[str]:
    """Paths (relative to the root) the project's commands write by default, read from their sources."""
    from cpkv.cli.simulate import simulate
    from cpkv.cli.sweep import sweep

    paths = [str(next(p for p in cmd.params if p.name == "out_dir").default) for cmd in (simulate, sweep)]
    makefile = (ROOT / "Makefile").read_text()
    demo = makefile.split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    paths += re.findall(r"--out (\S+)", demo)
    paths += re.findall(r"^(?:SGLANG059_)?(?:SGLANG_)?VENV\s*\?=\s*(\S+)", makefile, flags=re.M)
    gpu = re.search(r"^out=\$\{1:-([^}]+)\}", (ROOT / "benchmarks/gpu_check.sh").read_text(), flags=re.M)
    paths.append(gpu[1])
    return [*paths, "build", "dist", "src/cpkv.egg-info"]


def test_the_sources_name_the_outputs_this_test_expects():
    paths = written_paths()
    for want in (
        "out/simulate",
        "out/sweep",
        "out/demo",
        "gpu-out",
        ".venv",
        ".venv-sglang",
        ".venv-sglang059",
    ):
        assert any(p == want or p.startswith(want + "/") for p in paths), (want, paths)


@pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout"
)
@pytest.mark.parametrize("path", written_paths())
def test_each_output_is_ignored(path):
    venv = Path(path).name.startswith(".venv")  # a venv may be a symlink (git stops at one): its name itself
    for probe in [path] if venv else [f"{path}/report.json"]:
        rc = subprocess.run(
            ["git", "check-ignore", "--no-index", "-q", probe], cwd=ROOT, check=False
        ).returncode
        assert rc == 0, f"{probe} is not ignored by .gitignore"
