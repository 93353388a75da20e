//! Runs the component's command line (its `wasi:cli/run` export) for every command but
//! `lock -- COMMAND` and `state edit`: the same output and exit codes as under any other
//! runner, by construction. The host adds its allow-list, passes only the CLICKHOUSE_* /
//! MELTANO_STATE_BACKEND_* environment, asks for progress on a terminal, and gives the
//! component read-only access to the directory of each file the command line names (the FILE
//! of `sink` and `state import`, the --input-file of `state set` / `merge`), under the name
//! the argument uses (and the --config and --input of `target`): the arguments reach the component unchanged, and it opens the file
//! itself (as under `wasmtime run --dir DIR`), as often as it needs.

use std::path::{Path, PathBuf};

use clickhouse_component::host_api::cli::Command;
use clickhouse_component::host_api::cli::StateCommand;
use clickhouse_component_host::command_setup::readable_dirs;
use clickhouse_component_host::{CallError, CommandInput};

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
    let readable = readable_dirs(named_files(cli)).map_err(CallError::Component)?;
    run_component(cli, raw_args, CommandInput::Inherit, None, &readable).await
}

/// The files the command line names (absent ones aside).
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
    files.into_iter().flatten().map(PathBuf::as_path).collect()
}
