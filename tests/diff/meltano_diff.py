"""Differential test: `meltano state` (Meltano 4.4.1, default systemdb/SQLite state backend, in a
temporary Meltano project) against our CLI's `state` command (a fresh `--state-database` on the
ClickHouse named by CLICKHOUSE_URL), driven by one seeded sequence of operations.

Run under scripts/with-clickhouse (it sets CLICKHOUSE_URL, CLICKHOUSE_USER, CLICKHOUSE_PASSWORD):

    scripts/with-clickhouse .venv-meltano/bin/python tests/diff/meltano_diff.py \
        [--seed N] [--ops N] [--keep-going] [--cli-every K]

Any Python works as the launcher: without Meltano importable it runs scripts/meltano-venv when
.venv-meltano is missing and re-executes itself with .venv-meltano/bin/python.

Every step runs the same arguments (after `state`) through both tools: Meltano's CLI syntax
(`set --force ID STATE`, `merge ID STATE`, `merge --from-state-id SRC ID`, `--input-file F`,
`edit [--force] ID` with EDITOR=`cp FILE` or `true`, `clear --force ID`, `clear --all --force`,
`list --pattern P`, `copy/move --force SRC DST`, `get ID`, `export`, `import [FILE|-]`). Ours is `CLI state --state-database DB <args>`.

How Meltano is run: its real click CLI (`meltano.cli.main()`, with sys.argv/stdin/stdout
swapped) in this process, with the project deactivated before each call so every call finds the
project afresh, like a new process; Meltano's startup is ~1.9 s per process, the in-process call
~50 ms (after the first call it skips the per-call "is a migration needed" check of the system
database, which the first call migrated). Every K-th step (--cli-every, default 25) runs the real `meltano` executable instead; when
that step does not write (get, list, export) it is run in-process too and the two must agree
(a mismatch is a harness failure, "in-process runner != meltano executable").

Compared after each step:
- the exit code, exactly;
- stdout. Normalised only thus: `get` and `export` output is compared as JSON values when both
  sides print one JSON document (object key order and whitespace ignored; numbers compared by
  exact decimal value and kind: 1 != 1.0, -0.0 != 0.0, 1E5 == 100000.0, ints of any size exact,
  NaN/Infinity as themselves); `list` output is compared as a sorted list of lines (Meltano's
  order is SQLite's unordered SELECT). Everything else (and JSON that does not parse) is compared
  byte for byte. stderr is never compared (Meltano logs there). `--strict-text` turns the
  normalisation off.
- the full state of both stores: Meltano's from StateService.export_state() in process (what
  its `export` command prints, without the CLI's startup), ours with its `export` command (read
  as either one JSON
  object {id: {completed, partial}} or NDJSON/array of {id, partial, completed}), compared as
  JSON values as above.

After a step whose stores differ, the ids that differ are cleared in both (Meltano through its
StateService, ours with `clear --force ID`, falling back to `clear ID`) so that later steps start
from equal stores and one difference does not fail every later step.

Declared differences (EXPECTED): where ours differs from Meltano on purpose, a rule says what
ours must do instead (e.g. refuse a duplicate key with exit 1 and write nothing; keep a state
on `move X X`; list exactly the ids its glob matches); a step that differs passes only if one
rule explains it and ours did exactly that. Numbers Meltano rounded stay in both stores (later
steps merge over them) and compare equal when Meltano's is the float of ours.

Prints one line per failing step (and, with DIFF_VERBOSE=1, every step), a summary of the
distinct differences, then `N passed, N failed`; exits 1 on any failure. Without --keep-going it
stops at the first failing step. DIFF_KEEP=1 keeps the Meltano project and ours' database;
DIFF_DEBUG=1 prints why each differing step was or was not explained.
"""

from __future__ import annotations

import argparse
import copy
import decimal
import fnmatch
import io
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import unicodedata
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI = os.environ.get("DIFF_CLI", os.path.join(ROOT, "target", "debug", "clickhouse-component"))
VENV = os.environ.get("MELTANO_VENV", os.path.join(ROOT, ".venv-meltano"))
URL = os.environ.get("CLICKHOUSE_URL", "").rstrip("/")
USER = os.environ.get("CLICKHOUSE_USER") or "default"
PASSWORD = os.environ.get("CLICKHOUSE_PASSWORD", "")
MAX_ID_BYTES = 1024  # ours (src/state/mod.rs); Meltano's SQLite state_id has no limit
# Meltano runs with Python's default recursion limit (as the `meltano` executable does: it decides
# how deep a state Meltano can read); the harness' own recursive helpers get more.
MELTANO_RECURSION_LIMIT = sys.getrecursionlimit()
HARNESS_RECURSION_LIMIT = 50_000
MELTANO_ENV = {
    "MELTANO_SEND_ANONYMOUS_USAGE_STATS": "false",
    "MELTANO_DISABLE_TRACKING": "true",
    "MELTANO_CLI_LOG_LEVEL": "info",
    "NO_COLOR": "1",
}


def ensure_meltano() -> None:
    """Re-execute with .venv-meltano's Python unless Meltano is importable here."""
    try:
        import meltano  # noqa: F401
        return
    except ImportError:
        pass
    python = os.path.join(VENV, "bin", "python")
    if not os.path.exists(os.path.join(VENV, ".meltano-4.4.1")):
        subprocess.run([os.path.join(ROOT, "scripts", "meltano-venv")], check=True)
    os.execv(python, [python, os.path.abspath(__file__), *sys.argv[1:]])


# ---------------------------------------------------------------------------------------------
# ClickHouse over plain HTTP (setup and teardown only)
# ---------------------------------------------------------------------------------------------


def ch(sql: str, params: dict[str, str] | None = None) -> str:
    query = {"query": sql}
    query.update({f"param_{k}": v for k, v in (params or {}).items()})
    request = urllib.request.Request(
        f"{URL}/?{urllib.parse.urlencode(query)}", data=b"", method="POST",
        headers={"X-ClickHouse-User": USER, "X-ClickHouse-Key": PASSWORD})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.read().decode()
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"HTTP {e.code}: {e.read().decode(errors='replace').strip()}") from None


# ---------------------------------------------------------------------------------------------
# JSON as values: exact numbers, kinds kept apart
# ---------------------------------------------------------------------------------------------


class Const(str):
    """NaN, Infinity, -Infinity (Python's json reads and writes them; JSON has none)."""


def loads(text: str) -> Any:
    return json.loads(text, parse_float=decimal.Decimal, parse_constant=Const)


def same(a: Any, b: Any, rounding: bool = False) -> bool:
    """Equal JSON values (see loads). With `rounding`, a number `b` (ours) also matches the
    `a` (Meltano's) that Python's float makes of it (the declared number difference)."""
    if rounding and isinstance(b, decimal.Decimal) and isinstance(a, (decimal.Decimal, Const)) \
            and not same(a, b) and float_of(b, a):
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k], rounding) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y, rounding) for x, y in zip(a, b))
    if isinstance(a, decimal.Decimal):
        if a.is_nan() or b.is_nan():
            return a.is_nan() and b.is_nan()
        return a == b and a.is_signed() == b.is_signed()
    return a == b


def float_of(exact: decimal.Decimal, value: Any) -> bool:
    """Whether `value` is what Python's json makes of the number text `exact`: the nearest
    float (1.0000000000000000001 -> 1.0), Infinity past the float range (1e400)."""
    if exact.is_nan():
        return False
    f = float(exact)
    if math.isinf(f):
        return isinstance(value, Const) and str(value) == ("Infinity" if f > 0 else "-Infinity")
    want = decimal.Decimal(repr(f))
    return isinstance(value, decimal.Decimal) and not value.is_nan() and value == want \
        and value.is_signed() == want.is_signed()


def first_diff(a: Any, b: Any, path: str = "") -> str:
    """Where two JSON values first differ: `path: a vs b`."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            if k not in a or k not in b or not same(a[k], b[k]):
                if k not in a or k not in b:
                    return f"{path}/{k}: {'<absent>' if k not in a else short(dump(a[k]), 50)} vs " \
                           f"{'<absent>' if k not in b else short(dump(b[k]), 50)}"
                return first_diff(a[k], b[k], f"{path}/{k}")
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            if not same(x, y):
                return first_diff(x, y, f"{path}/{i}")
    return f"{path or '/'}: {short(dump(a), 50)} vs {short(dump(b), 50)}"


class Raw(str):
    """A JSON literal written as is (number spellings, escapes, NaN...)."""


def dump(v: Any) -> str:
    if isinstance(v, Raw):
        return str(v)
    if isinstance(v, dict):
        return "{" + ",".join(f"{dump(k) if isinstance(k, Raw) else json.dumps(k, ensure_ascii=False)}:"
                              f"{dump(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ",".join(dump(x) for x in v) + "]"
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, Const):
        return str(v)
    return json.dumps(v, ensure_ascii=False)


def parse_export(text: str) -> dict | None:
    """An export as {id: {"completed", "partial"}}: Meltano's one object, or NDJSON lines / an
    array of {"id", "partial", "completed"} (ours before the change). None: unreadable."""
    text = text.strip()
    if not text:
        return {}
    try:
        doc = loads(text)
        docs = doc if isinstance(doc, list) else [doc]
    except json.JSONDecodeError:
        try:
            docs = [loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError:
            return None
    if len(docs) == 1 and isinstance(docs[0], dict) and not (set(docs[0]) >= {"id", "completed"}):
        return docs[0]
    out = {}
    for d in docs:
        if not isinstance(d, dict) or "id" not in d:
            return None
        out[d["id"]] = {"completed": d.get("completed"), "partial": d.get("partial")}
    return out


# ---------------------------------------------------------------------------------------------
# The two tools
# ---------------------------------------------------------------------------------------------


@dataclass
class Out:
    code: int
    stdout: str
    stderr: str


class Meltano:
    def __init__(self, project: str):
        self.project = project
        os.environ.update(MELTANO_ENV)
        os.environ["MELTANO_PROJECT_ROOT"] = project
        import meltano.cli as mcli
        from meltano.core.project import Project
        self.mcli, self.Project = mcli, Project
        self.out, self.err = io.BytesIO(), io.BytesIO()
        self.outw = io.TextIOWrapper(self.out, encoding="utf-8", write_through=True)
        self.errw = io.TextIOWrapper(self.err, encoding="utf-8", write_through=True)
        self.keep: list = []  # stdin wrappers (a collected wrapper closes its buffer)
        self._project = None
        self.calls = 0

    def run(self, args: list[str], stdin: str = "", env: dict[str, str] | None = None) -> Out:
        """The real click CLI, in this process (`env` set in os.environ for the call)."""
        if self.calls == 1:
            # The first call migrated the new project's system database; later calls skip
            # Meltano's per-call check that no migration is needed (alembic re-reads its scripts:
            # ~65 ms of the ~115 ms a call takes). The `meltano` executable steps still check.
            from meltano.core.migration_service import MigrationService
            MigrationService.upgrade = lambda self, *, silent=False: None  # type: ignore[method-assign]
        self.calls += 1
        self.Project.deactivate()
        saved = sys.stdout, sys.stderr, sys.stdin, sys.argv
        sys.setrecursionlimit(MELTANO_RECURSION_LIMIT)
        o0, e0 = self.out.tell(), self.err.tell()
        sys.stdout, sys.stderr = self.outw, self.errw
        sys.stdin = io.TextIOWrapper(io.BytesIO(stdin.encode("utf-8", "surrogatepass")), encoding="utf-8")
        self.keep.append(sys.stdin)
        sys.argv = ["meltano", "state", *args]
        saved_env = {k: os.environ.get(k) for k in (env or {})}
        os.environ.update(env or {})
        code = 0
        try:
            self.mcli.main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException as e:  # noqa: BLE001 - report, never crash the harness
            code = 1
            self.errw.write(f"harness: uncaught {type(e).__name__}: {e}")
        finally:
            self.outw.flush()
            self.errw.flush()
            sys.stdout, sys.stderr, sys.stdin, sys.argv = saved
            sys.setrecursionlimit(HARNESS_RECURSION_LIMIT)
            for k, v in saved_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        return Out(code, self.out.getvalue()[o0:].decode("utf-8", "replace"),
                   self.err.getvalue()[e0:].decode("utf-8", "replace"))

    def run_process(self, args: list[str], stdin: str = "", extra: dict[str, str] | None = None) -> Out:
        """The `meltano` executable."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("CLICKHOUSE_")}
        env.update(MELTANO_ENV, MELTANO_PROJECT_ROOT=self.project)
        env.update(extra or {})
        p = subprocess.run([os.path.join(os.path.dirname(sys.executable), "meltano"), "state", *args],
                           input=stdin.encode("utf-8", "surrogatepass"), capture_output=True,
                           env=env, cwd=self.project, timeout=120)
        return Out(p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace"))

    def service(self, fn):  # noqa: ANN001, ANN201
        """fn(StateService) on a fresh session (Meltano's own service, no CLI)."""
        from meltano.core.db import project_engine
        from meltano.core.state_service import StateService
        if self._project is None:
            self.Project.deactivate()
            self._project = self.Project.find()
            self.Project.deactivate()
        _, sessionmaker = project_engine(self._project)
        session = sessionmaker(future=True)
        sys.setrecursionlimit(MELTANO_RECURSION_LIMIT)
        try:
            with StateService(self._project, session) as service:
                return fn(service)
        finally:
            session.close()
            sys.setrecursionlimit(HARNESS_RECURSION_LIMIT)

    def export(self) -> Out:
        """What `meltano state export` prints, from StateService.export_state() (the CLI's
        own call) without the CLI's ~100 ms of project loading."""
        try:
            states = self.service(lambda s: s.export_state())
            return Out(0, json.dumps(states, separators=(",", ":")) + "\n", "")
        except Exception as e:  # noqa: BLE001
            return Out(1, "", f"{type(e).__name__}: {e}")

    def clear_ids(self, ids: list[str]) -> None:
        self.service(lambda s: [s.clear_state(i) for i in ids])


class Ours:
    def __init__(self, database: str):
        self.database = database
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("CLICKHOUSE_", "MELTANO_"))}
        self.env.update(CLICKHOUSE_URL=URL, CLICKHOUSE_USER=USER, CLICKHOUSE_PASSWORD=PASSWORD)

    def run(self, args: list[str], stdin: str = "", env: dict[str, str] | None = None) -> Out:
        p = subprocess.run([CLI, "state", "--state-database", self.database, *args],
                           input=stdin.encode("utf-8", "surrogatepass"), capture_output=True,
                           env={**self.env, **(env or {})}, timeout=120)
        return Out(p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace"))

    def clear_ids(self, ids: list[str]) -> None:
        for i in ids:
            if self.run(["clear", "--force", i]).code != 0:
                self.run(["clear", i])


# ---------------------------------------------------------------------------------------------
# The generated operations
# ---------------------------------------------------------------------------------------------

SPECIAL_IDS = [
    "tap-a", "tap-b", "Tap-A", "TAP-A",
    "dev:tap-github-to-target-postgres", "dev:tap-x-to-target-y:suffix", "prod:tap-a-to-target-b",
    "nope:tap-a-to-target-b",
    "a_b", "axb", "a%b", "a%%b", "a*b", "a?b", "a[b]c", "ab]", "a[!x]b", "it's", 'say "hi"',
    "back\\slash", "\\%", "a b", "  lead-space", "trail-space ", "ünï-çødé", "日本語の状態",
    "emoji-🎉", "e\u0301", "שלום", "x" * MAX_ID_BYTES, "x" * (MAX_ID_BYTES + 1),
    "é" * (MAX_ID_BYTES // 2), "é" * (MAX_ID_BYTES // 2 + 1), "🎉" * (MAX_ID_BYTES // 4),
    "y" * 5000,
]
RARE_IDS = ["", "tab\there"]
PATTERNS = [
    "*", "tap*", "tap-?", "*_*", "a_b", "a%b", "%", "_", "a?b", "a[b]c", "[at]*", "[!t]*", "*\\*",
    "dev:*", "DEV:*", "*tap*", "*é*", "*🎉", "x*", "it's", "*\"*", "back\\slash", "TAP-*", "a*b",
    "nomatch*", "?",
]
NUMBERS = [
    "0", "1", "-1", "9007199254740993", "9223372036854775807", "9223372036854775808",
    "18446744073709551615", "18446744073709551616", "-9223372036854775809",
    "123456789012345678901234567890", "-10000000000000000000000000000000000000000",
    "1e300", "1E300", "-0.0", "-0", "0.0", "0.1", "1E5", "1e5", "1E+5", "2.5E-3", "1e-7",
    "1.7976931348623157e308", "5e-324", "1.0000000000000000001", "100.000", "3.14159265358979323846",
    repr(0.1 + 0.2), repr(1 / 3), repr(2.0 ** 70), "1.5e+10", "123456789012345678901234567890.5",
]
RARE_LITERALS = ["1e400", "-1e400", "NaN", "Infinity", '"\\ud800"', '"nul\\u0000char"']
STRINGS = ["", "x", "2024-01-01T00:00:00Z", "ünïcødé", "日本", "🎉", "quote\"back\\slash",
           "line\nbreak", "tab\t", "\u2028sep", "<>&'"]


@dataclass
class Step:
    n: int
    kind: str  # the label used for grouping
    args: list[str]
    stdin: str = ""
    files: dict[str, str] = field(default_factory=dict)  # name -> content (written before the step)
    writes: bool = True
    ids: list[str] = field(default_factory=list)  # the state ids it names
    inputs: list[str] = field(default_factory=list)  # the JSON texts it gives (argument, file, stdin, editor)
    env: dict[str, str] = field(default_factory=dict)  # extra environment (EDITOR)


class Generator:
    def __init__(self, rng: random.Random, tmp: str):
        self.rng = rng
        self.tmp = tmp
        self.seen: list[str] = []
        self.file_no = 0
        self.big_done = False
        self.history: list[dict[str, str]] = []  # each step's exports (import sources)

    # -- values ------------------------------------------------------------------------------
    def scalar(self) -> Any:
        r = self.rng.random()
        if r < 0.45:
            return Raw(self.rng.choice(NUMBERS))
        if r < 0.47:
            return Raw(self.rng.choice(RARE_LITERALS))
        if r < 0.75:
            return self.rng.choice(STRINGS)
        if r < 0.85:
            return self.rng.choice([True, False, None])
        return [Raw(self.rng.choice(NUMBERS)), self.rng.choice(STRINGS)]

    def tree(self, depth: int) -> Any:
        if depth <= 0 or self.rng.random() < 0.3:
            return self.scalar()
        return {self.rng.choice(["a", "b", "c", "replication_key_value", "ü", "x.y", ""]):
                self.tree(depth - 1) for _ in range(self.rng.randint(0, 3))}

    def bookmarks(self) -> dict:
        streams = self.rng.sample(["users", "orders", "events", "schema.tbl", "ünï"], self.rng.randint(0, 3))
        return {s: {"replication_key": "updated_at", "replication_key_value": self.scalar(),
                    "extra": self.tree(3)} for s in streams}

    def state(self, existing: Any = None) -> str:
        """A valid (singer_state at the top) state's JSON text; sometimes shaped like `existing`
        so that merges meet objects with scalars and scalars with objects."""
        r = self.rng.random()
        singer: dict = {"bookmarks": self.bookmarks()}
        if r < 0.06:
            d = self.rng.choice([50, 127, 128, 129, 300, 600])
            deep: Any = Raw("1")
            for _ in range(d):
                deep = {"d": deep}
            singer["deep"] = deep
        elif r < 0.09:
            singer["big"] = "x" * self.rng.choice([1000, 30000, 100000])
        elif r < 0.12:
            singer["list"] = [self.tree(2) for _ in range(50)]
        doc: dict = {"singer_state": singer}
        if existing and isinstance(existing, dict) and self.rng.random() < 0.5:
            doc = self.conflict(existing)
        if self.rng.random() < 0.15:
            doc[self.rng.choice(["extra", "completed", "partial", "bookmarks"])] = self.tree(2)
        text = dump(doc)
        if self.rng.random() < 0.03:  # a duplicate key
            text = text.replace('{"singer_state":{', '{"singer_state":{"dup":1,"dup":2,', 1)
        return text

    def conflict(self, existing: dict) -> dict:
        """A state over `existing`'s keys with some values swapped between object and scalar."""
        def walk(v: Any, depth: int) -> Any:
            if isinstance(v, dict):
                if depth > 0 and self.rng.random() < 0.2:
                    return self.scalar()
                if self.rng.random() < 0.1:
                    return {}
                return {k: walk(x, depth + 1) for k, x in v.items() if self.rng.random() < 0.7}
            if self.rng.random() < 0.3:
                return {"was_scalar": self.scalar()}
            return self.scalar()
        doc = walk(existing, 0)
        if not isinstance(doc, dict):
            doc = {}
        doc.setdefault("singer_state", {"bookmarks": self.bookmarks()})
        return doc

    def invalid_state(self) -> str:
        return self.rng.choice([
            '{"bookmarks":{"s":{"v":1}}}', "{}", '{"Singer_State":{}}', '{"x":{"singer_state":{}}}',
            "[1]", "5", "null", '"singer_state"', "{", "", '{"singer_state":1,}', "[]",
            '{"completed":{"singer_state":{}}}', '{"singer_state": {}} trailing',
        ])

    # -- ids -----------------------------------------------------------------------------------
    def new_id(self) -> str:
        r = self.rng.random()
        if r < 0.5:
            i = self.rng.choice(SPECIAL_IDS)
        elif r < 0.52:
            i = self.rng.choice(RARE_IDS)
        else:
            i = f"{self.rng.choice(['dev', 'prod'])}:tap-{self.rng.randint(1, 40)}-to-target-{self.rng.choice('pq')}"
        return i

    def pick_id(self, existing: list[str]) -> str:
        if existing and self.rng.random() < 0.65:
            return self.rng.choice(existing)
        return self.new_id()

    def file(self, content: str) -> tuple[str, dict[str, str]]:
        self.file_no += 1
        path = os.path.join(self.tmp, f"input-{self.file_no}.json")
        return path, {path: content}

    # -- steps ---------------------------------------------------------------------------------
    def step(self, n: int, store: dict, exports: dict[str, str]) -> Step:
        """One operation; `store` is Meltano's current export (the reference), `exports` each
        tool's last export text (for import steps)."""
        ids = sorted(store)
        rng = self.rng
        kinds = [("set", 18), ("set-file", 3), ("merge", 14), ("merge-from", 4), ("merge-file", 2),
                 ("get", 14), ("list", 9), ("clear", 5), ("clear-all", 2), ("copy", 6), ("move", 5),
                 ("export", 5), ("import", 7), ("set-invalid", 3), ("merge-invalid", 2),
                 ("usage", 2), ("big", 1), ("edit", 4)]
        kind = rng.choices([k for k, _ in kinds], [w for _, w in kinds])[0]
        if kind == "big" and self.big_done:
            kind = "set-file"
        merged = lambda i: merged_exact(store.get(i))  # noqa: E731
        if kind == "set":
            i = self.pick_id(ids)
            text = self.state(merged(i))
            return Step(n, "set", ["set", "--force", i, text], ids=[i], inputs=[text])
        if kind == "set-file":
            i = self.pick_id(ids)
            text = self.state(merged(i))
            path, files = self.file(text)
            return Step(n, "set --input-file", ["set", "--force", "--input-file", path, i], files=files,
                        ids=[i], inputs=[text])
        if kind == "big":
            self.big_done = True
            size = rng.choice([2 * 1024 * 1024, 11 * 1024 * 1024])
            text = dump({"singer_state": {"big": "x" * size}})
            path, files = self.file(text)
            i = self.pick_id(ids)
            return Step(n, f"set --input-file ({size >> 20} MiB)", ["set", "--force", "--input-file", path, i],
                        files=files, ids=[i], inputs=[text])
        if kind == "merge":
            i = self.pick_id(ids)
            text = self.state(merged(i))
            return Step(n, "merge", ["merge", i, text], ids=[i], inputs=[text])
        if kind == "merge-from":
            src, dst = self.pick_id(ids), self.pick_id(ids)
            return Step(n, "merge --from-state-id", ["merge", "--from-state-id", src, dst], ids=[src, dst])
        if kind == "merge-file":
            i = self.pick_id(ids)
            text = self.state(merged(i))
            path, files = self.file(text)
            return Step(n, "merge --input-file", ["merge", "--input-file", path, i], files=files, ids=[i],
                        inputs=[text])
        if kind == "edit":
            # The editor (click runs it as shlex.split(EDITOR) + [file]) copies a prepared file
            # over the one being edited; `true` saves nothing.
            i = self.pick_id(ids)
            r = rng.random()
            text = self.state(merged(i)) if r < 0.7 else self.invalid_state()
            path, files = self.file(text)
            editor = "true" if r > 0.92 else f"cp {path}"
            force = rng.random() < 0.7
            answer = "" if force else rng.choice(["y\n", "n\n", "yes\n"])
            args = ["edit", "--force", i] if force else ["edit", i]
            label = "edit (not saved)" if editor == "true" else ("edit" if r < 0.7 else "edit (not a state)")
            return Step(n, label, args, stdin=answer, files=files, ids=[i],
                        inputs=[text] if editor != "true" and answer != "n\n" else [], env={"EDITOR": editor})
        if kind == "get":
            i = self.pick_id(ids)
            return Step(n, "get", ["get", i], writes=False, ids=[i])
        if kind == "list":
            if rng.random() < 0.25:
                return Step(n, "list", ["list"], writes=False)
            return Step(n, "list --pattern", ["list", "--pattern", rng.choice(PATTERNS)], writes=False)
        if kind == "clear":
            i = self.pick_id(ids)
            return Step(n, "clear", ["clear", "--force", i], ids=[i])
        if kind == "clear-all":
            return Step(n, "clear --all", ["clear", "--all", "--force"])
        if kind in ("copy", "move"):
            src = self.pick_id(ids)
            r = rng.random()
            dst = src if r < 0.08 else (rng.choice(ids) if ids and r < 0.5 else self.new_id())
            onto = "itself" if dst == src else ("existing" if dst in store else "new")
            return Step(n, f"{kind} (onto {onto})", [kind, "--force", src, dst], ids=[src, dst])
        if kind == "export":
            return Step(n, "export", ["export"], writes=False)
        if kind == "import":
            source = rng.choice(["meltano", "ours", "generated"])  # whose export, of an earlier step
            if source == "generated":
                payload = "{" + ",".join(
                    f"{json.dumps(self.new_id() if rng.random() < 0.7 else f'imp-{rng.randint(1, 9)}', ensure_ascii=False)}:"
                    f'{{"completed":{self.state()},"partial":{self.state() if rng.random() < 0.4 else "{}"}}}'
                    for _ in range(rng.randint(1, 4))) + "}"
            else:  # a snapshot from an earlier step, so the import overwrites something
                payload = rng.choice(self.history[-40:])[source] if self.history else exports[source]
            how = rng.choice(["stdin", "-", "file"])
            label = f"import ({source} export, {how})" if source == "generated" else f"import (earlier {source} export, {how})"
            try:
                imported = list(json.loads(payload))
            except (ValueError, TypeError):
                imported = []
            if how == "file":
                path, files = self.file(payload)
                return Step(n, label, ["import", path], files=files, ids=imported, inputs=[payload])
            return Step(n, label, ["import"] + (["-"] if how == "-" else []), stdin=payload, ids=imported,
                        inputs=[payload])
        if kind == "set-invalid":
            i = self.pick_id(ids)
            return Step(n, "set (no singer_state / not a state)", ["set", "--force", i, self.invalid_state()], ids=[i])
        if kind == "merge-invalid":
            i = self.pick_id(ids)
            return Step(n, "merge (no singer_state / not a state)", ["merge", i, self.invalid_state()], ids=[i])
        # usage errors
        i = self.pick_id(ids)
        args = rng.choice([
            ["merge", i], ["merge", "--from-state-id", i, i, self.state()], ["set", "--force", i],
            ["clear", "--force"], ["clear", "--force", "--all", i], ["get"], ["set", i, self.state()],
            ["clear", i], ["copy", "--force", i], ["list", "--pattern"],
        ])
        return Step(n, "usage: " + " ".join(a if a.startswith("-") or a in ("merge", "set", "clear", "get", "copy", "list") else "X"
                                             for a in args), args, ids=[i])


# ---------------------------------------------------------------------------------------------
# Comparing
# ---------------------------------------------------------------------------------------------


def short(text: str, width: int = 90) -> str:
    text = text.replace("\n", "⏎")
    return repr(text if len(text) <= width else text[: width - 30] + f"…({len(text)} chars)…" + text[-20:])


def compare_stdout(step: Step, m: str, o: str, strict: bool) -> bool:
    if strict:
        return m == o
    op = step.args[0] if step.args else ""
    if op in ("get", "export"):
        try:
            return same(loads(m), loads(o))
        except (json.JSONDecodeError, ValueError):
            return m == o
    if op == "list":
        return sorted(m.splitlines()) == sorted(o.splitlines())
    return m == o


def state_diff(m: dict | None, o: dict | None, rounding: bool = False) -> list[str]:
    """The ids whose states differ (with `rounding`: beyond Meltano's float rounding)."""
    if m is None or o is None:
        return ["<unreadable export>"]
    return sorted(i for i in set(m) | set(o) if i not in m or i not in o or not same(m[i], o[i], rounding))


# ---------------------------------------------------------------------------------------------
# Declared differences: where ours differs from Meltano on purpose. Each rule says what ours
# must do instead; a step passes as an expected difference only if ours did exactly that.
# ---------------------------------------------------------------------------------------------

MAX_PART_BYTES = 10 * 1024 * 1024  # ours (src/state/json.rs)
MAX_DEPTH = 127  # ours (src/state/json.rs): levels of objects and arrays

EXPECTED = {
    "numbers": "numbers: Meltano reads JSON numbers as Python floats (1.0000000000000000001 -> 1.0, "
               "1e400 -> Infinity); ours keeps their exact text (README: state values)",
    "id": "ids: ours refuses an empty id or one over 1024 UTF-8 bytes (invalid-input, exit 2, nothing "
          "written); Meltano's SQLite takes any",
    "id-control": "new ids: ours refuses to write (set, merge, edit, copy/move destination, import) an id "
                  "with a control character (invalid-input, exit 2, an import exit 1; the character named "
                  "by code point, the id never printed, nothing written); Meltano takes it. Reads and "
                  "deletes take such ids (README: State store)",
    "list-escape": "list: ours prints each id escaped for people (a backslash as \\\\, control characters "
                   "as \\n, \\x1b, \\u{85}...; one id a line, two ids never alike; --json is exact); "
                   "Meltano prints ids raw",
    "json": "input: ours refuses duplicate keys, NaN/Infinity, unpaired surrogates (\\ud800: no UTF-8 "
            "text holds one), nesting over 127 levels and states over 10 MiB (exit 1 or 2, nothing "
            "written); Meltano's Python json takes them (the last duplicate wins)",
    "prompt": "confirmation prompts: ours asks on stderr (stdout stays the command's output, as with "
              "--json); click asks on stdout. Same text, same answers",
    "move-self": "move X X: Meltano sets X to its merged state, then clears it (the state is lost); "
                  "ours sets it and keeps it",
    "glob": "list --pattern: ours matches the glob exactly (fnmatch: case-sensitive, ? and [..] are "
            "wildcards); Meltano's systemdb makes * a SQL LIKE % (case-insensitive, _ and % wildcards)",
    "merge-empty-object": "an empty object merged over a scalar or a list (in merge, or in the merged "
                          "view get, copy and move read): Meltano's merge keeps the old value (a "
                          "non-empty object crashes it: merge-crash); ours replaces it with {}",
    "merge-crash": "merging an object over a scalar or a list (or the reverse): Meltano's merge "
                   "crashes ('int' object does not support item assignment / has no attribute "
                   "'setdefault', exit 1) in merge and wherever it reads the merged state (get, list, "
                   "copy, move, merge --from-state-id); ours merges it: the newer value replaces the other",
}


def refusals(text: str) -> set[str]:
    """Why ours refuses this JSON text where Python's json takes it."""
    found: set[str] = set()
    if len(text.encode("utf-8", "surrogatepass")) > MAX_PART_BYTES:
        found.add("size")

    def pairs(items: list) -> dict:
        if len({k for k, _ in items}) != len(items):
            found.add("duplicate")
        return dict(items)

    def constant(name: str) -> float:
        found.add("nonfinite")
        return 0.0

    def depth(v: Any) -> int:
        if isinstance(v, str) and any("\ud800" <= c <= "\udfff" for c in v):
            found.add("surrogate")
        if isinstance(v, dict):
            for k in v:
                depth(k)
            return 1 + max((depth(x) for x in v.values()), default=0)
        if isinstance(v, list):
            return 1 + max((depth(x) for x in v), default=0)
        return 0
    try:
        if depth(json.loads(text, object_pairs_hook=pairs, parse_constant=constant)) > MAX_DEPTH:
            found.add("depth")
    except (ValueError, RecursionError):
        pass  # not JSON at all: both refuse it
    return found


PROMPTS = [  # Meltano 4.4.1's confirmation prompts (meltano/cli/state.py)
    "This will overwrite the state's current value. Continue?",
    "This will clear state for the job(s). Continue?",
    "This will overwrite state for the destination. Continue?",
    "This will clear the source state and overwrite destination state. Continue?",
]

REFUSAL_WORDS = {"size": "the limit is", "duplicate": "duplicate key",
                 "nonfinite": "NaN and Infinity are not JSON numbers", "depth": "levels deep",
                 "surrogate": "hex escape"}


def deep_merge(dst: dict, src: dict) -> dict:
    """Meltano's merge as ours does it: objects merge key by key, any other value replaces."""
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            deep_merge(dst[k], v)
        else:
            dst[k] = copy.deepcopy(v)
    return dst


def meltano_merge(src: dict, dest: Any) -> Any:
    """Meltano 4.4.1's merge (meltano.core.utils.merge), as it is: an object goes into whatever
    the destination holds (an empty one leaves a scalar alone; a non-empty one crashes)."""
    for key, value in src.items():
        if isinstance(value, dict):
            meltano_merge(value, dest.setdefault(key, {}))
        else:
            dest[key] = value
    return dest


def merged_view(entry: Any, merge: Any) -> Any:
    """A state's merged view: its partial part merged over its completed one by `merge(dst,
    src)`, on copies; {} for no state."""
    if not isinstance(entry, dict):
        return {}
    out = copy.deepcopy(entry.get("completed") or {})
    if isinstance(entry.get("partial"), dict):
        merge(out, copy.deepcopy(entry["partial"]))
    return out


def meltano_view(entry: Any) -> Any:
    """Meltano's merged view, by its own merge (raises where Meltano crashes)."""
    return merged_view(entry, lambda dst, src: meltano_merge(src, dst))


def merged_exact(entry: Any) -> Any:
    """The merged view as ours makes it (objects merge, anything else replaces), numbers kept."""
    return merged_view(entry, deep_merge)


def bad_id(i: str) -> bool:
    return i == "" or len(i.encode("utf-8", "surrogatepass")) > MAX_ID_BYTES


def control_at(i: str) -> str | None:
    """How ours names the first control character (Unicode Cc) of id `i` (src/state/mod.rs
    check_new_id), or None if it has none."""
    for n, c in enumerate(i):
        if unicodedata.category(c) == "Cc":
            return f"control character U+{ord(c):04X} at byte {len(i[:n].encode('utf-8', 'surrogatepass'))}"
    return None


def written_ids(step: Step) -> list[str]:
    """The ids a step would create or overwrite (checked by ours as new ids); the others it
    only reads or clears."""
    op = step.args[0] if step.args else ""
    if op in ("set", "merge", "edit", "copy", "move"):
        return step.ids[-1:]
    return step.ids if op == "import" else []


def escape_id(i: str) -> str:
    """An id as ours prints it for people (src/state/mod.rs escape_id): a backslash doubled,
    a control character escaped (\\t \\n \\r, \\xNN for other C0 and DEL, \\u{NN} for C1)."""
    out = []
    for c in i:
        if c == "\\":
            out.append("\\\\")
        elif c in "\t\n\r":
            out.append({"\t": "\\t", "\n": "\\n", "\r": "\\r"}[c])
        elif unicodedata.category(c) == "Cc":
            out.append(f"\\x{ord(c):02x}" if ord(c) < 0x80 else f"\\u{{{ord(c):x}}}")
        else:
            out.append(c)
    return "".join(out)


def explain(step: Step, m: Out, o: Out, o_before: dict | None, m_before: dict | None,
            o_after: dict | None, m_after: dict | None) -> str | None:
    """The declared difference this step shows (ours doing exactly what the rule says), or None."""
    if None in (o_before, m_before, o_after, m_after):
        return None
    op = step.args[0] if step.args else ""
    ours_unchanged = not state_diff(o_before, o_after)
    # Ours refuses a bad id or a bad input, whichever it meets first (an import's JSON is
    # parsed before its ids are checked).
    bad_ids = any(bad_id(i) for i in step.ids)
    reasons = set().union(*(refusals(t) for t in step.inputs))
    # (import fails with Meltano's exit 1, every other command with invalid-input's 2)
    if bad_ids and o.code == (1 if op == "import" else 2) and "state id" in o.stderr and ours_unchanged \
            and o.stdout == "":
        return "id"
    if reasons and o.code in (1, 2) and ours_unchanged and any(REFUSAL_WORDS[r] in o.stderr for r in reasons):
        return "json"
    controls = [i for i in written_ids(step) if control_at(i)]
    if controls and o.code == (1 if op == "import" else 2) and ours_unchanged and o.stdout == "" \
            and any(control_at(i) in o.stderr for i in controls) and not any(i in o.stderr for i in controls):
        return "id-control"
    if bad_ids or reasons or controls:
        return None
    if op == "move" and len(step.ids) == 2 and step.ids[0] == step.ids[1]:
        i = step.ids[0]
        # Ours sets X to its merged state (as move does to any destination) and keeps it.
        ok = o.code == 0 and set(state_diff(o_before, o_after)) <= {i} and i in m_before and \
            i not in m_after and i in o_after and same(merged_exact(o_before.get(i)), merged_exact(o_after[i]))
        return "move-self" if ok else None
    if op == "list" and m.code == 0 and o.code == 0 and ours_unchanged and \
            sorted(o.stdout.splitlines()) == sorted(escape_id(i) for i in m.stdout.splitlines()):
        return "list-escape"
    if op == "list" and step.args[1:2] == ["--pattern"] and len(step.args) == 3:
        want = sorted(escape_id(i) for i in o_before if fnmatch.fnmatchcase(i, step.args[2]))
        ok = o.code == 0 and ours_unchanged and sorted(o.stdout.splitlines()) == want
        return "glob" if ok else None
    if op == "merge" and m.code == 0 and o.code == 0:
        dst = step.ids[-1] if step.ids else None
        if "--from-state-id" in step.args and len(step.ids) == 2:
            o_src, m_src = merged_exact(o_before.get(step.ids[0])), merged_exact(m_before.get(step.ids[0]))
        elif step.inputs:
            o_src = m_src = loads(step.inputs[0])
        else:
            return None
        partial = lambda store: copy.deepcopy((store.get(dst) or {}).get("partial") or {})  # noqa: E731
        try:
            want_m = meltano_merge(copy.deepcopy(m_src), partial(m_before))
        except (AttributeError, TypeError):
            return None
        want_o = deep_merge(partial(o_before), o_src)
        ok = dst in o_after and dst in m_after and same(want_o, o_after[dst].get("partial")) and \
            same(m_after[dst].get("partial"), want_m, rounding=True) and \
            set(state_diff(m_after, o_after, rounding=True)) <= {dst}
        return "merge-empty-object" if ok else None
    if op in ("get", "copy", "move") and m.code == 0 and o.code == 0 and step.ids:
        # The merged view (partial over completed) met an empty object over a scalar or list.
        src = step.ids[0]
        try:
            want_m = meltano_view(m_before.get(src))
        except (AttributeError, TypeError):
            return None
        want_o = merged_exact(o_before.get(src))
        if op == "get":
            try:
                ok = same(want_o, loads(o.stdout)) and same(loads(m.stdout), want_m, rounding=True)
            except ValueError:
                ok = False
        else:
            dst = step.ids[-1]
            ok = dst in o_after and dst in m_after and same(want_o, o_after[dst].get("completed")) and \
                same(m_after[dst].get("completed"), want_m, rounding=True) and \
                set(state_diff(m_after, o_after, rounding=True)) <= {dst}
        return "merge-empty-object" if ok and not same(want_o, want_m, rounding=True) else None
    crashed = ("does not support item assignment" in m.stderr or "has no attribute 'setdefault'" in m.stderr
               or ("StatePersistenceError" in m.stderr and "setdefault" in m.stderr))
    if m.code == 1 and crashed and o.code == 0:
        if op == "list":
            pattern = step.args[2] if step.args[1:2] == ["--pattern"] and len(step.args) == 3 else "*"
            ok = ours_unchanged and sorted(o.stdout.splitlines()) == sorted(
                escape_id(i) for i in o_before if fnmatch.fnmatchcase(i, pattern))
        elif op == "merge" and step.inputs and len(step.ids) == 1:
            i = step.ids[0]
            before = (o_before.get(i) or {}).get("partial") or {}
            want = deep_merge(copy.deepcopy(before), loads(step.inputs[0]))
            ok = i in o_after and same(want, o_after[i].get("partial")) and \
                set(state_diff(m_after, o_after, rounding=True)) <= {i}
        elif op == "get":
            try:
                ok = same(merged_exact(o_before.get(step.ids[0])), loads(o.stdout))
            except ValueError:
                ok = False
        elif op in ("copy", "move") and len(step.ids) == 2:
            # Ours writes the source's merged view as the destination's completed state (and
            # a move clears the source): checked, not only that the stores differ nowhere else.
            src, dst = step.ids
            ok = dst in o_after and same(merged_exact(o_before.get(src)), o_after[dst].get("completed")) \
                and not (o_after[dst].get("partial") or {}) \
                and (op == "copy" or src == dst or src not in o_after) \
                and set(state_diff(m_after, o_after, rounding=True)) <= set(step.ids)
        elif op == "merge" and "--from-state-id" in step.args and len(step.ids) == 2:
            # Ours merges the source's merged view into the destination's partial state.
            src, dst = step.ids
            before = (o_before.get(dst) or {}).get("partial") or {}
            want = deep_merge(copy.deepcopy(before), merged_exact(o_before.get(src)))
            ok = dst in o_after and same(want, o_after[dst].get("partial")) and \
                set(state_diff(m_after, o_after, rounding=True)) <= {dst}
        else:
            ok = False
        return "merge-crash" if ok else None
    return None


@dataclass
class Failure:
    step: Step
    what: list[str]


def describe_args(args: list[str]) -> str:
    return " ".join(short(a, 40) if (len(a) > 40 or not a or any(c in a for c in " '\"\\\n\t")) else a for a in args)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--ops", type=int, default=300)
    parser.add_argument("--keep-going", action="store_true", help="report every failing step")
    parser.add_argument("--cli-every", type=int, default=25,
                        help="run every K-th step with the real meltano executable (0: never)")
    parser.add_argument("--strict-text", action="store_true", help="compare stdout byte for byte")
    opts = parser.parse_args()
    sys.setrecursionlimit(HARNESS_RECURSION_LIMIT)
    if not URL:
        print("CLICKHOUSE_URL is not set (run via scripts/with-clickhouse)", file=sys.stderr)
        return 2
    if not os.access(CLI, os.X_OK):
        print(f"no CLI at {CLI} (cargo build -p clickhouse-component-host)", file=sys.stderr)
        return 2
    verbose = bool(os.environ.get("DIFF_VERBOSE"))
    keep = bool(os.environ.get("DIFF_KEEP"))
    started = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="meltano-diff-")
    project = os.path.join(tmp, "project")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLICKHOUSE_")}
    env.update(MELTANO_ENV)
    subprocess.run([os.path.join(os.path.dirname(sys.executable), "meltano"), "init", project,
                    "--no-usage-stats"], check=True, capture_output=True, env=env, cwd=tmp, timeout=120)
    database = f"meltano_diff_{opts.seed}_{os.getpid()}"
    ch("DROP DATABASE IF EXISTS {db:Identifier} SYNC", {"db": database})
    meltano, ours = Meltano(project), Ours(database)
    rng = random.Random(opts.seed)
    gen = Generator(rng, tmp)
    print(f"seed {opts.seed}, {opts.ops} ops; Meltano project {project}, ours --state-database {database}",
          file=sys.stderr)

    failures: list[Failure] = []
    passed = failed = 0
    timings = {"meltano in-process": [], "meltano executable": [], "ours": []}
    m_export = meltano.export()
    o_export = ours.run(["export"])
    exports = {"meltano": m_export.stdout, "ours": o_export.stdout}
    store = parse_export(m_export.stdout) or {}
    m_before, o_before = parse_export(m_export.stdout), parse_export(o_export.stdout)
    expected: dict[str, list[int]] = {}
    try:
        for n in range(1, opts.ops + 1):
            step = gen.step(n, store, exports)
            for path, content in step.files.items():
                with open(path, "w", encoding="utf-8", errors="surrogatepass") as f:
                    f.write(content)
            use_process = opts.cli_every > 0 and n % opts.cli_every == 0
            problems: list[str] = []
            t = time.monotonic()
            if use_process:
                m = meltano.run_process(step.args, step.stdin, step.env)
                timings["meltano executable"].append(time.monotonic() - t)
                if not step.writes:
                    again = meltano.run(step.args, step.stdin, step.env)
                    if (again.code, again.stdout) != (m.code, m.stdout):
                        problems.append(f"harness: in-process runner != meltano executable: exit "
                                        f"{again.code}/{m.code}, stdout {short(again.stdout)} / {short(m.stdout)}")
            else:
                m = meltano.run(step.args, step.stdin, step.env)
                timings["meltano in-process"].append(time.monotonic() - t)
            t = time.monotonic()
            o = ours.run(step.args, step.stdin, step.env)
            timings["ours"].append(time.monotonic() - t)

            op = step.args[0] if step.args else ""
            # A prompt click wrote on stdout, that ours wrote (the same) on stderr.
            prompt = next((p for p in PROMPTS if m.stdout.startswith(p + " [y/N]: ")), None)
            moved = not opts.strict_text and prompt is not None and (prompt + " [y/N]: ") in o.stderr
            if moved:
                m = Out(m.code, m.stdout[len(prompt) + len(" [y/N]: "):], m.stderr)
            if m.code != o.code:
                problems.append(f"exit {m.code} vs {o.code}")
            rounded = False
            if not compare_stdout(step, m.stdout, o.stdout, opts.strict_text):
                try:
                    rounded = op in ("get", "export") and not opts.strict_text and \
                        same(loads(m.stdout), loads(o.stdout), rounding=True)
                except (json.JSONDecodeError, ValueError):
                    pass
                if not rounded:
                    try:
                        where = f" (first difference {first_diff(loads(m.stdout), loads(o.stdout))})"
                    except (json.JSONDecodeError, ValueError):
                        where = ""
                    problems.append(f"stdout {short(m.stdout)} vs {short(o.stdout)}{where}")
            m_export = meltano.export()
            o_export = ours.run(["export"])
            m_store, o_store = parse_export(m_export.stdout), parse_export(o_export.stdout)
            if m_export.code != 0 or m_store is None:
                problems.append(f"harness: Meltano's export failed (exit {m_export.code}): "
                                f"{short(m_export.stderr.strip().splitlines()[-1] if m_export.stderr.strip() else m_export.stdout)}")
            if o_export.code != 0 or o_store is None:
                problems.append(f"ours' export failed (exit {o_export.code}): {short(o_export.stderr.strip() or o_export.stdout)}")
            differing = state_diff(m_store, o_store)
            to_clear: list[str] = []
            if differing and m_store is not None and o_store is not None:
                # Numbers Meltano rounded stay (later steps merge over them); a difference this
                # step made in them is the declared number difference.
                def rounded_only(i: str) -> bool:
                    return i in m_store and i in o_store and same(m_store[i], o_store[i], rounding=True)

                def changed(i: str) -> bool:
                    return not same((m_before or {}).get(i), m_store.get(i)) or \
                        not same((o_before or {}).get(i), o_store.get(i))
                rounded |= any(rounded_only(i) and changed(i) for i in differing)
                to_clear = [i for i in differing if not rounded_only(i)]
                if to_clear:
                    detail = "; ".join(
                        f"{short(i, 30)}{first_diff(m_store[i], o_store[i])}" if i in m_store and i in o_store
                        else f"{short(i, 30)}: {'<absent>' if i not in m_store else 'present'} vs "
                             f"{'<absent>' if i not in o_store else 'present'}" for i in to_clear[:3])
                    problems.append(f"stores differ in {len(to_clear)} id(s): {detail}")
            reason = None
            if problems and not any(p.startswith(("harness", "ours' export")) for p in problems):
                reason = explain(step, m, o, o_before, m_before, o_store, m_store)
                if os.environ.get("DIFF_DEBUG"):
                    print(f"explain: {reason}; m.code={m.code} o.code={o.code} crashed={'setdefault' in m.stderr} ids={step.ids!r:.80} inputs={len(step.inputs)} diff={state_diff(m_store, o_store)!r:.200} ours={o.stderr[-300:]!r} out={o.stdout[:100]!r}", file=sys.stderr)
            elif not problems and rounded:
                reason = "numbers"
            elif not problems and moved:
                reason = "prompt"
            if to_clear:
                meltano.clear_ids(to_clear)
                ours.clear_ids(to_clear)
                m_export, o_export = meltano.export(), ours.run(["export"])
                m_store, o_store = parse_export(m_export.stdout), parse_export(o_export.stdout)
                if any(i in (m_store or {}) or i in (o_store or {}) for i in to_clear):
                    problems.append("harness: clearing the differing ids did not clear them")
                    reason = None
            store = m_store if m_store is not None else store
            m_before, o_before = m_store, o_store
            exports = {"meltano": m_export.stdout, "ours": o_export.stdout}
            if len(exports["meltano"]) + len(exports["ours"]) < 1_000_000:
                gen.history.append(exports)

            via = " [meltano executable]" if use_process else ""
            line = f"step {n:>3} {step.kind}{via}: {describe_args(step.args)}"
            if problems and reason is None:
                failed += 1
                failures.append(Failure(step, problems))
                print(f"FAIL {line}\n       " + "\n       ".join(problems), flush=True)
                if verbose:
                    errors = [line for line in m.stderr.splitlines() if "Error" in line][-3:]
                    print(f"       meltano errors: {short(' | '.join(errors), 400)}")
                    print(f"       meltano stderr: {short(m.stderr.strip()[-400:], 400)}\n"
                          f"       ours stderr:    {short(o.stderr.strip(), 400)}", flush=True)
                if not opts.keep_going:
                    break
            elif reason is not None:
                passed += 1
                expected.setdefault(reason, []).append(n)
                if verbose:
                    print(f"PASS {line}  (expected difference: {reason}; " + "; ".join(problems) + ")",
                          flush=True)
            else:
                passed += 1
                if verbose:
                    print(f"PASS {line}  (exit {m.code})", flush=True)
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                ch("DROP DATABASE IF EXISTS {db:Identifier} SYNC", {"db": database})
            except RuntimeError as e:
                print(f"could not drop {database}: {e}", file=sys.stderr)

    if failures:
        groups: dict[tuple, list[int]] = {}
        for f in failures:
            for w in f.what:
                if w.startswith("exit"):
                    key = (f.step.kind, w)
                elif w.startswith("stdout"):
                    key = (f.step.kind, "stdout differs")
                elif w.startswith("stores differ"):
                    key = (f.step.kind, "stores differ")
                else:
                    key = (f.step.kind, w.split(":")[0])
                groups.setdefault(key, []).append(f.step.n)
        print("\ndistinct differences (operation, what: steps):")
        for (kind, what), steps in sorted(groups.items()):
            shown = ", ".join(map(str, steps[:8])) + (", …" if len(steps) > 8 else "")
            print(f"  {kind}: {what}: {len(steps)} step(s) ({shown})")
    if expected:
        print("\nexpected differences (declared; ours did what the rule says):")
        for reason, steps in sorted(expected.items()):
            shown = ", ".join(map(str, steps[:8])) + (", …" if len(steps) > 8 else "")
            print(f"  {reason}: {len(steps)} step(s) ({shown})\n      {EXPECTED[reason]}")
    for name, ts in timings.items():
        if ts:
            print(f"{name}: {len(ts)} ops, {1000 * sum(ts) / len(ts):.0f} ms per op", file=sys.stderr)
    print(f"({time.monotonic() - started:.1f} s)", file=sys.stderr)
    print(f"{passed} passed ({sum(map(len, expected.values()))} of them declared differences), {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    ensure_meltano()
    sys.exit(main())
