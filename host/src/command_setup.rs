//! What the host prepares before it runs the component's command line, shared by the reference
//! CLI and the Python wheel's console script: the directories of the files a command names
//! ([`readable_dirs`]), and, for the Singer target, what its config file says about where the
//! component may connect, which CAs it trusts and which BATCH directories it may read
//! ([`TargetHosting::read`]). The component reads
//! the same files itself; the host reads the config first because the allow-list and the TLS
//! trust are fixed before the component starts.

use std::path::{Component, Path};

use clickhouse_component::host_api::cli::TargetConfig;
use clickhouse_component::host_api::Error;

use crate::{default_allow_list, AllowList, Network, ReadableDir, TlsOptions};

/// The directory of each file, readable under the name its argument uses (`data` for
/// `data/rows.ndjson`, `.` for `rows.ndjson`, `/srv/in` for `/srv/in/rows.ndjson`); `-` (stdin)
/// and empty names are skipped. A file that cannot be opened is `invalid-input` before anything
/// runs; so is a path through `..` (the guest resolves it against its own root, not the host's
/// working directory) or one that is not UTF-8.
pub fn readable_dirs<'a>(
    files: impl IntoIterator<Item = &'a Path>,
) -> Result<Vec<ReadableDir>, Error> {
    let mut dirs: Vec<ReadableDir> = Vec::new();
    for file in files {
        if file.as_os_str() == "-" || file.as_os_str().is_empty() {
            continue;
        }
        let shown = file.display().to_string().escape_debug().to_string();
        std::fs::File::open(file)
            .map_err(|e| Error::invalid(format!("cannot open {shown}: {e}")))?;
        if file.components().any(|c| c == Component::ParentDir) {
            return Err(Error::invalid(format!(
                "the file {shown} is named through '..': give it without '..' (its absolute path, say) or on stdin (-)"
            )));
        }
        let parent = file
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let guest = parent.to_str().ok_or_else(|| {
            Error::invalid(format!(
                "the file {shown} has a name that is not UTF-8: give it on stdin (-)"
            ))
        })?;
        if !dirs.iter().any(|d| d.guest == guest) {
            dirs.push(ReadableDir {
                host: parent.to_path_buf(),
                guest: guest.to_string(),
            });
        }
    }
    Ok(dirs)
}

/// What a Singer target's config file gives the host.
pub struct TargetHosting {
    /// The config connection's origin and the config's `allowed_hosts`.
    pub allow: AllowList,
    /// A network trusting the config's `ca_file` too, when it names one (else the embedder's).
    pub network: Option<Network>,
    /// The config's `batch_dirs`, readable (read-only) under their own names: the BATCH files
    /// the target may read.
    pub readable: Vec<ReadableDir>,
}

impl TargetHosting {
    /// Reads the config file at `path` (the target reads it again, and refuses it the same
    /// way). Every failure is `invalid-input`, naming the file or the setting.
    pub fn read(path: &Path) -> Result<TargetHosting, Error> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::invalid(format!(
                "cannot read the config {}: {e}",
                path.display().to_string().escape_debug()
            ))
        })?;
        let config = TargetConfig::parse(&text)?;
        let mut allow = default_allow_list(&config.connection)?;
        allow.extend(
            AllowList::parse(&config.allowed_hosts)
                .map_err(|e| Error::invalid(format!("setting allowed_hosts: {e}")))?,
        );
        let network = match config.ca_file {
            Some(ca_file) => Some(
                Network::new(&TlsOptions {
                    ca_file: Some(ca_file.into()),
                })
                .map_err(|e| Error::invalid(format!("setting ca_file: {e}")))?,
            ),
            None => None,
        };
        let mut readable = Vec::new();
        for dir in &config.batch_dirs {
            if !Path::new(dir).is_dir() {
                return Err(Error::invalid(format!(
                    "setting batch_dirs: {} is not a directory",
                    dir.escape_debug()
                )));
            }
            readable.push(ReadableDir {
                host: dir.into(),
                guest: dir.clone(),
            });
        }
        Ok(TargetHosting {
            allow,
            network,
            readable,
        })
    }
}
