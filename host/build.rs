//! Builds the component (`wasm32-wasip2`, release) so the host binary can embed it.
//!
//! The component is built by a nested cargo with its own target directory (like wasmtime's
//! test-programs), so it never contends with the outer build's lock. The path of the result is
//! passed to the crate as `CLICKHOUSE_COMPONENT_WASM`. Beside it, the library component (no
//! command mode), built for size and shrunk with binaryen's `wasm-opt` (`build/shrink.rs`):
//! `CLICKHOUSE_COMPONENT_LIBRARY_WASM`.
//!
//! Instead, a prebuilt component: `CLICKHOUSE_COMPONENT_PREBUILT`, or the one a source
//! distribution of the Python package carries (`prebuilt/clickhouse_component.wasm` beside this
//! file; scripts/sdist).

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "build/shrink.rs"]
mod shrink;

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir.parent().unwrap().to_path_buf();
    for watched in ["src", "wit", "vendor", "Cargo.toml", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }
    println!("cargo:rerun-if-env-changed=CLICKHOUSE_COMPONENT_PREBUILT");
    println!("cargo:rerun-if-env-changed=WASM_OPT");
    println!("cargo:rerun-if-changed=build/shrink.rs");

    // An embedder may supply a prebuilt component instead (e.g. a signed release artefact).
    if let Ok(prebuilt) = env::var("CLICKHOUSE_COMPONENT_PREBUILT") {
        println!("cargo:rustc-env=CLICKHOUSE_COMPONENT_WASM={prebuilt}");
        // No library component then (component::LIBRARY_COMPONENT_PATH is None).
        return;
    }

    // The Python package's source distribution (scripts/sdist) carries the component it was
    // made with, as `host/prebuilt/clickhouse_component.wasm`: building from it compiles only
    // the native host (no wasm32-wasip2 target, no nested cargo). A checkout never has this
    // file (scripts/sdist writes it into the archive only). No library component then either:
    // the Python package does not use it.
    let shipped = manifest_dir
        .join("prebuilt")
        .join("clickhouse_component.wasm");
    if shipped.is_file() {
        // Watched only when present: a missing watched file would rerun this script on every
        // build of a checkout.
        println!("cargo:rerun-if-changed={}", shipped.display());
        println!(
            "cargo:warning=embedding the prebuilt component {} (a source distribution's), \
             not building it",
            shipped.display()
        );
        println!(
            "cargo:rustc-env=CLICKHOUSE_COMPONENT_WASM={}",
            shipped.display()
        );
        return;
    }

    // <workspace>/target/component: outside the outer profile directory, shared by every
    // profile of the host, so the component is built once.
    let target_dir = env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("target"))
        .join("component");
    // The library component (no command mode: `--no-default-features` drops the `command`
    // feature, clap and `wasi:cli/run`) in a target directory of its own: the crate's output
    // file has the same name whatever its features, so a shared directory could hand back the
    // other build's file. Built for size (opt-level z; lz4_flex keeps its opt-level 3) and
    // copied beside the full one, which the host embeds; the copy is then shrunk.
    let library_dir = target_dir.with_file_name("component-library");
    let remap = short_source_paths(&root);
    let library = build_component(
        &root,
        &library_dir,
        &["--no-default-features"],
        &[
            ("CARGO_PROFILE_RELEASE_OPT_LEVEL", "z"),
            ("CARGO_ENCODED_RUSTFLAGS", &remap),
        ],
    );
    std::fs::create_dir_all(&target_dir).expect("creating the component directory");
    let library_copy = target_dir.join("clickhouse_component_library.wasm");
    std::fs::copy(&library, &library_copy).expect("copying the library component");
    shrink_library(&library_copy, &library_dir);
    println!(
        "cargo:rustc-env=CLICKHOUSE_COMPONENT_LIBRARY_WASM={}",
        library_copy.display()
    );
    // The full component (the CLI's, the Python and Rust embedders'), built for speed: its
    // sink reads every value of every row. At opt-level 3 it reads 1M rows (175 MB) in 1.37 s
    // of CPU instead of 1.69 s at the release profile's `s` (docs/benchmarks.md); it is 19%
    // larger (1.57 MB), which only its first, cached compile pays. With wasm's `simd128`
    // (wasmtime, V8 and every runtime the project runs on execute it): the byte scans of the
    // JSON reader and of `memchr` take 16 bytes a step; the library component keeps the
    // scalar scans (its size budget), and the typed corpus runs through both.
    let speed_flags = format!("{remap}\x1f-Ctarget-feature=+simd128");
    let wasm = build_component(
        &root,
        &target_dir,
        &[],
        &[
            ("CARGO_PROFILE_RELEASE_OPT_LEVEL", "3"),
            ("CARGO_ENCODED_RUSTFLAGS", &speed_flags),
        ],
    );
    println!(
        "cargo:rustc-env=CLICKHOUSE_COMPONENT_WASM={}",
        wasm.display()
    );
}

/// rustc flags (`CARGO_ENCODED_RUSTFLAGS`) that write source paths in panic locations relative
/// to their crate's registry directory or this repository (`serde_json-1.0.145/src/de.rs`, not
/// `/root/.cargo/registry/src/index.crates.io-…/serde_json-1.0.145/src/de.rs`; `core/src/…`
/// for the standard library's): ~3 KB.
fn short_source_paths(root: &Path) -> String {
    let cargo_home = env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    let mut prefixes = vec![root.to_path_buf()];
    if let Some(Ok(registries)) = cargo_home.map(|h| std::fs::read_dir(h.join("registry/src"))) {
        let mut registries: Vec<PathBuf> = registries.flatten().map(|e| e.path()).collect();
        // The same flags (so no rebuild) whatever order the directory lists them in.
        registries.sort();
        prefixes.extend(registries);
    }
    // The standard library's sources (`core/src/...`).
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    if let Ok(out) = Command::new(rustc).args(["--print", "sysroot"]).output() {
        let sysroot = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if out.status.success() && !sysroot.is_empty() {
            prefixes.push(Path::new(&sysroot).join("lib/rustlib/src/rust/library"));
        }
    }
    prefixes
        .iter()
        .map(|p| format!("--remap-path-prefix={}/=", p.display()))
        .collect::<Vec<_>>()
        .join("\x1f")
}

/// Shrinks the library component with binaryen's `wasm-opt` (`WASM_OPT`, else `wasm-opt` on
/// the PATH; `make setup` installs Debian's): ~100 KB smaller. Without it, or when it fails
/// (an older binaryen than 108, say), the component is left as built, with a warning.
fn shrink_library(component: &Path, work: &Path) {
    let wasm_opt = env::var_os("WASM_OPT").map_or_else(|| PathBuf::from("wasm-opt"), PathBuf::from);
    let found = Command::new(&wasm_opt)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        println!(
            "cargo:warning=wasm-opt (binaryen) not found: the library component is not shrunk \
             (make setup installs it; or set WASM_OPT)"
        );
        return;
    }
    if let Err(e) = shrink::shrink(component, &wasm_opt, work) {
        println!("cargo:warning=the library component is not shrunk: {e}");
    }
}

/// Builds the component crate for `wasm32-wasip2` in release mode with `extra` arguments and
/// `envs`; returns the path of the `.wasm`.
fn build_component(
    root: &Path,
    target_dir: &Path,
    extra: &[&str],
    envs: &[(&str, &str)],
) -> PathBuf {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(root)
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--package",
            "clickhouse-component",
            "--lib",
        ])
        .args(extra)
        .env("CARGO_TARGET_DIR", target_dir)
        // Flags meant for the host must not leak into the wasm build.
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_RUSTFLAGS")
        .env_remove("CARGO_MAKEFLAGS")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("RUSTC_WRAPPER");
    // Nor a cross build's settings for its target (`maturin --zig`, `make wheels`: zig as
    // `CARGO_TARGET_<TRIPLE>_LINKER`, which would also link this build's build scripts and
    // proc macros when the triple is the host's, and maturin's `target-applies-to-host`
    // switch): cargo fingerprints them, so they would be rebuilt under them, and again by the
    // next ordinary build of the shared target/component.
    const CROSS: [&str; 3] = [
        "CARGO_TARGET_APPLIES_TO_HOST",
        "CARGO_UNSTABLE_TARGET_APPLIES_TO_HOST",
        "__CARGO_TEST_CHANNEL_OVERRIDE_DO_NOT_USE_THIS",
    ];
    for (key, _) in env::vars() {
        if key.starts_with("CARGO_FEATURE_")
            || key.starts_with("CARGO_CFG_")
            || (key.starts_with("CARGO_TARGET_") && key != "CARGO_TARGET_DIR")
            || CROSS.contains(&key.as_str())
        {
            cmd.env_remove(key);
        }
    }
    cmd.envs(envs.iter().copied());
    let status = cmd.status().expect("running cargo to build the component");
    assert!(
        status.success(),
        "building the component failed; is the target installed? (rustup target add wasm32-wasip2)"
    );
    let wasm = target_dir.join("wasm32-wasip2/release/clickhouse_component.wasm");
    assert!(wasm.exists(), "component not found at {}", wasm.display());
    wasm
}
