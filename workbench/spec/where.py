"""Where in a profile's text a key is written: ``{key path: line}`` from the TOML text
(tomllib keeps no positions), ``--set`` origins, and pydantic's errors as lines that name
the key, its line and the file.
"""

from __future__ import annotations

import re
import tomllib

from pydantic import ValidationError

from workbench.spec.schema import _FieldError


# --------------------------------------------------------------------------- loading
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


class _KeyLines:
    """Line of every key, table and array item of a TOML text, keyed by its path
    (``("task", "name")``, ``("sweep", "models", 1, "n_layers")``).

    Error messages need the line of the value that failed. A text search for the last key
    finds the first ``name =`` of the file whatever the table; this follows the document's
    structure (tables, arrays of tables, dotted keys, inline tables, arrays across lines).
    It runs only on text tomllib has accepted, so it need not diagnose anything."""

    def __init__(self, text: str):
        self.s, self.i, self.line = text, 0, 1
        self.lines: dict[tuple, int] = {}
        self.aot: dict[tuple, int] = {}  # array-of-tables path -> index of its last table

    def _adv(self, n: int = 1) -> None:
        self.line += self.s.count("\n", self.i, self.i + n)
        self.i += n

    def _skip(self, newlines: bool = False) -> None:
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c in " \t\r" or (newlines and c == "\n"):
                self._adv()
            elif c == "#":
                end = s.find("\n", self.i)
                self._adv((len(s) if end < 0 else end) - self.i)
            else:
                return

    def _record(self, path: tuple, line: int) -> None:
        for n in range(1, len(path) + 1):
            self.lines.setdefault(path[:n], line)

    def _string_end(self, j: int) -> int:
        """Index just past the string starting at ``j``."""
        s = self.s
        q = next(q for q in ('"""', "'''", '"', "'") if s.startswith(q, j))
        j += len(q)
        while not s.startswith(q, j):
            j += 2 if (s[j] == "\\" and q[0] == '"') else 1
        j += len(q)
        extra = 0  # a multi-line string's content may end in up to two of its quotes
        while len(q) == 3 and extra < 2 and s[j:j + 1] == q[0]:
            j, extra = j + 1, extra + 1
        return j

    def _key(self) -> tuple:
        parts: list[str] = []
        while True:
            self._skip()
            if self.s[self.i] in "\"'":
                end = self._string_end(self.i)
                parts.append(tomllib.loads(f"k = {self.s[self.i:end]}")["k"])
                self._adv(end - self.i)
            else:
                m = _BARE_KEY.match(self.s, self.i)
                parts.append(m.group())
                self._adv(m.end() - self.i)
            self._skip()
            if self.s.startswith(".", self.i):
                self._adv()
                continue
            return tuple(parts)

    def _value(self, path: tuple) -> None:
        s, c = self.s, self.s[self.i]
        if c in "\"'":
            self._adv(self._string_end(self.i) - self.i)
        elif c == "[":
            self._adv()
            k = 0
            while True:
                self._skip(newlines=True)
                if s[self.i] == "]":
                    self._adv()
                    return
                self._record(path + (k,), self.line)
                self._value(path + (k,))
                self._skip(newlines=True)
                if s[self.i] == ",":
                    self._adv()
                k += 1
        elif c == "{":
            self._adv()
            while True:
                self._skip(newlines=True)
                if s[self.i] == "}":
                    self._adv()
                    return
                self._pair(path)
                self._skip(newlines=True)
                if s[self.i] == ",":
                    self._adv()
        else:  # number, bool, date: up to the next separator
            m = re.compile(r"[^,\]}\n#]*").match(s, self.i)
            self._adv(m.end() - self.i)

    def _pair(self, table: tuple) -> None:
        line = self.line
        key = table + self._key()
        self._record(key, line)
        self._skip()
        self._adv()  # '='
        self._skip()
        self._value(key)

    def _resolve(self, key: tuple) -> tuple:
        """A header's path with the current index of each array of tables on it."""
        out: tuple = ()
        for part in key:
            out += (part,)
            if out in self.aot:
                out += (self.aot[out],)
        return out

    def scan(self) -> dict[tuple, int]:
        s, table = self.s, ()
        while True:
            self._skip(newlines=True)
            if self.i >= len(s):
                return self.lines
            line = self.line
            if s.startswith("[[", self.i):
                self._adv(2)
                key = self._key()
                base = self._resolve(key[:-1]) + key[-1:]
                self.aot[base] = self.aot.get(base, -1) + 1
                table = base + (self.aot[base],)
                self._skip()
                self._adv(2)
                self._record(table, line)
            elif s[self.i] == "[":
                self._adv()
                table = self._resolve(self._key())
                self._skip()
                self._adv()
                self._record(table, line)
            else:
                self._pair(table)


def _key_lines(text: str) -> dict[tuple, int]:
    """``{key path: line}`` of a TOML text (best effort: a text it cannot follow gives
    what it found so far, never an error in the middle of reporting one)."""
    scanner = _KeyLines(text)
    try:
        return scanner.scan()
    except Exception:
        return scanner.lines


class _Where:
    """Where a key's value came from, for messages: ``" (line N)"``, ``" (from --set K=V)"``."""

    def __init__(self, text: str, origins: dict[tuple, str] | None = None):
        self.lines = _key_lines(text)
        self.origins = origins or {}

    def with_origins(self, extra: dict[tuple, str]) -> "_Where":
        """The same lines, with more keys placed by origin (a grid value, a variant)."""
        w = _Where.__new__(_Where)
        w.lines, w.origins = self.lines, {**self.origins, **extra}
        return w

    def line(self, *loc) -> int | None:
        for n in range(len(loc), 0, -1):
            if loc[:n] in self.lines:
                return self.lines[loc[:n]]
        return None

    def __call__(self, *loc) -> str:
        # a value set on the command line has no line in the file: name the --set instead
        for n in range(len(loc), 0, -1):
            if loc[:n] in self.origins:
                return f" ({self.origins[loc[:n]]})"
        line = self.line(*loc)
        return f" (line {line})" if line else ""


_BRANCHES = ("str", "ModelChoice")  # pydantic's names for the two kinds of sweep.models item


def _format_loc(loc: tuple) -> str:
    parts: list[str] = []
    for p in loc:
        if isinstance(p, int):
            parts[-1] = f"{parts[-1]}[{p}]" if parts else f"[{p}]"
        elif p in _BRANCHES:
            continue
        else:
            parts.append(str(p))
    return ".".join(parts)


def _validation_message(err: ValidationError, path: str, where: _Where) -> str:
    lines = [f"{path}: invalid profile"]
    errors = err.errors()
    failed_as_table = {e["loc"][:-1] for e in errors if e["loc"][-1:] != ("str",)
                       and "ModelChoice" in e["loc"]}
    seen = set()
    for e in errors:
        loc = tuple(e["loc"])
        if loc[-1:] == ("str",) and any(t[:len(loc) - 1] == loc[:-1] for t in failed_as_table):
            continue  # a table item that failed as a table: "not a string" says nothing
        msg = e["msg"].removeprefix("Value error, ")
        cause = (e.get("ctx") or {}).get("error")
        if isinstance(cause, _FieldError):  # a table-level check about one of its keys
            loc = loc + (cause.key if isinstance(cause.key, tuple) else (cause.key,))
        if loc[-1:] == ("ModelChoice",):
            msg = 'expected a model name or a table { name = "..." }'
        key = _format_loc(loc)
        if (key, e["type"]) in seen:
            continue
        seen.add((key, e["type"]))
        clean = tuple(p for p in loc if p not in _BRANCHES)
        if e["type"] == "extra_forbidden":
            lines.append(f"  unknown key '{key}'{where(*clean)}")
        elif e["type"] == "missing":
            parent = where(*clean[:-1]) if len(clean) > 1 else ""
            lines.append(f"  missing key '{key}'{parent.replace(' (line', ' (in the table at line')}")
        else:
            got = e.get("input")
            shown = ("" if isinstance(got, dict) or isinstance(cause, _FieldError) or "got " in msg
                     else f"; got {got!r}")
            lines.append(f"  '{key}'{where(*clean)}: {msg}{shown}")
    return "\n".join(lines)

