#!/usr/bin/env python3
"""A tiny incremental Singer tap for the Meltano tests: stream `counter`, records with ids
after the bookmark (`bookmarks.<key>.last` of --state), a STATE after each record. Config
(--config): count (records per run), key (bookmark key, default `counter`), fail_after
(exit 1 after that many records, their states emitted), log (a file to append the starting
bookmark and the bookmark keys of --state to), barrier (a directory: the tap meets a second tap
there twice, waiting up to 120 s each time and exiting 1 if none comes. First before any
output: Meltano reads the state it passes with --state before it starts a tap, so neither
tap's starting state holds what the other run writes. Then after its first record and STATE:
two runs are then certainly streaming at the same time)."""

import argparse
import json
import os
import sys
import time


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
            keys = sorted(state.get("bookmarks", {}))
            log.write(json.dumps({"key": key, "start": last, "keys": keys}) + "\n")
    if config.get("barrier") and not meet(os.path.join(config["barrier"], "start"), key):
        print("tap_counter: no second tap came to the start", file=sys.stderr)
        return 1
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
        if (
            n == 0
            and config.get("barrier")
            and not meet(os.path.join(config["barrier"], "first"), key)
        ):
            print("tap_counter: no second tap came to the barrier", file=sys.stderr)
            return 1
    return 0


def meet(barrier: str, key: str) -> bool:
    """Announces `key` in the directory `barrier` and waits until two taps have."""
    os.makedirs(barrier, exist_ok=True)
    open(os.path.join(barrier, key), "w").close()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if len(os.listdir(barrier)) >= 2:
            return True
        time.sleep(0.02)
    return False


if __name__ == "__main__":
    sys.exit(main())
