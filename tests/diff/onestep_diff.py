"""Differential test: the same payloads and options through onestep-clickhouse 0.1.1's table sink
and through ours (the CLI's `sink`), against the same ClickHouse.

Run with `make diff` (the venv with onestep-clickhouse, the host binary, and the local ClickHouse
via scripts/with-clickhouse), or by hand:

    CLICKHOUSE_URL=... CLICKHOUSE_USER=... CLICKHOUSE_PASSWORD=... \
        .venv-bench/bin/python tests/diff/onestep_diff.py [CASE_NAME_SUBSTRING ...]

Each case gets a fresh table for each side (created, run, read back, dropped). Per case it compares
(a) accepted or rejected, (b) the error kind, (c) the rows left in the table (exact contents).

How onestep's outcomes map onto our error kinds (from onestep_clickhouse/connector.py and
resilience.py):
- `ValueError`/`TypeError` from `table_sink(...)` (option checks) -> invalid-input;
- `ConnectorOperationError` whose cause is a `ClickHousePayloadError` (the row rules, checked
  before any request; onestep labels it PERMANENT because it has no invalid-input) -> invalid-input;
- any other `ConnectorOperationError` -> its kind (disconnected, transient, throttled,
  misconfigured, permanent, uncertain: the same names as ours);
- anything else is re-raised by onestep unclassified (its `classify_clickhouse_error` returns None
  for errors without a ClickHouse code: clickhouse-connect's client-side serialisation refusals)
  -> `unclassified(ExceptionType)`, which never equals one of our kinds.

Ours: `--json` output and the exit code (which must match the kind). A case agrees when both
outcomes equal its `expect` and the rows are equal (and equal `rows` when given). A case with a
`Diff` passes only if the observed difference is exactly the expected one.

Through the plugin: with `DIFF_PLUGIN_PYTHON` naming the Python of a venv holding onestep 1.15.0
and our wheel (not onestep-clickhouse: onestep refuses a second registration of a resource type,
so the two cannot share a venv; `make test` passes `.venv-plugin/bin/python`), every case also
runs a third time through our onestep plugin (`clickhouse_component.onestep`, the same calls as
onestep's side: `ClickHouseConnector(dsn).table_sink(...)`, `send(Envelope(rows))`), in a
subprocess of that venv. The plugin must agree with our CLI (outcome and rows), except where a
case's `plugin` names the difference: the plugin, like onestep, takes Python objects and checks
the whole payload before its first chunk.

Prints one line per case, then `N passed, N failed`; exits 1 on any failure. DIFF_VERBOSE=1 adds
each side's error message and rows under its case; DIFF_KEEP=1 keeps the tables.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import decimal
import ipaddress
import json
import logging
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass, field
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI = os.environ.get("DIFF_CLI", os.path.join(ROOT, "target", "debug", "clickhouse-component"))
URL = os.environ.get("CLICKHOUSE_URL", "").rstrip("/")
USER = os.environ.get("CLICKHOUSE_USER") or "default"
PASSWORD = os.environ.get("CLICKHOUSE_PASSWORD", "")
DB = "onestep_diff"  # every case's table lives here unless the case names another
EXIT_CODES = {
    "invalid-input": 2, "misconfigured": 3, "disconnected": 4, "transient": 5, "throttled": 6,
    "permanent": 7, "uncertain": 8, "locked": 9, "not-found": 10,
}

# ---------------------------------------------------------------------------------------------
# ClickHouse over plain HTTP (setup and verification only)
# ---------------------------------------------------------------------------------------------


class ClickHouseError(Exception):
    pass


def ch(sql: str, params: dict[str, str] | None = None, settings: dict[str, str] | None = None) -> str:
    query = {"query": sql, **(settings or {})}
    query.update({f"param_{k}": v for k, v in (params or {}).items()})
    request = urllib.request.Request(
        f"{URL}/?{urllib.parse.urlencode(query)}",
        data=b"",
        method="POST",
        headers={"X-ClickHouse-User": USER, "X-ClickHouse-Key": PASSWORD},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.read().decode()
    except urllib.error.HTTPError as e:
        raise ClickHouseError(f"HTTP {e.code}: {e.read().decode(errors='replace').strip()}") from None


def split_table(table: str) -> tuple[str, str]:
    db, _, name = table.rpartition(".")
    return db or "default", name


def create_table(table: str, ddl: str) -> None:
    db, name = split_table(table)
    drop_table(table)
    ch(
        f"CREATE TABLE {{db:Identifier}}.{{t:Identifier}} ({ddl}) ENGINE = MergeTree ORDER BY tuple()",
        {"db": db, "t": name},
    )


def drop_table(table: str) -> None:
    db, name = split_table(table)
    ch("DROP TABLE IF EXISTS {db:Identifier}.{t:Identifier} SYNC", {"db": db, "t": name})


def table_rows(table: str) -> list[dict] | None:
    """The table's rows, sorted (None when the table does not exist)."""
    db, name = split_table(table)
    try:
        exists = ch("EXISTS TABLE {db:Identifier}.{t:Identifier}", {"db": db, "t": name}).strip()
    except ClickHouseError:  # an unknown database
        return None
    if exists != "1":
        return None
    text = ch(
        "SELECT * FROM {db:Identifier}.{t:Identifier} FORMAT JSONEachRow",
        {"db": db, "t": name},
        {"output_format_json_quote_64bit_integers": "0"},
    )
    return canonical([json.loads(line) for line in text.splitlines() if line.strip()])


def canonical(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True, ensure_ascii=False))


def flush_async_inserts() -> None:
    """Make fire-and-forget inserts visible (a server without an async queue has none pending)."""
    try:
        ch("SYSTEM FLUSH ASYNC INSERT QUEUE")
    except ClickHouseError:
        pass


# ---------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------


@dataclass
class Diff:
    """A deliberate difference: exactly these outcomes (and, when given, these rows)."""

    onestep: str
    ours: str
    reason: str
    onestep_rows: list[dict] | None = None
    ours_rows: list[dict] | None = None


@dataclass
class PluginDiff:
    """Where our onestep plugin differs from our CLI: exactly this outcome and these rows."""

    outcome: str
    reason: str
    rows: list[dict] | None = None


@dataclass
class Case:
    name: str
    ddl: str | None  # column definitions; None: no table is created
    rows: list[Any] | str  # JSON values (one per row), or raw NDJSON text
    expect: str | None = None  # the agreed outcome: "accepted" or "rejected:<kind>"
    rows_after: list[dict] | None = None  # the table's exact contents afterwards (both sides)
    diff: Diff | None = None
    table: str | None = None  # default: onestep_diff.<name>
    columns: list[str] | None = None
    batch_size: int | None = None
    settings: dict[str, str] = field(default_factory=dict)
    ours_input: str = "ndjson"  # or "array": the payload as one JSON array
    # onestep's payload when it differs from `rows` read by json.loads (rows nested deeper than
    # Python's json reads: built as Python objects instead).
    objects: list[Any] | None = None
    plugin: PluginDiff | None = None  # the plugin's difference from our CLI, if any

    def target(self) -> str:
        return self.table or f"{DB}.{self.name}"

    def payload_text(self) -> str:
        if isinstance(self.rows, str):
            return self.rows
        if self.ours_input == "array":
            return json.dumps(self.rows, ensure_ascii=False)
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in self.rows)

    def payload_objects(self) -> list[Any]:
        # onestep takes Python objects: the same payload as json.loads reads it.
        if self.objects is not None:
            return self.objects
        if isinstance(self.rows, str):
            return [json.loads(line) for line in self.rows.splitlines() if line.strip()]
        return json.loads(json.dumps(self.rows))


BASIC = "id UInt32, name String"
NESTED = (
    "id UInt32, s String, j JSON, a Array(UInt32), aa Array(Array(UInt32)), "
    "m Map(String, UInt32), tp Tuple(x String, y UInt32), ut Tuple(String, UInt32)"
)
AWKWARD = "`id` UInt32, `weird col` String, `a\\`b` String, `ünï` String, `select` String, `x.y` String"
AWKWARD_ROW = {"id": 1, "weird col": "w c", "a`b": "back`quote", "ünï": "ü", "select": "kw", "x.y": "dot"}
FIVE = [{"id": i, "name": f"n{i}"} for i in range(1, 6)]
CHECKED = "id UInt32, v Int32, CONSTRAINT v_positive CHECK v > 0"
UNCLASSIFIED = "onestep re-raises clickhouse-connect's client-side refusal without a kind"


def deep(levels: int) -> tuple[str, dict]:
    """A row whose objects nest `levels` deep (the row's own object included), as NDJSON text
    and as Python objects built without json (which cannot read past ~995 levels)."""
    value: Any = 1
    for _ in range(levels - 1):
        value = {"k": value}
    text = '{"id":1,"j":' + '{"k":' * (levels - 1) + "1" + "}" * levels + "\n"
    return text, {"id": 1, "j": value}


DEEP_OK = deep(950)  # about as deep as onestep's Python rows get through json.dumps
DEEP_OVER = deep(1001)  # past our row limit (1,000 levels, the server's input_format_json_max_depth)


PLUS_2 = dt.timezone(dt.timedelta(hours=2))
UUID = uuid.UUID("6f1c8a52-0e4b-4a55-9d1e-2b7c3f4a5d6e")


def nested(**values: Any) -> dict:
    row = {"id": 1, "s": "s", "j": {"k": 1}, "a": [1], "aa": [[1]], "m": {"a": 1},
           "tp": {"x": "x", "y": 1}, "ut": ["u", 1]}
    row.update(values)
    return row


# Objects and arrays, nested and of different shapes per row, into JSON/Array/Map/Tuple columns.
NESTED_ROWS = [
    nested(j={"k": [1, {"z": "q"}], "n": {"m": 2}}, a=[1, 2, 3], aa=[[1], [2, 3]],
           m={"a": 1, "b": 2}, tp={"x": "q", "y": 2}, ut=["u", 3]),
    nested(id=2, j={"other": "shape", "list": ["a", "b"]}),
]

CASES: list[Case] = [
    # --- row rules -------------------------------------------------------------------------
    Case("rows_ok", BASIC, [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}], expect="accepted",
         rows_after=[{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]),
    Case("rows_ok_json_array", BASIC, [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}],
         ours_input="array", expect="accepted",
         rows_after=[{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]),
    Case("rows_key_order_differs", BASIC, [{"id": 1, "name": "a"}, {"name": "b", "id": 2}],
         expect="accepted", rows_after=[{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]),
    Case("row_not_object_array", BASIC, [{"id": 1, "name": "a"}, [1, "b"]],
         expect="rejected:invalid-input", rows_after=[]),
    Case("row_not_object_scalar", BASIC, [{"id": 1, "name": "a"}, "text"],
         expect="rejected:invalid-input", rows_after=[]),
    Case("row_not_object_null", BASIC, [{"id": 1, "name": "a"}, None],
         expect="rejected:invalid-input", rows_after=[]),
    Case("row_not_object_first", BASIC, [42, {"id": 1, "name": "a"}],
         expect="rejected:invalid-input", rows_after=[]),
    Case("row_not_object_json_array", BASIC, [{"id": 1, "name": "a"}, 7], ours_input="array",
         expect="rejected:invalid-input", rows_after=[]),
    Case("row_missing_key", BASIC, [{"id": 1, "name": "a"}, {"id": 2}],
         expect="rejected:invalid-input", rows_after=[]),
    Case("row_extra_key", BASIC, [{"id": 1, "name": "a"}, {"id": 2, "name": "b", "x": 1}],
         expect="rejected:invalid-input", rows_after=[]),
    Case("rows_mixed_key_sets", BASIC, [{"id": 1, "name": "a"}, {"id": 2, "x": "b"}],
         expect="rejected:invalid-input", rows_after=[]),
    Case("row_key_twice", BASIC, '{"id":1,"name":"a"}\n{"id":2,"name":"b","id":3}\n',
         diff=Diff("accepted", "rejected:invalid-input",
                   "onestep gets Python dicts, which cannot hold a key twice (json.loads keeps the last); "
                   "ours refuses the ambiguous row",
                   onestep_rows=[{"id": 1, "name": "a"}, {"id": 3, "name": "b"}], ours_rows=[]),
         plugin=PluginDiff("accepted", "the plugin gets the same Python dicts as onestep",
                           rows=[{"id": 1, "name": "a"}, {"id": 3, "name": "b"}])),
    Case("payload_empty", BASIC, [], expect="rejected:invalid-input", rows_after=[]),
    Case("payload_empty_json_array", BASIC, [], ours_input="array",
         expect="rejected:invalid-input", rows_after=[]),
    Case("first_row_empty_object", BASIC, [{}, {"id": 1, "name": "a"}],
         expect="rejected:invalid-input", rows_after=[]),
    Case("columns_row_missing_one", BASIC, [{"id": 1}], columns=["id", "name"],
         expect="rejected:invalid-input", rows_after=[]),
    Case("columns_row_has_extra", BASIC, [{"id": 1, "name": "a"}], columns=["id"],
         expect="rejected:invalid-input", rows_after=[]),
    Case("columns_empty_row", BASIC, [{}], columns=["id"],
         expect="rejected:invalid-input", rows_after=[]),
    Case("columns_subset_default_filled", BASIC, [{"id": 1}, {"id": 2}], columns=["id"],
         expect="accepted", rows_after=[{"id": 1, "name": ""}, {"id": 2, "name": ""}]),
    Case("columns_order_differs_from_keys", BASIC, [{"id": 1, "name": "a"}], columns=["name", "id"],
         expect="accepted", rows_after=[{"id": 1, "name": "a"}]),
    Case("row_rule_broken_in_later_batch", BASIC, FIVE[:4] + [{"id": 5}], batch_size=2,
         diff=Diff("rejected:invalid-input", "rejected:uncertain",
                   "the CLI streams and validates batch by batch (README), so a bad row after committed "
                   "batches is uncertain; onestep validates the whole payload first",
                   onestep_rows=[], ours_rows=FIVE[:4]),
         plugin=PluginDiff("rejected:invalid-input", "the plugin, like onestep, is given the whole "
                           "payload and checks it before its first chunk", rows=[])),
    # --- options ---------------------------------------------------------------------------
    Case("option_batch_size_zero", BASIC, [{"id": 1, "name": "a"}], batch_size=0,
         expect="rejected:invalid-input", rows_after=[]),
    Case("option_columns_twice", BASIC, [{"id": 1, "name": "a"}], columns=["id", "id"],
         expect="rejected:invalid-input", rows_after=[]),
    Case("option_column_blank", BASIC, [{"id": 1, "name": "a"}], columns=["id", " "],
         expect="rejected:invalid-input", rows_after=[]),
    # --- batch sizes -----------------------------------------------------------------------
    Case("batch_size_1", BASIC, FIVE, batch_size=1, expect="accepted", rows_after=FIVE),
    Case("batch_size_2_of_5", BASIC, FIVE, batch_size=2, expect="accepted", rows_after=FIVE),
    Case("batch_size_5_of_5", BASIC, FIVE, batch_size=5, expect="accepted", rows_after=FIVE),
    Case("batch_size_over_rows", BASIC, FIVE, batch_size=100, expect="accepted", rows_after=FIVE),
    # --- nested and mixed shapes -----------------------------------------------------------
    Case("nested_all_columns", NESTED, NESTED_ROWS, expect="accepted", rows_after=NESTED_ROWS),
    # The row depth limit accepts every row onestep's Python rows can be (json.dumps stops near
    # Python's recursion limit of 1,000 frames); past ours, onestep fails inside clickhouse-connect.
    Case("nesting_950_levels", "id UInt32, j JSON", DEEP_OK[0], objects=[DEEP_OK[1]],
         expect="accepted"),
    Case("nesting_past_the_row_limit", "id UInt32, j JSON", DEEP_OVER[0], objects=[DEEP_OVER[1]],
         diff=Diff("rejected:unclassified(RecursionError)", "rejected:invalid-input",
                   "Python cannot serialise a row so deep; ours refuses it by its depth limit",
                   onestep_rows=[], ours_rows=[])),
    Case("object_into_string", NESTED, [nested(s={"o": [1, 2]})],
         diff=Diff("rejected:unclassified(AttributeError)", "accepted",
                   "ours passes JSON through and ClickHouse stores an object's JSON text in a String "
                   "column (README); onestep's Native serializer cannot encode a dict",
                   onestep_rows=[], ours_rows=[nested(s='{"o": [1, 2]}')]),
         plugin=PluginDiff("accepted", "the plugin writes Python objects as compact JSON",
                           rows=[nested(s='{"o":[1,2]}')])),
    Case("array_into_string", NESTED, [nested(s=[1, "x"])],
         diff=Diff("rejected:unclassified(AttributeError)", "accepted",
                   "ClickHouse's JSON input stores an array's JSON text in a String column; "
                   "onestep's Native serializer cannot encode a list",
                   onestep_rows=[], ours_rows=[nested(s='[1, "x"]')]),
         plugin=PluginDiff("accepted", "the plugin writes Python objects as compact JSON",
                           rows=[nested(s='[1,"x"]')])),
    Case("number_into_string", NESTED, [nested(s=12)],
         diff=Diff("rejected:unclassified(AttributeError)", "accepted",
                   "ClickHouse's JSON input reads a number into a String column as its text; "
                   "onestep's Native serializer cannot encode an int",
                   onestep_rows=[], ours_rows=[nested(s="12")])),
    Case("array_into_json", NESTED, [nested(j=[1, 2])], expect="rejected:permanent", rows_after=[]),
    Case("scalar_into_json", NESTED, [nested(j="text")], expect="rejected:permanent", rows_after=[]),
    Case("null_into_json", NESTED, [nested(j=None)],
         diff=Diff("accepted", "rejected:permanent",
                   "onestep silently stores null as {} in a JSON column; ours refuses a null there",
                   onestep_rows=[nested(j={})], ours_rows=[])),
    Case("object_into_array", NESTED, [nested(a={"k": 1})],
         diff=Diff("rejected:unclassified(ValueError)", "rejected:invalid-input",
                   UNCLASSIFIED + "; ours refuses it before any INSERT, naming the row and column (invalid-input)",
                   onestep_rows=[], ours_rows=[])),
    Case("list_into_map", NESTED, [nested(m=[1])],
         diff=Diff("rejected:unclassified(DataError)", "rejected:invalid-input",
                   UNCLASSIFIED + "; ours refuses it before any INSERT, naming the row and column (invalid-input)",
                   onestep_rows=[], ours_rows=[])),
    Case("named_tuple_from_array", NESTED, [nested(tp=["q", 2])],
         diff=Diff("accepted", "rejected:permanent",
                   "ClickHouse's JSON input reads a named Tuple only from an object and the sink does "
                   "not reshape values; onestep's Native serializer takes a list positionally",
                   onestep_rows=[nested(tp={"x": "q", "y": 2})], ours_rows=[])),
    # --- NULLs ------------------------------------------------------------------------------
    Case("null_into_nullable", "id UInt32, ns Nullable(String), ni Nullable(UInt32), "
         "na Array(Nullable(UInt32))",
         [{"id": 1, "ns": None, "ni": None, "na": [1, None]}, {"id": 2, "ns": "x", "ni": 5, "na": []}],
         expect="accepted",
         rows_after=[{"id": 1, "ns": None, "ni": None, "na": [1, None]},
                     {"id": 2, "ns": "x", "ni": 5, "na": []}]),
    Case("null_into_string", BASIC, [{"id": 1, "name": None}],
         diff=Diff("rejected:unclassified(DataError)", "rejected:invalid-input",
                   UNCLASSIFIED + "; ours refuses a null for a non-Nullable column before any INSERT",
                   onestep_rows=[], ours_rows=[])),
    Case("null_into_uint32", BASIC, [{"id": None, "name": "a"}],
         diff=Diff("rejected:unclassified(TypeError)", "rejected:invalid-input",
                   UNCLASSIFIED + "; ours checks nulls against the column types (ClickHouse would store 0)",
                   onestep_rows=[], ours_rows=[])),
    Case("null_in_array_of_uint32", NESTED, [nested(a=[1, None])],
         diff=Diff("rejected:unclassified(DataError)", "rejected:invalid-input",
                   UNCLASSIFIED + "; ours checks nested nulls against the column types (ClickHouse would store 0)",
                   onestep_rows=[], ours_rows=[])),
    # --- wrong types -------------------------------------------------------------------------
    Case("string_into_uint32", BASIC, [{"id": "x", "name": "a"}],
         diff=Diff("rejected:unclassified(ValueError)", "rejected:invalid-input",
                   UNCLASSIFIED + "; ours refuses it before any INSERT, naming the row and column (invalid-input)",
                   onestep_rows=[], ours_rows=[])),
    Case("numeric_string_into_uint32", BASIC, [{"id": "5", "name": "a"}], expect="accepted",
         rows_after=[{"id": 5, "name": "a"}]),
    Case("bool_into_uint32", BASIC, [{"id": True, "name": "a"}], expect="accepted",
         rows_after=[{"id": 1, "name": "a"}]),
    Case("fraction_into_uint32", BASIC, [{"id": 1.7, "name": "a"}],
         diff=Diff("accepted", "rejected:invalid-input",
                   "onestep silently truncates 1.7 to 1; ours refuses a fraction for an integer "
                   "column before any INSERT (as ClickHouse's JSON input would)",
                   onestep_rows=[{"id": 1, "name": "a"}], ours_rows=[])),
    Case("negative_into_uint32", BASIC, [{"id": -1, "name": "a"}],
         diff=Diff("rejected:unclassified(DataError)", "rejected:invalid-input",
                   UNCLASSIFIED + "; ours refuses it before any INSERT, naming the row and column (invalid-input)",
                   onestep_rows=[], ours_rows=[])),
    Case("out_of_range_integers", "id UInt32, u8 UInt8, i8 Int8",
         [{"id": 4294967301, "u8": 300, "i8": 200}],
         diff=Diff("rejected:unclassified(DataError)", "rejected:invalid-input",
                   "both refuse: onestep's serializer with an unclassified DataError, ours as "
                   "invalid-input before any request (ClickHouse's JSON input would wrap them)",
                   onestep_rows=[], ours_rows=[])),
    Case("string_false_into_bool", "id UInt32, b Bool", [{"id": 1, "b": "false"}],
         diff=Diff("accepted", "rejected:invalid-input",
                   "onestep silently stores 'false' as true (Python truthiness); ours refuses a "
                   "quoted bool before any INSERT (ClickHouse refuses it too)",
                   onestep_rows=[{"id": 1, "b": True}], ours_rows=[])),
    Case("int64_uint64_extremes", "u UInt64, i Int64",
         [{"u": 18446744073709551615, "i": -9223372036854775808}], expect="accepted",
         rows_after=[{"u": 18446744073709551615, "i": -9223372036854775808}]),
    Case("decimal_past_its_scale", "id UInt32, d Decimal(10, 2)", [{"id": 1, "d": 1.005}],
         diff=Diff("accepted", "rejected:invalid-input",
                   "onestep's Decimal serializer drops the digits past the scale (1.005 is stored "
                   "as 1.00); ours refuses the value",
                   onestep_rows=[{"id": 1, "d": 1}], ours_rows=[])),
    # --- Python's own value types (onestep and the plugin get the objects; the CLI the JSON
    # text that means the same) ---------------------------------------------------------------
    Case("python_datetimes_and_dates", "id UInt32, naive DateTime64(6), aware DateTime64(3, 'UTC'), "
         "secs DateTime('UTC'), d Date, d32 Date32",
         [{"id": 1, "naive": "2024-05-06 07:08:09.123456", "aware": "2024-05-06 09:08:09.123+02:00",
           "secs": "2024-05-06 07:08:09", "d": "2024-02-29", "d32": "1950-01-02"}],
         objects=[{"id": 1, "naive": dt.datetime(2024, 5, 6, 7, 8, 9, 123456),
                   "aware": dt.datetime(2024, 5, 6, 9, 8, 9, 123000, tzinfo=PLUS_2),
                   "secs": dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=dt.timezone.utc),
                   "d": dt.date(2024, 2, 29), "d32": dt.date(1950, 1, 2)}],
         expect="accepted"),
    Case("python_decimals_uuids_addresses", "id UInt32, dec Decimal(18, 4), nd Nullable(Decimal(9, 2)), "
         "u UUID, ip4 IPv4, ip6 IPv6, days Array(Date)",
         # (NDJSON text: json.dumps would round the second decimal through a float.)
         f'{{"id":1,"dec":12.3400,"nd":-0.50,"u":"{UUID}","ip4":"10.1.2.3","ip6":"2001:db8::1",'
         '"days":["2024-01-01","2024-01-02"]}\n'
         f'{{"id":2,"dec":-99999999999999.9999,"nd":null,"u":"{UUID}","ip4":"0.0.0.0","ip6":"::",'
         '"days":[]}\n',
         objects=[{"id": 1, "dec": decimal.Decimal("12.3400"), "nd": decimal.Decimal("-0.50"), "u": UUID,
                   "ip4": ipaddress.IPv4Address("10.1.2.3"), "ip6": ipaddress.IPv6Address("2001:db8::1"),
                   "days": [dt.date(2024, 1, 1), dt.date(2024, 1, 2)]},
                  {"id": 2, "dec": decimal.Decimal("-99999999999999.9999"), "nd": None, "u": UUID,
                   "ip4": ipaddress.IPv4Address("0.0.0.0"), "ip6": ipaddress.IPv6Address("::"),
                   "days": []}],
         expect="accepted"),
    Case("python_microseconds_into_datetime", "id UInt32, t DateTime('UTC')",
         [{"id": 1, "t": "2024-05-06 07:08:09.123456"}],
         objects=[{"id": 1, "t": dt.datetime(2024, 5, 6, 7, 8, 9, 123456)}],
         diff=Diff("accepted", "rejected:invalid-input",
                   "clickhouse-connect drops the microseconds (int(timestamp())); ours refuses the value",
                   onestep_rows=[{"id": 1, "t": "2024-05-06 07:08:09"}], ours_rows=[])),
    Case("python_decimal_past_its_scale", "id UInt32, d Decimal(10, 2)", [{"id": 1, "d": 1.005}],
         objects=[{"id": 1, "d": decimal.Decimal("1.005")}],
         diff=Diff("accepted", "rejected:invalid-input",
                   "clickhouse-connect drops the digits past the scale; ours refuses the value",
                   onestep_rows=[{"id": 1, "d": 1}], ours_rows=[])),
    Case("python_datetime_into_date", "id UInt32, d Date", [{"id": 1, "d": "2024-05-06 07:08:00"}],
         objects=[{"id": 1, "d": dt.datetime(2024, 5, 6, 7, 8)}],
         diff=Diff("accepted", "rejected:invalid-input",
                   "clickhouse-connect stores the datetime's date and drops its time; ours refuses it",
                   onestep_rows=[{"id": 1, "d": "2024-05-06"}], ours_rows=[])),
    Case("python_datetime_into_string", BASIC, [{"id": 1, "name": "2024-05-06 07:08:00"}],
         objects=[{"id": 1, "name": dt.datetime(2024, 5, 6, 7, 8)}],
         diff=Diff("rejected:unclassified(AttributeError)", "accepted",
                   "clickhouse-connect refuses a datetime in a String column; our CLI is given "
                   "its text, which a String column stores",
                   onestep_rows=[], ours_rows=[{"id": 1, "name": "2024-05-06 07:08:00"}]),
         plugin=PluginDiff("rejected:invalid-input", "the plugin is given the datetime itself "
                           "(a packed value of its own), which a String column refuses before "
                           "any request, as clickhouse-connect refuses it", rows=[])),
    Case("python_values_into_string", BASIC + ", more String",
         [{"id": 1, "name": "12.50", "more": str(UUID)}],
         objects=[{"id": 1, "name": decimal.Decimal("12.50"), "more": UUID}],
         diff=Diff("rejected:unclassified(AttributeError)", "accepted",
                   "clickhouse-connect refuses a Decimal or UUID in a String column; our CLI is "
                   "given their text, which a String column stores",
                   onestep_rows=[], ours_rows=[{"id": 1, "name": "12.50", "more": str(UUID)}]),
         plugin=PluginDiff("rejected:invalid-input", "the plugin is given the Decimal itself, "
                           "which a String column refuses, as clickhouse-connect refuses it",
                           rows=[])),
    # --- unknown and missing columns, tables, databases -------------------------------------
    Case("unknown_column", BASIC, [{"id": 1, "name": "a", "zz": 1}],
         diff=Diff("rejected:unclassified(ProgrammingError)", "rejected:misconfigured",
                   UNCLASSIFIED + " ('Unrecognized column'); ours: the server's NO_SUCH_COLUMN_IN_TABLE "
                   "is misconfigured", onestep_rows=[], ours_rows=[])),
    Case("unknown_configured_column", BASIC, [{"id": 1, "zz": 1}], columns=["id", "zz"],
         diff=Diff("rejected:unclassified(ProgrammingError)", "rejected:misconfigured",
                   UNCLASSIFIED + " ('Unrecognized column'); ours: the server's NO_SUCH_COLUMN_IN_TABLE "
                   "is misconfigured", onestep_rows=[], ours_rows=[])),
    Case("table_column_missing_from_rows", "id UInt32, name String, n UInt32 DEFAULT 7, "
         "d String DEFAULT 'dflt'", [{"id": 1, "name": "a"}], expect="accepted",
         rows_after=[{"id": 1, "name": "a", "n": 7, "d": "dflt"}]),
    Case("unknown_table", None, [{"id": 1}], table=f"{DB}.no_such_table",
         expect="rejected:misconfigured"),
    Case("unknown_database", None, [{"id": 1}], table="onestep_diff_no_such_db.t",
         expect="rejected:misconfigured"),
    Case("unqualified_table", BASIC, [{"id": 1, "name": "a"}], table="onestep_diff_unqualified",
         expect="accepted", rows_after=[{"id": 1, "name": "a"}]),
    Case("awkward_column_names", AWKWARD, [AWKWARD_ROW, dict(AWKWARD_ROW, id=2)],
         expect="accepted", rows_after=[AWKWARD_ROW, dict(AWKWARD_ROW, id=2)]),
    Case("awkward_column_names_configured", AWKWARD, [AWKWARD_ROW, dict(AWKWARD_ROW, id=2)],
         columns=["x.y", "select", "ünï", "a`b", "weird col", "id"], batch_size=1,
         expect="accepted", rows_after=[AWKWARD_ROW, dict(AWKWARD_ROW, id=2)]),
    # --- CHECK constraint; failures after committed chunks ----------------------------------
    Case("check_violation_first_chunk", CHECKED, [{"id": 1, "v": -1}, {"id": 2, "v": 2}],
         batch_size=2,
         diff=Diff("rejected:transient", "rejected:permanent",
                   "a CHECK violation is the data's fault and retrying cannot help (our taxonomy: "
                   "permanent); onestep's code table falls through to transient",
                   onestep_rows=[], ours_rows=[])),
    Case("check_violation_later_chunk", CHECKED,
         [{"id": i, "v": i} for i in range(1, 5)] + [{"id": 5, "v": -5}], batch_size=2,
         expect="rejected:uncertain", rows_after=[{"id": i, "v": i} for i in range(1, 5)]),
    Case("server_rejects_later_chunk", "id UInt32, j JSON",
         [{"id": i, "j": {"k": i}} for i in range(1, 5)] + [{"id": 5, "j": "text"}], batch_size=2,
         expect="rejected:uncertain", rows_after=[{"id": i, "j": {"k": i}} for i in range(1, 5)]),
    Case("bad_value_later_chunk", BASIC, FIVE[:4] + [{"id": "x", "name": "n5"}], batch_size=2,
         diff=Diff("rejected:unclassified(ValueError)", "rejected:uncertain",
                   UNCLASSIFIED + ", even after two chunks committed (its uncertain rule only covers "
                   "classified errors); ours (the CLI reading stdin batch by batch): uncertain",
                   onestep_rows=FIVE[:4], ours_rows=FIVE[:4]),
         plugin=PluginDiff("rejected:invalid-input",
                           "our plugin sends the envelope in one call, whose every value is read "
                           "before its first INSERT: nothing written", rows=[])),
    # --- async inserts ----------------------------------------------------------------------
    Case("async_insert_1", "id UInt32", [{"id": 1}], settings={"async_insert": "1"},
         expect="rejected:invalid-input", rows_after=[]),
    Case("async_insert_true", "id UInt32", [{"id": 1}], settings={"async_insert": "true"},
         diff=Diff("accepted", "rejected:invalid-input",
                   "onestep recognises only 1/True/'1' and sends a fire-and-forget insert for 'true'; "
                   "ours refuses every spelling", onestep_rows=[{"id": 1}], ours_rows=[])),
    Case("async_insert_on", "id UInt32", [{"id": 1}], settings={"async_insert": "on"},
         diff=Diff("rejected:transient", "rejected:invalid-input",
                   "ours refuses fire-and-forget before sending; onestep misses 'on' and sends it, and "
                   "the server refuses the value (CANNOT_PARSE_BOOL)", onestep_rows=[], ours_rows=[])),
    Case("async_insert_1_wait_0", "id UInt32", [{"id": 1}],
         settings={"async_insert": "1", "wait_for_async_insert": "0"},
         expect="rejected:invalid-input", rows_after=[]),
    Case("async_insert_1_wait_1", "id UInt32", [{"id": 1}, {"id": 2}],
         settings={"async_insert": "1", "wait_for_async_insert": "1"},
         expect="accepted", rows_after=[{"id": 1}, {"id": 2}]),
    Case("async_insert_true_wait_1", "id UInt32", [{"id": 1}, {"id": 2}],
         settings={"async_insert": "true", "wait_for_async_insert": "1"},
         expect="accepted", rows_after=[{"id": 1}, {"id": 2}]),
    Case("async_insert_on_wait_1", "id UInt32", [{"id": 1}], settings={"async_insert": "on",
         "wait_for_async_insert": "1"},
         diff=Diff("rejected:transient", "rejected:invalid-input",
                   "ClickHouse refuses the value 'on' (CANNOT_PARSE_BOOL): ours refuses it before "
                   "sending; onestep sends it and calls the refusal transient", onestep_rows=[], ours_rows=[])),
]

# ---------------------------------------------------------------------------------------------
# Running one side
# ---------------------------------------------------------------------------------------------


@dataclass
class Result:
    outcome: str  # "accepted" or "rejected:<kind>"
    detail: str = ""
    committed_rows: int | None = None
    problem: str | None = None  # a harness-level inconsistency (exit code vs kind, ...)


def onestep_dsn() -> tuple[str, dict]:
    parts = urllib.parse.urlsplit(URL)
    auth = f"{urllib.parse.quote(USER, safe='')}:{urllib.parse.quote(PASSWORD, safe='')}"
    options: dict[str, Any] = {"compress": False}
    if parts.scheme in ("https", "clickhouses"):
        options["secure"] = True
    return f"clickhouse://{auth}@{parts.netloc}/default", options


def sink_options(case: Case) -> dict[str, Any]:
    """The case's `table_sink(...)` options, as onestep-clickhouse and our plugin both take them."""
    options: dict[str, Any] = {}
    if case.columns is not None:
        options["columns"] = case.columns
    if case.batch_size is not None:
        options["batch_size"] = case.batch_size
    if case.settings:
        options["settings"] = dict(case.settings)
    return options


async def run_onestep(case: Case) -> Result:
    from onestep import ConnectorOperationError, Envelope
    from onestep_clickhouse import ClickHouseConnector, ClickHousePayloadError

    dsn, client_options = onestep_dsn()
    connector = ClickHouseConnector(dsn, client_options=client_options)
    options = sink_options(case)
    try:
        try:
            sink = connector.table_sink(table=case.target(), **options)
        except (ValueError, TypeError) as e:
            return Result("rejected:invalid-input", f"{type(e).__name__}: {e}")
        try:
            await asyncio.wait_for(sink.send(Envelope(body=case.payload_objects())), 30)
        except ConnectorOperationError as e:
            if isinstance(e.cause, ClickHousePayloadError):
                return Result("rejected:invalid-input", f"{e.kind.value}: {e.cause}")
            return Result(f"rejected:{e.kind.value}", str(e.cause))
        except Exception as e:  # noqa: BLE001 - onestep re-raised it unclassified
            return Result(f"rejected:unclassified({type(e).__name__})", str(e))
        return Result("accepted")
    finally:
        await connector.close()


async def run_plugin(case: Case) -> Result:
    """The case through our onestep plugin, as onestep's side runs it (in the plugin's venv)."""
    from onestep import ConnectorOperationError, Envelope

    from clickhouse_component.onestep import ClickHouseConnector, ClickHousePayloadError

    dsn, _ = onestep_dsn()  # clickhouse-connect's `compress` is not one of our client_options
    connector = ClickHouseConnector(dsn)
    options = sink_options(case)
    try:
        try:
            sink = connector.table_sink(table=case.target(), **options)
        except (ValueError, TypeError) as e:
            return Result("rejected:invalid-input", f"{type(e).__name__}: {e}")
        try:
            await asyncio.wait_for(sink.send(Envelope(body=case.payload_objects())), 30)
        except ConnectorOperationError as e:
            cause = e.cause
            if isinstance(cause, ClickHousePayloadError) or getattr(cause, "kind", None) == "invalid-input":
                kind = "invalid-input"
            else:
                kind = getattr(cause, "kind", None) or e.kind.value
            if e.kind.value != EXPECTED_ONESTEP_KIND.get(kind, kind):
                return Result(f"rejected:{kind}", str(cause), getattr(cause, "committed_rows", None),
                              problem=f"plugin raised onestep kind {e.kind.value} for our {kind}")
            return Result(f"rejected:{kind}", str(cause), getattr(cause, "committed_rows", None))
        except Exception as e:  # noqa: BLE001 - the plugin let something through unclassified
            return Result(f"rejected:unclassified({type(e).__name__})", str(e),
                          problem=f"the plugin raised {type(e).__name__} outside ConnectorOperationError")
        finally:
            await sink.close()
        return Result("accepted")
    finally:
        await connector.close()


# Our kinds as onestep's `ConnectorErrorKind` (onestep has no invalid-input, locked or not-found).
EXPECTED_ONESTEP_KIND = {"invalid-input": "permanent", "locked": "transient", "not-found": "misconfigured"}


def run_ours(case: Case) -> Result:
    args = [CLI, "--json"]
    for name, value in case.settings.items():
        args += ["--setting", f"{name}={value}"]
    args += ["sink", "--table", case.target()]
    if case.columns is not None:
        args += ["--columns", ",".join(case.columns)]
    if case.batch_size is not None:
        args += ["--batch-size", str(case.batch_size)]
    args.append("-")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLICKHOUSE_", "MELTANO_"))}
    env.update(CLICKHOUSE_URL=URL, CLICKHOUSE_USER=USER, CLICKHOUSE_PASSWORD=PASSWORD)
    proc = subprocess.run(args, input=case.payload_text().encode(), capture_output=True, env=env,
                          timeout=60)
    lines = [line for line in proc.stdout.decode(errors="replace").splitlines() if line.strip()]
    try:
        doc = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        stderr = proc.stderr.decode(errors="replace").strip().replace("\n", " | ")
        if proc.returncode == 2:  # a usage error from the argument parser
            return Result("rejected:invalid-input", stderr[:300])
        return Result(f"runner-failure(exit {proc.returncode})", stderr[:300],
                      problem=f"ours printed no JSON (exit {proc.returncode}): {stderr[:300]}")
    if doc.get("ok"):
        problem = None if proc.returncode == 0 else f"ours succeeded with exit {proc.returncode}"
        return Result("accepted", f"{doc.get('rows')} rows in {doc.get('chunks')} chunks", problem=problem)
    error = doc.get("error", {})
    kind = error.get("kind", "?")
    problem = None
    if EXIT_CODES.get(kind) != proc.returncode:
        problem = f"ours exited {proc.returncode} for kind {kind} (expected {EXIT_CODES.get(kind)})"
    server = error.get("server") or {}
    detail = error.get("message", "")
    if server:
        detail += f" [server {server.get('code')} {server.get('name')} HTTP {server.get('http_status')}]"
    return Result(f"rejected:{kind}", detail, error.get("committed_rows"), problem)


def run_side(case: Case, side: str) -> tuple[Result, list[dict] | None]:
    table = case.target()
    if case.ddl is not None:
        create_table(table, case.ddl)
    try:
        if side == "onestep":
            result = asyncio.run(run_onestep(case))
        elif side == "plugin":
            result = asyncio.run(run_plugin(case))
        else:
            result = run_ours(case)
        if case.settings.get("async_insert"):
            flush_async_inserts()
        return result, table_rows(table)
    finally:
        if case.ddl is not None and not os.environ.get("DIFF_KEEP"):
            drop_table(table)


# ---------------------------------------------------------------------------------------------
# Verdicts
# ---------------------------------------------------------------------------------------------


def show_rows(rows: list[dict] | None) -> str:
    return "-" if rows is None else str(len(rows))


def judge(case: Case, os_res: Result, os_rows, ours_res: Result, ours_rows) -> list[str]:
    problems = [p for p in (os_res.problem, ours_res.problem) if p]

    def want_rows(rows: list[dict] | None) -> list[dict] | None:
        return None if rows is None else canonical(rows)

    if case.diff is None:
        if case.expect is None:
            problems.append("case has neither expect nor diff")
        if os_res.outcome != ours_res.outcome:
            problems.append(f"outcomes differ: onestep {os_res.outcome}, ours {ours_res.outcome}")
        for side, res in (("onestep", os_res), ("ours", ours_res)):
            if case.expect and res.outcome != case.expect:
                problems.append(f"{side} {res.outcome}, expected {case.expect}")
        if os_rows != ours_rows:
            problems.append(f"rows differ: onestep {json.dumps(os_rows, ensure_ascii=False)}, "
                            f"ours {json.dumps(ours_rows, ensure_ascii=False)}")
        if case.rows_after is not None:
            for side, rows in (("onestep", os_rows), ("ours", ours_rows)):
                if rows != want_rows(case.rows_after):
                    problems.append(f"{side} left {json.dumps(rows, ensure_ascii=False)}, expected "
                                    f"{json.dumps(want_rows(case.rows_after), ensure_ascii=False)}")
    else:
        d = case.diff
        if os_res.outcome != d.onestep:
            problems.append(f"onestep {os_res.outcome}, expected {d.onestep}")
        if ours_res.outcome != d.ours:
            problems.append(f"ours {ours_res.outcome}, expected {d.ours}")
        expected = {"onestep": d.onestep_rows, "ours": d.ours_rows}
        observed = {"onestep": os_rows, "ours": ours_rows}
        if d.onestep_rows is None and d.ours_rows is None and os_rows != ours_rows:
            problems.append(f"rows differ: onestep {json.dumps(os_rows, ensure_ascii=False)}, "
                            f"ours {json.dumps(ours_rows, ensure_ascii=False)}")
        for side in ("onestep", "ours"):
            if expected[side] is not None and observed[side] != want_rows(expected[side]):
                problems.append(f"{side} left {json.dumps(observed[side], ensure_ascii=False)}, expected "
                                f"{json.dumps(want_rows(expected[side]), ensure_ascii=False)}")
    # Ours' uncertain errors must count exactly the rows that are in the table.
    if ours_res.outcome == "rejected:uncertain" and ours_rows is not None:
        if ours_res.committed_rows != len(ours_rows):
            problems.append(f"ours reported {ours_res.committed_rows} committed rows, the table has "
                            f"{len(ours_rows)}")
    return problems


def judge_plugin(case: Case, plugin_res: Result, plugin_rows, ours_res: Result, ours_rows) -> list[str]:
    """The plugin must agree with our CLI, or differ exactly as the case's `plugin` says."""
    problems = [plugin_res.problem] if plugin_res.problem else []
    want_outcome, want_rows = ours_res.outcome, ours_rows
    if case.plugin is not None:
        want_outcome = case.plugin.outcome
        want_rows = None if case.plugin.rows is None else canonical(case.plugin.rows)
    if plugin_res.outcome != want_outcome:
        problems.append(f"plugin {plugin_res.outcome}, expected {want_outcome}")
    if plugin_rows != want_rows:
        problems.append(f"plugin left {json.dumps(plugin_rows, ensure_ascii=False)}, expected "
                        f"{json.dumps(want_rows, ensure_ascii=False)}")
    if plugin_res.outcome == "rejected:uncertain" and plugin_rows is not None:
        if plugin_res.committed_rows != len(plugin_rows):
            problems.append(f"plugin reported {plugin_res.committed_rows} committed rows, the table "
                            f"has {len(plugin_rows)}")
    return problems


def plugin_side(names: list[str]) -> int:
    """Runs the named cases through the plugin (in the plugin's venv): one JSON line per case."""
    logging.disable(logging.CRITICAL)
    by_name = {c.name: c for c in CASES}
    for name in names:
        result, rows = run_side(by_name[name], "plugin")
        print(json.dumps({"name": name, "result": result.__dict__, "rows": rows}), flush=True)
    return 0


def run_plugin_side(python: str, cases: list[Case]) -> dict[str, tuple[Result, list[dict] | None]]:
    """Every case through the plugin, in one subprocess of the plugin's venv, before the others
    (each side creates and drops the case's table in turn)."""
    proc = subprocess.run([python, os.path.abspath(__file__), "--plugin-side", *(c.name for c in cases)],
                          capture_output=True, timeout=600)
    out: dict[str, tuple[Result, list[dict] | None]] = {}
    for line in proc.stdout.decode(errors="replace").splitlines():
        doc = json.loads(line)
        out[doc["name"]] = (Result(**doc["result"]), doc["rows"])
    if proc.returncode != 0 or len(out) != len(cases):
        stderr = proc.stderr.decode(errors="replace").strip()[-2000:]
        raise SystemExit(f"the plugin side failed (exit {proc.returncode}, {len(out)} of {len(cases)} "
                         f"cases):\n{stderr}")
    return out


def main() -> int:
    if sys.argv[1:2] == ["--plugin-side"]:
        return plugin_side(sys.argv[2:])
    if not URL:
        print("CLICKHOUSE_URL is not set (run via scripts/with-clickhouse or `make diff`)", file=sys.stderr)
        return 2
    if not os.access(CLI, os.X_OK):
        print(f"no CLI at {CLI} (cargo build -p clickhouse-component-host)", file=sys.stderr)
        return 2
    logging.disable(logging.CRITICAL)  # clickhouse-connect logs every refusal with a traceback
    verbose = bool(os.environ.get("DIFF_VERBOSE"))
    selected = [c for c in CASES if not sys.argv[1:] or any(s in c.name for s in sys.argv[1:])]
    names = [c.name for c in CASES]
    assert len(names) == len(set(names)), "case names must be unique"

    started = time.monotonic()
    ch("DROP DATABASE IF EXISTS {db:Identifier} SYNC", {"db": DB})
    ch("CREATE DATABASE {db:Identifier}", {"db": DB})
    plugin_python = os.environ.get("DIFF_PLUGIN_PYTHON")
    plugin = run_plugin_side(plugin_python, selected) if plugin_python else {}
    passed = failed = 0
    width = max(len(c.name) for c in selected)
    for case in selected:
        os_res, os_rows = run_side(case, "onestep")
        ours_res, ours_rows = run_side(case, "ours")
        problems = judge(case, os_res, os_rows, ours_res, ours_rows)
        same = "same" if os_rows == ours_rows else "differ"
        rows = f"rows {show_rows(os_rows)}/{show_rows(ours_rows)} {same}"
        if case.name in plugin:
            plugin_res, plugin_rows = plugin[case.name]
            problems += judge_plugin(case, plugin_res, plugin_rows, ours_res, ours_rows)
            rows += f" plugin {plugin_res.outcome}"
        if problems:
            failed += 1
            verdict = "FAIL: " + "; ".join(problems)
        else:
            passed += 1
            verdict = "PASS" if case.diff is None else f"PASS (expected difference: {case.diff.reason})"
        print(f"{case.name:<{width}}  onestep {os_res.outcome:<40} ours {ours_res.outcome:<24} "
              f"{rows:<18} {verdict}", flush=True)
        if verbose:
            sides = [("onestep", os_res, os_rows), ("ours", ours_res, ours_rows)]
            if case.name in plugin:
                sides.append(("plugin", *plugin[case.name]))
            for side, res, left in sides:
                print(f"{'':<{width}}    {side + ':':<8} {' '.join(res.detail.split())[:400]}")
                print(f"{'':<{width}}    {'':<8} rows {json.dumps(left, ensure_ascii=False)}", flush=True)
    if not os.environ.get("DIFF_KEEP"):
        ch("DROP DATABASE IF EXISTS {db:Identifier} SYNC", {"db": DB})
    print(f"({time.monotonic() - started:.1f} s)", file=sys.stderr)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
