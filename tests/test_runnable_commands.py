"""Every command the README and the docs mark runnable runs as written and exits 0.

A fenced block is marked by the HTML comment ``<!-- runnable -->`` on the line right before its
opening fence: invisible on GitHub and on the mkdocs site, so the page reads the same. Mark only
what is cheap and offline (no AWS account, GPU, container, network, or more than ~20 s); the
whole set takes well under a minute. Each command of a marked block (backslash continuations
joined, comment lines skipped) runs in bash with the checkout's Python first on PATH, so
``python`` and ``spectrum`` are this checkout's, from a temporary folder that links every entry
of the repository root: the relative paths the docs use resolve as from the root, and what a
command writes (``--plot sim.png``, ``./out/``) lands in the temporary folder, not the checkout.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
MARKER = "<!-- runnable -->"
FENCE_OPEN = re.compile(r"^(`{3,}|~{3,})")
TIMEOUT_S = 60      # a hung command fails its test instead of the run


def marked_blocks(path: Path, root: Path = REPO) -> list[tuple[int, str]]:
    """(line of the opening fence, body) of each fenced block right after the marker. A marker
    not followed by a fence is an error: the block it meant would silently not run."""
    lines = path.read_text().splitlines()
    blocks = []
    for i, line in enumerate(lines):
        if line.strip() != MARKER:
            continue
        fence = FENCE_OPEN.match(lines[i + 1]) if i + 1 < len(lines) else None
        if fence is None:
            raise ValueError(f"{path.relative_to(root)}:{i + 1}: {MARKER} must be right before a fence")
        end = next((j for j in range(i + 2, len(lines)) if lines[j].startswith(fence.group(1))), None)
        if end is None:
            raise ValueError(f"{path.relative_to(root)}:{i + 2}: the marked fence is never closed")
        blocks.append((i + 2, "\n".join(lines[i + 2:end])))
    return blocks


def commands(body: str) -> list[str]:
    """The commands of a block: continuation lines joined, blank and comment lines dropped."""
    joined = re.sub(r"\s*\\\n\s*", " ", body)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def collected() -> list[tuple[str, str]]:
    out = []
    for path in documents():
        for line, body in marked_blocks(path):
            out += [(f"{path.relative_to(REPO)}:{line}", command) for command in commands(body)]
    return out


CASES = collected()


@pytest.fixture(scope="module")
def root_links(tmp_path_factory) -> Path:
    """A folder linking every entry of the repository root (.git and local venvs aside)."""
    folder = tmp_path_factory.mktemp("root")
    for entry in REPO.iterdir():
        if entry.name not in (".git", "out", "site") and not entry.name.startswith(".venv"):
            (folder / entry.name).symlink_to(entry)
    return folder


def run(command: str, cwd: Path) -> subprocess.CompletedProcess:
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "containers" / "byo-vllm"),
                                          os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "COLUMNS": "120", "NO_COLOR": "1"}
    for key in ("AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        env.pop(key, None)            # a marked command needs no account: prove it
    return subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S)


def test_the_docs_mark_commands_runnable():
    where = {case[0].split(":")[0] for case in CASES}
    assert "README.md" in where and any(w.startswith("docs/") for w in where), where


@pytest.mark.parametrize("where, command", CASES, ids=[f"{w} {c[:60]}" for w, c in CASES])
def test_a_marked_command_runs_as_written(root_links, where, command):
    started = time.monotonic()
    done = run(command, root_links)
    took = time.monotonic() - started
    assert done.returncode == 0, (f"{where}: `{command}` exited {done.returncode} after {took:.1f} s\n"
                                  f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}")


def test_a_failing_marked_command_is_reported(tmp_path, root_links):
    """The check can fail: a marked block whose command exits non-zero fails with the command
    and its output; an unmarked block is not collected; a marker with no fence after it is refused."""
    page = tmp_path / "page.md"
    page.write_text(f"# Page\n\n{MARKER}\n```bash\n# a comment\npython -c \\\n    'import sys; print(\"out\"); "
                    "sys.exit(3)'\n```\n\n```bash\nnot marked\n```\n")
    [(line, body)] = marked_blocks(page, root=tmp_path)
    assert line == 4 and commands(body) == ["python -c 'import sys; print(\"out\"); sys.exit(3)'"]
    with pytest.raises(AssertionError) as failed:
        test_a_marked_command_runs_as_written(root_links, f"page.md:{line}", commands(body)[0])
    assert "exited 3" in str(failed.value) and "sys.exit(3)" in str(failed.value) and "out" in str(failed.value)
    page.write_text(f"{MARKER}\n\nbash\n")
    with pytest.raises(ValueError, match="page.md:1: .* must be right before a fence"):
        marked_blocks(page, root=tmp_path)
