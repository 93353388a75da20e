//! Runs the component's command line (its `wasi:cli/run` export) for every command but
//! `lock -- COMMAND` and `state edit`: the same output and exit codes as under any other
//! runner, by construction. The host adds its allow-list, turns a FILE argument of `sink` /
//! `state import` and the --input-file of `state set` / `merge` into the component's stdin
//! (the component gets no filesystem), passes only the CLICKHOUSE_* / MELTANO_STATE_BACKEND_*
//! environment, and asks for progress on a terminal.

use std::path::PathBuf;

use clap::{ArgMatches, CommandFactory, Parser};
use clickhouse_component::cli::state::{ask_to_continue, declined, StateCommand, OVERWRITE_PROMPT};
use clickhouse_component::cli::{Cli, Command};
use clickhouse_component::client::Error;
use clickhouse_component_host::config::{value_position, ValuePosition};
use clickhouse_component_host::{CallError, CommandInput};

use super::component::run_component;
use super::HostCli;

/// Runs the command through the component; returns the exit code. `matches` are what
/// `raw_args` parsed into (`cli`).
pub async fn run(
    cli: &HostCli,
    matches: &ArgMatches,
    raw_args: &[String],
) -> Result<i32, CallError> {
    if let Command::State {
        command: StateCommand::Edit { id, force },
        ..
    } = &cli.cli.command
    {
        return super::edit::run(cli, raw_args, id, *force).await;
    }
    // A file argument becomes the component's stdin: that argument (and no other with the
    // same text) becomes `-`.
    let mut args = raw_args.to_vec();
    let mut stdin = CommandInput::Inherit;
    if let Some(file) = file_argument(cli, matches, &args)? {
        let opened = std::fs::File::open(&file.path).map_err(|e| {
            CallError::Component(Error::invalid(format!(
                "cannot open {}: {e}",
                file.path.display()
            )))
        })?;
        args = file.at.replace(&args, "-");
        if file.confirm {
            // `set` asks before it overwrites, on stdin: the file has it now, so the host asks
            // first (as Meltano does, before reading anything) and the component gets --force.
            if !ask_to_continue(
                OVERWRITE_PROMPT,
                &mut std::io::stdin().lock(),
                &mut std::io::stderr(),
            ) {
                return Ok(declined().emit(cli.cli.global.json, &mut std::io::stdout()));
            }
            args.insert(file.at.index + 1, "--force".to_string());
        }
        stdin = CommandInput::File(opened);
    }
    run_component(cli, &args, stdin, None).await
}

/// A file the command line names that becomes the component's stdin.
struct FileArgument {
    path: PathBuf,
    /// Where it is in the arguments.
    at: ValuePosition,
    /// Whether the command asks for confirmation on stdin (`set` without --force).
    confirm: bool,
}

/// The FILE of `sink` / `state import` or the --input-file of `state set` / `state merge`
/// (unless `-` or left out), and its position in `args`: where clap found it (not the last
/// argument with the same text: `sink data --table data`).
fn file_argument(
    cli: &HostCli,
    matches: &ArgMatches,
    args: &[String],
) -> Result<Option<FileArgument>, CallError> {
    let (path, id, file, confirm): (&[&str], _, _, _) = match &cli.cli.command {
        Command::Sink(sink) => (&["sink"], "file", sink.file.clone(), false),
        Command::State { command, .. } => match command {
            StateCommand::Import { file } => {
                (&["state", "import"], "file", Some(file.clone()), false)
            }
            StateCommand::Set {
                input_file, force, ..
            } => (&["state", "set"], "input_file", input_file.clone(), !force),
            StateCommand::Merge { input_file, .. } => {
                (&["state", "merge"], "input_file", input_file.clone(), false)
            }
            _ => return Ok(None),
        },
        _ => return Ok(None),
    };
    let Some(file) = file.filter(|f| f.as_os_str() != "-" && !f.as_os_str().is_empty()) else {
        return Ok(None);
    };
    match value_position(&HostCli::command(), matches, args, path, id)
        .filter(|&at| only_the_file_becomes_stdin(cli, args, at))
    {
        Some(at) => Ok(Some(FileArgument {
            path: file,
            at,
            confirm,
        })),
        None => Err(CallError::Component(Error::invalid(format!(
            "cannot tell which argument is the file '{}': give it after -- (sink --table T -- FILE) or on stdin",
            file.display().to_string().escape_debug()
        )))),
    }
}

/// Whether `-` in place of the value at `at` parses as the same command line with `-` as its
/// file (a check on the position found: nothing else may change).
fn only_the_file_becomes_stdin(cli: &HostCli, args: &[String], at: ValuePosition) -> bool {
    let Ok(reparsed) = HostCli::try_parse_from(at.replace(args, "-")) else {
        return false;
    };
    let mut expected: Cli = cli.cli.clone();
    let stdin = Some(PathBuf::from("-"));
    match &mut expected.command {
        Command::Sink(sink) => sink.file = stdin,
        Command::State { command, .. } => match command {
            StateCommand::Import { file } => *file = "-".into(),
            StateCommand::Set { input_file, .. } | StateCommand::Merge { input_file, .. } => {
                *input_file = stdin
            }
            _ => return false,
        },
        _ => return false,
    }
    format!("{:?} {:?}", reparsed.host, reparsed.cli) == format!("{:?} {expected:?}", cli.host)
}
