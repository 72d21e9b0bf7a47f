"""Reading the project's input files (clusters, models, plans, problems, profiles, programs): one
place that turns every read or parse failure into an InvalidInputError naming the file and what is
wrong with it, so no bad file reaches the user as a traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import InvalidInputError

__all__ = ["read_json", "read_structured_file", "read_text"]


def read_text(path: str | Path) -> str:
    """A file's text; missing, unreadable (a folder, no permission), non-UTF-8 and empty files are
    input errors naming the file."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise InvalidInputError("file not found", source=str(p)) from None
    except OSError as err:
        raise InvalidInputError(f"cannot read file ({err.strerror})", source=str(p)) from None
    except UnicodeDecodeError as err:
        raise InvalidInputError(f"not a UTF-8 text file (undecodable byte at offset {err.start})",
                                source=str(p)) from None
    if not text.strip():
        raise InvalidInputError("file is empty", source=str(p))
    return text


def read_json(path: str | Path) -> Any:
    """A JSON file's value (:func:`read_text`'s errors, and a syntax error with its line and column)."""
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise InvalidInputError(f"invalid JSON at line {err.lineno} column {err.colno}: {err.msg}",
                                source=str(path)) from None


def read_structured_file(path: str | Path) -> Any:
    """A JSON file (``.json``) or else a YAML file, parsed; every failure an input error naming the file."""
    if Path(path).suffix.lower() == ".json":
        return read_json(path)
    text = read_text(path)
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise InvalidInputError(f"unreadable YAML{where}: {problem}", source=str(path)) from None
