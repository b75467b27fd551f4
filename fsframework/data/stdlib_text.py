"""Standard-library text: the real English prose and Python code every Python install carries.

- Prose: the reference-manual topics shipped inside the standard library
  (`pydoc_data/topics.py`), then the docstrings of its source files.
- Code: the library's source files, whole.

Files are found through `sysconfig` and read in sorted order, so the text is
deterministic for one Python version. The embedded corpus (`fsframework.data.corpus`)
trains on it and the evaluation's natural-text haystack (`fsframework.eval.ruler`)
is cut from it.
"""

from __future__ import annotations

import ast
import sysconfig
from pathlib import Path


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_sources() -> list[Path]:
    """Every `.py` file of the standard library outside tests and site-packages, sorted."""
    root = stdlib_root()
    skip = ("site-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__")
    files = [p for p in root.rglob("*.py") if not any(part in skip for part in p.relative_to(root).parts)]
    return sorted(files)


def _docstrings(source: str) -> list[str]:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc and len(doc) > 80:
                out.append(doc)
    return out


def stdlib_prose(max_chars: int) -> list[str]:
    """English prose: the reference manual topics (pydoc_data), then docstrings; at most max_chars."""
    docs: list[str] = []
    total = 0
    try:
        from pydoc_data.topics import topics

        for key in sorted(topics):
            docs.append(topics[key].strip())
            total += len(docs[-1])
            if total >= max_chars:
                return docs
    except ImportError:
        pass
    for path in stdlib_sources():
        for doc in _docstrings(path.read_text(encoding="utf-8", errors="replace")):
            docs.append(doc)
            total += len(doc)
            if total >= max_chars:
                return docs
    return docs


def stdlib_code(max_chars: int) -> list[str]:
    """Source files of the standard library, whole, at most max_chars in total."""
    docs, total = [], 0
    for path in stdlib_sources():
        text = path.read_text(encoding="utf-8", errors="replace")
        docs.append(text)
        total += len(text)
        if total >= max_chars:
            break
    return docs
