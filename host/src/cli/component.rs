//! Runs the component's command line once (its `wasi:cli/run` export), with the host's
//! allow-list, limits and network, and only the CLICKHOUSE_* / MELTANO_STATE_BACKEND_*
//! environment: what [`super::command`] and [`super::edit`] both run commands through.
//! Uses no other module of the host's command line but [`super::HostCli`].

use std::io::IsTerminal;

use clickhouse_component::host_api::cli::{Command, TargetArgs};
use clickhouse_component_host::command_setup::TargetHosting;
use clickhouse_component_host::config::strip_host_flags;
use clickhouse_component_host::{
    AllowList, CallError, CapturedOutput, CommandInput, ReadableDir, Runtime,
};

use super::HostCli;

/// Environment variables the component may see (the runtime adds its memory limit,
/// `CLICKHOUSE_MAX_MEMORY_MIB`: [`Runtime::instantiate_command`]).
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

/// Runs the component's command line `args` (the host's own flags are stripped here) with this
/// stdin, its stdout into `stdout` (or the host's), and these directories readable; returns
/// the exit code.
pub async fn run_component(
    cli: &HostCli,
    args: &[String],
    stdin: CommandInput,
    stdout: Option<&CapturedOutput>,
    readable: &[ReadableDir],
) -> Result<i32, CallError> {
    // The target's connection is in its config file: the host reads it for the allow-list
    // (its hosts, and the config's allowed_hosts, with --allow-host) and its `ca_file`, which
    // replaces `--ca-file`.
    let mut readable = readable.to_vec();
    let (allow, network) = match &cli.cli.command {
        Command::Target(TargetArgs {
            config: Some(path), ..
        }) => {
            let hosting = TargetHosting::read(path).map_err(CallError::Component)?;
            let mut allow = hosting.allow;
            allow.extend(cli.host.extra_allow_list().map_err(CallError::Component)?);
            readable.extend(hosting.readable);
            (allow, hosting.network)
        }
        // `target --about`: no connection, nothing to reach.
        Command::Target(TargetArgs { config: None, .. }) => (AllowList::default(), None),
        _ => {
            let connection = cli.cli.global.connection().map_err(CallError::Component)?;
            let allow = cli
                .host
                .allow_list(&connection)
                .map_err(CallError::Component)?;
            (allow, None)
        }
    };
    let args = strip_host_flags(args);
    let network = match network {
        Some(network) => network,
        None => cli.host.network().map_err(CallError::Component)?,
    };
    let limits = cli.host.limits().map_err(CallError::Component)?;
    // Without a call timeout nothing needs to interrupt the guest: its code then runs without
    // epoch checks (the typed reads about 30% faster, docs/benchmarks.md). The command runs on
    // this thread (main's `block_on`); the connections on the runtime's workers.
    let (source, cache) = (cli.host.component_source(), cli.host.cache_policy());
    let runtime = match limits.call_timeout {
        None => Runtime::new_uninterruptible(&source, &cache)?,
        Some(_) => Runtime::new(&source, &cache)?,
    }
    .with_limits(limits)
    .with_network(network);
    let mut instance = runtime
        .instantiate_command(allow, &args, &component_env(), stdin, stdout, &readable)
        .await?;
    instance.run_command().await
}
