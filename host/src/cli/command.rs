//! Runs the component's command line (its `wasi:cli/run` export) for every command but
//! `lock -- COMMAND`: the same output and exit codes as under any other runner, by
//! construction. The host adds its allow-list, turns a FILE argument of `sink` / `state
//! import` into the component's stdin (the component gets no filesystem), passes only the
//! CLICKHOUSE_* / MELTANO_STATE_BACKEND_* environment, and asks for progress on a terminal.

use std::io::IsTerminal;
use std::path::PathBuf;

use clap::{ArgMatches, CommandFactory, Parser};
use clickhouse_component::cli::state::StateCommand;
use clickhouse_component::cli::{Cli, Command};
use clickhouse_component::client::Error;
use clickhouse_component_host::config::{positional_index, strip_host_flags};
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

/// Runs the command through the component; returns the exit code. `matches` are what
/// `raw_args` parsed into (`cli`).
pub async fn run(
    cli: &HostCli,
    matches: &ArgMatches,
    raw_args: &[String],
) -> Result<i32, CallError> {
    let connection = cli.cli.global.connection().map_err(CallError::Component)?;
    let allow = cli
        .host
        .allow_list(&connection)
        .map_err(CallError::Component)?;
    // A FILE argument becomes the component's stdin: that argument, and no other with the
    // same text, becomes `-`.
    let mut args = raw_args.to_vec();
    let stdin = match file_argument(cli, matches, &args)? {
        None => None,
        Some((at, path)) => {
            let opened = std::fs::File::open(&path).map_err(|e| {
                CallError::Component(Error::invalid(format!(
                    "cannot open {}: {e}",
                    path.display()
                )))
            })?;
            args[at] = "-".to_string();
            Some(opened)
        }
    };
    let args = strip_host_flags(&args);
    let runtime = Runtime::new(&cli.host.component_source(), &cli.host.cache_policy())?
        .with_limits(cli.host.limits().map_err(CallError::Component)?)
        .with_network(cli.host.network().map_err(CallError::Component)?);
    let mut instance = runtime
        .instantiate_command(allow, &args, &component_env(), stdin)
        .await?;
    instance.run_command().await
}

/// The FILE of `sink` / `state import` (unless `-` or left out), and its position in `args`:
/// where clap found it (not the last argument with the same text: `sink data --table data`).
fn file_argument(
    cli: &HostCli,
    matches: &ArgMatches,
    args: &[String],
) -> Result<Option<(usize, PathBuf)>, CallError> {
    let (path, file): (&[&str], _) = match &cli.cli.command {
        Command::Sink(sink) => (&["sink"], sink.file.clone()),
        Command::State {
            command: StateCommand::Import { file },
            ..
        } => (&["state", "import"], Some(file.clone())),
        _ => return Ok(None),
    };
    let Some(file) = file.filter(|f| f.as_os_str() != "-") else {
        return Ok(None);
    };
    match positional_index(&HostCli::command(), matches, args, path, "file")
        .filter(|&at| only_the_file_becomes_stdin(cli, args, at))
    {
        Some(at) => Ok(Some((at, file))),
        None => Err(CallError::Component(Error::invalid(format!(
            "cannot tell which argument is the file '{}': give it after -- (sink --table T -- FILE) or on stdin",
            file.display().to_string().escape_debug()
        )))),
    }
}

/// Whether `-` in place of `args[at]` parses as the same command line with `-` as its FILE
/// (a check on the position found: nothing else may change).
fn only_the_file_becomes_stdin(cli: &HostCli, args: &[String], at: usize) -> bool {
    let mut replaced = args.to_vec();
    replaced[at] = "-".to_string();
    let Ok(reparsed) = HostCli::try_parse_from(&replaced) else {
        return false;
    };
    let mut expected: Cli = cli.cli.clone();
    match &mut expected.command {
        Command::Sink(sink) => sink.file = Some("-".into()),
        Command::State {
            command: StateCommand::Import { file },
            ..
        } => *file = "-".into(),
        _ => return false,
    }
    format!("{:?} {:?}", reparsed.host, reparsed.cli) == format!("{:?} {expected:?}", cli.host)
}
