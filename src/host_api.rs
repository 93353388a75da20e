//! The crate as a host of the component uses it (the reference host links it natively): the
//! connection and error types, the command line's definitions and printing, and the few rules
//! a host applies itself before the component runs (a new state id's rules, how an id is
//! printed, the one backoff). Everything else in the crate is the component's own; a host
//! that imports from here stays clear of it.

pub use crate::client::request::OPERATION_HEADER;
pub use crate::client::retry::backoff;
pub use crate::client::{
    Compression, ConnectionOptions, Endpoint, Error, ErrorKind, Redactor, ServerError,
};
pub use crate::hex::hex;
pub use crate::state::{check_new_id, escape_id, LockEngineChoice, State};

/// A row's values as a binding writes them for the sink: for `send-json` the value and its
/// JSON text as the component reads it; for `send-packed` the packed rows' writer.
pub mod rows {
    pub use crate::sink::encode::{write_json_string, write_value, Value};
    #[cfg(feature = "speed")]
    pub use crate::sink::packed::{Tag, Writer as PackedWriter};
}

/// The command line: its definitions, as the component parses them, and how it prints.
#[cfg(feature = "command")]
pub mod cli {
    pub use crate::cli::lock::LockArgs;
    pub use crate::cli::output::{error, sanitize};
    pub use crate::cli::state::{
        ask_to_continue, declined, python_json, GetFormat, StateCommand, OVERWRITE_PROMPT,
    };
    pub use crate::cli::target::TargetArgs;
    pub use crate::cli::{usage_error, Cli, Command, GlobalArgs, StoreArgs};
    pub use crate::loader::config::TargetConfig;
}
