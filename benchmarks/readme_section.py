"""Write one benchmark's section into benchmarks/README.md between its begin/end markers."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent / "README.md"


def write_section(begin: str, end: str, body: str, path: Path = README) -> None:
    """Replace the text from ``begin`` to ``end`` (inclusive) with ``body`` — which must itself start
    with ``begin`` and end with ``end`` — or append ``body`` when the markers are absent. The file is
    read right before writing, so sections written by other benchmarks in between are kept."""
    text = path.read_text() if path.exists() else "# hexhelix benchmarks\n"
    if begin in text and end in text:
        text = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: body, text, flags=re.S)
    else:
        text = text.rstrip("\n") + "\n\n" + body + "\n"
    path.write_text(text)
