#!/usr/bin/env python3
"""A deterministic Singer tap for the target's tests: stream `rows` (and `events` with
`events: true`), five typed properties (`id` integer, the key; `name` string; `amount`
number; `at` date-time, RFC 3339 with microseconds and `Z`; `ok` boolean), every value a
function of the id. Records with ids after the bookmark `bookmarks.rows.last` of --state,
`count` of them per run (config, default 10), a STATE (`{"bookmarks": {"rows": {"last": id}}}`)
after every `state_every` records (default 1) and at the end. So a run from a given bookmark
always prints the same messages. Other settings: `fail_after` (exit 1 after that many records),
`sleep_every` / `sleep_seconds` (pause after every that many records), `log` (a file to append
the starting bookmark to, one JSON line a run). `--about` and `--discover` print minimal
answers."""

import argparse
import datetime
import json
import sys
import time

STREAMS = ("rows", "events")
EPOCH = datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc)

SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "name": {"type": "string"},
        "amount": {"type": "number"},
        "at": {"type": "string", "format": "date-time"},
        "ok": {"type": "boolean"},
    },
}


def row(i: int, stream: str = "rows") -> dict:
    """The record of id `i` (the tests compute it too)."""
    at = EPOCH + datetime.timedelta(seconds=i * 61, microseconds=(i * 7919) % 1_000_000)
    return {
        "id": i,
        "name": f"{stream} {i}" + (" é" if i % 7 == 0 else ""),
        "amount": i * 1.25 + 0.5,
        "at": at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "ok": i % 3 == 0,
    }


def read(path: str | None) -> dict:
    if not path:
        return {}
    with open(path) as f:
        return json.load(f)


def emit(out, message: dict) -> None:
    out.write(json.dumps(message, ensure_ascii=False) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config")
    parser.add_argument("--state")
    parser.add_argument("--catalog")
    parser.add_argument("--properties")
    parser.add_argument("--discover", action="store_true")
    parser.add_argument("--about", action="store_true")
    parser.add_argument("--format", default="text")
    args = parser.parse_args()
    if args.about:
        print(json.dumps({"name": "tap-rows", "capabilities": ["state", "discover"]}))
        return 0
    if args.discover:
        streams = [
            {"tap_stream_id": s, "stream": s, "schema": SCHEMA, "key_properties": ["id"]}
            for s in STREAMS
        ]
        print(json.dumps({"streams": streams}))
        return 0
    config = read(args.config)
    state = read(args.state)
    count = int(config.get("count") or 10)
    state_every = max(1, int(config.get("state_every") or 1))
    fail_after = config.get("fail_after")
    sleep_every = int(config.get("sleep_every") or 0)
    sleep_seconds = float(config.get("sleep_seconds") or 0)
    events = str(config.get("events", "")).lower() in ("1", "true")
    last = int(state.get("bookmarks", {}).get("rows", {}).get("last", 0))
    if config.get("log"):
        with open(config["log"], "a") as log:
            log.write(json.dumps({"start": last}) + "\n")
    out = sys.stdout
    streams = ["rows", "events"] if events else ["rows"]
    for stream in streams:
        emit(out, {"type": "SCHEMA", "stream": stream, "schema": SCHEMA, "key_properties": ["id"]})
    bookmark = last
    for n, i in enumerate(range(last + 1, last + 1 + count)):
        if fail_after is not None and str(fail_after) != "" and n >= int(fail_after):
            out.flush()
            print("tap_rows: failing as configured", file=sys.stderr)
            return 1
        for stream in streams:
            emit(out, {"type": "RECORD", "stream": stream, "record": row(i, stream)})
        bookmark = i
        if (n + 1) % state_every == 0:
            emit(out, {"type": "STATE", "value": {"bookmarks": {"rows": {"last": i}}}})
        out.flush()
        if sleep_every and (n + 1) % sleep_every == 0:
            time.sleep(sleep_seconds)
    if count % state_every != 0 or count == 0:
        emit(out, {"type": "STATE", "value": {"bookmarks": {"rows": {"last": bookmark}}}})
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
