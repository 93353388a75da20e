//! Builds the component (`wasm32-wasip2`, release) so the host binary can embed it.
//!
//! The component is built by a nested cargo with its own target directory (like wasmtime's
//! test-programs), so it never contends with the outer build's lock. The path of the result is
//! passed to the crate as `CLICKHOUSE_COMPONENT_WASM`.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir.parent().unwrap().to_path_buf();
    for watched in ["src", "wit", "Cargo.toml", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }
    println!("cargo:rerun-if-env-changed=CLICKHOUSE_COMPONENT_PREBUILT");

    // An embedder may supply a prebuilt component instead (e.g. a signed release artefact).
    if let Ok(prebuilt) = env::var("CLICKHOUSE_COMPONENT_PREBUILT") {
        println!("cargo:rustc-env=CLICKHOUSE_COMPONENT_WASM={prebuilt}");
        // No library component then (component::LIBRARY_COMPONENT_PATH is None).
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
    // other build's file. Copied beside the full one, which the host embeds.
    let library_dir = target_dir.with_file_name("component-library");
    let library = build_component(&root, &library_dir, &["--no-default-features"]);
    std::fs::create_dir_all(&target_dir).expect("creating the component directory");
    let library_copy = target_dir.join("clickhouse_component_library.wasm");
    std::fs::copy(&library, &library_copy).expect("copying the library component");
    println!(
        "cargo:rustc-env=CLICKHOUSE_COMPONENT_LIBRARY_WASM={}",
        library_copy.display()
    );
    let wasm = build_component(&root, &target_dir, &[]);
    println!(
        "cargo:rustc-env=CLICKHOUSE_COMPONENT_WASM={}",
        wasm.display()
    );
}

/// Builds the component crate for `wasm32-wasip2` in release mode with `extra` arguments;
/// returns the path of the `.wasm`.
fn build_component(root: &Path, target_dir: &Path, extra: &[&str]) -> PathBuf {
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
    for (key, _) in env::vars() {
        if key.starts_with("CARGO_FEATURE_") || key.starts_with("CARGO_CFG_") {
            cmd.env_remove(key);
        }
    }
    let status = cmd.status().expect("running cargo to build the component");
    assert!(
        status.success(),
        "building the component failed; is the target installed? (rustup target add wasm32-wasip2)"
    );
    let wasm = target_dir.join("wasm32-wasip2/release/clickhouse_component.wasm");
    assert!(wasm.exists(), "component not found at {}", wasm.display());
    wasm
}
