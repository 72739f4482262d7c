"""The docs: the mkdocs site builds with --strict (a broken link between its pages, a page
missing from the nav, a CLI whose parser no longer builds: each fails the build), every relative
link of the README and of every tracked markdown file resolves, and the CLI reference is written
from the parsers, every subcommand and flag included."""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "docs"))
import gen_cli  # noqa: E402

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def markdown_files() -> list[Path]:
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard", "*.md"],
                            capture_output=True, text=True, check=True).stdout.split()
    return [REPO / name for name in listed if (REPO / name).is_file()]


def github_anchors(path: Path) -> set[str]:
    """The ids GitHub gives a file's headings (what a README's #anchor must match)."""
    text = FENCE.sub("", path.read_text())
    out = set()
    for heading in re.findall(r"^#+\s+(.*?)\s*$", text, re.M):
        out.add(re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-"))
    return out


def broken_links(path: Path, generated: set[Path], root: Path = REPO) -> list[str]:
    text = FENCE.sub("", path.read_text())
    text = re.sub(r"`[^`\n]*`", "", text)           # a link in code is an example, not a link
    bad = []
    for url in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", url) or url.startswith("/"):
            continue
        target, _, anchor = url.partition("#")
        resolved = (path.parent / target).resolve() if target else path
        if not resolved.exists() and resolved not in generated:
            bad.append(f"{path.relative_to(root)}: {url} (no such file)")
        elif anchor and resolved.suffix == ".md" and resolved.exists() and anchor not in github_anchors(resolved):
            bad.append(f"{path.relative_to(root)}: {url} (no such heading)")
    return bad


def test_every_relative_link_in_the_markdown_resolves():
    generated = {(REPO / "docs" / page).resolve() for page in gen_cli.generated_pages()}
    files = markdown_files()
    assert REPO / "README.md" in files and any(f.parent == REPO / "docs" for f in files)
    bad = [b for f in files for b in broken_links(f, generated)]
    assert not bad, "\n".join(bad)


def test_the_link_check_catches_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[ok](page.md#title) [gone](nowhere.md) [bad anchor](page.md#nope)\n"
                    "```\n[in a fence](ignored.md)\n```\n")
    assert broken_links(page, set(), root=tmp_path) == [
        "page.md: nowhere.md (no such file)", "page.md: page.md#nope (no such heading)"]


def _subcommands(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield name, sub
                yield from _subcommands(sub)


@pytest.mark.parametrize("page", sorted(gen_cli.PAGES))
def test_the_cli_reference_holds_every_subcommand_and_flag_of_the_parsers(page):
    text = gen_cli.page_markdown(page)
    for _, factory in gen_cli.PAGES[page][2]:
        parser = factory()
        for p in [parser, *(sub for _, sub in _subcommands(parser))]:
            assert f"`{p.prog}`" in text, p.prog
            for action in p._actions:
                if action.help != argparse.SUPPRESS:
                    for flag in action.option_strings:
                        assert f"`{flag}" in text, (p.prog, flag)


def test_the_site_builds_with_strict(tmp_path):
    """The build CI runs: any warning (a link to a missing page or heading, a page outside the
    nav) fails it. About 3 s."""
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "cost" / "index.html").is_file()
    assert (tmp_path / "site" / "concepts" / "index.html").is_file()
