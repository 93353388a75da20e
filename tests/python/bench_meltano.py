"""`meltano run` of a tap emitting N STATE messages (default 200), with our state backend and
with Meltano's default (systemdb): wall time of each (not a test; run under
scripts/with-clickhouse with the wheel installed in Meltano's venv:
`.venv-plugin/bin/python tests/python/bench_meltano.py 200`)."""

from __future__ import annotations

import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest import cli, sql
from test_meltano import JOB, Project


def timed_run(project: Project, count: int) -> float:
    started = time.monotonic()
    project.run(count=count)
    return time.monotonic() - started


def main() -> int:
    count = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 200
    results = {}
    for backend in ("clickhouse", "systemdb"):
        database = f"pybench_{uuid.uuid4().hex[:8]}"
        project = Project(Path(tempfile.mkdtemp()) / "project", database)
        if backend == "systemdb":
            yml = json.loads((project.root / "meltano.yml").read_text())
            yml["state_backend"] = {"uri": "systemdb"}
            (project.root / "meltano.yml").write_text(json.dumps(yml))
        project.meltano("upgrade", "database")
        timed_run(project, 1)  # warm: plugins, system database, schema
        results[backend] = timed_run(project, count)
        if backend == "clickhouse":
            stored = json.loads(cli("get", JOB, database=database).stdout)
            assert stored["singer_state"]["bookmarks"]["counter"]["last"] == count + 1
            sql(f"DROP DATABASE IF EXISTS `{database}`")
    if "--json" in sys.argv[2:]:
        print(json.dumps(results))  # {"clickhouse": seconds, "systemdb": seconds}: `make bench`
        return 0
    print(f"meltano run, {count} STATE messages:")
    for backend, seconds in results.items():
        print(f"  {backend:10} {seconds:6.1f} s  ({seconds / count * 1e3:.1f} ms per STATE)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
