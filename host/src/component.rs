//! Loading the component: from the bytes embedded at build time, a file, or bytes in memory,
//! with a precompiled copy cached on disk keyed by the component's hash and the engine.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use sha2::{Digest, Sha256};
use wasmtime::component::Component;
use wasmtime::Engine;

/// The component built with this host (see `build.rs`).
pub const EMBEDDED_COMPONENT: &[u8] = include_bytes!(env!("CLICKHOUSE_COMPONENT_WASM"));

/// Where the embedded component was built (useful to run it under other runtimes).
pub const EMBEDDED_COMPONENT_PATH: &str = env!("CLICKHOUSE_COMPONENT_WASM");

/// wasmtime version this host links (part of the cache key).
pub const WASMTIME_VERSION: &str = "48.0.8";

/// Where the component comes from.
#[derive(Clone, Debug, Default)]
pub enum ComponentSource {
    /// The bytes embedded at build time (the default: one binary carries its component).
    #[default]
    Embedded,
    /// A `.wasm` component file.
    File(PathBuf),
    /// Component bytes.
    Bytes(Vec<u8>),
}

/// Whether and where precompiled components are cached.
#[derive(Clone, Debug, Default)]
pub enum CachePolicy {
    /// `$CLICKHOUSE_COMPONENT_CACHE_DIR`, else `$XDG_CACHE_HOME/clickhouse-component`, else
    /// `$HOME/.cache/clickhouse-component`; no cache when none of these is set.
    #[default]
    Default,
    /// This directory.
    Dir(PathBuf),
    /// Always compile.
    Disabled,
}

impl CachePolicy {
    /// The directory this policy resolves to, if any.
    pub fn dir(&self) -> Option<PathBuf> {
        match self {
            CachePolicy::Dir(dir) => Some(dir.clone()),
            CachePolicy::Disabled => None,
            CachePolicy::Default => std::env::var_os("CLICKHOUSE_COMPONENT_CACHE_DIR")
                .map(PathBuf::from)
                .or_else(|| {
                    std::env::var_os("XDG_CACHE_HOME")
                        .map(|d| PathBuf::from(d).join("clickhouse-component"))
                })
                .or_else(|| {
                    std::env::var_os("HOME")
                        .map(|d| PathBuf::from(d).join(".cache/clickhouse-component"))
                }),
        }
    }
}

/// How the component was obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadKind {
    /// Compiled now; no cache in use.
    Compiled,
    /// Compiled now and written to the cache.
    CompiledAndCached,
    /// Read from the cache (no compilation).
    CacheHit,
}

/// What loading cost.
#[derive(Clone, Debug)]
pub struct LoadReport {
    /// How it was obtained.
    pub kind: LoadKind,
    /// Wall time of loading (read + compile or deserialize).
    pub duration: Duration,
    /// Size of the component in bytes.
    pub size: usize,
    /// The cache file, when a cache is in use.
    pub cache_file: Option<PathBuf>,
}

/// Loads (and caches) the component for `engine`.
pub fn load(
    engine: &Engine,
    source: &ComponentSource,
    cache: &CachePolicy,
) -> anyhow::Result<(Component, LoadReport)> {
    let started = Instant::now();
    let bytes: std::borrow::Cow<'_, [u8]> = match source {
        ComponentSource::Embedded => EMBEDDED_COMPONENT.into(),
        ComponentSource::Bytes(b) => b.as_slice().into(),
        ComponentSource::File(path) => std::fs::read(path)
            .with_context(|| format!("reading component {}", path.display()))?
            .into(),
    };
    let Some(dir) = cache.dir() else {
        let component = Component::new(engine, &bytes)
            .map_err(anyhow::Error::from)
            .context("compiling the component")?;
        return Ok((
            component,
            LoadReport {
                kind: LoadKind::Compiled,
                duration: started.elapsed(),
                size: bytes.len(),
                cache_file: None,
            },
        ));
    };
    let file = dir.join(cache_file_name(engine, &bytes));
    if file.exists() {
        // Read into memory rather than mapping the file: a cache file truncated or replaced
        // by someone else must not crash a running host (a mapped file would SIGBUS).
        // SAFETY: the file is in our cache directory, named by the hash of the component and
        // of the engine configuration, and written atomically by `store` below; wasmtime also
        // checks its header against the engine. A file that fails to load is recompiled.
        let loaded = std::fs::read(&file)
            .map_err(anyhow::Error::from)
            .and_then(|b| {
                unsafe { Component::deserialize(engine, b) }.map_err(anyhow::Error::from)
            });
        match loaded {
            Ok(component) => {
                return Ok((
                    component,
                    LoadReport {
                        kind: LoadKind::CacheHit,
                        duration: started.elapsed(),
                        size: bytes.len(),
                        cache_file: Some(file),
                    },
                ))
            }
            Err(e) => {
                tracing::warn!(file = %file.display(), error = %e, "ignoring unusable cached component")
            }
        }
    }
    let component = Component::new(engine, &bytes)
        .map_err(anyhow::Error::from)
        .context("compiling the component")?;
    let kind = match store(&component, &dir, &file) {
        Ok(()) => LoadKind::CompiledAndCached,
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "could not cache the compiled component");
            LoadKind::Compiled
        }
    };
    Ok((
        component,
        LoadReport {
            kind,
            duration: started.elapsed(),
            size: bytes.len(),
            cache_file: (kind == LoadKind::CompiledAndCached).then_some(file),
        },
    ))
}

/// `clickhouse_component-<sha256 of bytes, 16 hex>-<engine hash>-wasmtime-<version>.cwasm`.
pub fn cache_file_name(engine: &Engine, bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut hasher);
    format!(
        "clickhouse_component-{hex}-{:016x}-wasmtime-{WASMTIME_VERSION}.cwasm",
        hasher.finish()
    )
}

fn store(component: &Component, dir: &Path, file: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let bytes = component.serialize()?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        file.file_name().unwrap_or_default().to_string_lossy(),
        std::process::id()
    ));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, file)?;
    Ok(())
}
