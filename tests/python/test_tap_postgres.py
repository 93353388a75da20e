"""A real tap into the wheel's target: MeltanoLabs' tap-postgres 0.10.0 (PyPI, in
.venv-tap-postgres: scripts/tap-postgres-venv) reads a PostgreSQL table of awkward values (a
private server for this module: scripts/postgres) and `target-clickhouse-component` loads it.

The table, public.pg_types, is 20,000 rows generated in SQL from their id (`PG_TYPES_SQL`):
a bigint key and thirteen nullable columns of PostgreSQL's common types, each NULL on some rows,
with unicode, quotes, backslashes, newlines and control characters in the text, numeric(38,0)
values past 2^53 and near +-10^37, negative numerics, timestamps with microseconds before 1970
and after 2100, dates from 1901 to 2284, empty arrays, and nested, scalar and JSON-null jsonb.
The tap runs as Meltano would run it: its own `--discover`, then the catalog's metadata edited
to select the stream `public-pg_types`, INCREMENTAL by `id`.

1. tap | target, then every value of every row read back from ClickHouse and compared with
   PostgreSQL's, column by column (`COLUMNS` says how each is normalised). Columns that are not
   exact today are recorded in `NOT_EXACT` with the loss they are allowed: every other column
   must be exact, a recorded column must show its loss and nothing beyond it, and a recorded
   column that becomes exact fails too (so the record is kept true). A summary per column is
   printed.
2. The target killed with SIGKILL mid-load at seeded points, while a proxy holds one of its
   INSERTs (test_target.py's `HoldProxy`), then the tap rerun from the last STATE the target
   printed and piped into it again; after the kills, a full run to the end. Read without FINAL
   from a MergeTree, where a duplicate stays visible: reruns from the start load exactly once,
   but a rerun from a bookmark loads again what was committed after it (the SDK resumes with
   `id >= bookmark`): recorded exactly, in `DUPLICATES_AFTER_A_BOOKMARK` and the test. With
   `add_record_metadata` on, whose clocks differ in every rerun: every row's metadata checked.
3. The same through the real Meltano: `meltano run tap-postgres target-clickhouse-component`
   in a temporary project (test_target.py's `Project`: this project's ClickHouse state backend),
   then 100 more rows in PostgreSQL and a second run that loads only them (and the bookmark's
   row again, which the ReplacingMergeTree's FINAL collapses).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import pytest
from conftest import PASSWORD, ROOT, cli_get, sql
from test_target import MELTANO, TARGET, HoldProxy, Project, uri

TAP = Path(os.environ.get("TAP_POSTGRES", ROOT / ".venv-tap-postgres" / "bin" / "tap-postgres"))
POSTGRES_SCRIPT = ROOT / "scripts" / "postgres"
STREAM = "public-pg_types"
TABLE = "pg_types"
ROWS = 20_000
# The seed of the kill points of test 2 (TAP_POSTGRES_SEED=N for another schedule).
SEED = int(os.environ.get("TAP_POSTGRES_SEED", "45"))

# The table and its rows, a function of the id (so the rows 20,001-20,100 of test 3 come from
# the same generator). Each nullable column is NULL on its own residue of id.
PG_TYPES_SQL = r"""
CREATE TABLE public.pg_types (
    id bigint PRIMARY KEY,
    c_text text,
    c_varchar varchar(40),
    c_numeric numeric(18, 2),
    c_numeric38 numeric(38, 0),
    c_double double precision,
    c_smallint smallint,
    c_bool boolean,
    c_timestamptz timestamptz,
    c_timestamp timestamp,
    c_date date,
    c_text_array text[],
    c_jsonb jsonb,
    c_uuid uuid
);
CREATE FUNCTION public.pg_types_rows(lo bigint, hi bigint) RETURNS SETOF public.pg_types
LANGUAGE sql IMMUTABLE AS $$
SELECT
    i,
    CASE WHEN i % 11 = 1 THEN NULL ELSE (ARRAY[
        'plain ' || i,
        E'quote '' and " and \\ backslash ' || i,
        E'line\nbreak\r\nand\ttab ' || i,
        'unicode é ñ 中文 😀 𝄞 e' || U&'\0301' || ' ' || i,
        '',
        ' padded ' || i || ' ',
        repeat('long ', 300) || i,
        'NULL',
        E'\\N \\t \\\\ {"not": "json"} ' || i,
        E'control \x01\x1f\x7f ' || i
    ])[1 + i % 10] END,
    CASE WHEN i % 11 = 2 THEN NULL ELSE left((ARRAY[
        'v' || i, E'q''"\\' || i, E'nl\n' || i, 'ü😀' || i, '', repeat('x', 35) || i
    ])[1 + i % 6], 40) END,
    CASE WHEN i % 11 = 3 THEN NULL
         WHEN i % 997 = 0 THEN 9999999999999999.99
         WHEN i % 997 = 1 THEN -9999999999999999.99
         WHEN i % 997 = 2 THEN -0.01
         ELSE round(((i * 7919) % 200003 - 100000) * 1234.5678, 2) END,
    CASE WHEN i % 11 = 4 THEN NULL
         WHEN i % 5 = 0 THEN 9999999999999999999999999999999999999 - i
         WHEN i % 5 = 1 THEN 9007199254740993 + i
         WHEN i % 5 = 2 THEN -(10::numeric ^ 37)::numeric(38, 0) + i
         WHEN i % 5 = 3 THEN (i % 1000) - 500
         ELSE i::numeric * 1000000007 * 998244353 * 4294967311 * (1 - 2 * (i / 4 % 2)) END,
    CASE WHEN i % 11 = 5 THEN NULL ELSE (ARRAY[
        i * 0.1, 1e300 / i, -1e-300 * i, 5e-324, 0.1 + 0.2 * i, -(2 ^ 53 + i), 1.0 / 3 * i
    ])[1 + i % 7] END,
    CASE WHEN i % 11 = 6 THEN NULL
         WHEN i % 1000 = 0 THEN -32768
         WHEN i % 1000 = 1 THEN 32767
         ELSE (i * 37) % 65536 - 32768 END,
    CASE WHEN i % 11 = 7 THEN NULL ELSE i % 3 = 0 END,
    CASE WHEN i % 11 = 8 THEN NULL
         ELSE timestamptz '1901-06-01 00:00:00.000001+00' + i * interval '5 days 01:02:03.456789'
    END,
    CASE WHEN i % 11 = 9 THEN NULL
         ELSE timestamp '1969-12-31 23:59:59.999999'
              + (i - 5000) * interval '4 days 00:00:01.000123'
    END,
    CASE WHEN i % 11 = 10 THEN NULL ELSE date '1901-01-01' + (i * 7)::int END,
    CASE WHEN i % 13 = 1 THEN NULL
         WHEN i % 4 = 0 THEN '{}'::text[]
         ELSE ARRAY['a' || i, E'q"\\,{}''', 'NULL', 'é😀', '', E'two\nlines'] END,
    CASE WHEN i % 13 = 2 THEN NULL
         WHEN i % 13 = 3 THEN to_jsonb('a string ' || i)
         WHEN i % 13 = 4 THEN '[]'::jsonb
         WHEN i % 13 = 5 THEN '{}'::jsonb
         WHEN i % 13 = 6 THEN to_jsonb(i * 1000000007)
         WHEN i % 13 = 8 THEN 'null'::jsonb
         ELSE jsonb_build_object(
            'id', i,
            'text', E'uni é 😀 "q" \\ \n',
            'nested', jsonb_build_object(
                'list', jsonb_build_array(i, 'two', 1.5, true, NULL,
                                          jsonb_build_object('deep', jsonb_build_array())),
                'big', 123456789012345678901234567890 + i,
                'neg', -0.25 * i,
                'frac', CASE WHEN i % 7 = 0 THEN 0.1000000000000000055511151231257827 ELSE 0.5 END))
    END,
    CASE WHEN i % 13 = 7 THEN NULL ELSE md5(i::text)::uuid END
FROM generate_series(lo, hi) AS i
$$;
INSERT INTO public.pg_types SELECT * FROM public.pg_types_rows(1, 20000);
"""


# PostgreSQL.


def psql_binary() -> str:
    found = shutil.which("psql") or next(
        iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/psql"), reverse=True)), None
    )
    if not found:
        pytest.fail("no psql (scripts/postgres install)")
    return str(found)


@dataclass
class Postgres:
    """The module's PostgreSQL server (scripts/postgres start), as the tap's config and psql."""

    dir: Path
    dsn: str
    port: int
    psql_path: str

    @classmethod
    def start(cls, root: Path) -> Postgres:
        """`scripts/postgres start root/pg` (its directory the `postgres` user's), then the
        module's table with its first ROWS rows (PG_TYPES_SQL). A failure raises."""
        started = subprocess.run(
            [str(POSTGRES_SCRIPT), "start", str(root / "pg")],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if started.returncode != 0:
            raise RuntimeError(
                f"scripts/postgres start exited {started.returncode}: {started.stderr}"
            )
        dsn = started.stdout.strip()
        port = int(re.fullmatch(r"postgresql://[^@]+@127\.0\.0\.1:(\d+)/postgres", dsn)[1])
        pg = cls(root / "pg", dsn, port, psql_binary())
        pg.psql(PG_TYPES_SQL)
        return pg

    def psql(self, script: str) -> str:
        """Runs SQL through psql (unaligned, tuples only, stop on the first error)."""
        proc = subprocess.run(
            [self.psql_path, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", self.dsn],
            input=script,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if proc.returncode != 0:
            pytest.fail(f"psql exited {proc.returncode}: {proc.stderr[-3000:]}")
        return proc.stdout

    def tap_config(self) -> dict:
        return {
            "host": "127.0.0.1",
            "port": self.port,
            "user": "postgres",
            "password": "postgres",
            "database": "postgres",
            "filter_schemas": ["public"],
        }


@dataclass
class Tap:
    """The tap's config and the catalog it discovered, with the stream selected."""

    pg: Postgres
    config: Path
    catalog: Path


def select_incremental(catalog: dict) -> dict:
    """The catalog as Meltano's `select` and `metadata` rules leave it: only `public-pg_types`
    selected (every property), INCREMENTAL by `id`."""
    assert STREAM in [s["tap_stream_id"] for s in catalog["streams"]], catalog
    for stream in catalog["streams"]:
        chosen = stream["tap_stream_id"] == STREAM
        for entry in stream["metadata"]:
            entry["metadata"]["selected"] = chosen
            if chosen and entry["breadcrumb"] == []:
                entry["metadata"]["replication-method"] = "INCREMENTAL"
                entry["metadata"]["replication-key"] = "id"
    return catalog


def discover(config: Path) -> dict:
    """The catalog `tap-postgres --discover` finds with this config."""
    discovered = subprocess.run(
        [str(TAP), "--config", str(config), "--discover"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert discovered.returncode == 0, discovered.stderr[-3000:]
    return json.loads(discovered.stdout)


@pytest.fixture(scope="module")
def tap():
    """A PostgreSQL server for the module (data on tmpfs when there is one), the table, and the
    tap's discovered catalog; the server is stopped after the module."""
    if not os.access(TAP, os.X_OK):
        pytest.fail(f"no tap-postgres at {TAP} (scripts/tap-postgres-venv)")
    parent = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    # Not under pytest's tmp_path: its directories are closed to the `postgres` user.
    root = Path(tempfile.mkdtemp(prefix="tap-postgres-", dir=parent))
    root.chmod(0o711)  # the server's own directory below it is the `postgres` user's
    try:
        try:
            pg = Postgres.start(root)
        except RuntimeError as e:
            pytest.fail(str(e))
        config = root / "tap-config.json"
        config.write_text(json.dumps(pg.tap_config()))
        catalog = root / "catalog.json"
        catalog.write_text(json.dumps(select_incremental(discover(config))))
        yield Tap(pg, config, catalog)
    finally:
        subprocess.run([str(POSTGRES_SCRIPT), "stop", str(root / "pg")], timeout=120, check=False)
        shutil.rmtree(root, ignore_errors=True)


# Reading both sides.

# A value that is SQL NULL (kept apart from a JSON null inside a jsonb).
NULL = None


def _json(text: str) -> object:
    """A JSON document with every number exact (Decimal), so 2.50 and 2.5 are equal and
    0.1000000000000000055511151231257827 is not 0.1."""
    return json.loads(text, parse_float=Decimal, parse_int=Decimal)


def _number(text: str) -> Decimal:
    return Decimal(text)


@dataclass(frozen=True)
class Column:
    """How one column is read on each side and compared.

    pg_expr: the column as text (or JSON) in PostgreSQL's row object; ch_expr: in ClickHouse's
    JSONEachRow row; norm: each side's value (never NULL) to the form compared for exactness."""

    name: str
    pg_expr: str
    ch_expr: str
    norm_pg: Callable[[object], object]
    norm_ch: Callable[[object], object]
    how: str


def _same(value: object) -> object:
    return value


_TS = "YYYY-MM-DD HH24:MI:SS.US"

# Per-type normalisation (PostgreSQL runs with TimeZone UTC; ClickHouse's toString):
COLUMNS = [
    Column("c_text", "c_text", "c_text", _same, _same, "text: equal strings"),
    Column("c_varchar", "c_varchar", "c_varchar", _same, _same, "text: equal strings"),
    # Numbers as exact decimals: PostgreSQL's text of the numeric against ClickHouse's text of
    # whatever the column holds (a Float64 prints the shortest text that reads back as it).
    Column(
        "c_numeric",
        "c_numeric::text",
        "toString(c_numeric)",
        _number,
        _number,
        "decimal digits equal",
    ),
    Column(
        "c_numeric38",
        "c_numeric38::text",
        "toString(c_numeric38)",
        _number,
        _number,
        "decimal digits equal",
    ),
    # A double on both sides: the same binary double (PostgreSQL prints the shortest exact text).
    Column(
        "c_double",
        "c_double::text",
        "toString(c_double)",
        float,
        float,
        "the same double",
    ),
    Column(
        "c_smallint",
        "c_smallint::text",
        "toString(c_smallint)",
        int,
        int,
        "equal integers",
    ),
    Column("c_bool", "c_bool", "c_bool", bool, bool, "equal booleans"),
    # Instants in UTC to the microsecond: to_char of the timestamptz at UTC against toString of
    # the DateTime64(6, 'UTC'); the timestamp without time zone as the tap sends it, as UTC.
    Column(
        "c_timestamptz",
        f"to_char(c_timestamptz AT TIME ZONE 'UTC', '{_TS}')",
        "toString(c_timestamptz)",
        _same,
        _same,
        "'YYYY-MM-DD hh:mm:ss.ffffff' UTC equal",
    ),
    Column(
        "c_timestamp",
        f"to_char(c_timestamp, '{_TS}')",
        "toString(c_timestamp)",
        _same,
        _same,
        "'YYYY-MM-DD hh:mm:ss.ffffff' (as UTC) equal",
    ),
    Column(
        "c_date",
        "to_char(c_date, 'YYYY-MM-DD')",
        "toString(c_date)",
        _same,
        _same,
        "'YYYY-MM-DD' equal",
    ),
    # The array as a JSON list (to_json) against the String's JSON text, parsed.
    Column(
        "c_text_array",
        "to_json(c_text_array)::text",
        "c_text_array",
        _json,
        _json,
        "equal lists (JSON text parsed)",
    ),
    # The jsonb's text against the String's JSON text, both parsed with exact numbers; a JSON
    # null in the jsonb is the JSON text 'null', apart from a NULL jsonb.
    Column("c_jsonb", "c_jsonb::text", "c_jsonb", _json, _json, "equal JSON (exact numbers)"),
    Column("c_uuid", "c_uuid::text", "toString(c_uuid)", _same, _same, "equal text"),
]


@dataclass(frozen=True)
class Loss:
    """A column that is not exact today: why, and the only difference allowed (given the
    PostgreSQL and ClickHouse values, NULL as None, before normalisation)."""

    why: str
    allowed: Callable[[object, object], bool]


def _nearest_double(pg: object, ch: object) -> bool:
    """ClickHouse holds the double nearest to PostgreSQL's decimal (nothing worse)."""
    return pg is not None and ch is not None and float(Decimal(pg)) == float(ch)


def _jsonb_loss(pg: object, ch: object) -> bool:
    # A JSON null: the tap writes null, as for a NULL jsonb.
    return pg == "null" and ch is None


# Columns not exact today. The tap declares numeric as JSON Schema `number`, which the target
# stores as Float64: digits past a double's 15-17 are lost, but each value is the nearest
# double (asserted). The jsonb's type is every JSON type, stored as a String of the value's
# JSON text (a JSON string quoted, exact), but a JSON null arrives as NULL (the tap writes
# null, as for a NULL jsonb).
NOT_EXACT: dict[str, Loss] = {
    "c_numeric": Loss("numeric(18,2) as `number`: a Float64", _nearest_double),
    "c_numeric38": Loss("numeric(38,0) as `number`: a Float64", _nearest_double),
    "c_jsonb": Loss("a JSON null as NULL", _jsonb_loss),
}


def pg_rows(pg: Postgres, *, upto: int = ROWS) -> dict[int, dict]:
    """PostgreSQL's rows by id, each column as `COLUMNS` reads it (None: SQL NULL)."""
    fields = ", ".join(f"'{c.name}', {c.pg_expr}" for c in COLUMNS)
    out = pg.psql(
        "SET TimeZone = 'UTC';\n"
        f"SELECT json_build_object('id', id, {fields}) FROM public.pg_types "
        f"WHERE id <= {upto} ORDER BY id;"
    )
    rows = {}
    for line in out.splitlines():
        row = json.loads(line)
        rows[row["id"]] = row
    return rows


def ch_rows(database: str, *, final: bool = False) -> tuple[dict[int, dict], int]:
    """ClickHouse's rows by id (the last copy of an id, when there are several), and how many
    rows were read."""
    fields = ", ".join(f"{c.ch_expr} AS {c.name}" for c in COLUMNS)
    out = sql(
        f"SELECT id, {fields} FROM `{database}`.`{TABLE}` {'FINAL' if final else ''} "
        "ORDER BY id FORMAT JSONEachRow SETTINGS output_format_json_quote_64bit_integers = 0"
    )
    rows, read = {}, 0
    for line in out.splitlines():
        row = json.loads(line)
        rows[row["id"]] = row
        read += 1
    return rows, read


def ch_copies(database: str) -> dict[int, int]:
    """How many rows each id has (without FINAL)."""
    out = sql(f"SELECT id, count() FROM `{database}`.`{TABLE}` GROUP BY id FORMAT TSV")
    return {int(i): int(n) for i, n in (line.split("\t") for line in out.splitlines())}


def ch_column_types(database: str) -> dict[str, str]:
    out = sql(
        "SELECT name, type FROM system.columns WHERE database = {db:String} AND table = {t:String}"
        " FORMAT TSV",
        db=database,
        t=TABLE,
    )
    return dict(line.split("\t", 1) for line in out.splitlines())


@dataclass
class ColumnResult:
    column: Column
    nulls: int = 0
    exact: int = 0
    differ: list[tuple[int, object, object]] | None = None
    beyond: list[tuple[int, object, object]] | None = None


def _equal(column: Column, pg: object, ch: object) -> bool:
    try:
        return column.norm_pg(pg) == column.norm_ch(ch)
    except ValueError:  # not JSON, not a number: not the same value
        return False


def compare(pg: dict[int, dict], ch: dict[int, dict]) -> list[ColumnResult]:
    """Every column of every row, PostgreSQL's against ClickHouse's (the same ids first)."""
    missing, extra = sorted(set(pg) - set(ch)), sorted(set(ch) - set(pg))
    assert not missing and not extra, f"ids differ: missing {missing[:10]}, extra {extra[:10]}"
    results = []
    for column in COLUMNS:
        result = ColumnResult(column, differ=[], beyond=[])
        loss = NOT_EXACT.get(column.name)
        for i, row in pg.items():
            want, got = row[column.name], ch[i][column.name]
            if want is NULL:
                result.nulls += 1
            same = (want is NULL and got is NULL) or (
                want is not NULL and got is not NULL and _equal(column, want, got)
            )
            if same:
                result.exact += 1
                continue
            result.differ.append((i, want, got))
            if loss is None or not loss.allowed(want, got):
                result.beyond.append((i, want, got))
        results.append(result)
    return results


def _short(value: object) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def summary(results: list[ColumnResult], types: dict[str, str]) -> str:
    """A line per column: its ClickHouse type, rows, NULLs, exact rows, and the verdict (with
    an example of each kind of difference: to a value, and to NULL)."""
    head = f"{'column':<14} {'ClickHouse type':<31} {'rows':>6} {'nulls':>6} {'exact':>6}  result"
    lines = [head]
    for r in results:
        name = r.column.name
        rows = r.exact + len(r.differ)
        if not r.differ:
            verdict = f"exact ({r.column.how})"
        else:
            why = NOT_EXACT[name].why if name in NOT_EXACT else "NOT RECORDED"
            kinds = {}
            for i, want, got in r.differ:
                kinds.setdefault(got is NULL, f"id {i}: {_short(want)} -> {_short(got)}")
            verdict = f"NOT exact: {len(r.differ)} rows ({why}); e.g. " + ", ".join(kinds.values())
        kind = types.get(name, "?").replace("\\'", "'")
        lines.append(f"{name:<14} {kind:<31} {rows:>6} {r.nulls:>6} {r.exact:>6}  {verdict}")
    return "\n".join(lines)


def check(results: list[ColumnResult], text: str) -> None:
    """Exact columns stay exact; recorded columns show their loss and nothing beyond it."""
    problems = []
    for r in results:
        name = r.column.name
        if r.beyond:
            kind = "beyond its recorded loss" if name in NOT_EXACT else "not exact"
            examples = "; ".join(f"id {i}: {want!r} -> {got!r}" for i, want, got in r.beyond[:3])
            problems.append(f"{name}: {len(r.beyond)} rows {kind}, e.g. {examples}")
        elif name in NOT_EXACT and not r.differ:
            problems.append(f"{name}: now exact: remove it from NOT_EXACT")
        if r.nulls == 0:
            problems.append(f"{name}: no NULL in PostgreSQL (the data lost a case)")
    assert not problems, "\n".join(problems) + "\n" + text


def check_values(tap: Tap, database: str, *, upto: int = ROWS, final: bool = False) -> str:
    """Compares every value (the rows up to `upto`); returns the summary."""
    pg = pg_rows(tap.pg, upto=upto)
    ch, _ = ch_rows(database, final=final)
    results = compare(pg, ch)
    text = summary(results, ch_column_types(database))
    check(results, text)
    return text


def counts(database: str) -> tuple[int, int]:
    """(count(), uniqExact(id)) without FINAL: a duplicate shows."""
    out = sql(f"SELECT count(), uniqExact(id) FROM `{database}`.`{TABLE}`").split()
    return int(out[0]), int(out[1])


# The pipeline.


def target_config(path: Path, database: str, *, port: int | None = None, **more) -> Path:
    config = {"uri": uri(database, port=port, password=PASSWORD), "database": database}
    config.update(table_name=TABLE, **more)
    path.write_text(json.dumps(config))
    return path


@dataclass
class Run:
    """One tap | target run: the target's exit code, the STATE values it printed, its stderr."""

    code: int
    states: list[dict]
    stderr: str
    tap_code: int | None


def start_pipeline(tap: Tap, config: Path, state: dict | None, work: Path):
    """Starts `tap-postgres --config --catalog [--state] | target-clickhouse-component --config`:
    the tap's stdout is the target's stdin."""
    args = [str(TAP), "--config", str(tap.config), "--catalog", str(tap.catalog)]
    if state is not None:
        state_file = work / "state.json"
        state_file.write_text(json.dumps(state))
        args += ["--state", str(state_file)]
    with (work / "tap.log").open("a") as tap_log:
        tap_proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=tap_log)
    target = subprocess.Popen(
        [str(TARGET), "--config", str(config)],
        stdin=tap_proc.stdout,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    tap_proc.stdout.close()  # the target holds the pipe's read end; the tap sees it close
    return tap_proc, target


def finish(tap_proc: subprocess.Popen, target: subprocess.Popen, timeout: float = 300) -> Run:
    out, err = target.communicate(timeout=timeout)
    try:
        tap_code = tap_proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        tap_proc.kill()
        tap_code = tap_proc.wait()
    # A Singer target prints each STATE's value, a line of JSON.
    states = [json.loads(line) for line in out.decode().splitlines()]
    return Run(target.returncode, states, err.decode(errors="replace"), tap_code)


def bookmark(state: dict | None) -> int | None:
    if state is None:
        return None
    return state["bookmarks"][STREAM]["replication_key_value"]


# 1. tap | target, every value compared.


def test_every_value_read_back_equals_postgresql(tap, database, tmp_path, capsys):
    config = target_config(tmp_path / "target.json", database)
    started = time.monotonic()
    run = finish(*start_pipeline(tap, config, None, tmp_path))
    seconds = time.monotonic() - started
    assert run.code == 0 and run.tap_code == 0, run.stderr[-4000:]
    assert bookmark(run.states[-1]) == ROWS
    assert counts(database) == (ROWS, ROWS)
    text = check_values(tap, database)
    with capsys.disabled():
        print(f"\ntap-postgres | target: {ROWS} rows in {seconds:.1f} s; per column:\n{text}")


# 2. SIGKILL mid-load, rerun from the last STATE printed.

KILL_ACTIONS = ("hold-reply", "hold-partial", "pause")
BATCH = 1000
# The Singer SDK (tap-postgres's) writes a STATE after every 10,000th record of a run (and one
# at its end); the target sends the records a STATE covers in chunks of BATCH once it reads it.
SDK_STATE_EVERY = 10_000
# Today a rerun from a bookmark loads again the rows that earlier runs committed after it (the
# test's docstring says why); False once the target loads such a tap exactly once, and then
# count() must be 20,000.
DUPLICATES_AFTER_A_BOOKMARK = True


def test_killed_mid_load_then_rerun_from_its_last_state(tap, database, tmp_path, capsys):
    """Runs killed (SIGKILL) while the proxy holds their Nth INSERT (executed with its reply
    held, half its body sent, or not sent: seeded, as N is), each run from the last STATE the
    one before printed; then a run to the end. Chunks of 1000 rows into a plain MergeTree, read
    without FINAL. The first kill is in the run's first 10,000 records (no STATE printed yet),
    the second after its first STATE, then 0-2 more.

    A rerun from the start sends the same chunks with the same tokens, and the server drops
    those it has: exactly once. A rerun from a bookmark B does not: the SDK's incremental query
    is `id >= B`, so the tap sends row B again and every chunk after it is shifted by one row,
    with tokens no earlier run sent; the rows that runs from another starting point committed
    after B are loaded twice (at least once, as docs/meltano.md says of a tap that re-emits the
    record at its bookmark). So the table must hold, for each starting point, the rows its runs
    committed (runs from one point share chunks: the longest prefix), and nothing else: every
    id, each copy identical, and exactly that many rows."""
    since_ms = int(time.time() * 1000)
    rng = random.Random(SEED)
    plan = [(1, SDK_STATE_EVERY // BATCH), (SDK_STATE_EVERY // BATCH + 1, ROWS // BATCH)]
    plan += [None] * rng.randint(0, 2)
    state: dict | None = None
    committed: dict[int, int] = {}  # rows committed by the runs from each starting id
    history = []
    for k, span in enumerate(plan):
        first = bookmark(state) or 1
        most = (ROWS - first + 1) // BATCH  # the run sends at least this many INSERTs
        low, high = span or (2, most)
        if high < max(low, 2):
            break
        n, action = rng.randint(max(low, 2), high), rng.choice(KILL_ACTIONS)
        before = counts(database)[0] if k else 0
        proxy = HoldProxy()
        config = target_config(
            tmp_path / f"target-{k}.json",
            database,
            port=proxy.port,
            engine_type="MergeTree",
            batch_size_rows=BATCH,
            add_record_metadata=True,
        )
        proxy.add(lambda r: r.inserts_into(database, TABLE), action, skip=n - 1)
        tap_proc, target = start_pipeline(tap, config, state, tmp_path)
        try:
            proxy.wait_held(timeout=120)
            target.send_signal(signal.SIGKILL)
        finally:
            proxy.close()
            run = finish(tap_proc, target)
        assert run.code == -signal.SIGKILL, run.stderr[-4000:]
        if run.states:
            state = run.states[-1]
        rows = counts(database)
        committed[first] = committed.get(first, 0) + rows[0] - before
        history.append(
            f"run {k + 1} from id {first}: killed at INSERT {n} ({action}); "
            f"STATEs printed {[bookmark(s) for s in run.states]}; (count, uniq) {rows}"
        )
        # A STATE printed only once the records before it were committed.
        if bookmark(state):
            below = sql(
                f"SELECT uniqExact(id) FROM `{database}`.`{TABLE}` WHERE id <= {bookmark(state)}"
            )
            assert int(below) == bookmark(state), "\n".join(history)
    config = target_config(
        tmp_path / "target.json",
        database,
        engine_type="MergeTree",
        batch_size_rows=BATCH,
        add_record_metadata=True,
    )
    first = bookmark(state) or 1
    run = finish(*start_pipeline(tap, config, state, tmp_path))
    assert run.code == 0 and run.tap_code == 0, run.stderr[-4000:]
    committed[first] = ROWS - first + 1  # all of this run's records
    total, unique = counts(database)
    history.append(f"last run from id {first}: (count, uniq) {(total, unique)}")
    story = "\n".join(history)
    assert bookmark(run.states[-1]) == ROWS, story
    assert unique == ROWS, story
    # Copies of an id (a rerun from a bookmark) differ in their clocks only.
    distinct = sql(
        f"SELECT count() FROM (SELECT DISTINCT * EXCEPT ({', '.join(CLOCKS)}) "
        f"FROM `{database}`.`{TABLE}`)"
    )
    assert int(distinct) == ROWS, f"copies of an id differ\n{story}"
    check_metadata(database, since_ms)
    expected = sum(committed.values()) if DUPLICATES_AFTER_A_BOOKMARK else ROWS
    twice = sorted(i for i, c in ch_copies(database).items() if c > 1)
    spans = f"ids loaded more than once: {len(twice)}" + (
        f" ({twice[0]}-{twice[-1]})" if twice else ""
    )
    assert total == expected, f"{story}\n{spans}; expected {expected} rows ({committed})"
    check_values(tap, database)
    with capsys.disabled():
        print(f"\nkilled and rerun (seed {SEED}):\n{story}\n{spans}")


# The Singer SDK's metadata columns (add_record_metadata) that hold clocks: the tap's
# (time_extracted, version) and the target's.
CLOCKS = (
    "_sdc_extracted_at",
    "_sdc_table_version",
    "_sdc_received_at",
    "_sdc_batched_at",
    "_sdc_sequence",
    "_sdc_sync_started_at",
)


def check_metadata(database: str, since_ms: int) -> None:
    """Every row's metadata filled as the SDK fills it: the tap's time_extracted, no version
    (an INCREMENTAL stream) and no deletion, and clocks in order, read during the test."""
    now_ms = int(time.time() * 1000) + 1
    out = sql(
        "SELECT countIf(_sdc_extracted_at IS NULL), countIf(_sdc_deleted_at IS NOT NULL),"
        " countIf(_sdc_table_version IS NOT NULL),"
        " countIf(NOT (_sdc_sync_started_at BETWEEN {lo:Int64} AND {hi:Int64})),"
        " countIf(toUnixTimestamp64Milli(_sdc_batched_at) < _sdc_sync_started_at),"
        " countIf(_sdc_received_at < _sdc_batched_at),"
        " countIf(abs(toUnixTimestamp64Milli(_sdc_received_at) - _sdc_sequence) > 1),"
        " countIf(toUnixTimestamp64Milli(_sdc_extracted_at) NOT BETWEEN {lo:Int64} AND {hi:Int64}),"
        " count() FROM {db:Identifier}.{t:Identifier} FORMAT TSV",
        db=database,
        t=TABLE,
        lo=str(since_ms),
        hi=str(now_ms),
    ).split()
    bad = dict(
        zip(
            [
                "no _sdc_extracted_at",
                "a _sdc_deleted_at",
                "a _sdc_table_version",
                "_sdc_sync_started_at outside the test",
                "batched before the sync started",
                "received before batched",
                "_sdc_sequence not _sdc_received_at's millisecond",
                "_sdc_extracted_at outside the test",
            ],
            map(int, out[:-1]),
            strict=True,
        )
    )
    assert int(out[-1]) > 0 and not any(bad.values()), bad


# 3. The real Meltano.

JOB = "dev:tap-postgres-to-target-clickhouse-component"


class PostgresProject(Project):
    """test_target.py's project (this project's ClickHouse state backend, the wheel's console
    script as the loader) with tap-postgres as the extractor: the tap venv's executable, the
    stream selected and INCREMENTAL by id through Meltano's `select` and `metadata`."""

    def __init__(self, root: Path, database: str, pg: Postgres, **target: object) -> None:
        super().__init__(root, database, **target)
        config = pg.tap_config()
        del config["password"]  # from the environment
        self.yml["plugins"]["extractors"] = [
            {
                "name": "tap-postgres",
                "namespace": "tap_postgres",
                "executable": str(TAP),
                "capabilities": ["catalog", "discover", "state", "about"],
                "settings": [
                    {"name": "host"},
                    {"name": "port", "kind": "integer"},
                    {"name": "user"},
                    {"name": "password", "kind": "password"},
                    {"name": "database"},
                    {"name": "filter_schemas", "kind": "array"},
                ],
                "config": config,
                "select": [f"{STREAM}.*"],
                "metadata": {
                    STREAM: {"replication-method": "INCREMENTAL", "replication-key": "id"}
                },
            }
        ]
        self.yml["plugins"]["loaders"][0]["settings"].append({"name": "table_name"})
        self.write()

    def env(self, tap: dict[str, object]) -> dict[str, str]:
        env = super().env({})
        env["TAP_POSTGRES_PASSWORD"] = "postgres"
        return env

    def args(self, force: bool) -> list[str]:
        return [
            str(MELTANO),
            "run",
            *(["--force"] if force else []),
            "tap-postgres",
            "target-clickhouse-component",
        ]


def stored_bookmark(database: str) -> int | None:
    state = cli_get(JOB, database=database)
    merged = {**state["completed"], **state["partial"]}
    return bookmark(merged.get("singer_state"))


def tap_record_count(stderr: str) -> int:
    """The tap's own count of the records it sent (its METRIC line, relayed by Meltano)."""
    found = re.findall(r'"metric":\s*"record_count",\s*"value":\s*(\d+)', stderr)
    assert len(found) == 1, stderr[-4000:]
    return int(found[0])


def test_meltano_run_then_an_incremental_run(tap, database, tmp_path, capsys):
    project = PostgresProject(tmp_path / "project", database, tap.pg, table_name=TABLE)
    try:
        started = time.monotonic()
        first = project.run()
        seconds = [time.monotonic() - started]
        assert tap_record_count(first.stderr) == ROWS
        assert counts(database) == (ROWS, ROWS)
        assert stored_bookmark(database) == ROWS
        check_values(tap, database)

        more = f"public.pg_types_rows({ROWS + 1}, {ROWS + 100})"
        tap.pg.psql(f"INSERT INTO public.pg_types SELECT * FROM {more};")
        started = time.monotonic()
        second = project.run()
        seconds.append(time.monotonic() - started)
        # Only the new rows, and the bookmark's row again: the tap (the SDK's incremental
        # query, `id >= bookmark`) sends it once more. The table, a ReplacingMergeTree ordered
        # by the key, holds it twice until a merge (FINAL collapses it).
        assert tap_record_count(second.stderr) == 101
        assert stored_bookmark(database) == ROWS + 100
        total, unique = counts(database)
        assert unique == ROWS + 100 and total in (ROWS + 100, ROWS + 101), (total, unique)
        assert ch_copies(database).get(ROWS, 0) == total - ROWS - 99
        final = int(sql(f"SELECT count() FROM `{database}`.`{TABLE}` FINAL"))
        assert final == ROWS + 100
        check_values(tap, database, upto=ROWS + 100, final=True)
        with capsys.disabled():
            print(
                f"\nmeltano run: {ROWS} rows in {seconds[0]:.1f} s; after 100 more rows, "
                f"{tap_record_count(second.stderr)} records in {seconds[1]:.1f} s; "
                f"(count, uniq) {(total, unique)} without FINAL, {final} with"
            )
    finally:
        tap.pg.psql(f"DELETE FROM public.pg_types WHERE id > {ROWS};")


# 4. ACTIVATE_VERSION: a full-table stream whose source lost rows between runs.

FULL_TABLE = "pg_full"
FULL_ROWS = 1000


@dataclass
class FullTable:
    """A PostgreSQL table of its own (`public.pg_full`: id, name; FULL_ROWS rows) and the tap
    replicating it FULL_TABLE (with `tap_settings`), into `database` (its table `pg_full`)."""

    tap: Tap
    database: str
    work: Path

    @classmethod
    def make(cls, tap: Tap, database: str, work: Path, **tap_settings) -> FullTable:
        tap.pg.psql(
            f"DROP TABLE IF EXISTS public.{FULL_TABLE};"
            f"CREATE TABLE public.{FULL_TABLE} (id bigint PRIMARY KEY, name text);"
            f"INSERT INTO public.{FULL_TABLE} SELECT i, 'row ' || i "
            f"FROM generate_series(1, {FULL_ROWS}) i;"
        )
        config = json.loads(tap.config.read_text()) | tap_settings
        tap_config = work / "tap-full.json"
        tap_config.write_text(json.dumps(config))
        catalog = discover(tap_config)
        for stream in catalog["streams"]:
            for entry in stream["metadata"]:
                chosen = stream["tap_stream_id"] == f"public-{FULL_TABLE}"
                entry["metadata"]["selected"] = chosen
                if chosen and entry["breadcrumb"] == []:
                    entry["metadata"]["replication-method"] = "FULL_TABLE"
        catalog_path = work / "catalog-full.json"
        catalog_path.write_text(json.dumps(catalog))
        return cls(Tap(tap.pg, tap_config, catalog_path), database, work)

    def run(self, **settings) -> Run:
        """tap | target with these settings, to the end."""
        config = self.work / "target-full.json"
        base = {
            "uri": uri(self.database, password=PASSWORD),
            "default_target_schema": self.database,
        }
        config.write_text(json.dumps(base | settings))
        done = finish(*start_pipeline(self.tap, config, None, self.work))
        assert done.code == 0 and done.tap_code == 0, done.stderr[-4000:]
        return done

    def table(self, query: str) -> list[list[str]]:
        """The rows (TSV fields) of `query`, whose `{T}` is the table."""
        text = sql(query.format(T=f"`{self.database}`.`{FULL_TABLE}`"))
        return [line.split("\t") for line in text.splitlines()]

    def drop(self) -> None:
        self.tap.pg.psql(f"DROP TABLE IF EXISTS public.{FULL_TABLE};")


def test_full_table_with_activate_version_retires_rows_deleted_at_the_source(
    tap, database, tmp_path
):
    """A table of its own, replicated FULL_TABLE with the SDK's
    `emit_activate_version_messages` (ACTIVATE_VERSION, then each record with the version),
    into a target with `add_record_metadata`. After 100 rows are deleted in PostgreSQL, a run
    without `hard_delete` marks them in `_sdc_deleted_at` (and nothing else), then one with it
    leaves exactly the rows PostgreSQL has, each once."""
    full = FullTable.make(tap, database, tmp_path, emit_activate_version_messages=True)
    pg = tap.pg
    try:

        def run(hard_delete: bool) -> Run:
            # The SDK's version is the tap's start in whole seconds: a run in the same second
            # as the one before would send the same version, and retire nothing.
            exists = sql(
                "SELECT count() FROM system.tables "
                "WHERE database = {db:String} AND name = {t:String}",
                db=database,
                t=FULL_TABLE,
            )
            if exists.strip() == "1":
                last = sql(f"SELECT max(_sdc_table_version) FROM `{database}`.`{FULL_TABLE}`")
                while time.time() < int(last) + 1:
                    time.sleep(0.05)
            return full.run(add_record_metadata=True, hard_delete=hard_delete)

        table = full.table
        run(hard_delete=False)
        first = table(
            "SELECT count(), uniqExact(_sdc_table_version), "
            "countIf(_sdc_deleted_at IS NULL) FROM {T}"
        )
        assert first == [[str(FULL_ROWS), "1", str(FULL_ROWS)]]

        pg.psql(f"DELETE FROM public.{FULL_TABLE} WHERE id % 10 = 0;")
        second = run(hard_delete=False)
        assert "marked deleted" in second.stderr, second.stderr[-4000:]
        # The first run's rows are all marked (the ones deleted at the source among them);
        # the second run's are not.
        live = table(
            "SELECT count(), uniqExact(id), max(id % 10 = 0) FROM {T} WHERE _sdc_deleted_at IS NULL"
        )
        assert live == [["900", "900", "0"]]
        marked = table(
            "SELECT count(), uniqExact(_sdc_table_version) FROM {T} "
            "WHERE _sdc_deleted_at IS NOT NULL"
        )
        assert marked == [[str(FULL_ROWS), "1"]]

        third = run(hard_delete=True)
        assert "deleted (ACTIVATE_VERSION)" in third.stderr, third.stderr[-4000:]
        left = table(
            "SELECT count(), uniqExact(id), uniqExact(_sdc_table_version), "
            "max(id % 10 = 0) FROM {T}"
        )
        assert left == [["900", "900", "1", "0"]]
    finally:
        full.drop()


# 5. BATCH messages: the tap writes its records into gzip JSON Lines files.


def test_batch_files_of_the_tap_load_exactly_once_through_a_kill(tap, database, tmp_path, capsys):
    """tap-postgres with `batch_config` (jsonl, gzip; the SDK writes a STATE after each
    BATCH): the target, given the files' directory in `batch_dirs`, is killed while the proxy
    holds one of the first batch's INSERTs (seeded: before any STATE), then the tap is run
    again from the start, writing new files; every row once, every value equal to
    PostgreSQL's."""
    rng = random.Random(SEED)
    batches = tmp_path / "batches"
    batches.mkdir()
    config = json.loads(tap.config.read_text())
    config["batch_config"] = {
        "encoding": {"format": "jsonl", "compression": "gzip"},
        "storage": {"root": f"file://{batches}", "prefix": "pg-"},
    }
    tap_config = tmp_path / "tap-batch.json"
    tap_config.write_text(json.dumps(config))
    batching = Tap(tap.pg, tap_config, tap.catalog)
    n, action = rng.randint(2, SDK_STATE_EVERY // BATCH - 1), rng.choice(KILL_ACTIONS)
    proxy = HoldProxy()
    settings = {"engine_type": "MergeTree", "batch_size_rows": BATCH, "batch_dirs": [str(batches)]}
    killed = target_config(tmp_path / "killed.json", database, port=proxy.port, **settings)
    proxy.add(lambda r: r.inserts_into(database, TABLE), action, skip=n - 1)
    tap_proc, target = start_pipeline(batching, killed, None, tmp_path)
    try:
        proxy.wait_held(timeout=120)
        target.send_signal(signal.SIGKILL)
    finally:
        proxy.close()
        run = finish(tap_proc, target)
    assert run.code == -signal.SIGKILL and run.states == [], run.stderr[-4000:]
    landed = counts(database)[0]
    files = len(list(batches.iterdir()))
    config = target_config(tmp_path / "target.json", database, **settings)
    run = finish(*start_pipeline(batching, config, None, tmp_path))
    assert run.code == 0 and run.tap_code == 0, run.stderr[-4000:]
    assert bookmark(run.states[-1]) == ROWS
    assert len(list(batches.iterdir())) > files, "the rerun wrote files of its own"
    assert counts(database) == (ROWS, ROWS)
    check_values(tap, database)
    with capsys.disabled():
        print(
            f"\nBATCH: killed at INSERT {n} ({action}) with {landed} rows in; "
            f"the rerun's new files: every row once"
        )


# 6. load_method upsert and overwrite with the real tap.


def test_upsert_keeps_the_row_updated_at_the_source_under_final(tap, database, tmp_path):
    """`load_method: upsert` from a fresh server (a ReplacingMergeTree versioned by
    `_sdc_upsert_version`): after 50 rows are updated in PostgreSQL, a second full-table run
    leaves, under FINAL, each row once with PostgreSQL's values."""
    full = FullTable.make(tap, database, tmp_path)
    try:
        full.run(load_method="upsert")
        tap.pg.psql(f"UPDATE public.{FULL_TABLE} SET name = 'updated ' || id WHERE id % 20 = 0;")
        full.run(load_method="upsert")
        rows = full.table(
            "SELECT count(), uniqExact(id), countIf(name = 'updated ' || toString(id)), "
            "countIf(name = 'row ' || toString(id)) FROM {T} FINAL"
        )
        assert rows == [[str(FULL_ROWS), str(FULL_ROWS), "50", str(FULL_ROWS - 50)]]
        engine = sql(
            "SELECT engine_full FROM system.tables "
            "WHERE database = {db:String} AND name = {t:String}",
            db=database,
            t=FULL_TABLE,
        )
        assert engine.startswith("ReplacingMergeTree(_sdc_upsert_version)"), engine
    finally:
        full.drop()


def test_overwrite_replaces_the_table_with_the_sources_rows(tap, database, tmp_path):
    """`load_method: overwrite` from a fresh server, then after 100 rows are deleted and 10
    updated in PostgreSQL: the table holds exactly PostgreSQL's rows (no FINAL: the old table
    is swapped out), and the table loaded aside is gone."""
    full = FullTable.make(tap, database, tmp_path)
    try:
        full.run(load_method="overwrite")
        tap.pg.psql(
            f"DELETE FROM public.{FULL_TABLE} WHERE id % 10 = 0;"
            f"UPDATE public.{FULL_TABLE} SET name = 'updated' WHERE id % 100 = 1;"
        )
        run = full.run(load_method="overwrite")
        assert "replaced by the records of this run" in run.stderr, run.stderr[-4000:]
        rows = full.table(
            "SELECT count(), uniqExact(id), max(id % 10 = 0), countIf(name = 'updated') FROM {T}"
        )
        assert rows == [["900", "900", "0", "10"]]
        tables = sql("SELECT name FROM system.tables WHERE database = {db:String}", db=database)
        assert tables.split() == [FULL_TABLE]
    finally:
        full.drop()
