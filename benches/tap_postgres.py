"""A real tap into three places: MeltanoLabs' tap-postgres 0.10.0 (.venv-tap-postgres,
scripts/tap-postgres-venv) reading the 14-column table of tests/python/test_tap_postgres.py
(`PG_TYPES_SQL` and its generator, imported from there) from a private PostgreSQL
(scripts/postgres), timed

1. alone, its output to /dev/null;
2. piped into this project's loader, the wheel's console script `target-clickhouse-component`
   (.venv-plugin), its default engine, batch_size_rows 10,000, a fresh database per run;
3. piped into shaped-target-clickhouse 0.2.5 (the Meltano Hub's `target-clickhouse`, in
   .venv-shaped, installed here when missing as the Makefile's SHAPED_DEPS does), configured as
   benches/src/loader.rs configures it, a fresh database per run.

Both targets get `default_target_schema` (the run's fresh database) besides those settings:
without it they route the stream `public-pg_types` to `public.pg_types`, as SDK SQL targets
do, and every run lands in that one table.

Rows past the test's 20,000 repeat its rows 1-20,000 with new ids (its generator's values
leave ClickHouse's ranges past id 20,767: dates after 2299). The stream is selected as the test
selects it (INCREMENTAL by `id`), and every run starts without state, so each reads the whole
table. Each path runs `--repeat` times (the paths interleaved); the table on stdout gives the
best wall time, its rows/s, the spread, and the rows each target run left in ClickHouse
(count() and uniqExact(id), without FINAL). Afterwards, untimed, every value the last run of
each target left is compared with PostgreSQL's as the test compares them (a second table:
types, non-NULL and exact values per column).

    scripts/with-clickhouse .venv-plugin/bin/python benches/tap_postgres.py [--rows N] [--repeat K]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUR_TARGET = ROOT / ".venv-plugin" / "bin" / "target-clickhouse-component"
SHAPED_VENV = ROOT / ".venv-shaped"
SHAPED_TARGET = SHAPED_VENV / "bin" / "target-clickhouse"
# The Makefile's SHAPED_DEPS marker: written after an install here too, so `make bench` keeps it.
SHAPED_MARKER = SHAPED_VENV / ".shaped-target-clickhouse-0.2.5"
POSTGRES_SCRIPT = ROOT / "scripts" / "postgres"
BATCH = 10_000
LABELS = {
    "tap": "tap-postgres alone, to /dev/null",
    "ours": "tap-postgres \\| `target-clickhouse-component` (the wheel, default engine)",
    "shaped": "tap-postgres \\| shaped-target-clickhouse 0.2.5",
}
# Ids per query when the values are compared (the test's psql has a 120 s timeout).
READ_CHUNK = 20_000

# The test module has no import-time side effects beyond reading the environment (conftest
# reads CLICKHOUSE_*; test_target loads the tap_rows plugin module, which only defines things),
# but it imports its siblings by their bare names, as pytest's rootdir does.
sys.path.insert(0, str(ROOT / "tests" / "python"))
from conftest import PASSWORD, URL, USER, sql  # noqa: E402
from test_tap_postgres import (  # noqa: E402
    COLUMNS,
    ROWS,
    STREAM,
    TABLE,
    TAP,
    Column,
    Postgres,
    _short,
    select_incremental,
)


@dataclass
class Run:
    seconds: float
    tap_code: int
    target_code: int | None
    tap_records: int | None
    tables: dict[str, tuple[int, int]] = field(default_factory=dict)
    stderr_tail: str = ""
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return not self.timed_out and self.tap_code == 0 and self.target_code in (0, None)


def die(message: str) -> None:
    print(f"tap_postgres.py: {message}", file=sys.stderr)
    sys.exit(1)


def ensure_shaped() -> None:
    if os.access(SHAPED_TARGET, os.X_OK):
        return
    print("installing shaped-target-clickhouse 0.2.5 into .venv-shaped", file=sys.stderr)
    subprocess.run(["python3", "-m", "venv", str(SHAPED_VENV)], check=True)
    subprocess.run(
        [
            str(SHAPED_VENV / "bin" / "pip"),
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "shaped-target-clickhouse==0.2.5",
        ],
        check=True,
    )
    SHAPED_MARKER.touch()


def start_postgres(root: Path, rows: int) -> Postgres:
    """scripts/postgres start with the test's table (Postgres.start), holding ids 1..rows."""
    try:
        pg = Postgres.start(root)
    except RuntimeError as e:
        die(str(e))
    if rows < ROWS:
        pg.psql(f"DELETE FROM public.{TABLE} WHERE id > {rows};")
    # Past ROWS the generator leaves the ranges its values were made for (from id 20,767 its
    # dates pass 2299-12-31, Date32's end), so the rows after ROWS repeat rows 1..ROWS, each
    # with its own id: id k * ROWS + j holds row j's values.
    columns = pg.psql(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = 'public' "
        f"AND table_name = '{TABLE}' AND column_name <> 'id' ORDER BY ordinal_position;"
    ).split()
    values = ", ".join(f"t.{c}" for c in columns)
    for lo in range(ROWS + 1, rows + 1, ROWS):
        hi = min(lo + ROWS - 1, rows)
        pg.psql(
            f"INSERT INTO public.{TABLE} SELECT t.id + {lo - 1}, {values} "
            f"FROM public.pg_types_rows(1, {hi - lo + 1}) AS t;"
        )
    pg.psql(f"VACUUM ANALYZE public.{TABLE};")
    have = int(pg.psql(f"SELECT count(*) FROM public.{TABLE};"))
    if have != rows:
        die(f"PostgreSQL holds {have} rows, not {rows}")
    return pg


def discover(pg: Postgres, work: Path) -> tuple[Path, Path]:
    """The tap's config and its discovered catalog with the stream selected, INCREMENTAL by id."""
    config = work / "tap-config.json"
    config.write_text(json.dumps(pg.tap_config()))
    found = subprocess.run(
        [str(TAP), "--config", str(config), "--discover"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if found.returncode != 0:
        die(f"tap-postgres --discover exited {found.returncode}: {found.stderr[-3000:]}")
    catalog = work / "catalog.json"
    catalog.write_text(json.dumps(select_incremental(json.loads(found.stdout))))
    return config, catalog


def url_with_auth() -> str:
    """CLICKHOUSE_URL with the user and password from the environment in it."""
    parts = urllib.parse.urlsplit(URL)
    auth = urllib.parse.quote(USER, safe="") + ":" + urllib.parse.quote(PASSWORD, safe="")
    return urllib.parse.urlunsplit(
        (parts.scheme, f"{auth}@{parts.hostname}:{parts.port}", "", "", "")
    )


def our_config(path: Path, database: str) -> Path:
    config = {"uri": url_with_auth(), "database": database, "batch_size_rows": BATCH}
    path.write_text(json.dumps({**config, **route(database)}))
    return path


def route(database: str) -> dict:
    """Both targets route a stream `schema-table` as Singer SDK SQL targets do: to the table
    `pg_types` in the database `public`, whatever `database` says (a trial put the runs of both
    into one `public.pg_types`). `default_target_schema`, the SDK's setting for that database,
    sends each run to its own fresh database instead."""
    return {"default_target_schema": database}


def shaped_config(path: Path, database: str) -> Path:
    """benches/src/loader.rs's config for shaped-target-clickhouse."""
    parts = urllib.parse.urlsplit(URL)
    path.write_text(
        json.dumps(
            {
                "host": parts.hostname,
                "port": parts.port,
                "username": USER,
                "password": PASSWORD,
                "database": database,
                "engine_type": "ReplacingMergeTree",
                **route(database),
            }
        )
    )
    return path


def table_counts() -> dict[str, int]:
    """Every table outside the system databases whose name holds the table's name, with its
    row count (count(), no FINAL): where a run's rows went."""
    out = sql(
        "SELECT database, name FROM system.tables WHERE position(name, {t:String}) > 0 "
        "AND database NOT IN ('system', 'INFORMATION_SCHEMA', 'information_schema') "
        "AND engine NOT IN ('View', 'MaterializedView') FORMAT TSV",
        t=TABLE,
    )
    found = {}
    for line in out.splitlines():
        db, name = line.split("\t", 1)
        found[f"{db}.{name}"] = int(sql(f"SELECT count() FROM `{db}`.`{name}`"))
    return found


def _same(column: Column, want: object, got: object) -> bool:
    """The test's comparison of one value (None: NULL), any failure to read it as unequal."""
    if want is None or got is None:
        return want is None and got is None
    try:
        return column.norm_pg(want) == column.norm_ch(got)
    except Exception:  # not a number, not JSON: not the same value
        return False


def exact_values(pg: Postgres, table: str, rows: int) -> tuple[dict[str, int], dict[str, str]]:
    """Every value of every row, PostgreSQL's against the table's, read and normalised as the
    test reads them (`COLUMNS`), in ranges of ids: the exact values per column, and the first
    difference of each column. A row missing in ClickHouse counts as NULLs there."""
    db, name = table.split(".", 1)
    exact = {c.name: 0 for c in COLUMNS}
    example: dict[str, str] = {}
    pg_fields = ", ".join(f"'{c.name}', {c.pg_expr}" for c in COLUMNS)
    ch_fields = ", ".join(f"{c.ch_expr} AS {c.name}" for c in COLUMNS)
    for lo in range(1, rows + 1, READ_CHUNK):
        hi = min(lo + READ_CHUNK - 1, rows)
        out = pg.psql(
            "SET TimeZone = 'UTC';\n"
            f"SELECT json_build_object('id', id, {pg_fields}) FROM public.{TABLE} "
            f"WHERE id BETWEEN {lo} AND {hi} ORDER BY id;"
        )
        want = {row["id"]: row for row in map(json.loads, out.splitlines())}
        out = sql(
            f"SELECT id, {ch_fields} FROM `{db}`.`{name}` WHERE id BETWEEN {lo} AND {hi} "
            "FORMAT JSONEachRow SETTINGS output_format_json_quote_64bit_integers = 0"
        )
        got = {row["id"]: row for row in map(json.loads, out.splitlines())}
        for i, row in want.items():
            other = got.get(i, {})
            for c in COLUMNS:
                if _same(c, row[c.name], other.get(c.name)):
                    exact[c.name] += 1
                elif c.name not in example:
                    example[c.name] = (
                        f"id {i}: {_short(row[c.name])} -> {_short(other.get(c.name))}"
                    )
    return exact, example


def column_report(pg: Postgres, tables: dict[str, str], rows: int) -> list[str]:
    """A markdown table: each column's type in each target's table (its last run's), its
    non-NULL values there and in PostgreSQL, and how many of its values equal PostgreSQL's
    (NULL for NULL), as test_tap_postgres.py compares them; then the first difference of each
    column that is not exact."""
    names: list[str] = ["id"]
    got: dict[str, dict[str, str]] = {}
    notes: list[str] = []
    for label, table in tables.items():
        db, name = table.split(".", 1)
        out = sql(
            "SELECT name, type FROM system.columns WHERE database = {db:String} "
            "AND table = {t:String} ORDER BY position FORMAT TSV",
            db=db,
            t=name,
        )
        types = {
            c: t.replace("\\'", "'") for c, t in (line.split("\t", 1) for line in out.splitlines())
        }
        counts = sql(
            "SELECT " + ", ".join(f"count(`{c}`)" for c in types) + f" FROM `{db}`.`{name}`"
        ).split()
        try:
            exact, example = exact_values(pg, table, rows)
        except Exception as e:  # a table the test's reads cannot read
            exact, example = {}, {}
            notes.append(f"{label}: its values could not be compared: {e}")
        got[label] = {}
        for (c, t), n in zip(types.items(), counts, strict=True):
            same = f", {exact[c]:,} exact" if c in exact else ""
            got[label][c] = f"`{t}`: {int(n):,} non-NULL{same}"
        names += [c for c in types if c not in names]
        notes += [f"{label}, `{c}`: {e}" for c, e in example.items()]
    pg_names = pg.psql(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = 'public' "
        f"AND table_name = '{TABLE}' ORDER BY ordinal_position;"
    ).split()
    pg_counts = pg.psql(
        "SELECT " + ", ".join(f"count({c})" for c in pg_names) + f" FROM public.{TABLE};"
    ).split("|")
    in_pg = dict(zip(pg_names, (f"{int(n):,}" for n in pg_counts), strict=True))
    names += [c for c in pg_names if c not in names]
    head = " | ".join(tables)
    lines = [
        f"| column | PostgreSQL type | PostgreSQL non-NULL | {head} |",
        "|---|---|---:|" + "---|" * len(tables),
    ]
    pg_types = dict(
        line.split("|", 1)
        for line in pg.psql(
            "SELECT column_name, data_type FROM information_schema.columns "
            f"WHERE table_schema = 'public' AND table_name = '{TABLE}';"
        ).splitlines()
    )
    for c in names:
        cells = " | ".join(got[label].get(c, "(none)") for label in tables)
        lines.append(f"| {c} | {pg_types.get(c, '')} | {in_pg.get(c, '(none)')} | {cells} |")
    if notes:
        lines += ["", "The first value of each column that differs (PostgreSQL -> ClickHouse):", ""]
        lines += [f"- {n}" for n in notes]
    return lines


def count_and_unique(table: str) -> tuple[int, int]:
    db, name = table.split(".", 1)
    out = sql(f"SELECT count(), uniqExact(id) FROM `{db}`.`{name}`").split()
    return int(out[0]), int(out[1])


def tap_record_count(log: str) -> int | None:
    """The tap's own count of the records it sent (the SDK's record_count METRIC lines)."""
    found = re.findall(r'"metric":\s*"record_count",\s*"value":\s*(\d+)', log)
    return sum(int(n) for n in found) if found else None


def run_path(
    tap_args: list[str],
    target: list[str] | None,
    work: Path,
    name: str,
    timeout: float,
) -> Run:
    """Times the tap alone (stdout to /dev/null) or `tap | target`, until both have exited."""
    tap_log = work / f"{name}.tap.log"
    target_log = work / f"{name}.target.log"
    before = table_counts() if target else {}
    with tap_log.open("w") as tap_err, target_log.open("w") as target_err:
        started = time.monotonic()
        if target is None:
            tap = subprocess.Popen(tap_args, stdout=subprocess.DEVNULL, stderr=tap_err)
            sink = None
        else:
            tap = subprocess.Popen(tap_args, stdout=subprocess.PIPE, stderr=tap_err)
            sink = subprocess.Popen(
                target, stdin=tap.stdout, stdout=subprocess.DEVNULL, stderr=target_err
            )
            tap.stdout.close()  # the target holds the read end; the tap sees it close
        timed_out = False
        try:
            if sink is not None:
                sink.wait(timeout=timeout)
            tap.wait(timeout=timeout if sink is None else 60)
        except subprocess.TimeoutExpired:
            timed_out = True
            for proc in (tap, sink):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait()
        seconds = time.monotonic() - started
    tap_text = tap_log.read_text(errors="replace")
    result = Run(
        seconds=seconds,
        tap_code=tap.returncode,
        target_code=None if sink is None else sink.returncode,
        tap_records=tap_record_count(tap_text),
        timed_out=timed_out,
    )
    if target is not None:
        after = table_counts()
        for table, n in after.items():
            if n != before.get(table):
                result.tables[table] = count_and_unique(table)
    if not result.ok:
        failed = target_log if (sink is not None and sink.returncode) else tap_log
        result.stderr_tail = failed.read_text(errors="replace")[-2500:]
    return result


def fmt_rate(rows: int, seconds: float) -> str:
    return f"{rows / seconds:,.0f}"


def where(runs: list[Run], databases: list[str]) -> tuple[str, str]:
    """(count() / uniqExact(id) of each run, the tables they went to, a run's own database
    written `<fresh db>`)."""
    counts, places = [], set()
    for r, db in zip(runs, databases, strict=True):
        if not r.tables:
            counts.append("no table")
        for table, (n, u) in r.tables.items():
            counts.append(f"{n:,} / {u:,}")
            places.add("<fresh db>" + table[len(db) :] if table.startswith(db + ".") else table)
    return "; ".join(counts), ", ".join(sorted(places)) or "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000, help="rows in PostgreSQL")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each path")
    parser.add_argument(
        "--timeout", type=float, default=1800, help="seconds before a run is killed"
    )
    args = parser.parse_args()
    if args.rows < 1 or args.repeat < 1:
        die("--rows and --repeat must be at least 1")
    if not URL:
        die("no ClickHouse: run under scripts/with-clickhouse (CLICKHOUSE_URL)")
    for exe, how in (
        (TAP, "scripts/tap-postgres-venv"),
        (OUR_TARGET, "make plugin-wheel (the wheel into .venv-plugin)"),
    ):
        if not os.access(exe, os.X_OK):
            die(f"no {exe} ({how})")
    ensure_shaped()

    wall_start = time.monotonic()
    load_start = os.getloadavg()
    parent = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    # Not a 0700 directory: the server's own directory below it belongs to `postgres` as root.
    root = Path(tempfile.mkdtemp(prefix="bench-tap-postgres-", dir=parent))
    root.chmod(0o711)
    work = root / "work"
    work.mkdir()
    tag = uuid.uuid4().hex[:8]
    databases: list[str] = []
    results: dict[str, list[Run]] = {"tap": [], "ours": [], "shaped": []}
    fresh: dict[str, list[str]] = {"ours": [], "shaped": []}
    try:
        setup_start = time.monotonic()
        pg = start_postgres(root, args.rows)
        tap_config, catalog = discover(pg, work)
        setup_seconds = time.monotonic() - setup_start
        tap_args = [str(TAP), "--config", str(tap_config), "--catalog", str(catalog)]
        # The component compiled (and cached) before anything is timed, as loader.rs does.
        subprocess.run([str(OUR_TARGET), "--about"], capture_output=True, check=True)
        for k in range(args.repeat):
            results["tap"].append(run_path(tap_args, None, work, f"tap-{k}", args.timeout))

            db = f"bench_tap_pg_ours_{tag}_{k}"
            databases.append(db)
            fresh["ours"].append(db)
            config = our_config(work / f"ours-{k}.json", db)
            target = [str(OUR_TARGET), "--config", str(config)]
            results["ours"].append(run_path(tap_args, target, work, f"ours-{k}", args.timeout))

            db = f"bench_tap_pg_shaped_{tag}_{k}"
            databases.append(db)
            fresh["shaped"].append(db)
            sql(f"CREATE DATABASE `{db}`")  # as loader.rs: shaped-target creates no database
            config = shaped_config(work / f"shaped-{k}.json", db)
            target = [str(SHAPED_TARGET), "--config", str(config)]
            results["shaped"].append(run_path(tap_args, target, work, f"shaped-{k}", args.timeout))
        # The last run's table of each target, column by column.
        short = {"ours": "our target", "shaped": "shaped-target-clickhouse 0.2.5"}
        last = {short[k]: next(iter(results[k][-1].tables), None) for k in short}
        columns = column_report(pg, {k: t for k, t in last.items() if t}, args.rows)
    finally:
        subprocess.run([str(POSTGRES_SCRIPT), "stop", str(root / "pg")], timeout=120, check=False)
        shutil.rmtree(root, ignore_errors=True)
        for db in databases:
            with contextlib.suppress(OSError):
                sql(f"DROP DATABASE IF EXISTS `{db}`")

    print(
        f"\n## tap-postgres 0.10.0: {args.rows:,} rows of the 14-column `public.{TABLE}` "
        f"(stream `{STREAM}`, INCREMENTAL by id, no state), batch {BATCH:,}, "
        f"best of {args.repeat}\n"
    )
    print(
        "| path | rows | best s | rows/s (best) | spread (worst - best) | every run (s) "
        "| count() / uniqExact(id) per run | table |"
    )
    print("|---|---:|---:|---:|---:|---|---|---|")
    odd: list[str] = []
    for key, runs in results.items():
        good = [r.seconds for r in runs if r.ok]
        every = ", ".join(
            f"{r.seconds:.2f}" + ("" if r.ok else " (failed)" if not r.timed_out else " (timeout)")
            for r in runs
        )
        if good:
            best, worst = min(good), max(good)
            spread = f"{worst - best:.2f} s ({(worst - best) / best:.0%})"
            cells = f"{best:.2f} | {fmt_rate(args.rows, best)} | {spread}"
        else:
            cells = "failed | - | -"
        if key == "tap":
            counted, table = "-", "-"
        else:
            counted, table = where(runs, fresh[key])
            counted_tables = [t for r in runs for t in r.tables]
            for r, db in zip(runs, fresh[key], strict=True):
                elsewhere = [t for t in r.tables if not t.startswith(db + ".")]
                if elsewhere:
                    odd.append(f"{LABELS[key]}: rows went to {elsewhere}, not to {db}")
            if not counted_tables:
                odd.append(f"{LABELS[key]}: no table found holding the rows")
        print(f"| {LABELS[key]} | {args.rows:,} | {cells} | {every} | {counted} | {table} |")
        for k, r in enumerate(runs):
            if r.tap_records != args.rows:
                odd.append(
                    f"{LABELS[key]}, run {k + 1}: the tap's record_count metrics add up to "
                    f"{r.tap_records}, not {args.rows}"
                )
            for table, (n, u) in r.tables.items():
                if (n, u) != (args.rows, args.rows):
                    odd.append(f"{LABELS[key]}, run {k + 1}: {table} holds {n} rows, {u} ids")
            if not r.ok:
                how = (
                    "timed out" if r.timed_out else f"exit tap {r.tap_code}, target {r.target_code}"
                )
                odd.append(
                    f"{LABELS[key]}, run {k + 1} failed ({how}) after {r.seconds:.2f} s; "
                    f"its stderr's end:\n```\n{r.stderr_tail.strip()}\n```"
                )
    best = {k: min((r.seconds for r in v if r.ok), default=None) for k, v in results.items()}
    if best["tap"] and best["ours"]:
        print(
            f"\ntap | our target / tap alone, wall time: {best['ours'] / best['tap']:.2f}x",
            end="",
        )
        if best["shaped"]:
            print(
                f"; tap | shaped-target-clickhouse / tap alone: "
                f"{best['shaped'] / best['tap']:.2f}x; our rows/s / shaped's: "
                f"{best['shaped'] / best['ours']:.1f}x",
                end="",
            )
        print()
    # scripts/with-clickhouse's own server has a password `local-<digits>`.
    if PASSWORD.startswith("local-"):
        server = "ran under scripts/with-clickhouse (its local ClickHouse, chdb-core)"
    else:
        server = f"ClickHouse at {urllib.parse.urlsplit(URL).hostname} (CLICKHOUSE_URL)"
    try:
        wheel = "clickhouse-component " + importlib.metadata.version("clickhouse-component")
    except importlib.metadata.PackageNotFoundError:
        wheel = "clickhouse-component (version unknown: not this Python's package)"
    print(
        f"\nMachine: {len(os.sched_getaffinity(0))} CPUs (nproc), niceness {os.nice(0)}, "
        f"load average {load_start[0]:.2f} at the start and {os.getloadavg()[0]:.2f} at the end; "
        f"{server}; a private PostgreSQL "
        f"(scripts/postgres, set up in {setup_seconds:.1f} s); "
        f"{wheel}; {time.monotonic() - wall_start:.0f} s in all."
    )
    print(
        "\nThe tables the last runs left, column by column: the ClickHouse type, the non-NULL "
        "values (count(column)) and the values equal to PostgreSQL's (NULL for NULL; compared "
        f"as tests/python/test_tap_postgres.py compares them), of {args.rows:,} rows\n"
    )
    print("\n".join(columns))
    if odd:
        print("\nOdd:\n")
        for line in odd:
            print(f"- {line}")
    return 0 if all(r.ok for runs in results.values() for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
