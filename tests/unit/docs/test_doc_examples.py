"""Every fenced code block of README.md and docs/*.md marked runnable runs, as written.

Marker convention: an HTML comment (invisible once rendered) on the last non-blank line before the
opening fence::

    <!-- runnable -->            run the block; fast (seconds)
    <!-- runnable: script -->    a Python block saved as a file and run as ``python FILE`` (spawned children
                                 re-import it, so a missing ``if __name__ == "__main__":`` shows)
    <!-- runnable: slow -->      runs in more than a few seconds: the test is marked ``slow``

(``script`` and ``slow`` combine: ``<!-- runnable: script slow -->``.) How each language runs, from the
repository root with this interpreter's ``bin`` first on ``PATH`` (so ``cpkv`` is this tree's CLI):

- ``python``: ``python -c BLOCK`` (or the script above); a one-line expression statement whose comment
  (on its line, or alone on the next) starts with a Python literal (``x.tolist()  # [4, 1]: ...``) must
  equal that literal;
- ``bash``: ``bash -e -c BLOCK``: every command exits 0;
- ``console``: each ``$ CMD`` line runs under bash; the lines after it, up to the next ``$``, are its
  output: stdout then stderr, each line's trailing blanks ignored.

A block that is not marked is not run (placeholders, other machines, minutes-long runs).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
MARK = re.compile(r"^<!--\s*runnable(?::\s*(?P<opts>[\w\s]*?))?\s*-->$")
FENCE = re.compile(r"^```(?P<lang>\w*)\s*$")
LANGS = {"python", "bash", "console"}
OPTIONS = {"script", "slow"}


def marked_blocks() -> list[tuple[str, int, str, set[str], str]]:
    """``(file, line of the fence, language, options, code)`` of every block marked runnable."""
    out = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        lines = path.read_text(encoding="utf-8").split("\n")
        i = 0
        while i < len(lines):
            fence = FENCE.match(lines[i])
            if not fence:
                i += 1
                continue
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            before = [s.strip() for s in lines[:i] if s.strip()]
            mark = MARK.match(before[-1]) if before else None
            if mark:
                opts = set((mark["opts"] or "").split())
                out.append(
                    (
                        path.name if path.parent == ROOT else f"docs/{path.name}",
                        i + 1,
                        fence["lang"],
                        opts,
                        "\n".join(lines[i + 1 : end]),
                    )
                )
            i = end + 1
    return out


BLOCKS = marked_blocks()


def _env() -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    return env


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)


def with_checks(code: str) -> str:
    """``code`` with an assert after each one-line expression statement whose comment opens with a literal."""
    lines = code.split("\n")
    out = list(lines)
    for node in ast.parse(code).body:
        if not isinstance(node, ast.Expr) or node.lineno != node.end_lineno:
            continue
        line = lines[node.lineno - 1]
        comment = line[node.end_col_offset :].strip()
        if not comment and node.lineno < len(lines):  # or the comment line right below it
            comment = lines[node.lineno].strip()
        if not comment.startswith("#"):
            continue
        text = comment[1:].strip()
        for cut in (len(text), *(m.start() for m in re.finditer(r":\s", text))):
            try:
                want = ast.literal_eval(text[:cut])
            except (ValueError, SyntaxError):
                continue
            expr = ast.get_source_segment(code, node)
            out[node.lineno - 1] = f"assert ({expr}) == {want!r}, ({expr!r}, ({expr}))"
            break
    return "\n".join(out)


def test_the_marker_convention_holds():
    assert BLOCKS, "no block of README.md or docs/*.md is marked runnable"
    for name, line, lang, opts, _ in BLOCKS:
        assert lang in LANGS, f"{name}:{line}: a runnable block must be one of {sorted(LANGS)}, got {lang!r}"
        assert opts <= OPTIONS, f"{name}:{line}: unknown runnable options {sorted(opts - OPTIONS)}"
        assert "script" not in opts or lang == "python", (
            f"{name}:{line}: only a python block runs as a script"
        )


def test_with_checks_turns_literal_comments_into_asserts():
    code = "x = [1, 2]\nx  # [1, 2]: both\nlen(x)  # two items\nx[0]  # 1\nx[1], x[0]\n# (2, 1)"
    assert with_checks(code).split("\n") == [
        "x = [1, 2]",
        "assert (x) == [1, 2], ('x', (x))",
        "len(x)  # two items",
        "assert (x[0]) == 1, ('x[0]', (x[0]))",
        "assert (x[1], x[0]) == (2, 1), ('x[1], x[0]', (x[1], x[0]))",
        "# (2, 1)",
    ]


@pytest.mark.parametrize(
    ("name", "line", "lang", "opts", "code"),
    [
        pytest.param(*b, id=f"{b[0]}:{b[1]}", marks=[pytest.mark.slow] if "slow" in b[3] else [])
        for b in BLOCKS
    ],
)
def test_a_runnable_block_runs_as_written(name, line, lang, opts, code, tmp_path):
    timeout = 280 if "slow" in opts else 60
    where = f"{name}:{line}"
    if lang == "python":
        checked = with_checks(code)
        if "script" in opts:
            script = tmp_path / "example.py"
            script.write_text(checked, encoding="utf-8")
            done = _run([sys.executable, str(script)], timeout)
        else:
            done = _run([sys.executable, "-c", checked], timeout)
        assert done.returncode == 0, f"{where}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    elif lang == "bash":
        done = _run(["bash", "-e", "-c", code], timeout)
        assert done.returncode == 0, f"{where}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    else:
        steps = re.split(r"^\$ ", code, flags=re.M)[1:]
        assert steps, f"{where}: a console block needs '$ ' command lines"
        for step in steps:
            cmd, _, shown = step.partition("\n")
            done = _run(["bash", "-c", cmd], timeout)
            got = [s.rstrip() for s in (done.stdout + done.stderr).rstrip("\n").split("\n")]
            want = [s.rstrip() for s in shown.rstrip("\n").split("\n")]
            assert got == want, f"{where}: `{cmd}` printed something else (exit {done.returncode})"
