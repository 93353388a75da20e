"""Benchmark helper: onestep-clickhouse 0.1.1 inserting the benchmark's events into ClickHouse.

Usage: python onestep_bench.py TABLE ROWS BATCH_SIZE (CLICKHOUSE_URL / _USER / _PASSWORD set).
Prints one JSON line: {"rows": N, "seconds": S, "compress": C}. Row generation is not timed.
"""

import asyncio
import datetime
import json
import os
import sys
import time

from onestep import Envelope
from onestep_clickhouse import ClickHouseConnector


async def main() -> None:
    table, rows, batch_size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    host_port = os.environ["CLICKHOUSE_URL"].split("//", 1)[1].rstrip("/")
    user = os.environ.get("CLICKHOUSE_USER", "default")
    password = os.environ.get("CLICKHOUSE_PASSWORD", "")
    dsn = f"clickhouse://{user}:{password}@{host_port}/default"
    # clickhouse-connect's default (compress=True: lz4 Content-Encoding on inserts), unless
    # ONESTEP_COMPRESS names another setting (False, lz4, zstd, gzip).
    compress = os.environ.get("ONESTEP_COMPRESS", "True")
    compress = {"True": True, "False": False}.get(compress, compress)
    connector = ClickHouseConnector(dsn, client_options={"compress": compress})
    sink = connector.table_sink(
        table=table,
        columns=["event_id", "occurred_at", "kind", "payload"],
        batch_size=batch_size,
    )
    base = datetime.datetime(2026, 11, 29, 10, 0, 0)
    payload = "p" * 64
    documents = [
        {
            "event_id": f"ev-{n:07d}",
            "occurred_at": base + datetime.timedelta(milliseconds=n),
            "kind": f"k{n % 7}",
            "payload": payload,
        }
        for n in range(rows)
    ]
    started = time.perf_counter()
    await sink.send(Envelope(body=documents))
    seconds = time.perf_counter() - started
    await connector.close()
    print(json.dumps({"rows": rows, "seconds": seconds, "compress": str(compress)}))


asyncio.run(main())
