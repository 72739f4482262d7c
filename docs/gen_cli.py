"""The CLI reference, generated from the commands' own argparse parsers at every docs build.

Run by mkdocs as a hook (``hooks:`` in mkdocs.yml): ``on_files`` adds one page a command under
``reference/`` to the site, written from ``build_parser()`` of each CLI, so the reference cannot
drift from the flags. ``on_page_markdown`` turns links that leave ``docs/`` for a file of the
repository (``../containers/gateway/gateway.example.yaml``) into the path in code, since the site
carries only ``docs/``; a link to a file that does not exist is left alone for mkdocs to refuse.

    python docs/gen_cli.py OUT_DIR        # the same pages as files, without mkdocs
"""
from __future__ import annotations

import argparse
import posixpath
import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
REPO = DOCS.parent


def _on_path() -> None:
    """The checkout and the images' packages, as the tests import them. Called at build time:
    mkdocs restores sys.path after loading a hook."""
    for folder in (REPO, REPO / "containers" / "byo-vllm", REPO / "containers" / "gateway"):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))


def _cost():
    from cost.__main__ import build_parser
    return build_parser("spectrum cost")


def _deploy():
    from options.deploy import build_parser
    return build_parser(None, "spectrum deploy")


def _bench():
    from options.bench.__main__ import build_parser
    return build_parser("spectrum bench")


def _agent():
    from options.agent.__main__ import build_parser
    return build_parser("spectrum agent")


def _check():
    from options.check import build_parser
    return build_parser("spectrum check")


def _gateway_serve():
    from spectrum_gateway.serve import build_parser
    return build_parser("spectrum gateway serve")


def _gateway_admin():
    from spectrum_gateway.admin import parser
    return parser("spectrum gateway admin")


# page → (title, what it is, [(module the user types, parser factory)])
PAGES = {
    "cost": ("spectrum cost", "`python -m cost`: prices, break-evens, capacity, simulation, recommendation, bills.",
             [("python -m cost", _cost)]),
    "deploy": ("spectrum deploy", "`python -m options.deploy`: every rung's flags, grouped by level.",
               [("python -m options.deploy", _deploy)]),
    "bench": ("spectrum bench", "`python -m options.bench`: TTFT / ITL / E2E / tok/s of any rung, trace replay.",
              [("python -m options.bench", _bench)]),
    "agent": ("spectrum agent", "`python -m options.agent`: the knowledge agent on any rung.",
              [("python -m options.agent", _agent)]),
    "check": ("spectrum check", "`python -m options.check`: what a level needs and whether it is there.",
              [("python -m options.check", _check)]),
    "gateway": ("spectrum gateway", "`containers/gateway/serve` and `containers/gateway/admin`.",
                [("containers/gateway/serve", _gateway_serve), ("containers/gateway/admin", _gateway_admin)]),
}


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _option_row(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    formatter = parser._get_formatter()
    if action.option_strings:
        metavar = formatter._format_args(action, action.dest.upper()) if action.nargs != 0 else ""
        name = ", ".join(f"`{o}{' ' + metavar if metavar else ''}`" for o in action.option_strings)
    else:
        name = f"`{formatter._metavar_formatter(action, action.dest)(1)[0]}`"
    help_text = formatter._expand_help(action) if action.help else ""
    extra = []
    if action.choices and not isinstance(action, argparse._SubParsersAction) and "{" not in name:
        extra.append("one of " + ", ".join(f"`{c}`" for c in action.choices))
    if (action.required and action.option_strings):
        extra.append("required")
    text = help_text + (f" ({'; '.join(extra)})" if extra else "")
    return f"| {_cell(name)} | {_cell(text) or ' '} |"


def _subparsers(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser, str]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            seen = set()
            for name, sub in action.choices.items():
                if id(sub) not in seen:
                    seen.add(id(sub))
                    out.append((name, sub, helps.get(name, "")))
    return out


def parser_markdown(parser: argparse.ArgumentParser, depth: int = 2, title: str | None = None,
                    summary: str = "") -> str:
    """One parser as markdown: its usage, description, each argument group as a table, then
    each subcommand the same way one heading down."""
    lines = [f"{'#' * depth} `{title or parser.prog}`", ""]
    if summary:
        lines += [summary[0].upper() + summary[1:] + ".", ""]
    if parser.description and parser.description != summary:
        lines += [parser.description, ""]
    lines += ["```text", parser.format_usage().strip(), "```", ""]
    for group in parser._action_groups:
        actions = [a for a in group._group_actions
                   if a.help != argparse.SUPPRESS and not isinstance(a, argparse._SubParsersAction)]
        if not actions:
            continue
        lines += [f"**{group.title}**" if group.title else "**options**", "", "| flag | what it does |",
                  "|---|---|"]
        lines += [_option_row(parser, a) for a in actions]
        lines.append("")
    if parser.epilog:
        lines += ["```text", parser.epilog.strip("\n"), "```", ""]
    for name, sub, help_text in _subparsers(parser):
        lines.append(parser_markdown(sub, depth + 1, summary=help_text))
    return "\n".join(lines)


def page_markdown(page: str) -> str:
    title, what, parsers = PAGES[page]
    lines = [f"# {title}", "", what + " Generated from the command's own parser at each docs build "
             f"(`docs/gen_cli.py`); `{title} --help` prints the same.", ""]
    for module, factory in parsers:
        lines.append(parser_markdown(factory(), 2))
    return "\n".join(lines)


def reference_index() -> str:
    rows = [f"| [{title}]({page}.md) | {what} |" for page, (title, what, _) in PAGES.items()]
    return "\n".join(["# CLI reference", "",
                      "Every command's flags, generated from its argparse parser. Each `spectrum "
                      "COMMAND` is the same parser as its `python -m` module.", "",
                      "| command | |", "|---|---|", *rows, ""])


def generated_pages() -> dict[str, str]:
    _on_path()
    pages = {"reference/index.md": reference_index()}
    pages.update({f"reference/{page}.md": page_markdown(page) for page in PAGES})
    return pages


# ---- mkdocs hooks ----------------------------------------------------------------------------

def on_files(files, config):
    from mkdocs.structure.files import File
    for path, text in generated_pages().items():
        files.append(File.generated(config, path, content=text))
    return files


LINK = re.compile(r"(?<!!)\[([^\]]+)\]\(([^)\s#]+)(#[^)\s]*)?\)")


def on_page_markdown(markdown, page, config, files):
    here = posixpath.dirname(page.file.src_uri)
    docs = Path(config["docs_dir"]).resolve()

    def outside(match: re.Match) -> str:
        text, target = match.group(1), match.group(2)
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            return match.group(0)
        resolved = (docs / here / target).resolve()
        if resolved.is_relative_to(docs) or not resolved.exists():
            return match.group(0)          # inside the site, or broken: mkdocs judges it
        path = resolved.relative_to(REPO).as_posix()
        return text if text.strip("`") == path else f"{text} (`{path}`)"
    return LINK.sub(outside, markdown)


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "reference-out")
    for path, text in generated_pages().items():
        (out / path).parent.mkdir(parents=True, exist_ok=True)
        (out / path).write_text(text)
        print(out / path)
