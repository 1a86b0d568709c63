"""The search space of ``@fastdlight.autotune``: named values per parameter, constraints over
them (named by ``__name__`` or a lambda's source), and the points they accept (see
:mod:`fastdlight.search.autotune`)."""

from __future__ import annotations

import inspect
import itertools
import json
import linecache
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

from fastdlight.compiler.workers import one_line

#: a point of the space: (name, value) pairs in the space's order
Params = tuple[tuple[str, Any], ...]


class AutotuneError(ValueError):
    """Bad input to ``@autotune`` (one line, raised before anything is built)."""


def fmt_params(params: Params) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in params)


# -- the space ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Constraint:
    """A predicate over some of the space's parameters; ``name`` is its ``__name__``, or a
    lambda's source text (``bm * bn <= 128 * 128``)."""

    fn: Callable = field(repr=False, compare=False)
    name: str
    params: tuple[str, ...]  # the space parameters it is called with

    def accepts(self, point: Mapping[str, Any]) -> bool:
        return bool(self.fn(**{k: point[k] for k in self.params}))


@dataclass(frozen=True)
class Space:
    """Named values per parameter (a value list each, in the order given) and constraints."""

    params: tuple[tuple[str, tuple], ...]
    constraints: tuple[Constraint, ...] = ()

    @classmethod
    def of(cls, space, constraints: Sequence[Callable] = ()) -> Space:
        if not isinstance(space, Mapping):
            raise AutotuneError(f"autotune: the space must be a dict {{name: [values, ...]}}, "
                                f"got {type(space).__name__}")
        if not space:
            raise AutotuneError("autotune: the space is empty: give {name: [values, ...]} for at least one parameter")
        params = []
        for name, values in space.items():
            if not isinstance(name, str) or not name.isidentifier():
                raise AutotuneError(f"autotune: parameter name {name!r} is not a Python identifier")
            if hasattr(values, "tolist") and not isinstance(values, (str, bytes)):  # a numpy array
                values = values.tolist()
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
                raise AutotuneError(f"autotune: the values of {name!r} must be a list, got {type(values).__name__}")
            if not values:
                raise AutotuneError(f"autotune: parameter {name!r} has no values")
            params.append((name, tuple(values)))
        names = [n for n, _ in params]
        if callable(constraints):
            constraints = [constraints]
        return cls(tuple(params), tuple(_constraint(c, names) for c in constraints))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.params)

    @property
    def size(self) -> int:
        return math.prod(len(v) for _, v in self.params)

    def points(self) -> Iterator[Params]:
        for values in itertools.product(*(v for _, v in self.params)):
            yield tuple(zip(self.names, values))

    def rejection(self, params: Params) -> str | None:
        """Why a constraint rejects the point (None: every constraint accepts it)."""
        point = dict(params)
        for c in self.constraints:
            try:
                if not c.accepts(point):
                    return f"rejected by `{c.name}`"
            except Exception as e:  # noqa: BLE001 - a constraint that raises rejects the point
                return f"`{c.name}` raised {one_line(e)}"
        return None

    def to_json(self) -> dict:
        return {n: list(v) for n, v in self.params}

    def find(self, stored: Mapping[str, Any]) -> Params | None:
        """The point whose values have the JSON encoding of ``stored`` (a database record's)."""
        if set(stored) != set(self.names):
            return None
        found = []
        for name, values in self.params:
            want = json.dumps(stored[name], sort_keys=True)
            match = [v for v in values if json.dumps(v, sort_keys=True) == want]
            if not match:
                return None
            found.append((name, match[0]))
        return tuple(found)


def _constraint(fn, names: Sequence[str]) -> Constraint:
    if not callable(fn):
        raise AutotuneError(f"autotune: a constraint must be a callable of the space's parameters, got {fn!r}")
    name = _constraint_name(fn)
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return Constraint(fn, name, tuple(names))
    if any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
        return Constraint(fn, name, tuple(names))
    wanted = [p.name for p in sig.parameters.values() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = [p for p in wanted if p not in names]
    if unknown or any(p.kind in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL) for p in sig.parameters.values()):
        what = ", ".join(unknown) or "positional-only parameters"
        raise AutotuneError(f"autotune: constraint `{name}` names unknown parameter(s) {what}; "
                            f"the space has {', '.join(names)}")
    return Constraint(fn, name, tuple(wanted))


def _constraint_name(fn) -> str:
    """``fn.__name__``, or for a lambda the source text of its body (from the code's positions)."""
    name = getattr(fn, "__name__", "") or repr(fn)
    code = getattr(fn, "__code__", None)
    if name != "<lambda>" or code is None or not hasattr(code, "co_positions"):
        return name
    spans = [p for p in code.co_positions() if None not in p and not (p[0] == p[1] and p[2] == p[3] == 0)]
    lines = linecache.getlines(code.co_filename)
    if not spans or not lines:
        return f"lambda {', '.join(code.co_varnames[:code.co_argcount])}"
    (l0, c0), (l1, c1) = min((p[0], p[2]) for p in spans), max((p[1], p[3]) for p in spans)
    raw = [ln.encode() for ln in lines[l0 - 1:l1]]  # columns are UTF-8 byte offsets
    raw[-1] = raw[-1][:c1]
    raw[0] = raw[0][c0:]
    return " ".join(b"".join(raw).decode(errors="replace").split())
