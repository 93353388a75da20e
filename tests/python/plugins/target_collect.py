#!/usr/bin/env python3
"""A tiny Singer target for the Meltano tests: appends each RECORD to the file of its `path`
setting (one JSON line each), then echoes each STATE's value on stdout once the records before
it are written (as a target does after committing them)."""

import argparse
import json
import sys


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config")
    args = parser.parse_args()
    config = {}
    if args.config:
        with open(args.config) as f:
            config = json.load(f)
    with open(config["path"], "a") as sink:
        for line in sys.stdin:
            if not line.strip():
                continue
            message = json.loads(line)
            if message["type"] == "RECORD":
                sink.write(json.dumps(message["record"]) + "\n")
            elif message["type"] == "STATE":
                sink.flush()
                sys.stdout.write(json.dumps(message["value"]) + "\n")
                sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
