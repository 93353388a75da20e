//! The reference host's command line: the component's own command line (run through its
//! `wasi:cli/run` export) plus what only the host can do: an allow-list, another component file,
//! a cache, files as input, progress on a terminal, and running a command under a lock.

pub mod command;
pub mod component;
pub mod edit;
pub mod lock;
pub mod record;
pub mod watchdog;

use clap::Parser;
use clickhouse_component::host_api::cli::Cli;
use clickhouse_component_host::config::HostArgs;

/// `clickhouse-component`: the shared command line plus the host's own options.
#[derive(Parser, Debug)]
#[command(name = "clickhouse-component", version, about, long_about = None)]
pub struct HostCli {
    /// Options only the reference host has.
    #[command(flatten)]
    pub host: HostArgs,
    /// The component's command line.
    #[command(flatten)]
    pub cli: Cli,
}
