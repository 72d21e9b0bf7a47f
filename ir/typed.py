"""Building the IR's frozen dataclasses from parsed JSON with every field checked against its
annotation: a file holding a value of the wrong kind is an input error that names the value's
place, not a TypeError deep inside whatever reads it later."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, TypeVar, get_args, get_origin, get_type_hints

from .checks import finite_number
from .errors import InvalidInputError

__all__ = ["build", "checked", "mapping"]

T = TypeVar("T")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """The annotation of each field ``cls(...)`` takes."""
    hints = get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


def checked(value: Any, tp: Any, where: str) -> Any:
    """``value`` if it is of type ``tp`` (bool, int, float: any finite number, str, and tuples of
    these, read from JSON lists); other annotations are left to the caller's own checks."""
    if tp is bool:
        if not isinstance(value, bool):
            raise InvalidInputError(f"must be true or false, got {value!r}", field=where)
    elif tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidInputError(f"must be an integer, got {value!r}", field=where)
    elif tp is float:
        if not finite_number(value):
            raise InvalidInputError(f"must be a finite number, got {value!r}", field=where)
    elif tp is str:
        if not isinstance(value, str):
            raise InvalidInputError(f"must be a string, got {value!r}", field=where)
    elif get_origin(tp) is tuple:
        args = get_args(tp)
        if not isinstance(value, list | tuple):
            raise InvalidInputError(f"must be a list, got {value!r}", field=where)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(checked(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise InvalidInputError(f"must be a list of {len(args)}, got {value!r}", field=where)
        return tuple(checked(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    return value


def build(cls: type[T], data: Any, where: str, **given: Any) -> T:
    """``cls(**data)`` with each field of ``data`` :func:`checked` against ``cls``'s annotation;
    ``given`` holds fields the caller has already turned into their types (they win over ``data``).
    Unknown and missing fields are input errors naming ``where`` and the field."""
    if not isinstance(data, dict):
        raise InvalidInputError(f"must be an object, got {data!r}", field=where)
    hints = _hints(cls)
    kw = dict(given)
    for key, value in data.items():
        if key in given:
            continue
        if key not in hints:
            raise InvalidInputError("unknown field", field=f"{where}.{key}")
        kw[key] = checked(value, hints[key], f"{where}.{key}")
    for f in dataclasses.fields(cls):
        if (f.init and f.name not in kw and f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING):
            raise InvalidInputError("missing required field", field=f"{where}.{f.name}")
    return cls(**kw)


def mapping(value: Any, where: str) -> dict[str, Any]:
    """A free-form object field (``meta``) as a new dict: absent or null is empty, anything but an
    object an input error naming ``where``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInputError(f"must be an object, got {value!r}", field=where)
    return dict(value)
