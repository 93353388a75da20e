//! Where a stream's records go, named as Singer SDK SQL targets name them (the Hub's
//! target-clickhouse among them), so a pipeline switching to this target finds the tables and
//! columns its models already read.
//!
//! - **Table:** the stream name's last `-` part (`public-users` → `users`; a name without `-`
//!   is the table), conformed.
//! - **Database:** `default_target_schema` when set (as given), else the stream name's
//!   second-to-last part when it has two or three parts (`public-users` → `public`,
//!   `db-public-users` → `public`), conformed, else the `database` setting.
//! - **Columns:** each property name, conformed.
//!
//! [`conform`] is the SDK's `SQLSink.conform_name` (singer-sdk 0.36, which the Hub's target pins,
//! to 0.54: unchanged): characters other than ASCII letters, digits, `_`, `-`, `.` and
//! whitespace removed; lowercased; whitespace trimmed at both ends; `.`, `-` and space made `_`;
//! a leading digit replaced by the letter of its place (`0` → `a`, `1` → `b`, ...). Two
//! properties that conform to one name are refused, as the SDK refuses them. A name that
//! conforms to nothing (only non-ASCII letters, say) is refused, naming the setting that keeps
//! names verbatim (`conform_names: false`: the table is the stream's name, in `database`
//! or `default_target_schema`, and the columns the properties' names, as given).

use std::borrow::Cow;

use crate::client::Error;
use crate::text::escaped;

/// Whitespace as Python's `str.isspace` has it (the SDK's `\s`, `strip`): Unicode's, plus
/// the four ASCII separators (0x1C-0x1F) that Python counts and Rust does not.
fn python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// The SDK's `conform_name`, or `None` when nothing is left of the name.
pub fn conform(name: &str) -> Option<String> {
    let kept: String = name
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') || python_space(*c))
        .collect();
    let trimmed = kept.trim_matches(python_space);
    let mut out: String = trimmed
        .chars()
        .map(|c| match c {
            '.' | '-' | ' ' => '_',
            c => c.to_ascii_lowercase(),
        })
        .collect();
    let first = out.chars().next()?;
    if let Some(d) = first.to_digit(10) {
        out.replace_range(..1, &char::from(b'a' + d as u8).to_string());
    }
    Some(out)
}

/// How names are made: conformed as the SDK does, or kept as given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Naming {
    /// The SDK's names.
    Conformed,
    /// The stream's and properties' names as given.
    Verbatim,
}

impl Naming {
    /// A name for a database, table or column (`what` and `name` for the error).
    pub fn name<'n>(self, what: &str, name: &'n str) -> Result<Cow<'n, str>, Error> {
        match self {
            Naming::Verbatim => Ok(Cow::Borrowed(name)),
            Naming::Conformed => match conform(name) {
                Some(conformed) if conformed == name => Ok(Cow::Borrowed(name)),
                Some(conformed) => Ok(Cow::Owned(conformed)),
                None => Err(Error::invalid(format!(
                    "{what} '{}' has no ASCII letter, digit, '_', '-' or '.' to make a name of, as Singer SDK targets make names: set conform_names to false to keep names as given",
                    escaped(name)
                ))),
            },
        }
    }

    /// A stream's database (`None`: the `database` setting) and table.
    pub fn route(
        self,
        stream: &str,
        default_target_schema: Option<&str>,
    ) -> Result<(Option<String>, String), Error> {
        let parts: Vec<&str> = stream.split('-').collect();
        let (schema, table) = match self {
            Naming::Verbatim => (None, stream),
            Naming::Conformed => {
                let schema = (parts.len() == 2 || parts.len() == 3).then(|| parts[parts.len() - 2]);
                (
                    schema,
                    *parts.last().expect("split gives one part at least"),
                )
            }
        };
        let database = match default_target_schema {
            Some(db) => Some(db.to_string()),
            None => schema
                .map(|s| self.name(&format!("stream '{}': schema", escaped(stream)), s))
                .transpose()?
                .map(Cow::into_owned),
        };
        let table = self
            .name(&format!("stream '{}': table", escaped(stream)), table)?
            .into_owned();
        Ok((database, table))
    }

    /// The column of each property; two properties with one column are refused.
    pub fn columns(self, stream: &str, properties: &[&str]) -> Result<Vec<String>, Error> {
        let mut columns: Vec<String> = Vec::with_capacity(properties.len());
        for (i, property) in properties.iter().enumerate() {
            let column = self
                .name(&format!("stream '{}': property", escaped(stream)), property)?
                .into_owned();
            if let Some(j) = columns.iter().position(|c| *c == column) {
                return Err(Error::invalid(format!(
                    "stream '{}': properties '{}' and '{}' both make the column '{}' (names are conformed as Singer SDK targets conform them; set conform_names to false to keep them as given)",
                    escaped(stream),
                    escaped(properties[j]),
                    escaped(properties[i]),
                    escaped(&column)
                )));
            }
            columns.push(column);
        }
        Ok(columns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_conform_as_the_sdk_conforms_them() {
        // Each expectation is what singer-sdk 0.36's SQLSink.conform_name returns.
        for (name, want) in [
            ("users", "users"),
            ("UserName", "username"),
            ("first name", "first_name"),
            ("a.b-c", "a_b_c"),
            ("  padded\t", "padded"),
            ("tab\tinside", "tab\tinside"),
            ("1st", "bst"),
            ("0", "a"),
            ("9lives", "jlives"),
            ("café", "caf"),
            ("naïve-name", "nave_name"),
            ("$price (usd)", "price_usd"),
            ("_sdc_batched_at", "_sdc_batched_at"),
            ("--x", "__x"),
            ("\u{1f}edge\u{a0}", "edge"),
        ] {
            assert_eq!(conform(name).as_deref(), Some(want), "{name:?}");
        }
        for empty in ["", "日本", "   ", "€"] {
            assert_eq!(conform(empty), None, "{empty:?}");
        }
    }

    #[test]
    fn streams_route_to_the_sdks_database_and_table() {
        let c = Naming::Conformed;
        let route = |s: &str, d: Option<&str>| c.route(s, d).unwrap();
        assert_eq!(route("users", None), (None, "users".into()));
        assert_eq!(
            route("public-users", None),
            (Some("public".into()), "users".into())
        );
        assert_eq!(
            route("db-Sales-Order.Lines", None),
            (Some("sales".into()), "order_lines".into())
        );
        // Four parts: no schema part, the table is the last.
        assert_eq!(route("a-b-c-d", None), (None, "d".into()));
        assert_eq!(
            route("public-users", Some("Raw")),
            (Some("Raw".into()), "users".into())
        );
        let e = c.route("public-日本", None).unwrap_err();
        assert!(e.message.contains("conform_names"), "{}", e.message);
        let v = Naming::Verbatim;
        assert_eq!(
            v.route("public-Users", None).unwrap(),
            (None, "public-Users".into())
        );
        assert_eq!(
            v.route("x", Some("raw")).unwrap(),
            (Some("raw".into()), "x".into())
        );
    }

    #[test]
    fn two_properties_with_one_column_are_refused() {
        let c = Naming::Conformed;
        assert_eq!(
            c.columns("s", &["Id", "firstName"]).unwrap(),
            ["id", "firstname"]
        );
        let e = c.columns("s", &["a", "userName", "username"]).unwrap_err();
        assert!(
            e.message
                .contains("'userName' and 'username' both make the column 'username'"),
            "{}",
            e.message
        );
        assert_eq!(
            Naming::Verbatim
                .columns("s", &["userName", "username"])
                .unwrap()
                .len(),
            2
        );
    }
}
