//! Loading the component: from the bytes embedded at build time, a file, or bytes in memory,
//! with a precompiled copy cached on disk keyed by the component's hash and the engine.

use std::hash::{Hash, Hasher};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use sha2::{Digest, Sha256};
use wasmtime::component::Component;
use wasmtime::Engine;

/// The component built with this host (see `build.rs`).
pub(crate) const EMBEDDED_COMPONENT: &[u8] = include_bytes!(env!("CLICKHOUSE_COMPONENT_WASM"));

/// Where the embedded component was built (useful to run it under other runtimes).
pub const EMBEDDED_COMPONENT_PATH: &str = env!("CLICKHOUSE_COMPONENT_WASM");

/// Where the build left the library component: the same interfaces without command mode
/// (`wasi:cli/run`) or the command line's code, for embedders that only call the library
/// (about half the size). Not embedded; `None` when the host was built from a prebuilt
/// component (`CLICKHOUSE_COMPONENT_PREBUILT`).
pub const LIBRARY_COMPONENT_PATH: Option<&str> = option_env!("CLICKHOUSE_COMPONENT_LIBRARY_WASM");

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
///
/// A cache directory is used only when it is owned by this user and not group- or
/// world-writable (checked on the directory a symlink resolves to); it is created `0700` when
/// missing. A cache file is read only when it is a regular file owned by this user and not
/// group- or world-writable, and its SHA-256 checksum matches (a torn or damaged file is
/// recompiled and replaced, never deserialized). Files are written under a new name
/// (`O_EXCL`, never through a symlink) and renamed into place. A refused directory means
/// compiling in memory (with a warning).
///
/// The threat model (docs/security.md): whoever can write into the cache directory can run
/// code as this user, so the directory must be this user's alone, which is what is checked.
/// There is no keyed tag: a key kept in the same directory would guard it against nobody the
/// ownership checks do not already keep out.
pub(crate) fn load(
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
    let cache = cache.dir().and_then(|dir| match Cache::open(&dir) {
        Ok(cache) => Some(cache),
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %format!("{e:#}"), "not using the precompiled-component cache; compiling in memory");
            None
        }
    });
    let Some(cache) = cache else {
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
    let name = cache_file_name(engine, &bytes);
    let file = cache.dir.join(&name);
    // Read into memory rather than mapping the file: a cache file truncated or replaced by
    // someone else must not crash a running host (a mapped file would SIGBUS).
    let loaded = cache.read(&name).and_then(|artifact| {
        artifact
            .map(|artifact| {
                // SAFETY: `Cache::read` returns bytes only from a regular file owned by this
                // user and writable by it alone, in a directory owned by this user and writable
                // by it alone, whose checksum matches: so they were written whole by
                // `Cache::store` from `Component::serialize` of this component (its hash is in
                // the file name) for this engine configuration (wasmtime checks its header
                // against the engine too), or by someone who can run code as this user anyway.
                // A file that fails to load is recompiled.
                unsafe { Component::deserialize(engine, artifact) }.map_err(anyhow::Error::from)
            })
            .transpose()
    });
    match loaded {
        Ok(Some(component)) => {
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
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(file = %file.display(), error = %format!("{e:#}"), "ignoring unusable cached component; recompiling")
        }
    }
    let component = Component::new(engine, &bytes)
        .map_err(anyhow::Error::from)
        .context("compiling the component")?;
    let kind = match cache.store(&name, &component) {
        Ok(()) => LoadKind::CompiledAndCached,
        Err(e) => {
            tracing::warn!(dir = %cache.dir.display(), error = %format!("{e:#}"), "could not cache the compiled component");
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
pub(crate) fn cache_file_name(engine: &Engine, bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let hex = clickhouse_component::host_api::hex(&digest[..8]);
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut hasher);
    format!(
        "clickhouse_component-{hex}-{:016x}-wasmtime-{WASMTIME_VERSION}.cwasm",
        hasher.finish()
    )
}

/// First bytes of every cache file, followed by the checksum and the serialized component.
const MAGIC: &[u8; 8] = b"chcSHA2\0";
/// Length of the SHA-256 checksum of the serialized component.
const SUM_LEN: usize = 32;
/// Length of the header before the serialized component.
const HEADER_LEN: usize = MAGIC.len() + SUM_LEN;

/// A cache directory that passed the checks.
#[cfg_attr(not(unix), allow(dead_code))]
struct Cache {
    /// The directory (symlinks resolved).
    dir: PathBuf,
}

#[cfg_attr(not(unix), allow(dead_code))]
impl Cache {
    /// Creates `dir` (`0700`) when missing, checks that it is owned by this user and not
    /// group- or world-writable.
    #[cfg(unix)]
    fn open(dir: &Path) -> anyhow::Result<Cache> {
        create_private_dir(dir).with_context(|| format!("creating {}", dir.display()))?;
        let dir = checked_dir(dir)?;
        Ok(Cache { dir })
    }

    /// Without unix ownership and permissions the directory cannot be checked.
    #[cfg(not(unix))]
    fn open(_dir: &Path) -> anyhow::Result<Cache> {
        anyhow::bail!("the precompiled-component cache is only supported on unix")
    }

    /// The serialized component in the cache file `name`: `None` when there is no such file,
    /// an error when it is not a regular file of this user's, writable by it alone, or its
    /// checksum does not match.
    fn read(&self, name: &str) -> anyhow::Result<Option<Vec<u8>>> {
        let mut file = match open_regular(&self.dir.join(name)) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            let meta = file.metadata()?;
            if meta.uid() != effective_uid() {
                anyhow::bail!("owned by uid {}, not by this user", meta.uid());
            }
            if meta.mode() & 0o022 != 0 {
                anyhow::bail!("group- or world-writable (mode {:o})", meta.mode() & 0o7777);
            }
        }
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        if bytes.len() < HEADER_LEN || &bytes[..MAGIC.len()] != MAGIC {
            anyhow::bail!("not a cache file written by this version of the host");
        }
        if Sha256::digest(&bytes[HEADER_LEN..])[..] != bytes[MAGIC.len()..HEADER_LEN] {
            anyhow::bail!("checksum mismatch (the file is torn or damaged)");
        }
        bytes.drain(..HEADER_LEN);
        Ok(Some(bytes))
    }

    /// Writes `component` as the cache file `name`: to a new temporary file, then renamed.
    fn store(&self, name: &str, component: &Component) -> anyhow::Result<()> {
        let payload = component.serialize()?;
        let sum = Sha256::digest(&payload);
        let tmp = write_temp(&self.dir, name, &[MAGIC, &sum, &payload])?;
        if let Err(e) = std::fs::rename(&tmp, self.dir.join(name)) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e.into());
        }
        Ok(())
    }
}

/// Creates `dir` with mode `0700` when it does not exist (its missing parents with the
/// default mode).
#[cfg(unix)]
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
    if std::fs::symlink_metadata(dir).is_ok() {
        // Exists (possibly a symlink): `checked_dir` decides.
        return Ok(());
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {
            // 0700 whatever the umask.
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
                .open(dir)?
                .set_permissions(std::fs::Permissions::from_mode(0o700))
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// `dir` with symlinks resolved, when that directory is owned by this user and not group- or
/// world-writable.
#[cfg(unix)]
fn checked_dir(dir: &Path) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let resolved =
        std::fs::canonicalize(dir).with_context(|| format!("resolving {}", dir.display()))?;
    let meta = std::fs::metadata(&resolved)
        .with_context(|| format!("reading the metadata of {}", resolved.display()))?;
    if !meta.is_dir() {
        anyhow::bail!("{} is not a directory", resolved.display());
    }
    let uid = effective_uid();
    if meta.uid() != uid {
        anyhow::bail!(
            "{} is owned by uid {}, not by this user (uid {uid})",
            resolved.display(),
            meta.uid()
        );
    }
    if meta.mode() & 0o022 != 0 {
        anyhow::bail!(
            "{} is group- or world-writable (mode {:o})",
            resolved.display(),
            meta.mode() & 0o7777
        );
    }
    Ok(resolved)
}

#[cfg(unix)]
fn effective_uid() -> u32 {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Opens `path` for reading when it is a regular file (not following a symlink, not blocking
/// on a FIFO).
fn open_regular(path: &Path) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    }
    let file = options.open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok(file)
}

/// Writes `parts` to the new file `path` (`0600`): fails if anything, a symlink included,
/// already exists there.
fn write_new(path: &Path, parts: &[&[u8]]) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    // create_new is O_CREAT | O_EXCL: never opens an existing file, never follows a symlink.
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600).custom_flags(libc::O_NOFOLLOW);
    }
    let mut file = options.open(path)?;
    let written = (|| {
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            // 0600 whatever the umask.
            file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        }
        parts.iter().try_for_each(|part| file.write_all(part))
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(path);
    }
    written
}

/// Writes `parts` to a new file in `dir` (`.<stem>.<pid>.<n>.tmp`, the first such name that
/// does not exist: created with `O_EXCL`, so a name taken by anything, a symlink included, is
/// skipped, never written through).
fn write_temp(dir: &Path, stem: &str, parts: &[&[u8]]) -> anyhow::Result<PathBuf> {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut attempts = 0;
    loop {
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = dir.join(format!(".{stem}.{}.{n}.tmp", std::process::id()));
        match write_new(&tmp, parts) {
            Ok(()) => return Ok(tmp),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempts < 16 => {
                attempts += 1;
            }
            Err(e) => return Err(e).with_context(|| format!("creating {}", tmp.display())),
        }
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    /// An empty component (preamble only).
    const EMPTY_COMPONENT: &[u8] = b"\0asm\x0d\x00\x01\x00";

    /// A tiny valid component, different for each `n` (a custom section `x` holding `n`).
    fn tiny_component(n: u8) -> Vec<u8> {
        let mut bytes = EMPTY_COMPONENT.to_vec();
        bytes.extend_from_slice(&[0x00, 0x03, 0x01, b'x', n]);
        bytes
    }

    fn engine() -> Engine {
        let mut config = wasmtime::Config::new();
        config.wasm_component_model(true);
        Engine::new(&config).unwrap()
    }

    /// A fresh path (not created) under the system temp directory.
    fn temp_path(test: &str) -> PathBuf {
        static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "chc-component-cache-{test}-{}-{n}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&path);
        path
    }

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    fn load_bytes(engine: &Engine, bytes: &[u8], dir: &Path) -> LoadReport {
        load(
            engine,
            &ComponentSource::Bytes(bytes.to_vec()),
            &CachePolicy::Dir(dir.to_path_buf()),
        )
        .unwrap()
        .1
    }

    /// The cache file is one the cache reads: this user's alone, its checksum matching.
    fn assert_intact(dir: &Path, file: &Path) {
        let cache = Cache::open(dir).unwrap();
        let name = file.file_name().unwrap().to_str().unwrap();
        assert!(
            cache.read(name).unwrap().is_some(),
            "{} is not intact",
            file.display()
        );
        assert!(!std::fs::symlink_metadata(file)
            .unwrap()
            .file_type()
            .is_symlink());
    }

    #[test]
    fn cache_hit_after_compile() {
        let engine = engine();
        let dir = temp_path("hit");
        let first = load_bytes(&engine, &tiny_component(0), &dir);
        assert_eq!(first.kind, LoadKind::CompiledAndCached);
        let second = load_bytes(&engine, &tiny_component(0), &dir);
        assert_eq!(second.kind, LoadKind::CacheHit);
        assert_eq!(first.cache_file, second.cache_file);
        // Damaged (truncated) files are recompiled.
        let file = second.cache_file.unwrap();
        std::fs::write(&file, b"garbage").unwrap();
        assert_eq!(
            load_bytes(&engine, &tiny_component(0), &dir).kind,
            LoadKind::CompiledAndCached
        );
        std::fs::write(&file, b"").unwrap();
        assert_eq!(
            load_bytes(&engine, &tiny_component(0), &dir).kind,
            LoadKind::CompiledAndCached
        );
        assert_eq!(
            load_bytes(&engine, &tiny_component(0), &dir).kind,
            LoadKind::CacheHit
        );
        // An existing directory of ours that is 0755 is fine.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(
            load_bytes(&engine, &tiny_component(0), &dir).kind,
            LoadKind::CacheHit
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_cache_file_not_this_users_alone_is_recompiled_not_deserialized() {
        let engine = engine();
        let dir = temp_path("planted");
        let report = load_bytes(&engine, &tiny_component(1), &dir);
        assert_eq!(report.kind, LoadKind::CompiledAndCached);
        let file = report.cache_file.unwrap();
        // The serialized bytes of another component, with a right checksum: wasmtime itself
        // would load them.
        let other = Component::new(&engine, tiny_component(2))
            .unwrap()
            .serialize()
            .unwrap();
        // SAFETY: produced by `serialize` just above, for this engine.
        assert!(unsafe { Component::deserialize(&engine, &other) }.is_ok());
        let sum = Sha256::digest(&other);
        let summed = [MAGIC.as_slice(), &sum, &other].concat();
        // (bytes, mode, owner): no header; writable by the group; by everyone; someone else's
        // (only root can make one).
        let mut plants = vec![
            (other.clone(), 0o600, None),
            (summed.clone(), 0o660, None),
            (summed.clone(), 0o602, None),
        ];
        if effective_uid() == 0 {
            plants.push((summed.clone(), 0o600, Some(65534)));
        }
        for (planted, planted_mode, owner) in plants {
            std::fs::remove_file(&file).unwrap();
            std::fs::write(&file, &planted).unwrap();
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(planted_mode)).unwrap();
            if let Some(uid) = owner {
                std::os::unix::fs::chown(&file, Some(uid), Some(uid)).unwrap();
            }
            let report = load_bytes(&engine, &tiny_component(1), &dir);
            assert_eq!(
                report.kind,
                LoadKind::CompiledAndCached,
                "mode {planted_mode:o}, owner {owner:?}"
            );
            assert_eq!(report.cache_file.as_deref(), Some(file.as_path()));
            // Replaced by a file of this user's alone.
            let meta = std::fs::symlink_metadata(&file).unwrap();
            assert_eq!((meta.uid(), mode(&file)), (effective_uid(), 0o600));
            assert_intact(&dir, &file);
            assert_eq!(
                load_bytes(&engine, &tiny_component(1), &dir).kind,
                LoadKind::CacheHit
            );
        }
        // The same checksummed bytes, this user's alone: what the checks let through (only
        // this user could have written them).
        std::fs::remove_file(&file).unwrap();
        std::fs::write(&file, &summed).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(Cache::open(&dir)
            .unwrap()
            .read(file.file_name().unwrap().to_str().unwrap())
            .unwrap()
            .is_some());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn tampered_artifact_is_recompiled_not_deserialized() {
        let engine = engine();
        let dir = temp_path("tampered");
        let report = load_bytes(&engine, &tiny_component(3), &dir);
        assert_eq!(report.kind, LoadKind::CompiledAndCached);
        let file = report.cache_file.unwrap();
        let authentic = std::fs::read(&file).unwrap();
        // A flipped byte of the serialized component that wasmtime's own checks let through
        // (so only the checksum catches it).
        let start = if authentic.starts_with(MAGIC) {
            HEADER_LEN
        } else {
            0
        };
        let tampered = (start..authentic.len())
            .rev()
            .map(|i| {
                let mut bytes = authentic.clone();
                bytes[i] ^= 0x01;
                bytes
            })
            .find(|bytes| {
                // SAFETY: only checked, never run (nothing is instantiated).
                unsafe { Component::deserialize(&engine, &bytes[start..]) }.is_ok()
            })
            .expect("no byte of the artifact can be flipped unnoticed by wasmtime");
        std::fs::write(&file, &tampered).unwrap();
        let report = load_bytes(&engine, &tiny_component(3), &dir);
        assert_eq!(report.kind, LoadKind::CompiledAndCached);
        assert_ne!(std::fs::read(&file).unwrap(), tampered);
        assert_intact(&dir, &file);
        // A flipped checksum byte too.
        let mut tampered = std::fs::read(&file).unwrap();
        tampered[MAGIC.len()] ^= 0x80;
        std::fs::write(&file, &tampered).unwrap();
        assert_eq!(
            load_bytes(&engine, &tiny_component(3), &dir).kind,
            LoadKind::CompiledAndCached
        );
        assert_intact(&dir, &file);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn unsafe_cache_dirs_are_refused() {
        let engine = engine();
        let root = temp_path("refused");
        std::fs::create_dir(&root).unwrap();
        let mut refused = Vec::new();
        for (name, mode) in [("world", 0o777), ("group", 0o770), ("sticky", 0o1777)] {
            let dir = root.join(name);
            std::fs::create_dir(&dir).unwrap();
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
            refused.push((dir.clone(), dir));
        }
        // A symlink (in a private directory) to a world-writable directory.
        let link = root.join("link");
        std::os::unix::fs::symlink(root.join("world"), &link).unwrap();
        refused.push((link, root.join("world")));
        // A directory owned by someone else (only root can make one).
        if effective_uid() == 0 {
            let dir = root.join("other");
            std::fs::create_dir(&dir).unwrap();
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
            std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
            refused.push((dir.clone(), dir));
        }
        for (dir, target) in refused {
            let report = load_bytes(&engine, &tiny_component(4), &dir);
            assert_eq!(report.kind, LoadKind::Compiled, "{}", dir.display());
            assert_eq!(report.cache_file, None);
            assert!(entries(&target).is_empty(), "{}", target.display());
        }
        // A symlink to a private directory is fine.
        let private = root.join("private");
        std::fs::create_dir(&private).unwrap();
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
        let link = root.join("private-link");
        std::os::unix::fs::symlink(&private, &link).unwrap();
        assert_eq!(
            load_bytes(&engine, &tiny_component(4), &link).kind,
            LoadKind::CompiledAndCached
        );
        assert_eq!(
            load_bytes(&engine, &tiny_component(4), &link).kind,
            LoadKind::CacheHit
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn created_cache_is_private() {
        let engine = engine();
        let root = temp_path("private");
        let dir = root.join("a/b/cache");
        let report = load_bytes(&engine, &tiny_component(7), &dir);
        assert_eq!(report.kind, LoadKind::CompiledAndCached);
        let file = report.cache_file.unwrap();
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&file), 0o600);
        // Nothing else (no temporary file left behind).
        assert_eq!(
            entries(&dir),
            [file.file_name().unwrap().to_string_lossy().into_owned()]
        );
        assert_eq!(
            load_bytes(&engine, &tiny_component(7), &dir).kind,
            LoadKind::CacheHit
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn symlinks_at_temporary_paths_are_not_followed() {
        let engine = engine();
        let dir = temp_path("symlink");
        let victim = temp_path("symlink-victim");
        std::fs::write(&victim, b"victim").unwrap();
        assert_eq!(
            load_bytes(&engine, &tiny_component(8), &dir).kind,
            LoadKind::CompiledAndCached
        );
        // The temporary names the cache writes to are predictable (name, pid, a counter):
        // symlinks planted at the first ones are skipped, never written through.
        let name = cache_file_name(&engine, &tiny_component(9));
        let planted = dir.join(format!(".{name}.{}.0.tmp", std::process::id()));
        for n in 0..4 {
            let path = dir.join(format!(".{name}.{}.{n}.tmp", std::process::id()));
            std::os::unix::fs::symlink(&victim, &path).unwrap();
        }
        let report = load_bytes(&engine, &tiny_component(9), &dir);
        assert_eq!(report.kind, LoadKind::CompiledAndCached);
        assert_eq!(std::fs::read(&victim).unwrap(), b"victim");
        assert_intact(&dir, &report.cache_file.unwrap());
        // Creating a file never goes through a symlink, to an existing file or not.
        assert!(write_new(&planted, &[b"payload"]).is_err());
        assert_eq!(std::fs::read(&victim).unwrap(), b"victim");
        let dangling = dir.join("dangling");
        let missing = temp_path("symlink-missing");
        std::os::unix::fs::symlink(&missing, &dangling).unwrap();
        assert!(write_new(&dangling, &[b"payload"]).is_err());
        assert!(!missing.exists());
        let _ = std::fs::remove_file(&victim);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
