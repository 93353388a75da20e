//! Command-line and environment configuration shared by every subcommand: how to reach
//! ClickHouse, which hosts the component may reach, where the component comes from.

use std::path::PathBuf;

use clap::Args;
use clickhouse_component::client::{ConnectionOptions, Error};

use crate::allow_list::AllowList;
use crate::component::{CachePolicy, ComponentSource};
use crate::runtime::default_allow_list;

/// Global options (each also read from the environment variable shown).
#[derive(Args, Clone, Debug, Default)]
pub struct GlobalArgs {
    /// ClickHouse connection string: clickhouse:// clickhouses:// http:// https://
    /// [user[:password]@]host[:port][/database][?setting=value...]
    #[arg(long, env = "CLICKHOUSE_URL", global = true, hide_env_values = true)]
    pub url: Option<String>,

    /// Meltano's state backend URI, used when no --url / CLICKHOUSE_URL is given.
    #[arg(
        long = "meltano-state-backend-uri",
        env = "MELTANO_STATE_BACKEND_URI",
        global = true,
        hide = true,
        hide_env_values = true
    )]
    pub meltano_uri: Option<String>,

    /// Host, used only when no URL is given (with CLICKHOUSE_PORT; plain HTTP).
    #[arg(long, env = "CLICKHOUSE_HOST", global = true, hide = true)]
    pub host: Option<String>,

    /// Port, used only when no URL is given (default 8123).
    #[arg(long, env = "CLICKHOUSE_PORT", global = true, hide = true)]
    pub port: Option<u16>,

    /// User (overrides the URL's).
    #[arg(long, env = "CLICKHOUSE_USER", global = true)]
    pub user: Option<String>,

    /// Password (overrides the URL's; prefer the environment variable).
    #[arg(
        long,
        env = "CLICKHOUSE_PASSWORD",
        global = true,
        hide_env_values = true
    )]
    pub password: Option<String>,

    /// Database (overrides the URL path).
    #[arg(long, env = "CLICKHOUSE_DATABASE", global = true)]
    pub database: Option<String>,

    /// ClickHouse setting sent with every request, NAME=VALUE (repeatable).
    #[arg(long = "setting", value_name = "NAME=VALUE", global = true)]
    pub settings: Vec<String>,

    /// Connect timeout in milliseconds (default 10000).
    #[arg(long, env = "CLICKHOUSE_CONNECT_TIMEOUT_MS", global = true)]
    pub connect_timeout_ms: Option<u32>,

    /// Time allowed for the first response byte and between bytes, in ms (default 300000).
    #[arg(long, env = "CLICKHOUSE_REQUEST_TIMEOUT_MS", global = true)]
    pub request_timeout_ms: Option<u32>,

    /// Extra destination the component may reach, scheme://host:port with * wildcards
    /// (repeatable or comma-separated). Default: only the ClickHouse URL's origin.
    #[arg(
        long = "allow-host",
        env = "CLICKHOUSE_ALLOW_HOSTS",
        value_delimiter = ',',
        global = true
    )]
    pub allow_hosts: Vec<String>,

    /// Run this component file instead of the one embedded in this binary.
    #[arg(long, env = "CLICKHOUSE_COMPONENT", global = true)]
    pub component: Option<PathBuf>,

    /// Directory for the precompiled component ("off" disables the cache).
    #[arg(long, env = "CLICKHOUSE_COMPONENT_CACHE_DIR", global = true)]
    pub cache_dir: Option<String>,

    /// Print results (and errors) as JSON on stdout.
    #[arg(long, global = true)]
    pub json: bool,
}

impl GlobalArgs {
    /// The connection the options describe; `invalid-input` when none or malformed.
    pub fn connection(&self) -> Result<ConnectionOptions, Error> {
        let url =
            match (self.url.as_ref().or(self.meltano_uri.as_ref()), &self.host) {
                (Some(url), _) if !url.is_empty() => url.clone(),
                (_, Some(host)) if !host.is_empty() => {
                    format!("http://{host}:{}", self.port.unwrap_or(8123))
                }
                _ => return Err(Error::invalid(
                    "no ClickHouse to talk to: set --url or CLICKHOUSE_URL (or MELTANO_STATE_BACKEND_URI, or CLICKHOUSE_HOST)",
                )),
            };
        let mut settings = Vec::with_capacity(self.settings.len());
        for setting in &self.settings {
            let Some((name, value)) = setting.split_once('=') else {
                return Err(Error::invalid(format!(
                    "--setting expects NAME=VALUE, got '{}'",
                    setting.split('=').next().unwrap_or_default()
                )));
            };
            settings.push((name.trim().to_string(), value.to_string()));
        }
        Ok(ConnectionOptions {
            url,
            user: self.user.clone(),
            password: self.password.clone(),
            database: self.database.clone(),
            settings,
            connect_timeout_ms: self.connect_timeout_ms,
            request_timeout_ms: self.request_timeout_ms,
        })
    }

    /// The allow-list: the connection's origin plus every `--allow-host`.
    pub fn allow_list(&self, connection: &ConnectionOptions) -> Result<AllowList, Error> {
        let mut list = default_allow_list(connection)?;
        let extra =
            AllowList::parse(&self.allow_hosts).map_err(|e| Error::invalid(e.to_string()))?;
        list.extend(extra);
        Ok(list)
    }

    /// Where the component comes from.
    pub fn component_source(&self) -> ComponentSource {
        match &self.component {
            Some(path) => ComponentSource::File(path.clone()),
            None => ComponentSource::Embedded,
        }
    }

    /// The cache policy.
    pub fn cache_policy(&self) -> CachePolicy {
        match self.cache_dir.as_deref() {
            None | Some("") => CachePolicy::Default,
            Some("off") => CachePolicy::Disabled,
            Some(dir) => CachePolicy::Dir(dir.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_wins_over_host_and_port() {
        let args = GlobalArgs {
            url: Some("https://a:9440".into()),
            host: Some("b".into()),
            port: Some(1),
            ..Default::default()
        };
        assert_eq!(args.connection().unwrap().url, "https://a:9440");
        let args = GlobalArgs {
            host: Some("b".into()),
            ..Default::default()
        };
        assert_eq!(args.connection().unwrap().url, "http://b:8123");
        let args = GlobalArgs {
            meltano_uri: Some("clickhouse://m:1/db".into()),
            ..Default::default()
        };
        assert_eq!(args.connection().unwrap().url, "clickhouse://m:1/db");
        let args = GlobalArgs {
            url: Some("http://u:2".into()),
            meltano_uri: Some("clickhouse://m:1/db".into()),
            ..Default::default()
        };
        assert_eq!(args.connection().unwrap().url, "http://u:2");
        let err = GlobalArgs::default().connection().unwrap_err();
        assert!(err.message.contains("CLICKHOUSE_URL"));
    }

    #[test]
    fn settings_and_allow_list() {
        let args = GlobalArgs {
            url: Some("http://127.0.0.1:8123".into()),
            settings: vec!["max_threads=2".into(), "log_comment=a=b".into()],
            allow_hosts: vec!["https://*.example.com:443".into()],
            ..Default::default()
        };
        let conn = args.connection().unwrap();
        assert_eq!(
            conn.settings,
            vec![
                ("max_threads".to_string(), "2".to_string()),
                ("log_comment".to_string(), "a=b".to_string())
            ]
        );
        let allow = args.allow_list(&conn).unwrap();
        assert!(allow.allows("http", "127.0.0.1", 8123));
        assert!(allow.allows("https", "x.example.com", 443));
        assert!(!allow.allows("http", "127.0.0.1", 8124));
        let bad = GlobalArgs {
            settings: vec!["novalue".into()],
            ..args.clone()
        };
        assert!(bad.connection().unwrap_err().message.contains("NAME=VALUE"));
    }

    #[test]
    fn cache_policy_from_option() {
        let mut args = GlobalArgs::default();
        assert!(matches!(args.cache_policy(), CachePolicy::Default));
        args.cache_dir = Some("off".into());
        assert!(matches!(args.cache_policy(), CachePolicy::Disabled));
        args.cache_dir = Some("/tmp/x".into());
        assert!(matches!(args.cache_policy(), CachePolicy::Dir(_)));
    }
}
