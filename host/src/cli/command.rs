//! Runs the component's command line (its `wasi:cli/run` export) for every command but
//! `lock -- COMMAND`: the same output and exit codes as under any other runner, by
//! construction. The host adds its allow-list, turns a FILE argument of `sink` / `state
//! import` into the component's stdin (the component gets no filesystem), passes only the
//! CLICKHOUSE_* / MELTANO_STATE_BACKEND_* environment, and asks for progress on a terminal.

use std::io::IsTerminal;
use std::path::Path;

use clickhouse_component::cli::state::StateCommand;
use clickhouse_component::cli::Command;
use clickhouse_component::client::Error;
use clickhouse_component_host::config::strip_host_flags;
use clickhouse_component_host::{CallError, Runtime};

use super::HostCli;

/// Environment variables the component may see.
fn component_env() -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| k.starts_with("CLICKHOUSE_") || k.starts_with("MELTANO_STATE_BACKEND_"))
        .filter(|(k, _)| {
            !matches!(
                k.as_str(),
                "CLICKHOUSE_ALLOW_HOSTS"
                    | "CLICKHOUSE_COMPONENT"
                    | "CLICKHOUSE_COMPONENT_CACHE_DIR"
            )
        })
        .collect();
    if std::io::stderr().is_terminal() {
        env.push(("CLICKHOUSE_PROGRESS".into(), "1".into()));
    }
    env
}

/// Runs the command through the component; returns the exit code.
pub async fn run(cli: &HostCli, raw_args: &[String]) -> Result<i32, CallError> {
    let connection = cli.cli.global.connection().map_err(CallError::Component)?;
    let allow = cli
        .host
        .allow_list(&connection)
        .map_err(CallError::Component)?;
    let mut args = strip_host_flags(raw_args);
    // A FILE argument becomes the component's stdin.
    let file = match &cli.cli.command {
        Command::Sink(sink) => sink.file.clone(),
        Command::State {
            command: StateCommand::Import { file },
            ..
        } => Some(file.clone()),
        _ => None,
    };
    let stdin = match file.filter(|f| f.as_os_str() != "-") {
        None => None,
        Some(path) => {
            let opened = std::fs::File::open(&path).map_err(|e| {
                CallError::Component(Error::invalid(format!(
                    "cannot open {}: {e}",
                    path.display()
                )))
            })?;
            replace_last(&mut args, &path, "-");
            Some(opened)
        }
    };
    let runtime = Runtime::new(&cli.host.component_source(), &cli.host.cache_policy())?;
    let mut instance = runtime
        .instantiate_command(allow, &args, &component_env(), stdin)
        .await?;
    instance.run_command().await
}

/// Replaces the last argument equal to `path` with `with`.
fn replace_last(args: &mut [String], path: &Path, with: &str) {
    let text = path.to_string_lossy();
    if let Some(arg) = args.iter_mut().rev().find(|a| a.as_str() == text) {
        *arg = with.to_string();
    }
}
