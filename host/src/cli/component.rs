//! Runs the component's command line once (its `wasi:cli/run` export), with the host's
//! allow-list, limits and network, and only the CLICKHOUSE_* / MELTANO_STATE_BACKEND_*
//! environment: what [`super::command`] and [`super::edit`] both run commands through.
//! Uses no other module of the host's command line but [`super::HostCli`].

use std::io::IsTerminal;

use clickhouse_component::host_api::cli::{Command, TargetArgs, TargetConfig};
use clickhouse_component::host_api::Error;
use clickhouse_component_host::config::strip_host_flags;
use clickhouse_component_host::{
    AllowList, CallError, CapturedOutput, CommandInput, ReadableDir, Runtime,
};

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
    // The target's own `ca_file` setting, when it has one, replaces `--ca-file`.
    let mut ca_file = None;
    let allow = match &cli.cli.command {
        // The target's connection is in its config file: the host reads it for the
        // allow-list (its hosts, and the config's allowed_hosts).
        Command::Target(TargetArgs {
            config: Some(path), ..
        }) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                CallError::Component(Error::invalid(format!(
                    "cannot read the config {}: {e}",
                    path.display().to_string().escape_debug()
                )))
            })?;
            let config = TargetConfig::parse(&text).map_err(CallError::Component)?;
            let mut allow = cli
                .host
                .allow_list(&config.connection)
                .map_err(CallError::Component)?;
            let extra = AllowList::parse(&config.allowed_hosts)
                .map_err(|e| CallError::Component(Error::invalid(e.to_string())))?;
            allow.extend(extra);
            ca_file = config.ca_file.map(std::path::PathBuf::from);
            allow
        }
        // `target --about`: no connection, nothing to reach.
        Command::Target(TargetArgs { config: None, .. }) => AllowList::parse(Vec::<String>::new())
            .map_err(|e| CallError::Component(Error::invalid(e.to_string())))?,
        _ => {
            let connection = cli.cli.global.connection().map_err(CallError::Component)?;
            cli.host
                .allow_list(&connection)
                .map_err(CallError::Component)?
        }
    };
    let args = strip_host_flags(args);
    let runtime = Runtime::new(&cli.host.component_source(), &cli.host.cache_policy())?
        .with_limits(cli.host.limits().map_err(CallError::Component)?)
        .with_network(match ca_file {
            Some(ca_file) => {
                clickhouse_component_host::Network::new(&clickhouse_component_host::TlsOptions {
                    ca_file: Some(ca_file),
                })
                .map_err(|e| {
                    CallError::Component(Error::invalid(format!("setting ca_file: {e}")))
                })?
            }
            None => cli.host.network().map_err(CallError::Component)?,
        });
    let mut instance = runtime
        .instantiate_command(allow, &args, &component_env(), stdin, stdout, readable)
        .await?;
    instance.run_command().await
}
