"""Python-side state store latency (not a test; run under scripts/with-clickhouse with the
wheel installed): get / set / update p50 and p99 through clickhouse_component, one warm store,
to compare with the Rust embedding's (`target/debug/bench state`, same server)."""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import uuid

import clickhouse_component as cc


def main() -> int:
    iterations = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 200
    conn = cc.connect(
        os.environ["CLICKHOUSE_URL"],
        user=os.environ.get("CLICKHOUSE_USER"),
        password=os.environ.get("CLICKHOUSE_PASSWORD"),
    )
    db = f"pybench_{uuid.uuid4().hex[:8]}"
    store = cc.StateStore(conn, database=db)
    sid = "tap-bench--target-bench"
    completed = '{"singer_state":{"bookmarks":{"stream":{"replication_key_value":"x"}}}}'
    store.set(sid, completed=completed)
    for _ in range(20):
        store.get(sid)
        store.set(sid, completed=completed)
    times: dict[str, list[float]] = {"get": [], "set": [], "update": []}
    for n in range(iterations):
        t = time.perf_counter()
        store.get(sid)
        times["get"].append(time.perf_counter() - t)
        t = time.perf_counter()
        store.set(sid, completed=completed)
        times["set"].append(time.perf_counter() - t)
        t = time.perf_counter()
        store.update(sid, partial=f'{{"singer_state":{{"bookmarks":{{"s{n % 5}":{{"v":{n}}}}}}}}}')
        times["update"].append(time.perf_counter() - t)
    summary = {}
    for name, values in times.items():
        values.sort()
        summary[name] = (statistics.median(values) * 1e3, values[int(len(values) * 0.99) - 1] * 1e3)
    if "--json" in sys.argv[2:]:
        print(json.dumps(summary))  # {"get": [p50 ms, p99 ms], ...}: `make bench` reads it
    else:
        print(f"Python state store ({iterations} iterations each, one warm store)")
        for name, (p50, p99) in summary.items():
            print(f"{name:7} p50 {p50:6.2f} ms  p99 {p99:6.2f} ms")
    store.clear_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
