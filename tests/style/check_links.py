#!/usr/bin/env python3
"""Fails when a relative link in the repository's Markdown does not resolve: to a file or folder
of the repository and, for `#anchor`, to a heading of the target, as GitHub names it (lowercase;
everything but letters, digits, spaces, '-' and '_' removed; each space a '-'; a repeated heading
gets -1, -2, ...). A link that leaves the repository (`../shared/...`) is refused too: a reader of
the repository cannot follow it.

    check_links.py [FILE.md ...]    (default: every *.md of the repository, build trees aside)

Python 3 standard library only. One line per broken link: FILE:LINE: broken link 'LINK': why."""

from __future__ import annotations

import os
import re
import sys
import unicodedata
from urllib.parse import unquote

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SKIP_DIRS = {".git", "node_modules"}

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
HTML_ID = re.compile(r"<a\s[^>]*\b(?:name|id)\s*=\s*[\"']([^\"']+)[\"']", re.I)
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target) or ![alt](target), target optionally in <>, optionally followed by a title.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)"
                         r"(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)")
REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def markdown_files(top: str) -> list[str]:
    found = []
    for root, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs
                         if d not in SKIP_DIRS and not d.startswith(("build", ".")))
        found += [os.path.join(root, f) for f in sorted(files) if f.endswith(".md")]
    return found


def prose_lines(text: str):
    """(line number, line) of every line outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
            continue
        if fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) \
                    and not line.strip()[len(m.group(1)):].strip():
                fence = None
            continue
        yield number, line


def heading_text(markdown: str) -> str:
    """The text GitHub renders for a heading's inline Markdown."""
    text = CODE_SPAN.sub(lambda m: m.group(2).strip(), markdown)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)     # a link or image: its text
    text = re.sub(r"<[^>]+>", "", text)                         # inline HTML
    text = re.sub(r"(\*+|\b_+|_+\b)(?=\S)(.+?)(?<=\S)\1", r"\2", text)  # emphasis
    return text.strip()


def slug(text: str) -> str:
    kept = "".join(c for c in text.lower()
                   if c in " -_" or unicodedata.category(c)[0] in "LMN" or unicodedata.category(c) == "Pc")
    return kept.replace(" ", "-")


def anchors(path: str, cache: dict[str, set[str]]) -> set[str]:
    if path in cache:
        return cache[path]
    with open(path, encoding="utf-8") as f:
        text = f.read()
    seen: dict[str, int] = {}
    names: set[str] = set()
    previous = None
    for _number, line in prose_lines(text):
        names.update(HTML_ID.findall(line))
        m = ATX.match(line)
        title = None
        if m:
            title = m.group(2) or ""
        elif previous and previous.strip() and SETEXT.match(line) and not ATX.match(previous) \
                and not previous.lstrip().startswith(("-", "*", ">", "|")):
            title = previous.strip()
        previous = line
        if title is None:
            continue
        base = slug(heading_text(title))
        name = base if base not in seen else f"{base}-{seen[base]}"
        seen[base] = seen.get(base, 0) + 1
        names.add(name)
    cache[path] = names
    return names


def links(paragraph: list[str]):
    """The link targets that end on the last line of PARAGRAPH (its lines so far: a link's text
    may wrap), code spans aside."""
    text = " ".join(paragraph)
    last = len(text) - len(paragraph[-1])
    text = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), text)
    for m in INLINE_LINK.finditer(text):
        if m.end() > last:
            yield m.group(1).strip("<>")
    m = REF_DEF.match(paragraph[-1])
    if m:
        yield m.group(1).strip("<>")


def check_link(source: str, target: str, cache: dict[str, set[str]]) -> str | None:
    """Why TARGET, linked from SOURCE, does not resolve; None when it does."""
    if not target or SCHEME.match(target) or target.startswith("//"):
        return None                                   # empty, or not relative: not ours to check
    path, _, anchor = target.partition("#")
    path = unquote(path.split("?", 1)[0])
    if path.startswith("/"):
        resolved = os.path.normpath(os.path.join(REPO, path.lstrip("/")))
    elif path:
        resolved = os.path.normpath(os.path.join(os.path.dirname(source), path))
    else:
        resolved = source
    if os.path.commonpath([resolved, REPO]) != REPO:
        return f"points outside the repository (to {resolved})"
    if not os.path.exists(resolved):
        return f"no such file: {os.path.relpath(resolved, REPO)}"
    if not anchor:
        return None
    if os.path.isdir(resolved) or not resolved.endswith(".md"):
        return f"an anchor into {os.path.relpath(resolved, REPO)}, which is not a Markdown file"
    if unquote(anchor).lower() not in anchors(resolved, cache):
        return f"no heading with anchor #{anchor} in {os.path.relpath(resolved, REPO)}"
    return None


def main(argv: list[str]) -> int:
    files = [os.path.abspath(f) for f in argv] or markdown_files(REPO)
    cache: dict[str, set[str]] = {}
    broken = checked = 0
    for source in files:
        with open(source, encoding="utf-8") as f:
            text = f.read()
        paragraph: list[str] = []
        previous = 0
        for number, line in prose_lines(text):
            # a paragraph: lines of prose one after another, no blank line or code between
            paragraph = paragraph + [line] if line.strip() and number == previous + 1 else [line]
            previous = number
            for target in links(paragraph):
                checked += 1
                why = check_link(source, target, cache)
                if why:
                    broken += 1
                    print(f"{os.path.relpath(source, REPO)}:{number}: broken link '{target}': {why}")
    if broken:
        print(f"check_links: {broken} broken link(s) of {checked} in {len(files)} file(s); "
              f"fix the link or the heading it names (anchors as GitHub makes them: lowercase, "
              f"punctuation but '-' and '_' removed, spaces to '-', repeats -1, -2)")
        return 1
    print(f"check_links: {checked} links in {len(files)} Markdown files resolve")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
