//! Command mode (wasm32 only): the `wasi:cli/run` export runs the shared command line with the
//! arguments and environment the runner gives, over wasi:http and WASI clocks, reading WASI
//! stdin. `CLICKHOUSE_PROGRESS=1` in the environment shows sink progress on stderr;
//! `CLICKHOUSE_MAX_MEMORY_MIB` is the memory the host lets the component use (the reference host
//! sets it to its `--max-memory-mib`).

use clap::Parser;

use crate::cli::{self, Cli, Runner};
use crate::client::wasi_http::WasiHttpTransport;
use crate::platform::wasi::WasiPlatform;

/// Runs the command line; returns the exit code.
pub fn main() -> i32 {
    let args: Vec<String> = std::env::args().collect();
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) => {
            return cli::usage_error(&e, &args, &mut std::io::stdout(), &mut std::io::stderr())
        }
    };
    let mut stderr = std::io::stderr();
    let mut stdout = std::io::stdout();
    let mut runner = Runner {
        transport: WasiHttpTransport,
        platform: WasiPlatform,
        stdin: Box::new(std::io::stdin()),
        stderr: &mut stderr,
        progress: std::env::var("CLICKHOUSE_PROGRESS").is_ok_and(|v| v == "1"),
        memory_limit: std::env::var("CLICKHOUSE_MAX_MEMORY_MIB")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(|mib| mib.saturating_mul(1 << 20)),
    };
    cli::run(&cli, &mut runner, &mut stdout)
}
