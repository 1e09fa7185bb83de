"""The runbook and the background, rendered for the exporter's ``/docs/`` pages.

Served at ``/docs/runbook.md`` so that every card's ``runbook_url`` works without a docs host;
with it ``/docs/background.md``, the domain rules the runbook's sections link to.

The alert rules build the link as ``<runbook URL>#<alert name, lower case>``. The runbook URL is
Prometheus' external label ``grpo_runbook_url`` when it is set (a hosted copy of the repository,
an internal docs site), else ``config.DEFAULT_RUNBOOK_URL``: this exporter on its default port.
The pages are ``docs/<name>`` (packaged as ``grpo_monitor/runtime/<name>``, symbolic links in the
checkout) rendered to HTML with heading ids computed as GitHub computes them, so one fragment
works on both.

The renderer knows the Markdown these pages use (headings, paragraphs, lists, pipe tables,
fenced code, code spans, emphasis, links) and nothing more; everything is HTML-escaped.
"""

from __future__ import annotations

import functools
import html
import re
from importlib import resources

__all__ = ["LABEL", "PAGES", "PATH", "anchors", "page", "render_html", "slug",
           "source"]

PAGES = ("runbook.md", "background.md")  # served at /docs/<name>
PATH = "/docs/runbook.md"
LABEL = "grpo_runbook_url"  # Prometheus external label that overrides config.DEFAULT_RUNBOOK_URL

_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_FENCE = re.compile(r"^(\s*)(`{3,})\s*([\w+-]*)\s*$")
_ITEM = re.compile(r"^(\s*)([-*]|\d+\.)\s+(.*)$")
_RULE = re.compile(r"^\s*(?:-\s*){3,}$")
_TABLE_SEPARATOR = re.compile(r"^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")
_INLINE = re.compile(
    r"(?P<ticks>`+)(?P<code>.+?)(?P=ticks)"
    r"|\[(?P<text>[^\]]*)\]\((?P<href>[^)\s]*)\)"
    r"|\*\*(?P<strong>.+?)\*\*"
    r"|(?<![*\w])\*(?P<em>[^*\s](?:[^*]*[^*\s])?)\*(?![*\w])")


def source(name: str = "runbook.md") -> str | None:
    """A packaged page's Markdown; None when the install does not carry it."""
    if name not in PAGES:
        return None
    try:
        return (resources.files("grpo_monitor.runtime") / name).read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return None


def _plain(text: str) -> str:
    """A heading's text as a reader sees it: no code ticks, emphasis or link targets."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[`*]", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (letters, digits, ``_``,
    ``-`` and spaces stay), spaces become ``-``."""
    return re.sub(r"[^\w\- ]", "", _plain(heading).strip().lower()).replace(" ", "-")


def _headings(markdown: str) -> list[tuple[int, str, str]]:
    """(level, text, anchor) of every heading outside fenced code, with GitHub's ``-1``, ``-2``
    suffixes on repeated anchors."""
    seen: dict[str, int] = {}
    out: list[tuple[int, str, str]] = []
    fence: str | None = None
    for line in markdown.splitlines():
        m = _FENCE.match(line)
        if m and (fence is None or m.group(2) == fence):
            fence = None if fence else m.group(2)
            continue
        h = _HEADING.match(line) if fence is None else None
        if h:
            base = slug(h.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.append((len(h.group(1)), h.group(2), base if n == 0 else f"{base}-{n}"))
    return out


def anchors(markdown: str) -> list[str]:
    """Every heading anchor of a Markdown document, in order."""
    return [anchor for _, _, anchor in _headings(markdown)]


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


def _link(inner: str, href: str) -> str:
    if href.startswith("#") or re.match(r"https?://", href) or href.split("#")[0] in PAGES:
        return f'<a href="{_esc(href)}">{inner}</a>'
    # Another file of the repository: not served here, so say where it is instead of linking.
    return f'<span class="doc" title="docs/{_esc(href)}">{inner}</span>'


def _inline(text: str) -> str:
    out, pos = [], 0
    for m in _INLINE.finditer(text):
        out.append(_esc(text[pos:m.start()]))
        if m.group("ticks"):
            out.append(f"<code>{_esc(m.group('code').strip())}</code>")
        elif m.group("href") is not None:
            out.append(_link(_inline(m.group("text")), m.group("href")))
        elif m.group("strong") is not None:
            out.append(f"<strong>{_inline(m.group('strong'))}</strong>")
        else:
            out.append(f"<em>{_inline(m.group('em'))}</em>")
        pos = m.end()
    out.append(_esc(text[pos:]))
    return "".join(out)


def _cells(row: str) -> list[str]:
    row = row.strip()
    row = row[1:] if row.startswith("|") else row
    row = row[:-1] if row.endswith("|") and not row.endswith("\\|") else row
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", row)]


def _table(rows: list[str]) -> str:
    head, body = _cells(rows[0]), [_cells(r) for r in rows[2:]]
    parts = ["<table><thead><tr>", *(f"<th>{_inline(c)}</th>" for c in head),
             "</tr></thead><tbody>"]
    for cells in body:
        parts += ["<tr>", *(f"<td>{_inline(c)}</td>" for c in cells), "</tr>"]
    return "".join([*parts, "</tbody></table>"])


def render_html(markdown: str, title: str = "grpo-monitor runbook") -> bytes:
    """A self-contained page (inline CSS, no scripts) of ``markdown``."""
    ids = iter(_headings(markdown))
    lines = markdown.splitlines()
    body: list[str] = []
    open_list: str | None = None  # "ul" / "ol" while its items (and what they hold) follow
    i = 0

    def close_list() -> None:
        nonlocal open_list
        if open_list:
            body.append(f"</li></{open_list}>")
            open_list = None

    def paragraph_ends(line: str, first: bool) -> bool:
        return (not line.strip() or bool(_FENCE.match(line)) or bool(_HEADING.match(line))
                or (not first and bool(_ITEM.match(line))))

    while i < len(lines):
        line = lines[i]
        nested = line.startswith(" ") and open_list is not None  # inside the item above
        fence, heading, item = _FENCE.match(line), _HEADING.match(line), _ITEM.match(line)
        if not line.strip():
            i += 1
        elif fence:
            if not nested:
                close_list()
            indent, ticks, lang = fence.groups()
            code: list[str] = []
            i += 1
            while i < len(lines) and lines[i].strip() != ticks:
                raw = lines[i]
                code.append(raw[len(indent):] if raw.startswith(indent) else raw.lstrip())
                i += 1
            i += 1
            cls = f' class="language-{_esc(lang)}"' if lang else ""
            body.append(f"<pre><code{cls}>{_esc(chr(10).join(code))}</code></pre>")
        elif heading:
            close_list()
            level, text, anchor = next(ids)
            body.append(f'<h{level} id="{_esc(anchor)}">{_inline(text)}</h{level}>')
            i += 1
        elif _RULE.match(line):
            close_list()
            body.append("<hr>")
            i += 1
        elif (line.lstrip().startswith("|") and i + 1 < len(lines)
              and _TABLE_SEPARATOR.match(lines[i + 1])):
            if not nested:
                close_list()
            rows: list[str] = []
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                rows.append(lines[i])
                i += 1
            body.append(_table(rows))
        elif item and not item.group(1):
            marker, text = item.group(2), [str(item.group(3))]
            kind = "ul" if marker in "-*" else "ol"
            if open_list == kind:
                body.append("</li>")
            else:
                close_list()
                body.append(f"<{kind}>")
                open_list = kind
            i += 1
            while (i < len(lines) and lines[i].startswith(" ")
                   and not paragraph_ends(lines[i], False)):
                text.append(lines[i].strip())
                i += 1
            value = f' value="{marker[:-1]}"' if kind == "ol" else ""
            body.append(f"<li{value}>{_inline(' '.join(text))}")
        else:
            # A paragraph; an indented one (or a nested item) belongs to the item above it.
            if not nested:
                close_list()
            text = []
            while i < len(lines) and not paragraph_ends(lines[i], not text):
                text.append(lines[i].strip())
                i += 1
            body.append(f"<p>{_inline(' '.join(text))}</p>")
    close_list()
    style = ("body{font:15px/1.5 system-ui,sans-serif;max-width:60em;margin:1em auto;padding:0 1em}"
             "pre{background:#f5f5f5;padding:.5em;overflow-x:auto}code{font-size:90%}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .4em;"
             "vertical-align:top}.doc{text-decoration:underline dotted}")
    page_html = (f'<!doctype html><html><head><meta charset="utf-8"><title>{_esc(title)}</title>'
                 f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
    return page_html.encode("utf-8")


@functools.lru_cache(maxsize=len(PAGES))
def page(name: str = "runbook.md") -> bytes | None:
    """A packaged page as HTML, rendered once; None for another name, or when the install does
    not carry it."""
    markdown = source(name)
    if markdown is None:
        return None
    title = next((t for level, t, _ in _headings(markdown) if level == 1), name)
    return render_html(markdown, _plain(title))
