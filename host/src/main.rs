//! `clickhouse-component`: the command line of the reference host. Thin: parses options, runs
//! the component through the host library, prints results, exits with the error kind's code.

mod cli;

use std::process::ExitCode;

use clap::Parser;
use cli::{Cli, Command};

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
    let cli = Cli::parse();
    let json = cli.global.json;
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
        match &cli.command {
            Command::Check => cli::check::run(&cli.global).await,
            Command::State { store, command } => cli::state::run(&cli.global, store, command).await,
            Command::Lock(args) => cli::lock::run(&cli.global, args).await,
            Command::Sink(args) => cli::sink::run(&cli.global, args).await,
        }
    });
    match result {
        Ok(output) => output.emit(json),
        Err(error) => cli::output::error(json, &error),
    }
}
