//! `clickhouse-component`: the command line of the reference host. Thin: parses options, runs
//! the component through the host library, prints results, exits with the error kind's code.

use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand};
use clickhouse_component::client::Error;
use clickhouse_component_host::config::GlobalArgs;
use clickhouse_component_host::Runtime;
use serde_json::json;

/// Pipeline state store and acknowledged table sink for ClickHouse, run as a WebAssembly
/// component.
///
/// Exit codes: 0 ok, 1 runner failure, 2 invalid input, 3 misconfigured, 4 disconnected,
/// 5 transient, 6 throttled, 7 permanent, 8 uncertain, 9 locked, 10 not found.
#[derive(Parser, Debug)]
#[command(name = "clickhouse-component", version)]
struct Cli {
    #[command(flatten)]
    global: GlobalArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Connect through the component and print the server's version, user, time zone and the
    /// round-trip time.
    Check,
}

/// Exit code for a failure of the runner itself (component failed to load, trap).
const RUNNER_FAILURE: u8 = 1;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // wasmtime-wasi-http warns about every refused connection; the component
                // already reports it as a classified error.
                .unwrap_or_else(|_| {
                    tracing_subscriber::EnvFilter::new("warn,wasmtime_wasi_http=error")
                }),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return runner_failure(&cli.global, &anyhow::Error::from(e)),
    };
    match runtime.block_on(run(&cli)) {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(error)) => report_error(&cli.global, &error),
        Err(e) => runner_failure(&cli.global, &e),
    }
}

async fn run(cli: &Cli) -> anyhow::Result<Result<(), Error>> {
    match &cli.command {
        Command::Check => check(&cli.global).await,
    }
}

async fn check(global: &GlobalArgs) -> anyhow::Result<Result<(), Error>> {
    let connection = match global.connection() {
        Ok(c) => c,
        Err(e) => return Ok(Err(e)),
    };
    let allow = match global.allow_list(&connection) {
        Ok(a) => a,
        Err(e) => return Ok(Err(e)),
    };
    let started = Instant::now();
    let runtime = Runtime::new(&global.component_source(), &global.cache_policy())?;
    let load = runtime.load_report().clone();
    let mut instance = runtime.instantiate(allow).await?;
    let ready = started.elapsed();
    let info = match instance.ping(&connection).await? {
        Ok(info) => info,
        Err(e) => return Ok(Err(e)),
    };
    let total = started.elapsed();
    let origin = clickhouse_component::client::Endpoint::parse(&connection)
        .map(|e| e.origin())
        .unwrap_or_default();
    let round_trip_ms = info.round_trip_us as f64 / 1e3;
    if global.json {
        println!(
            "{}",
            json!({
                "ok": true,
                "server": origin,
                "version": info.version,
                "user": info.user,
                "database": info.database,
                "timezone": info.timezone,
                "round_trip_ms": round_trip_ms,
                "component_load": format!("{:?}", load.kind),
                "component_load_ms": load.duration.as_secs_f64() * 1e3,
                "ready_ms": ready.as_secs_f64() * 1e3,
                "total_ms": total.as_secs_f64() * 1e3,
            })
        );
    } else {
        println!("ClickHouse {} at {origin}", info.version);
        println!("  user        {}", info.user);
        println!("  database    {}", info.database);
        println!("  timezone    {}", info.timezone);
        println!("  round trip  {round_trip_ms:.2} ms");
        println!(
            "  component   {:?} in {:.1} ms; ready in {:.1} ms; total {:.1} ms",
            load.kind,
            load.duration.as_secs_f64() * 1e3,
            ready.as_secs_f64() * 1e3,
            total.as_secs_f64() * 1e3
        );
    }
    Ok(Ok(()))
}

fn report_error(global: &GlobalArgs, error: &Error) -> ExitCode {
    if global.json {
        println!(
            "{}",
            json!({
                "ok": false,
                "error": {
                    "kind": error.kind.as_str(),
                    "message": error.message,
                    "server": error.server.as_ref().map(|s| json!({
                        "code": s.code, "name": s.name, "http_status": s.http_status,
                    })),
                    "committed_rows": error.committed_rows,
                }
            })
        );
    } else {
        eprintln!("error ({}): {}", error.kind, error.message);
        if let Some(server) = &error.server {
            eprintln!(
                "  server error {} {} (HTTP {})",
                server.code, server.name, server.http_status
            );
        }
    }
    ExitCode::from(u8::try_from(error.kind.exit_code()).unwrap_or(RUNNER_FAILURE))
}

fn runner_failure(global: &GlobalArgs, error: &anyhow::Error) -> ExitCode {
    if global.json {
        println!(
            "{}",
            json!({"ok": false, "error": {"kind": "runner", "message": format!("{error:#}")}})
        );
    } else {
        eprintln!("error (runner): {error:#}");
    }
    ExitCode::from(RUNNER_FAILURE)
}
