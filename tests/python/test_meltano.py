"""Meltano 4.4.1 with our wheel installed (found by its `meltano.state_backends` and
`meltano.settings` entry points, nothing else): `meltano run` of a tiny incremental tap into a
tiny target keeps its bookmark in ClickHouse through our backend; Meltano's own `meltano state`
commands and our CLI see the same states."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest
from conftest import PASSWORD, URL, USER, FaultProxy, cli, cli_get, sql

MELTANO = Path(sys.executable).parent / "meltano"
PLUGINS = Path(__file__).resolve().parent / "plugins"
JOB = "dev:tap-counter-to-target-collect"
MELTANO_ENV = {
    "MELTANO_SEND_ANONYMOUS_USAGE_STATS": "false",
    "MELTANO_DISABLE_TRACKING": "true",
    "MELTANO_CLI_LOG_LEVEL": "info",
    "NO_COLOR": "1",
}


class Project:
    """A temporary Meltano project whose state backend is ours, on `database`."""

    def __init__(self, root: Path, database: str) -> None:
        self.root = root
        self.database = database
        self.output = root / "records.jsonl"
        self.log = root / "tap.log"
        parsed = urllib.parse.urlsplit(URL)
        # The password goes through the `state_backend.clickhouse.password` setting (declared
        # by our `meltano.settings` entry points), the state database through `schema`.
        uri = f"clickhouse://{urllib.parse.quote(USER)}@{parsed.hostname}:{parsed.port}/default"
        meltano_yml = {
            "default_environment": "dev",
            "project_id": "clickhouse-component-test",
            "send_anonymous_usage_stats": False,
            "environments": [{"name": "dev"}],
            "state_backend": {
                "uri": uri,
                "lock_timeout_seconds": 20,
                "clickhouse": {"schema": database},
            },
            "plugins": {
                "extractors": [
                    {
                        "name": "tap-counter",
                        "namespace": "tap_counter",
                        "executable": str(PLUGINS / "tap_counter.py"),
                        "capabilities": ["state"],
                        "settings": [
                            {"name": "count", "kind": "integer"},
                            {"name": "key"},
                            {"name": "fail_after", "kind": "integer"},
                            {"name": "log"},
                            {"name": "barrier"},
                        ],
                        "config": {"count": 3, "log": str(self.log)},
                    }
                ],
                "loaders": [
                    {
                        "name": "target-collect",
                        "namespace": "target_collect",
                        "executable": str(PLUGINS / "target_collect.py"),
                        "settings": [{"name": "path"}],
                        "config": {"path": str(self.output)},
                    }
                ],
            },
        }
        root.mkdir(parents=True, exist_ok=True)
        # JSON is YAML.
        (root / "meltano.yml").write_text(json.dumps(meltano_yml, indent=2))

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CLICKHOUSE_", "MELTANO_"))}
        env.update(MELTANO_ENV)
        env["MELTANO_PROJECT_ROOT"] = str(self.root)
        env["MELTANO_STATE_BACKEND_CLICKHOUSE_PASSWORD"] = PASSWORD
        env["MELTANO_STATE_BACKEND_CLICKHOUSES_PASSWORD"] = PASSWORD
        env.update(extra or {})
        return env

    def meltano(self, *args: str, env: dict[str, str] | None = None, check: bool = True):
        proc = subprocess.run(
            [str(MELTANO), *args],
            cwd=self.root,
            env=self.env(env),
            capture_output=True,
            text=True,
            timeout=300,
        )
        if check and proc.returncode != 0:
            pytest.fail(
                f"meltano {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
            )
        return proc

    def run(self, *, check: bool = True, **config: object):
        env = {f"TAP_COUNTER_{k.upper()}": str(v) for k, v in config.items()}
        return self.meltano("run", "tap-counter", "target-collect", env=env, check=check)

    def records(self) -> list[int]:
        if not self.output.exists():
            return []
        return [json.loads(line)["id"] for line in self.output.read_text().splitlines()]

    def starts(self) -> list[int]:
        return [json.loads(line)["start"] for line in self.log.read_text().splitlines()]


@pytest.fixture
def project(tmp_path, database):
    return Project(tmp_path / "project", database)


def bookmark(state: dict) -> int:
    return state["singer_state"]["bookmarks"]["counter"]["last"]


def test_meltano_run_keeps_its_bookmark_in_clickhouse(project):
    first = project.run()
    assert "ClickHouseStateStoreManager" in first.stderr  # Meltano loaded our add-on
    assert project.records() == [1, 2, 3]
    assert project.starts() == [0]

    # Our CLI reads the bookmark Meltano wrote, from the configured schema (a setting
    # declared by our entry points: without it the state would be in `meltano`).
    stored = cli_get(JOB, database=project.database)
    merged = {**stored["completed"], **stored["partial"]}
    assert bookmark(merged) == 3
    # And SQL, in the shared layout.
    rows = sql(
        f"SELECT completed_state, partial_state FROM `{project.database}`.state FINAL "
        "WHERE state_id = {id:String} FORMAT JSONEachRow",
        id=JOB,
    )
    assert '\\"last\\":3' in rows.replace(" ", "")

    second = project.run(count=2)
    assert second.returncode == 0
    assert project.starts() == [0, 3]  # resumed from the stored bookmark
    assert project.records() == [1, 2, 3, 4, 5]
    assert bookmark(json.loads(cli("get", JOB, database=project.database).stdout)) == 5


def test_failed_run_leaves_partial_state_and_next_run_resumes(project):
    project.run(count=3)
    failed = project.run(count=5, fail_after=2, check=False)
    assert failed.returncode != 0
    assert project.records() == [1, 2, 3, 4, 5]
    # Meltano stored every bookmark the target confirmed before the tap failed: the last one
    # is that of record 5 (the failed run's second), not the last successful run's 3.
    assert bookmark(json.loads(cli("get", JOB, database=project.database).stdout)) == 5
    project.run(count=1)
    assert project.starts() == [0, 3, 5]
    assert project.records() == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("form", ["path", "path-elsewhere", "fields", "clickhouses", "secure"])
def test_the_first_run_on_a_fresh_server(project, tls_front, form):
    """Each way docs/python.md gives to name the server, on a server that has nothing yet
    (neither the URI's database nor the state's): the first `meltano run` creates the schema
    and keeps its bookmark. meltano-state-backend-clickhouse's quick start names the state's
    database in the URI (`clickhouse://default@HOST:8123/meltano`), which the server refused
    (UNKNOWN_DATABASE) while it did not exist."""
    db = project.database
    host = urllib.parse.urlsplit(URL)
    user = urllib.parse.quote(USER)
    scheme, uri, settings = {
        "path": ("clickhouse", f"clickhouse://{user}@{host.hostname}:{host.port}/{db}", {}),
        "path-elsewhere": (
            "clickhouse",
            f"clickhouse://{user}@{host.hostname}:{host.port}/{db}_uri",
            {},
        ),
        "fields": (
            "clickhouse",
            "clickhouse://localhost",
            {"host": host.hostname, "port": host.port, "user": USER, "database": db},
        ),
        "clickhouses": (
            "clickhouses",
            f"clickhouses://{user}@localhost:{tls_front.port}/{db}",
            {"ca_file": tls_front.ca_file},
        ),
        "secure": (
            "clickhouse",
            f"clickhouse://{user}@localhost:{tls_front.port}/{db}?secure=true",
            {"ca_file": tls_front.ca_file},
        ),
    }[form]
    yml = json.loads((project.root / "meltano.yml").read_text())
    yml["state_backend"] = {
        "uri": uri,
        "lock_timeout_seconds": 20,
        scheme: {"schema": db, **settings},
    }
    (project.root / "meltano.yml").write_text(json.dumps(yml, indent=2))
    exists = "SELECT count() FROM system.databases WHERE name = {db:String}"
    assert sql(exists, db=db).strip() == "0"

    project.run()
    assert project.records() == [1, 2, 3]
    assert bookmark(json.loads(cli("get", JOB, database=db).stdout)) == 3
    assert sql(exists, db=f"{db}_uri").strip() == "0"  # only the state's database is made
    project.run(count=1)
    assert project.starts() == [0, 3]


def test_meltano_state_commands_agree_with_our_cli(project):
    db = project.database
    project.meltano("state", "set", "--force", "dev:a", '{"singer_state": {"x": 1}}')
    assert cli_get("dev:a", database=db) == {
        "id": "dev:a",
        "partial": {},
        "completed": {"singer_state": {"x": 1}},
    }
    cli("set", "--force", "dev:b", '{"singer_state": {"y": 2}}', database=db)
    cli("set", "--force", "other", '{"singer_state": {"z": 3}}', database=db)

    listed = project.meltano("state", "list").stdout.split()
    assert sorted(listed) == ["dev:a", "dev:b", "other"]
    assert sorted(project.meltano("state", "list", "--pattern", "dev:*").stdout.split()) == [
        "dev:a",
        "dev:b",
    ]
    assert cli("list", "dev:*", database=db).stdout.split() == ["dev:a", "dev:b"]

    for state_id in ("dev:a", "dev:b"):
        theirs = json.loads(project.meltano("state", "get", state_id).stdout)
        ours = json.loads(cli("get", state_id, database=db).stdout)
        assert theirs == ours

    project.meltano("state", "merge", "dev:a", '{"singer_state": {"w": 4}}')
    assert json.loads(cli("get", "dev:a", database=db).stdout) == {"singer_state": {"x": 1, "w": 4}}

    project.meltano("state", "copy", "--force", "dev:a", "dev:c")
    assert json.loads(cli("get", "dev:c", database=db).stdout) == {"singer_state": {"x": 1, "w": 4}}
    project.meltano("state", "move", "--force", "dev:c", "dev:d")
    assert cli("list", database=db).stdout.split() == ["dev:a", "dev:b", "dev:d", "other"]

    project.meltano("state", "clear", "--force", "dev:b")
    assert cli("list", database=db).stdout.split() == ["dev:a", "dev:d", "other"]
    assert json.loads(project.meltano("state", "get", "dev:a").stdout) == json.loads(
        cli("get", "dev:a", database=db).stdout
    )


def test_lock_held_by_our_cli_blocks_meltano(project):
    """Meltano's update() waits for our lock (held here by the CLI) and gives up with its own
    StateIDLockedError after state_backend.lock_timeout_seconds."""
    cli("set", "--force", "dev:held", '{"singer_state": {"x": 1}}', database=project.database)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MELTANO_")}
    env.update(CLICKHOUSE_URL=URL, CLICKHOUSE_USER=USER, CLICKHOUSE_PASSWORD=PASSWORD)
    from conftest import CLI

    holder = subprocess.Popen(
        [str(CLI), "lock", "--state-database", project.database, "dev:held", "--hold", "8s"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert "acquired" in holder.stderr.readline()
        merged = project.meltano(
            "state",
            "merge",
            "dev:held",
            '{"singer_state": {"y": 2}}',
            env={"MELTANO_STATE_BACKEND_LOCK_TIMEOUT_SECONDS": "1"},
            check=False,
        )
        assert merged.returncode != 0
        assert "lock" in (merged.stderr + merged.stdout).lower()
    finally:
        holder.kill()
        holder.wait()
    assert json.loads(cli("get", "dev:held", database=project.database).stdout) == {
        "singer_state": {"x": 1}
    }


def test_two_concurrent_runs_keep_every_partial_key(project):
    """Two `meltano run --force --state-strategy merge` of one job at once, from taps emitting
    different bookmark keys: Meltano's update() merges each partial state under our lock
    (fenced), so no write of one run is lost to the other's. The taps meet at a barrier twice
    (a tap exits 1 if the other never comes). Before any output: each run has read the state
    it starts from, so neither tap echoes a bookmark of the other (its STATEs would put that
    bookmark back, as Meltano's merge lets the newer partial state win; 2026-12-03's CI run
    lost beta's bookmarks so). After their first STATE: both runs are certainly streaming at
    the same moment, each with eleven STATEs still to write."""
    args = ("run", "--force", "--state-strategy", "merge", "tap-counter", "target-collect")
    # The system database (Meltano's jobs) first: two runs would both create it.
    project.meltano("upgrade", "database")
    runs = []
    for key in ("alpha", "beta"):
        env = project.env(
            {
                "TAP_COUNTER_KEY": key,
                "TAP_COUNTER_COUNT": "12",
                "TAP_COUNTER_BARRIER": str(project.root / "barrier"),
            }
        )
        runs.append(
            subprocess.Popen(
                [str(MELTANO), *args],
                cwd=project.root,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for run in runs:
        _, stderr = run.communicate(timeout=300)
        assert run.returncode == 0, stderr[-4000:]
    for point in ("start", "first"):
        assert sorted(os.listdir(project.root / "barrier" / point)) == ["alpha", "beta"]
    starts = sorted(json.loads(line)["keys"] for line in project.log.read_text().splitlines())
    assert starts == [[], []]  # neither tap started from the other's bookmark
    merged = json.loads(cli("get", JOB, database=project.database).stdout)
    assert merged["singer_state"]["bookmarks"] == {"alpha": {"last": 12}, "beta": {"last": 12}}
    stored = cli_get(JOB, database=project.database)
    assert stored["completed"] == {}  # merge strategy: partial states only


def through(project: Project, proxy: FaultProxy) -> None:
    """Points the project's state backend at the proxy."""
    parsed = urllib.parse.urlsplit(proxy.url)
    yml = json.loads((project.root / "meltano.yml").read_text())
    yml["state_backend"]["uri"] = (
        f"clickhouse://{urllib.parse.quote(USER)}@{parsed.hostname}:{parsed.port}/default"
    )
    (project.root / "meltano.yml").write_text(json.dumps(yml, indent=2))


def test_meltano_run_through_faults_that_retries_cover(project):
    """Requests refused or cut before the server got them are repeated (retries, 5 by
    default): the run finishes and every bookmark is stored exactly."""
    proxy = FaultProxy("refuse,cut-request", in_20=6, seed=22)
    try:
        through(project, proxy)
        project.run(count=8)
    finally:
        summary = proxy.stop()
    assert sum(summary["faults"].values()) >= 3, summary
    assert bookmark(json.loads(cli("get", JOB, database=project.database).stdout)) == 8
    assert project.records() == list(range(1, 9))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_meltano_run_with_lost_replies_stores_every_bookmark(project, seed):
    """Replies lost or cut after the server executed the request. The reads, the lock's
    requests and `update`'s own steps are repeated by the component; the write through the
    lock Meltano's update() holds is repeated by the backend while its outcome is unknown
    (the only write of that acquisition; once released, a late attempt is refused by the
    fence). So the run ends with every bookmark stored, and Meltano never logs a failed state
    write."""
    proxy = FaultProxy("drop-reply,cut-reply", in_20=2, seed=seed)
    try:
        through(project, proxy)
        run = project.run(count=8)
    finally:
        summary = proxy.stop()
    assert sum(summary["faults"].values()) >= 1, summary
    assert "Failed to persist" not in run.stderr
    assert bookmark(json.loads(cli("get", JOB, database=project.database).stdout)) == 8
    # The next run (no faults) resumes from it.
    parsed = urllib.parse.urlsplit(URL)
    _set_uri(
        project, f"clickhouse://{urllib.parse.quote(USER)}@{parsed.hostname}:{parsed.port}/default"
    )
    project.run(count=2)
    assert project.starts()[-1] == 8
    assert bookmark(json.loads(cli("get", JOB, database=project.database).stdout)) == 10


def _set_uri(project: Project, uri: str) -> None:
    yml = json.loads((project.root / "meltano.yml").read_text())
    yml["state_backend"]["uri"] = uri
    (project.root / "meltano.yml").write_text(json.dumps(yml, indent=2))


@pytest.mark.parametrize(
    "form",
    [
        "clickhouses://{user}@{host}:{port}/default",
        "clickhouse://{user}@{host}:{port}/default?secure=true",
    ],
)
def test_tls_asked_for_by_the_uri_is_honoured(project, form):
    """`clickhouses://` (its own entry point, a thin alias) and `?secure=true` connect with TLS:
    to the local server's plain HTTP port that fails, as our disconnected error, through our
    backend; `secure: false` turns it off again."""
    parsed = urllib.parse.urlsplit(URL)
    _set_uri(project, form.format(user=USER, host=parsed.hostname, port=parsed.port))
    scheme = form.split(":")[0]
    # Meltano reads the settings of the URI's scheme: state_backend.clickhouses.* here.
    namespace = f"MELTANO_STATE_BACKEND_{scheme.upper()}"
    failed = project.meltano(
        "state",
        "list",
        env={f"{namespace}_RETRIES": "0", f"{namespace}_SCHEMA": project.database},
        check=False,
    )
    assert failed.returncode != 0
    out = failed.stderr + failed.stdout
    assert "No state backend found" not in out
    assert "ClickHouseStateStoreManager" in out
    assert "tls" in out.lower() or "handshake" in out.lower() or "disconnected" in out.lower(), out[
        -2000:
    ]
    cli("set", "--force", "dev:tls", '{"singer_state": {"x": 1}}', database=project.database)
    plain = project.meltano(
        "state",
        "list",
        env={f"{namespace}_SECURE": "false", f"{namespace}_SCHEMA": project.database},
    )
    assert plain.stdout.split() == ["dev:tls"]


def test_the_cluster_setting_creates_the_schema_on_cluster(project):
    """`state_backend.clickhouse.cluster` reaches the store: the schema is created ON CLUSTER,
    which the local engine refuses (it runs no distributed DDL), said plainly; nothing made."""
    env = {
        "MELTANO_STATE_BACKEND_CLICKHOUSE_CLUSTER": "local_one",
        "MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA": f"{project.database}_cluster",
        "MELTANO_STATE_BACKEND_CLICKHOUSE_RETRIES": "0",
    }
    failed = project.meltano("state", "list", env=env, check=False)
    assert failed.returncode != 0
    out = failed.stderr + failed.stdout
    assert "ON CLUSTER 'local_one'" in out, out[-2000:]
    exists = sql(
        "SELECT count() FROM system.databases WHERE name = {db:String}",
        db=f"{project.database}_cluster",
    )
    assert exists.strip() == "0"
