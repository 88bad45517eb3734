"""Every relative link of the docs resolves: the file or folder exists, and its ``#anchor`` is a
heading there (or an ``<a id=...>``), by GitHub's rules for heading anchors."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from urllib.parse import unquote

import pytest

from paths import REPO_ROOT

PAGES = sorted(
    {
        REPO_ROOT / "README.md",
        *(REPO_ROOT / "docs").rglob("*.md"),
        *(REPO_ROOT / "docker").rglob("*.md"),
    }
)
FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target "title"), ![alt](target), and reference definitions: [name]: target
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.IGNORECASE)
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # http:, https:, mailto:


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """``(line number, text)`` outside fenced code blocks, inline code spans blanked."""
    lines = []
    fence = None
    for number, line in enumerate(path.read_text().splitlines(), 1):
        match = FENCE.match(line)
        if match and (fence is None or match.group(1).startswith(fence)):
            fence = None if fence else match.group(1)[:3]
            continue
        if fence is None:
            lines.append((number, CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)))
    return lines


def heading_text(markdown: str) -> str:
    """A heading's text as GitHub renders it: links, images, code marks and emphasis undone."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", markdown)
    text = text.replace("`", "")
    text = re.sub(r"(\*\*|__|\*)(.+?)\1", r"\2", text)
    return re.sub(r"<[^>]+>", "", text)


def slug(text: str) -> str:
    """GitHub's anchor of a heading: lower case; letters, digits, '-', '_' and spaces kept (each
    space a '-'), everything else dropped."""
    kept = []
    for char in heading_text(text).strip().lower():
        category = unicodedata.category(char)
        if char in "-_" or category[0] in "LNM":
            kept.append(char)
        elif char == " ":
            kept.append("-")
    return "".join(kept)


def anchors(path: Path) -> set[str]:
    """Every anchor of a page: its headings' (duplicates get -1, -2, ...) and HTML anchors."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in prose_lines(path):
        found.update(HTML_ANCHOR.findall(line))
    for _, line in _heading_lines(path):
        base = slug(line)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def _heading_lines(path: Path) -> list[tuple[int, str]]:
    raw = path.read_text().splitlines()
    headings = []
    for number, _ in prose_lines(path):
        match = HEADING.match(raw[number - 1])
        if match:
            headings.append((number, match.group(2)))
    return headings


def links(path: Path) -> list[tuple[int, str]]:
    """``(line, target)`` of every link and image of the page outside code."""
    found = []
    for number, line in prose_lines(path):
        found.extend((number, target) for target in INLINE_LINK.findall(line))
        match = REFERENCE.match(line)
        if match:
            found.append((number, match.group(1)))
    return found


def broken(path: Path, root: Path = REPO_ROOT) -> list[str]:
    """``file:line: target: why`` for each link of the page that does not resolve (``file``
    relative to ``root``)."""
    problems = []
    cache: dict[Path, set[str]] = {}
    for number, target in links(path):
        if EXTERNAL.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        destination = (path.parent / unquote(file_part)).resolve() if file_part else path
        where = f"{path.relative_to(root)}:{number}: {target}"
        if not destination.exists():
            problems.append(f"{where}: no such file")
            continue
        if anchor and destination.suffix == ".md":
            if destination not in cache:
                cache[destination] = anchors(destination)
            if unquote(anchor) not in cache[destination]:
                problems.append(f"{where}: no heading #{anchor} in {destination.name}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_relative_link_resolves(page):
    problems = broken(page)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("TLS at the gateway", "tls-at-the-gateway"),
        ("The gateway's cost (2026-12-03)", "the-gateways-cost-2026-12-03"),
        ("`python -m server`: flags", "python--m-server-flags"),
        ("perf_analyzer by hand", "perf_analyzer-by-hand"),
        ("The [gateway](x.md) & *limits*", "the-gateway--limits"),
        ("Mean ± SD, µs", "mean--sd-µs"),
    ],
)
def test_anchors_follow_githubs_rules(heading, anchor):
    assert slug(heading) == anchor


def test_duplicate_headings_get_numbered_anchors(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Results\n\n## Results\n\n```\n# not a heading\n```\n\n## Results\n")
    assert anchors(page) == {"results", "results-1", "results-2"}


def test_a_broken_link_is_reported_with_its_line(tmp_path):
    (tmp_path / "other.md").write_text("## TLS at the gateway\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#tls-at-the-gateway)\n[gone](other.md#tls)\n`[code](nowhere.md)`\n"
        "[missing](nowhere.md)\n"
    )
    assert broken(page, tmp_path) == [
        "page.md:2: other.md#tls: no heading #tls in other.md",
        "page.md:4: nowhere.md: no such file",
    ]
