"""Benchmark helper: the benchmark's events into ClickHouse from Python, three ways.

Usage (CLICKHOUSE_URL / _USER / _PASSWORD set):
    python onestep_bench.py onestep-clickhouse TABLE ROWS BATCH_SIZE [SHAPE]   # in .venv-bench
    python onestep_bench.py plugin TABLE ROWS BATCH_SIZE [SHAPE]               # in .venv-plugin
    python onestep_bench.py send-json TABLE FILE BATCH_SIZE            # in .venv-plugin

- `onestep-clickhouse`: onestep-clickhouse 0.1.1's table sink, one `send` of every row as dicts
  (clickhouse-connect's Native format and its default compression, lz4, unless ONESTEP_COMPRESS
  names another: False, lz4, zstd, gzip);
- `plugin`: the same `send` of the same rows through our onestep plugin
  (`clickhouse_component.onestep`, the wheel; the sink's default compression, lz4, unless
  PLUGIN_COMPRESSION names another: none, lz4, zstd, gzip);
- `send-json`: the wheel's `Sink.send_json` of the NDJSON file's bytes, in one call.

A fifth argument `mixed` sends the typed section's 6-column rows (id, at, kind, amount
Decimal(18, 2), tags Array(String), note) instead of the events (`events`, the default;
docs/benchmarks.md, "The typed sink").

Prints one JSON line: {"rows": N, "seconds": S, "path": P}. Building the rows and reading the file
are not timed, nor is loading our component (`warm_up`: compiled once per wheel, then cached).
"""

import asyncio
import datetime
import decimal
import json
import os
import sys
import time

SHAPE = sys.argv[5] if len(sys.argv) > 5 else "events"
COLUMNS = (
    ["id", "at", "kind", "amount", "tags", "note"]
    if SHAPE == "mixed"
    else ["event_id", "seq", "occurred_at", "kind", "payload"]
)


def dsn() -> str:
    host_port = os.environ["CLICKHOUSE_URL"].split("//", 1)[1].rstrip("/")
    user = os.environ.get("CLICKHOUSE_USER", "default")
    password = os.environ.get("CLICKHOUSE_PASSWORD", "")
    return f"clickhouse://{user}:{password}@{host_port}/default"


def documents(rows: int, as_datetime: bool) -> list[dict]:
    """The rows the Rust benchmark writes as NDJSON: onestep-clickhouse's Native serializer takes
    a datetime for DateTime64; ours takes the JSON text ClickHouse reads."""
    base = datetime.datetime(2026, 11, 29, 10, 0, 0)
    payload = "p" * 64
    out = []
    if SHAPE == "mixed":
        # As benches/src/typed.rs writes them: onestep-clickhouse takes Python values
        # (datetime, Decimal), ours the JSON text ClickHouse reads (a decimal as a string).
        note = "n" * 40
        for n in range(rows):
            at = base + datetime.timedelta(milliseconds=n)
            amount = f"{n % 100000}.{n % 100:02d}"
            out.append(
                {
                    "id": 1_000_000_000_000 + n,
                    "at": at if as_datetime else at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3],
                    "kind": f"k{n % 7}",
                    "amount": decimal.Decimal(amount) if as_datetime else amount,
                    "tags": [f"t{(n + t) % 10}" for t in range(n % 4)],
                    "note": f"note {n} {note}",
                }
            )
        return out
    for n in range(rows):
        at = base + datetime.timedelta(milliseconds=n)
        out.append(
            {
                "event_id": f"ev-{n:07d}",
                "seq": 1_000_000_000_000 + n,
                "occurred_at": at if as_datetime else at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3],
                "kind": f"k{n % 7}",
                "payload": payload,
            }
        )
    return out


async def onestep_send(
    connector, table: str, rows: int, batch_size: int, as_datetime: bool, **options
) -> float:
    from onestep import Envelope

    sink = connector.table_sink(table=table, columns=COLUMNS, batch_size=batch_size, **options)
    body = documents(rows, as_datetime)
    started = time.perf_counter()
    await sink.send(Envelope(body=body))
    seconds = time.perf_counter() - started
    await sink.close()
    await connector.close()
    return seconds


def main() -> None:
    mode, table, what, batch_size = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    if mode == "onestep-clickhouse":
        from onestep_clickhouse import ClickHouseConnector

        compress = os.environ.get("ONESTEP_COMPRESS", "True")
        compress = {"True": True, "False": False}.get(compress, compress)
        connector = ClickHouseConnector(dsn(), client_options={"compress": compress})
        rows = int(what)
        seconds = asyncio.run(onestep_send(connector, table, rows, batch_size, True))
        path = f"onestep-clickhouse 0.1.1 (clickhouse-connect, Native format, compress={compress})"
    elif mode == "plugin":
        import clickhouse_component as cc
        from clickhouse_component.onestep import ClickHouseConnector

        # The component loaded before the timer, as a process that sends more than once has
        # it: the first process after a new wheel compiles it (about a second, once, then
        # cached), which is not a cost of a send. Each send still makes its instance.
        cc.warm_up()

        rows = int(what)
        compression = os.environ.get("PLUGIN_COMPRESSION")
        options = {"compression": compression} if compression else {}
        seconds = asyncio.run(
            onestep_send(ClickHouseConnector(dsn()), table, rows, batch_size, False, **options)
        )
        path = (
            "our onestep plugin (`clickhouse_table_sink`, the wheel), the same dicts, "
            + (compression or "lz4")
        )
    elif mode == "send-json":
        import clickhouse_component as cc

        with open(what, "rb") as f:
            data = f.read()
        rows = data.count(b"\n")
        sink = cc.Sink(cc.connect(dsn()), table, columns=COLUMNS, batch_size=batch_size)
        started = time.perf_counter()
        receipt = sink.send_json(data)
        seconds = time.perf_counter() - started
        assert receipt.rows == rows, receipt
        sink.close()
        path = "Python wheel `Sink.send_json` of the file's bytes, one call, lz4"
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(json.dumps({"rows": rows, "seconds": seconds, "path": path}))


main()
