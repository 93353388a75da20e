"""The built wheel alone: `pip install <wheel>` into a fresh venv (no index, no other package:
no Rust, no wasmtime-py) gives a working `clickhouse_component`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
from conftest import PASSWORD, ROOT, URL, USER


def the_wheel() -> Path:
    given = os.environ.get("CLICKHOUSE_COMPONENT_WHEEL")
    if given:
        return Path(given)
    wheels = sorted(
        (ROOT / "target" / "wheels").glob("clickhouse_component-*.whl"), key=os.path.getmtime
    )
    if not wheels:
        pytest.fail("no wheel in target/wheels (make wheel)")
    return wheels[-1]


def test_wheel_is_abi3_and_carries_the_component():
    wheel = the_wheel()
    assert "-cp310-abi3-" in wheel.name and wheel.name.endswith("_x86_64.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "clickhouse_component/__init__.py" in names
    assert "clickhouse_component/py.typed" in names
    assert "clickhouse_component/_native.pyi" in names
    assert any(n.startswith("clickhouse_component/_native.") and n.endswith(".so") for n in names)
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "[meltano.state_backends]" in text
    assert "clickhouse=clickhouse_component.meltano:ClickHouseStateStoreManager" in text.replace(
        " ", ""
    )


def test_fresh_venv_with_nothing_else(tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-index",
            "--disable-pip-version-check",
            the_wheel(),
        ],
        check=True,
        timeout=300,
    )
    listed = subprocess.run(
        [python, "-m", "pip", "list", "--format", "json", "--disable-pip-version-check"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert {p["name"] for p in json.loads(listed)} <= {"clickhouse-component", "pip", "setuptools"}
    script = (
        "import sys, clickhouse_component as cc\n"
        "c = cc.connect(sys.argv[1], user=sys.argv[2], password=sys.argv[3])\n"
        "print(c.ping().user)\n"
    )
    # Not this test's environment: no PYTHONPATH, started outside the source tree.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    out = subprocess.run(
        [python, "-c", script, URL, USER, PASSWORD],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    ).stdout
    assert out.strip() == USER
    assert sys.executable != str(python)
