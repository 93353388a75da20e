//! `clickhouse-component`: the command line of the reference host. Thin: parses the shared
//! command line plus the host's own options, runs the component's `wasi:cli/run` (or, for
//! `lock -- COMMAND`, holds the lock through the component's library exports while the command
//! runs), and exits with the code the component (or the command) gave.

mod cli;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use cli::HostCli;
use clickhouse_component::cli::output::sanitize;
use clickhouse_component::cli::Command;
use clickhouse_component_host::config::{
    password_on_command_line, PASSWORD_ON_COMMAND_LINE_WARNING,
};
use clickhouse_component_host::CallError;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                // wasmtime-wasi-http warns about every refused connection; the component
                // already reports it as a classified error.
                tracing_subscriber::EnvFilter::new("warn,wasmtime_wasi_http=error")
            }),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    let raw_args: Vec<String> = std::env::args().collect();
    let matches = HostCli::command().get_matches_from(&raw_args);
    let cli = HostCli::from_arg_matches(&matches)
        .unwrap_or_else(|e| e.format(&mut HostCli::command()).exit());
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
            _ => cli::command::run(&cli, &matches, &raw_args).await,
        }
    });
    let code = match result {
        Ok(code) => code,
        Err(CallError::Component(e)) => clickhouse_component::cli::output::error(
            json,
            &e,
            &mut std::io::stdout(),
            &mut std::io::stderr(),
        ),
        Err(CallError::Runner(e)) => {
            if json {
                println!(
                    "{}",
                    serde_json::json!({"ok": false, "error": {"kind": "runner", "message": format!("{e:#}")}})
                );
            } else {
                eprintln!("error (runner): {}", sanitize(&format!("{e:#}")));
            }
            1
        }
    };
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
