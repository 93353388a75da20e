#!/usr/bin/env python3
"""A tiny incremental Singer tap for the Meltano tests: stream `counter`, records with ids
after the bookmark (`bookmarks.<key>.last` of --state), a STATE after each record. Config
(--config): count (records per run), key (bookmark key, default `counter`), fail_after
(exit 1 after that many records, their states emitted), log (a file to append the starting
bookmark to)."""

import argparse
import json
import sys


def read(path: str | None) -> dict:
    if not path:
        return {}
    with open(path) as f:
        return json.load(f)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config")
    parser.add_argument("--state")
    parser.add_argument("--discover", action="store_true")
    args = parser.parse_args()
    config = read(args.config)
    state = read(args.state)
    key = config.get("key") or "counter"
    count = int(config.get("count") or 3)
    fail_after = config.get("fail_after")
    last = int(state.get("bookmarks", {}).get(key, {}).get("last", 0))
    if config.get("log"):
        with open(config["log"], "a") as log:
            log.write(json.dumps({"key": key, "start": last}) + "\n")
    out = sys.stdout
    schema = {"type": "object", "properties": {"id": {"type": "integer"}}}
    out.write(
        json.dumps(
            {"type": "SCHEMA", "stream": "counter", "schema": schema, "key_properties": ["id"]}
        )
        + "\n"
    )
    bookmarks = dict(state.get("bookmarks", {}))
    for n, i in enumerate(range(last + 1, last + 1 + count)):
        if fail_after is not None and n >= int(fail_after):
            out.flush()
            print("tap_counter: failing as configured", file=sys.stderr)
            return 1
        out.write(
            json.dumps({"type": "RECORD", "stream": "counter", "record": {"id": i, "key": key}})
            + "\n"
        )
        bookmarks[key] = {"last": i}
        out.write(json.dumps({"type": "STATE", "value": {"bookmarks": bookmarks}}) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
