//! `clickhouse-component`: the command line of the reference host. Thin: parses the shared
//! command line plus the host's own options, runs the component's `wasi:cli/run` (or, for
//! `lock -- COMMAND`, holds the lock through the component's library exports while the command
//! runs), and exits with the code the component (or the command) gave.

mod cli;

use std::io::Write;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use cli::HostCli;
use clickhouse_component::host_api::cli::sanitize;
use clickhouse_component::host_api::cli::Command;
use clickhouse_component::host_api::{Endpoint, Redactor};
use clickhouse_component_host::config::{
    password_on_command_line, PASSWORD_ON_COMMAND_LINE_WARNING,
};
use clickhouse_component_host::CallError;

/// The host's log (stderr) with the connection's secrets redacted from every line: at trace
/// level wasmtime logs each WASI call with its arguments, the request target among them (a
/// secret setting travels in it).
#[derive(Clone)]
struct RedactedStderr(std::sync::Arc<Redactor>);

impl Write for RedactedStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        std::io::stderr().write_all(self.0.redact_whole(&text).as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for RedactedStderr {
    type Writer = RedactedStderr;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// Logs to stderr, filtered by `RUST_LOG`, with `secrets` redacted.
fn init_logging(secrets: Vec<String>) {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                // wasmtime-wasi-http warns about every refused connection; the component
                // already reports it as a classified error.
                tracing_subscriber::EnvFilter::new("warn,wasmtime_wasi_http=error")
            }),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(RedactedStderr(std::sync::Arc::new(Redactor::new(secrets))))
        .init();
}

fn main() -> ExitCode {
    // `lock ID -- COMMAND` starts this binary again as the command's watchdog.
    #[cfg(unix)]
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == cli::watchdog::ARG)
    {
        return cli::watchdog::main();
    }
    let raw_args: Vec<String> = std::env::args().collect();
    let parsed = HostCli::command()
        .try_get_matches_from(&raw_args)
        .and_then(|matches| HostCli::from_arg_matches(&matches).map(|cli| (matches, cli)));
    let (matches, cli) = match parsed {
        Ok(parsed) => parsed,
        Err(e) => {
            let code = clickhouse_component::host_api::cli::usage_error(
                &e.format(&mut HostCli::command()),
                &raw_args,
                &mut std::io::stdout(),
                &mut std::io::stderr(),
            );
            return ExitCode::from(u8::try_from(code).unwrap_or(1));
        }
    };
    // A connection that does not parse sends nothing (and says why without its secrets).
    let secrets = cli
        .cli
        .global
        .connection()
        .ok()
        .and_then(|c| Endpoint::parse(&c).ok())
        .map(|e| e.secrets())
        .unwrap_or_default();
    init_logging(secrets);
    // As mysql and psql do: arguments are visible to every user of the machine.
    if password_on_command_line(&matches) {
        eprintln!("{PASSWORD_ON_COMMAND_LINE_WARNING}");
    }
    let json = cli.cli.global.json;
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error (runner): {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(async {
        match &cli.cli.command {
            Command::Lock(args) if !args.command.is_empty() => {
                cli::lock::run(&cli.host, &cli.cli.global, args)
                    .await
                    .map(|(code, report)| {
                        if json {
                            println!("{report}");
                        }
                        code
                    })
            }
            _ => cli::command::run(&cli, &raw_args).await,
        }
    });
    let code = match result {
        Ok(code) => code,
        Err(CallError::Component(e)) => clickhouse_component::host_api::cli::error(
            json,
            &e,
            &mut std::io::stdout(),
            &mut std::io::stderr(),
        ),
        Err(CallError::Runner(e)) => {
            tracing::debug!(error = ?e, "runner failure");
            let message = clickhouse_component_host::runner_message(&e);
            if json {
                println!(
                    "{}",
                    serde_json::json!({"ok": false, "error": {"kind": "runner", "message": message}})
                );
            } else {
                eprintln!("error (runner): {}", sanitize(&message));
            }
            1
        }
    };
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
