//! Runs the component's command line (its `wasi:cli/run` export) for every command but
//! `lock -- COMMAND` and `state edit`: the same output and exit codes as under any other
//! runner, by construction. The host adds its allow-list, passes only the CLICKHOUSE_* /
//! MELTANO_STATE_BACKEND_* environment, asks for progress on a terminal, and gives the
//! component read-only access to the directory of each file the command line names (the FILE
//! of `sink` and `state import`, the --input-file of `state set` / `merge`), under the name
//! the argument uses (and the --config and --input of `target`): the arguments reach the component unchanged, and it opens the file
//! itself (as under `wasmtime run --dir DIR`), as often as it needs.

use std::path::{Component, Path, PathBuf};

use clickhouse_component::host_api::cli::Command;
use clickhouse_component::host_api::cli::StateCommand;
use clickhouse_component::host_api::Error;
use clickhouse_component_host::{CallError, CommandInput, ReadableDir};

use super::component::run_component;
use super::HostCli;

/// Runs the command through the component; returns the exit code. `cli` is what `raw_args`
/// parsed into.
pub async fn run(cli: &HostCli, raw_args: &[String]) -> Result<i32, CallError> {
    if let Command::State {
        command: StateCommand::Edit { id, force },
        ..
    } = &cli.cli.command
    {
        return super::edit::run(cli, raw_args, id, *force).await;
    }
    let readable = readable_dirs(cli).map_err(CallError::Component)?;
    run_component(cli, raw_args, CommandInput::Inherit, None, &readable).await
}

/// The files the command line names (`-` and absent ones aside).
fn named_files(cli: &HostCli) -> Vec<&Path> {
    let files: Vec<Option<&PathBuf>> = match &cli.cli.command {
        Command::Sink(sink) => vec![sink.file.as_ref()],
        Command::Target(target) => vec![target.config.as_ref(), target.input.as_ref()],
        Command::State { command, .. } => match command {
            StateCommand::Import { file } => vec![Some(file)],
            StateCommand::Set { input_file, .. } | StateCommand::Merge { input_file, .. } => {
                vec![input_file.as_ref()]
            }
            _ => vec![],
        },
        _ => vec![],
    };
    files
        .into_iter()
        .flatten()
        .map(PathBuf::as_path)
        .filter(|f| f.as_os_str() != "-" && !f.as_os_str().is_empty())
        .collect()
}

/// The directory of each named file, readable under the name its argument uses (`data` for
/// `data/rows.ndjson`, `.` for `rows.ndjson`, `/srv/in` for `/srv/in/rows.ndjson`). A file
/// that cannot be opened is `invalid-input` before anything runs; so is a path through `..`
/// (the guest resolves it against its own root, not the host's working directory) or one that
/// is not UTF-8.
fn readable_dirs(cli: &HostCli) -> Result<Vec<ReadableDir>, Error> {
    let mut dirs: Vec<ReadableDir> = Vec::new();
    for file in named_files(cli) {
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
