# The two commands:
#   make run    quick start: installs what it needs, starts the local ClickHouse (with a private
#               ZooKeeper) unless CLICKHOUSE_URL is set, and runs the CLI end to end
#   make test   installs the same and runs every test (what .ci/run runs): make lint, cargo tests, the
#               Node tests and the differential tests against onestep-clickhouse (the sink) and
#               Meltano 4.4.1 (`state`), and the Python wheel's tests (tests/python: the API, and
#               Meltano 4.4.1 using the wheel as its state backend)
#   make wheel  builds the Python wheel (python/) into target/wheels/
#   make wheels   the distribution: manylinux2014 wheels (x86_64, aarch64) and the sdist, into
#               target/wheels/dist/ (docs/python.md, Platforms; not part of `make test`)
#   make compose  builds the example consumer (examples/state-service) and plugs the library
#               component into it with wac: target/component/state_service_composed.wasm, for
#               stock `wasmtime serve` (docs/composition.md); and the binary WIT package
#   make soak SECONDS=N   the history verification's long runs (docs/verification.md), N s per
#               lock engine; make check-history FILE=F runs its checker on a recorded history

SHELL := /bin/bash
VENV := .venv
PYTHON := $(VENV)/bin/python
CHDB_VERSION := 26.9.0

# The Python wheel (docs/python.md): maturin builds python/ with the tests' cargo profile into the
# shared target directory (no second wasmtime build); WHEEL_PROFILE=release for a distribution.
# Its tools (maturin, ruff) and its test venv (Meltano, pytest; the wheel is pip-installed into
# it by `make test`, as a user would; onestep without onestep-clickhouse, which registers the
# same resource types) are pinned here.
PY_VENV := $(VENV)-python
PLUGIN_VENV := $(VENV)-plugin
MATURIN_VERSION := 1.16.0
RUFF_VERSION := 0.17.6
PYTEST_VERSION := 9.2.0
PLUGIN_MELTANO_VERSION := 4.4.1
PLUGIN_ONESTEP_VERSION := 1.15.0
WHEEL_PROFILE ?= dev
BENCH_DEPS := $(VENV)-bench/.onestep-clickhouse-0.1.1-onestep-$(PLUGIN_ONESTEP_VERSION)
PY_TOOLS := $(PY_VENV)/.tools-maturin-$(MATURIN_VERSION)-ruff-$(RUFF_VERSION)
PLUGIN_DEPS := $(PLUGIN_VENV)/.meltano-$(PLUGIN_MELTANO_VERSION)-onestep-$(PLUGIN_ONESTEP_VERSION)-pytest-$(PYTEST_VERSION)
RUFF := $(PY_VENV)/bin/ruff --config python/pyproject.toml
PY_SOURCES := python/clickhouse_component tests/python
# Defined before the rules that name it: make expands a rule's prerequisites as it reads them.
TAP_POSTGRES_DEPS := $(VENV)-tap-postgres/.meltanolabs-tap-postgres-0.10.0
MAP_TRANSFORMER_DEPS := $(VENV)-map-transformer/.meltano-map-transform-0.12.3
SHAPED_DEPS := $(VENV)-shaped/.shaped-target-clickhouse-0.2.5

.PHONY: meltano-diff run test setup wasm-target venv zookeeper postgres binaryen build bench diff lint fmt clean js wasmtime-cli wheel plugin-wheel wheels python-test compose wac-cli wasm-tools planted-bugs soak check-history

run: setup build
	scripts/with-clickhouse scripts/quickstart

test: setup wasmtime-cli wac-cli wasm-tools $(BENCH_DEPS) $(VENV)-meltano/.meltano-4.4.1 $(PLUGIN_DEPS) postgres $(TAP_POSTGRES_DEPS) $(MAP_TRANSFORMER_DEPS) lint
	cargo build --workspace --bins --examples
	scripts/planted-bugs
	$(MAKE) js
	$(MAKE) plugin-wheel
	scripts/with-clickhouse bash -c 'cargo test --workspace --all-targets && (cd js && npm test) && DIFF_PLUGIN_PYTHON=$(PLUGIN_VENV)/bin/python $(VENV)-bench/bin/python tests/diff/onestep_diff.py && $(VENV)-meltano/bin/python tests/diff/meltano_diff.py --keep-going && $(PLUGIN_VENV)/bin/python -m pytest -p no:cacheprovider tests/python'

# The history verification (docs/verification.md). The planted-bug components its test must
# catch (one wasm build per `planted-bug-*` feature, target/planted-bugs/; `make test` builds them).
planted-bugs: wasm-target
	scripts/planted-bugs

# Long seeded runs of the verification workload, SECONDS per lock engine (VERIFY_SEED=N for
# another schedule); histories in target/verify/, one line per run in target/verify/results.txt.
SECONDS ?= 300
soak: setup
	cargo build --workspace --bins
	VERIFY_SECONDS=$(SECONDS) cargo test -p clickhouse-component-tests --test verify_histories -- --ignored --nocapture soak

# The checker alone, on recorded histories (JSON lines): make check-history FILE=target/verify/keeper-map-seed1.jsonl
check-history:
	@test -n "$(FILE)" || { echo "usage: make check-history FILE=path/to/history.jsonl" >&2; exit 2; }
	cargo run --quiet -p clickhouse-component-tests --bin check-history -- $(FILE)

# The wheel: one abi3 wheel (CPython >= 3.10, Linux x86_64) into target/wheels/.
wheel: setup $(PY_TOOLS)
	$(PY_VENV)/bin/maturin build --manifest-path python/Cargo.toml --profile $(WHEEL_PROFILE) --strip --out target/wheels

# The wheel as `make test` builds it (the tests' profile), installed into the plugin venv as a user
# would (pip, found by its entry points).
plugin-wheel: $(PLUGIN_DEPS)
	$(MAKE) wheel WHEEL_PROFILE=dev
	$(PLUGIN_VENV)/bin/pip install --quiet --disable-pip-version-check --force-reinstall --no-deps target/wheels/clickhouse_component-*-cp310-abi3-*.whl

# Only the wheel's tests (builds the CLI and fault_proxy they use, and the wheel, installs it
# into the test venv; PYTEST_ARGS='-k meltano' passes options).
python-test: setup $(PY_TOOLS) $(PLUGIN_DEPS) postgres $(TAP_POSTGRES_DEPS) $(MAP_TRANSFORMER_DEPS)
	cargo build --workspace --bins
	$(MAKE) plugin-wheel
	scripts/with-clickhouse $(PLUGIN_VENV)/bin/python -m pytest -p no:cacheprovider tests/python $(PYTEST_ARGS)

# The distribution (docs/python.md, Platforms), into $(WHEELS_OUT): one abi3 wheel per
# WHEELS_TARGETS triple, manylinux2014 (glibc 2.17), cross-built and linked against glibc 2.17's
# symbols by zig (the `ziglang` package, in $(PY_VENV)), each shown by auditwheel; and the sdist
# (scripts/sdist), which carries the component built here, so `pip install` of it needs only a
# Rust toolchain. Then the native wheel is installed into a throwaway venv and its console
# script run. The same profile as `make wheel` (WHEELS_PROFILE). Each triple is a wasmtime build
# of its own under target/<triple>/ (not part of `make test`). A directory of its own: `make
# plugin-wheel` and tests/python take the wheel in target/wheels/.
ZIGLANG_VERSION := 0.17.0
AUDITWHEEL_VERSION := 6.8.2
WHEELS_PROFILE ?= dev
WHEELS_TARGETS ?= x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu
WHEELS_OUT := target/wheels/dist
WHEELS_TOOLS := $(PY_VENV)/.wheels-ziglang-$(ZIGLANG_VERSION)-auditwheel-$(AUDITWHEEL_VERSION)
wheels: setup $(PY_TOOLS) $(WHEELS_TOOLS)
	@for t in $(WHEELS_TARGETS); do \
		rustup target list --installed | grep -qx $$t || rustup target add $$t || exit 1; done
	rm -rf $(WHEELS_OUT)
	for t in $(WHEELS_TARGETS); do \
		PATH="$(CURDIR)/$(PY_VENV)/bin:$$PATH" $(PY_VENV)/bin/maturin build --manifest-path python/Cargo.toml \
			--profile $(WHEELS_PROFILE) --strip --zig --compatibility manylinux2014 --target $$t \
			--out $(WHEELS_OUT) || exit 1; done
	MATURIN=$(PY_VENV)/bin/maturin scripts/sdist $(WHEELS_OUT)
	for w in $(WHEELS_OUT)/*.whl; do $(PY_VENV)/bin/auditwheel show $$w || exit 1; done
	venv="$$(mktemp -d)" && trap 'rm -rf "$$venv"' EXIT && python3 -m venv "$$venv" && \
		"$$venv/bin/pip" install --quiet --disable-pip-version-check --no-index \
			$(WHEELS_OUT)/*-abi3-manylinux*_$$(uname -m).whl && \
		"$$venv/bin/target-clickhouse-component" --about >"$$venv/about" && head -3 "$$venv/about"
	ls -l $(WHEELS_OUT)

$(WHEELS_TOOLS): $(PY_TOOLS)
	$(PY_VENV)/bin/pip install --quiet --disable-pip-version-check "ziglang==$(ZIGLANG_VERSION)" "auditwheel==$(AUDITWHEEL_VERSION)"
	touch $@

$(PY_TOOLS):
	python3 -m venv $(PY_VENV)
	$(PY_VENV)/bin/pip install --quiet --disable-pip-version-check "maturin==$(MATURIN_VERSION)" "ruff==$(RUFF_VERSION)"
	touch $@

$(PLUGIN_DEPS):
	python3 -m venv $(PLUGIN_VENV)
	$(PLUGIN_VENV)/bin/pip install --quiet --disable-pip-version-check "meltano==$(PLUGIN_MELTANO_VERSION)" "onestep[yaml]==$(PLUGIN_ONESTEP_VERSION)" "pytest==$(PYTEST_VERSION)"
	touch $@

# The Node package: jco (pinned in js/package-lock.json) transpiles the component built above.
js: js/node_modules/.installed
	cd js && npm run build

js/node_modules/.installed: js/package-lock.json
	cd js && npm ci --no-audit --no-fund
	touch $@

setup: wasm-target venv zookeeper binaryen

# binaryen's wasm-opt (Debian's package): host/build.rs shrinks the library component with it.
binaryen:
	@scripts/apt-install /usr/bin/wasm-opt binaryen

# The real tap of tests/python/test_tap_postgres.py and `make bench BENCH=tap-postgres`: Debian's
# postgresql (each run starts a private server, scripts/postgres) and MeltanoLabs'
# tap-postgres 0.10.0 in a venv of its own (scripts/tap-postgres-venv, pinned there).
postgres:
	@scripts/postgres install

$(TAP_POSTGRES_DEPS):
	scripts/tap-postgres-venv

# The stream-maps mapper of tests/python/test_stream_maps.py (docs/stream-maps.md): Meltano's
# meltano-map-transform 0.12.3 in a venv of its own (scripts/map-transformer-venv, pinned there).
$(MAP_TRANSFORMER_DEPS):
	scripts/map-transformer-venv

# Debian's zookeeper package: the local ClickHouse runs a private ZooKeeper (KeeperMap tables).
zookeeper:
	@scripts/zookeeper install

# The stock wasmtime CLI, for the tests that run the component under it (~9 min to build once).
# The version the host embeds (Cargo.toml, its one place).
WASMTIME_VERSION := $(shell sed -n 's/^wasmtime = { version = "=\([0-9.]*\)".*/\1/p' Cargo.toml)
wasmtime-cli:
	@wasmtime --version 2>/dev/null | grep -q "wasmtime $(WASMTIME_VERSION)" || \
		cargo install wasmtime-cli@$(WASMTIME_VERSION) --locked

# The composition tools (docs/composition.md), pinned, installed once like wasmtime-cli: wac-cli
# without its default features (no registry client: plugs are local files; ~2.5 min to build)
# and wasm-tools with only `component` (`component wit`: imports, the binary WIT package).
WAC_VERSION := 0.12.0
WASM_TOOLS_VERSION := 1.263.0
wac-cli:
	@wac --version 2>/dev/null | grep -qx "wac-cli $(WAC_VERSION)" || \
		nice cargo install wac-cli@$(WAC_VERSION) --locked --no-default-features
wasm-tools:
	@wasm-tools --version 2>/dev/null | grep -q "^wasm-tools $(WASM_TOOLS_VERSION)" || \
		nice cargo install wasm-tools@$(WASM_TOOLS_VERSION) --locked --no-default-features --features component

# The example consumer plugged with the library component, and the binary WIT package.
compose: wasm-target binaryen wac-cli wasm-tools
	scripts/compose

wasm-target:
	@rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip2 || rustup target add wasm32-wasip2

venv: $(VENV)/.chdb-$(CHDB_VERSION)

$(VENV)/.chdb-$(CHDB_VERSION):
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet "chdb-core==$(CHDB_VERSION)"
	touch $@

build:
	cargo build -p clickhouse-component-host

lint: $(PY_TOOLS)
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	cargo clippy -p clickhouse-component --target wasm32-wasip2 -- -D warnings
	cargo clippy -p clickhouse-component --target wasm32-wasip2 --no-default-features -- -D warnings
	cargo clippy -p clickhouse-state-service --target wasm32-wasip2 -- -D warnings
	cargo clippy -p clickhouse-component --target wasm32-wasip2 --features "$$(scripts/planted-bugs --list | paste -sd,)" -- -D warnings
	$(RUFF) format --check $(PY_SOURCES)
	$(RUFF) check $(PY_SOURCES)

fmt: $(PY_TOOLS)
	cargo fmt --all
	$(RUFF) format $(PY_SOURCES)

clean:
	cargo clean
	rm -rf $(VENV)
	rm -rf $(PY_VENV) $(PLUGIN_VENV) $(VENV)-tap-postgres $(VENV)-map-transformer

# BENCH: the sections to run (state, python, serve, load, sink, typed, loader, tap-postgres,
# link); all of them by default. `loader`: our Singer target against the sink CLI and
# shaped-target-clickhouse 0.2.5 (in $(VENV)-shaped), docs/benchmarks.md "Meltano's loader".
# `tap-postgres`: the real meltanolabs-tap-postgres into our target and into
# shaped-target-clickhouse (benches/tap_postgres.py). `typed`: the typed sink against raw JSONEachRow and Native POSTs and onestep, two
# tables, with server CPU (docs/benchmarks.md, "The typed sink"); beside its first pass, the
# floor it must beat: serde_json's typed read of the same file in the same guest environment
# (benches/serde-guest, bench-only, never shipped), built here for wasm32-wasip2 as the CLI's
# component is (release, opt-level 3; a target directory of its own, as host/build.rs's).
# `python` (and the Python rows of `sink`) use the wheel, built and installed into
# $(PLUGIN_VENV) first. `serve` runs the composed example under wasmtime serve (installs
# wasmtime-cli, wac and wasm-tools). `link` runs the sink benchmark inside a network namespace
# whose loopback is shaped to 100 Mbit/s (scripts/shaped-link; skipped where namespaces are not
# permitted, or when CLICKHOUSE_URL names another server).
BENCH ?= state python serve load sink typed loader tap-postgres link
bench: setup wasmtime-cli wac-cli wasm-tools $(BENCH_DEPS) $(PLUGIN_DEPS) $(SHAPED_DEPS) postgres $(TAP_POSTGRES_DEPS)
	cargo build -p clickhouse-component-host -p clickhouse-component-bench
	CARGO_PROFILE_RELEASE_OPT_LEVEL=3 CARGO_TARGET_DIR=target/serde-guest \
		cargo build --release --target wasm32-wasip2 -p clickhouse-component-serde-guest
	$(MAKE) plugin-wheel
	@if [ -n "$(filter-out link tap-postgres,$(BENCH))" ]; then \
		scripts/with-clickhouse target/debug/bench $(filter-out link tap-postgres,$(BENCH)); fi
	@if [ -n "$(filter tap-postgres,$(BENCH))" ]; then \
		scripts/with-clickhouse $(PLUGIN_VENV)/bin/python benches/tap_postgres.py; fi
	@if [ -n "$(filter link,$(BENCH))" ]; then \
		if [ -n "$$CLICKHOUSE_URL" ]; then \
			echo "bench link: skipped (CLICKHOUSE_URL names a server the shaped loopback does not reach)"; \
		else scripts/shaped-link scripts/with-clickhouse target/debug/bench link; fi; fi

# Differential test of the table sink against onestep-clickhouse 0.1.1 (same payloads, options and
# ClickHouse; compares accepted/rejected, error kind and the rows left): tests/diff/onestep_diff.py.
# Each case runs through our CLI and through our onestep plugin (the wheel in $(PLUGIN_VENV):
# onestep refuses two registrations of one resource type, so each plugin has its own venv).
diff: setup $(BENCH_DEPS) $(PLUGIN_DEPS)
	cargo build -p clickhouse-component-host
	$(MAKE) plugin-wheel
	scripts/with-clickhouse env DIFF_PLUGIN_PYTHON=$(PLUGIN_VENV)/bin/python $(VENV)-bench/bin/python tests/diff/onestep_diff.py

# Differential test of `state` against Meltano 4.4.1's `meltano state` (systemdb backend in a
# temporary project; a seeded sequence of operations; compares stdout, exit code and both stores
# after each step; intended differences are declared rules): tests/diff/meltano_diff.py, also
# part of `make test`. MELTANO_DIFF='--seed 2 --ops 500' passes options.
meltano-diff: setup $(VENV)-meltano/.meltano-4.4.1
	cargo build -p clickhouse-component-host
	scripts/with-clickhouse $(VENV)-meltano/bin/python tests/diff/meltano_diff.py --keep-going $(MELTANO_DIFF)

$(VENV)-meltano/.meltano-4.4.1:
	scripts/meltano-venv

# shaped-target-clickhouse 0.2.5 (the Meltano Hub's target-clickhouse: the loader benchmark's
# comparison), in a venv of its own.
$(SHAPED_DEPS):
	python3 -m venv $(VENV)-shaped
	$(VENV)-shaped/bin/pip install --quiet --disable-pip-version-check "shaped-target-clickhouse==0.2.5"
	touch $@

# onestep-clickhouse 0.1.1 (the sink benchmark's Python comparison), in a venv of its own, on the
# same onestep as the plugin's venv.
$(BENCH_DEPS):
	python3 -m venv $(VENV)-bench
	$(VENV)-bench/bin/pip install --quiet --disable-pip-version-check "onestep-clickhouse==0.1.1" "onestep==$(PLUGIN_ONESTEP_VERSION)"
	touch $@
