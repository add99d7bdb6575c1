"""The README's five-line store-and-recall example runs as written (against the live server)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

from conftest import KEY

from recollect_client import Client

README = Path(__file__).resolve().parents[1] / "README.md"


def test_store_and_recall_example(url):
    text = README.read_text()
    section = text[text.index("## Store and recall"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert len([line for line in code.splitlines() if line.strip()]) == 5
    code = code.replace('"http://127.0.0.1:8080"', repr(url)).replace('"KEY"', repr(KEY))
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, str(README), "exec"), {})
        assert "I painted a sunrise over the lake last week." in out.getvalue().splitlines()[0]
    finally:
        with Client(url, KEY) as c:
            c.delete_conversation("chat-1")
