//! The typed sink against the real engine: the one type model reads back every type name the
//! server prints, and a seeded corpus of values per covered type (valid values, bounds, and
//! near-misses in spelling, calendar, range, precision, quoting and nesting) goes three ways:
//! through the sink (Native on the wire), as the server's own JSONEachRow, and as a `CAST`
//! of its text.
//!
//! - every valid value must be accepted (a sink that refuses everything fails: the accepted
//!   values are counted) and read back equal to what it means;
//! - every near-miss must be refused before any request, with nothing written (the sink of
//!   before this test, which let the server parse, stored `"2026-02-30"` as 2026-03-02 and
//!   sent `"yesterday"` to the server);
//! - a valid value the server's JSONEachRow stores as something else, or a near-miss it
//!   stores as its meaning, is a disagreement of the corpus with the server, reported and
//!   counted (declared spellings aside: docs/sink.md).

use clickhouse_component::client::ErrorKind;
use clickhouse_component_host::{
    CachePolicy, CallError, ComponentSource, Runtime, LIBRARY_COMPONENT_PATH,
};
use clickhouse_component_tests::native::sql;
use clickhouse_component_tests::values::{plus_one, Rng, BOUNDS};
use clickhouse_component_tests::{
    cache_dir, clickhouse, instance_for, runtime, sink_options, unique_name,
};
use serde_json::Value;

/// How a stored value is compared with its meaning.
#[derive(Clone, Debug, PartialEq)]
enum Meaning {
    /// The stored `toString` is this text.
    Text(String),
    /// A float of 64 bits (else 32): the stored text parsed at that width equals this (NaN
    /// equals NaN).
    Float(f64, bool),
    /// A decimal: equal once trailing fraction zeros are dropped.
    Decimal(String),
    /// SQL NULL.
    Null,
}

#[derive(Clone, Debug)]
struct Entry {
    ty: String,
    json: String,
    /// `None`: a near-miss, to be refused.
    meaning: Option<Meaning>,
}

fn q(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

fn text(s: impl Into<String>) -> Option<Meaning> {
    Some(Meaning::Text(s.into()))
}

fn date_text(days: i64) -> String {
    let (y, m, d) = clickhouse_component::sink::scalars::civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}")
}

fn datetime_text(secs: i64) -> String {
    let (days, of_day) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    format!(
        "{} {:02}:{:02}:{:02}",
        date_text(days),
        of_day / 3600,
        of_day / 60 % 60,
        of_day % 60
    )
}

fn corpus(seed: u64) -> Vec<Entry> {
    let mut r = Rng(seed | 1);
    let mut out = Vec::new();
    let mut add = |ty: &str, json: String, meaning: Option<Meaning>| {
        out.push(Entry {
            ty: ty.to_string(),
            json,
            meaning,
        })
    };

    // Integers of every width.
    for &(bits, max, min, umax) in &BOUNDS {
        for signed in [true, false] {
            let ty = format!("{}Int{bits}", if signed { "" } else { "U" });
            let (hi, lo) = if signed {
                (max.to_string(), format!("-{min}"))
            } else {
                (umax.to_string(), "0".to_string())
            };
            let width = hi.len();
            let mut valid = vec![hi.clone(), lo.clone(), "0".into(), "7".into()];
            for _ in 0..4 {
                let len = 1 + r.below(width as u64 - 1) as usize;
                let n = r.digits(len);
                valid.push(if signed && r.below(2) == 0 {
                    format!("-{n}")
                } else {
                    n
                });
            }
            for v in &valid {
                let meaning = text(v.clone());
                add(&ty, v.clone(), meaning.clone());
                add(&ty, q(v), meaning);
            }
            add(&ty, "true".into(), text("1"));
            add(&ty, "false".into(), text("0"));
            add(&ty, q(&format!("+{}", &hi[..1])), text(&hi[..1]));
            let over = plus_one(&hi);
            add(&ty, over.clone(), None);
            add(&ty, q(&over), None);
            if signed {
                add(&ty, format!("-{}", plus_one(min)), None);
            } else {
                add(&ty, "-1".into(), None);
                add(&ty, q("-0"), None);
            }
            for near in ["1.0", "1e2", "1.5"] {
                add(&ty, near.into(), None);
            }
            for near in ["", " 5", "5 ", "0x10", "1e2", "one", "1_000"] {
                add(&ty, q(near), None);
            }
            add(&ty, "null".into(), None);
        }
    }

    // Floats.
    for (ty, wide) in [("Float32", false), ("Float64", true)] {
        for v in ["0.5", "-2.25", "1", "0", "1e10", "-3.5e-7", "123456.75"] {
            let f: f64 = v.parse().unwrap();
            add(ty, v.into(), Some(Meaning::Float(f, wide)));
            add(ty, q(v), Some(Meaning::Float(f, wide)));
        }
        add(ty, "0.1".into(), Some(Meaning::Float(0.1, wide)));
        add(ty, q("inf"), Some(Meaning::Float(f64::INFINITY, wide)));
        add(ty, q("-inf"), Some(Meaning::Float(f64::NEG_INFINITY, wide)));
        add(ty, q("nan"), Some(Meaning::Float(f64::NAN, wide)));
        add(ty, "true".into(), Some(Meaning::Float(1.0, wide)));
        add(ty, if wide { "1e400" } else { "1e40" }.into(), None);
        add(ty, if wide { "1e-400" } else { "1e-50" }.into(), None);
        for near in ["", "0x1p3", " 1.5", "abc", "1.5.5"] {
            add(ty, q(near), None);
        }
        add(ty, "[1]".into(), None);
    }

    // Decimals.
    for (p, s) in [(9u32, 2u32), (18, 4), (38, 10), (76, 20), (5, 0)] {
        let ty = format!("Decimal({p}, {s})");
        for _ in 0..6 {
            let len = 1 + r.below(u64::from(p - s).max(1)) as usize;
            let int = r.digits(len);
            let int = if p == s { "0".to_string() } else { int };
            let len = r.below(u64::from(s) + 1) as usize;
            let frac = r.digits(len);
            let v = if frac.is_empty() {
                int.clone()
            } else {
                format!("{int}.{frac}")
            };
            let v = if r.below(3) == 0 { format!("-{v}") } else { v };
            add(&ty, v.clone(), Some(Meaning::Decimal(v.clone())));
            add(&ty, q(&v), Some(Meaning::Decimal(v)));
        }
        let max_int = "9".repeat((p - s) as usize);
        let max = if s > 0 {
            format!("{max_int}.{}", "9".repeat(s as usize))
        } else {
            max_int.clone()
        };
        add(&ty, max.clone(), Some(Meaning::Decimal(max.clone())));
        if s > 0 {
            add(&ty, format!("{max}0"), Some(Meaning::Decimal(max.clone())));
        }
        add(&ty, format!("1{max_int}"), None);
        add(&ty, format!("1.{}1", "0".repeat(s as usize)), None);
        add(
            &ty,
            "15e-1".into(),
            if s >= 1 {
                Some(Meaning::Decimal("1.5".into()))
            } else {
                None
            },
        );
        for near in ["", ".", "1e", "--1", "1.5x"] {
            add(&ty, q(near), None);
        }
        add(&ty, "true".into(), None);
    }

    // Bool.
    for (v, m) in [
        ("true", "true"),
        ("false", "false"),
        ("1", "true"),
        ("0", "false"),
    ] {
        add("Bool", v.into(), text(m));
    }
    for near in ["2", "\"true\"", "\"1\"", "null", "\"yes\""] {
        add("Bool", near.into(), None);
    }

    // Strings.
    for (json, m) in [
        ("\"abc\"", "abc"),
        ("\"\"", ""),
        ("\"caf\\u00e9 \\\"q\\\" \\\\ \\n\\t\"", "café \"q\" \\ \n\t"),
        ("\"\\ud83d\\ude00\"", "\u{1f600}"),
        ("12.50", "12.50"),
        ("true", "true"),
        ("{\"a\": [1, 2]}", "{\"a\": [1, 2]}"),
        ("[1,\"x\"]", "[1,\"x\"]"),
    ] {
        add("String", json.into(), text(m));
    }
    for near in ["null", "\"\\ud800\""] {
        add("String", near.into(), None);
    }
    // Stored padded with zero bytes, which `toString` leaves out.
    add("FixedString(4)", q("ab"), text("ab"));
    add("FixedString(4)", q("abcd"), text("abcd"));
    add("FixedString(4)", q("é"), text("é"));
    for near in ["\"abcde\"", "12", "null"] {
        add("FixedString(4)", near.into(), None);
    }

    // UUID, IPv4, IPv6.
    for _ in 0..4 {
        let hex: String = (0..32)
            .map(|_| char::from_digit(r.below(16) as u32, 16).unwrap())
            .collect();
        let dashed = format!(
            "{}-{}-{}-{}-{}",
            &hex[..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..]
        );
        add("UUID", q(&dashed), text(dashed.clone()));
        add("UUID", q(&dashed.to_uppercase()), text(dashed.clone()));
        add("UUID", q(&hex), text(dashed.clone()));
        add("UUID", q(&format!("{{{dashed}}}")), None);
        add("UUID", q(&dashed[1..]), None);
    }
    add("UUID", q("61f0c404-5cb3-11e7-907b-a6006ad3dbaz"), None);
    add("UUID", "0".into(), None);
    for _ in 0..4 {
        let a: Vec<String> = (0..4).map(|_| r.below(256).to_string()).collect();
        let ip = a.join(".");
        add("IPv4", q(&ip), text(ip.clone()));
        add("IPv6", q(&ip), text(format!("::ffff:{ip}")));
    }
    add("IPv4", q("255.255.255.255"), text("255.255.255.255"));
    for near in [
        "\"01.2.3.4\"",
        "\"256.1.1.1\"",
        "\"1.2.3\"",
        "16909060",
        "\"::ffff:1.2.3.4\"",
    ] {
        add("IPv4", near.into(), None);
    }
    for (v, m) in [
        ("::1", "::1"),
        ("2001:DB8::1", "2001:db8::1"),
        ("0:0:0:0:0:0:0:1", "::1"),
        ("::ffff:1.2.3.4", "::ffff:1.2.3.4"),
    ] {
        add("IPv6", q(v), text(m));
    }
    for near in ["\"[::1]\"", "\"fe80::1%eth0\"", "\"::g\"", "\"\"", "1"] {
        add("IPv6", near.into(), None);
    }

    // Dates.
    for (ty, lo, hi) in [("Date", 0i64, 65_535i64), ("Date32", -25_567, 120_529)] {
        let mut days = vec![lo, hi, 0, 19_782];
        for _ in 0..6 {
            days.push(lo + r.below((hi - lo) as u64) as i64);
        }
        for d in days {
            add(ty, q(&date_text(d)), text(date_text(d)));
        }
        add(ty, q(&date_text(lo - 1)), None);
        add(ty, q(&date_text(hi + 1)), None);
        for near in [
            "2026-02-29",
            "2025-02-29",
            "2026-04-31",
            "2026-13-01",
            "2026-00-10",
            "2026-01-00",
            "2026-2-3",
            "20260203",
            "2026-02-03 10:00:00",
            " 2026-02-03",
            "yesterday",
        ] {
            add(ty, q(near), None);
        }
        add(ty, "20000".into(), None);
    }
    add("Date", q("2024-02-29"), text("2024-02-29"));
    add("Date", q("2000-02-29"), text("2000-02-29"));
    add("Date32", q("1900-02-28"), text("1900-02-28"));
    add("Date32", q("1900-02-29"), None);

    // Date-times: UTC, and a zone that is not UTC (sent as text for the server to convert;
    // `Etc/GMT-9` is UTC+9 without daylight saving ever, so every wall-clock time exists once).
    for (ty, offset) in [
        ("DateTime('UTC')", 0i64),
        ("DateTime('Etc/GMT-9')", 9 * 3600),
    ] {
        let mut secs = vec![86_400 * 2, 1_767_225_600, 4_000_000_000];
        for _ in 0..5 {
            secs.push(86_400 + r.below(4_200_000_000) as i64);
        }
        for s in secs {
            // Wall-clock text in the column's zone, with a T, date only, a Z, an offset.
            let local = datetime_text(s);
            add(ty, q(&local), text(local.clone()));
            add(ty, q(&local.replace(' ', "T")), text(local.clone()));
            let instant = s - offset;
            add(
                ty,
                q(&format!("{}Z", datetime_text(instant).replace(' ', "T"))),
                text(local.clone()),
            );
            add(
                ty,
                q(&format!(
                    "{}+02:30",
                    datetime_text(instant + 9000).replace(' ', "T")
                )),
                text(local.clone()),
            );
            add(ty, instant.to_string(), text(local.clone()));
            add(ty, q(&instant.to_string()), text(local.clone()));
            add(ty, q(&format!("{local}.000")), text(local.clone()));
        }
        add(ty, q("2026-11-01"), text("2026-11-01 00:00:00"));
        for near in [
            "2026-11-01 24:00:00",
            "2026-11-01 23:59:60",
            "2026-11-01 10:00:00.5",
            "2026-02-30 00:00:00",
            "2026-11-01 10:00",
            "yesterday",
            "2026",
            "2026-11-01T10:00:00+5:00",
            "2026-11-01 10:00:00 ",
        ] {
            add(ty, q(near), None);
        }
        add(ty, "1767225600.5".into(), None);
        add(ty, "true".into(), None);
    }
    add("DateTime('Etc/GMT-9')", q("1970-01-01 08:59:59"), None);
    add(
        "DateTime('Etc/GMT-9')",
        q("1970-01-02 00:00:00"),
        text("1970-01-02 00:00:00"),
    );
    add(
        "DateTime('UTC')",
        q("1970-01-01 00:00:00"),
        text("1970-01-01 00:00:00"),
    );
    add("DateTime('UTC')", "-1".into(), None);
    add("DateTime('UTC')", "4294967296".into(), None);
    add("DateTime('UTC')", q("1969-12-31 23:59:59"), None);
    add(
        "DateTime('UTC')",
        q("2106-02-07 06:28:15"),
        text("2106-02-07 06:28:15"),
    );
    for (ty, p, offset) in [
        ("DateTime64(3, 'UTC')", 3usize, 0i64),
        ("DateTime64(6, 'Etc/GMT-9')", 6, 9 * 3600),
    ] {
        for _ in 0..6 {
            let s = -2_000_000_000 + r.below(12_000_000_000) as i64;
            let frac = r.digits(p);
            let local = format!("{}.{frac}", datetime_text(s));
            add(ty, q(&local), text(local.clone()));
            let instant = s - offset;
            let sign_ok = instant >= 0;
            if sign_ok {
                add(ty, format!("{instant}.{frac}"), text(local.clone()));
            }
            add(
                ty,
                q(&format!(
                    "{}.{frac}Z",
                    datetime_text(instant).replace(' ', "T")
                )),
                text(local.clone()),
            );
            add(ty, q(&format!("{}.{frac}1", datetime_text(s))), None);
        }
        let zeros = "0".repeat(p);
        if offset == 0 {
            add(
                ty,
                q("1900-01-01 00:00:00"),
                text(format!("1900-01-01 00:00:00.{zeros}")),
            );
            add(
                ty,
                q("2299-12-31 23:59:59"),
                text(format!("2299-12-31 23:59:59.{zeros}")),
            );
        } else {
            // In a zone the sink has no rules for, a wall-clock time within a day of the
            // range's edges is refused (the server's conversion would clamp it).
            add(ty, q("1900-01-01 00:00:00"), None);
            add(ty, q("2299-12-31 23:59:59"), None);
            add(
                ty,
                q("1900-01-02 00:00:00"),
                text(format!("1900-01-02 00:00:00.{zeros}")),
            );
            add(
                ty,
                q("2299-12-30 23:59:59"),
                text(format!("2299-12-30 23:59:59.{zeros}")),
            );
        }
        add(
            ty,
            q("2026-01-01 10:00:00.5"),
            text(format!("2026-01-01 10:00:00.5{}", "0".repeat(p - 1))),
        );
        add(
            ty,
            q(&format!("2026-01-01 10:00:00.{zeros}000")),
            text(format!("2026-01-01 10:00:00.{zeros}")),
        );
        for near in [
            "1899-12-31 23:59:59",
            "2300-01-01 00:00:00",
            "10:00:61.000",
            "2026-01-01 10:00:61.000",
            "yesterday",
            "2026-01-01 10:00:00.",
            "2026-01-01T10:00:00.123+01",
        ] {
            add(ty, q(near), None);
        }
    }
    add("DateTime64(3, 'UTC')", "1767225600123".into(), None);
    add(
        "DateTime64(3, 'UTC')",
        "-1.5".into(),
        text("1969-12-31 23:59:58.500"),
    );
    // DateTime64(9)'s ticks end at 2^63 - 1 ns (the sink's ticks are 64 bits, as the
    // column's; the server refuses the next nanosecond).
    let d9 = "DateTime64(9, 'UTC')";
    let last = "2262-04-11 23:47:16.854775807";
    add(d9, q(last), text(last));
    add(d9, "9223372036.854775807".into(), text(last));
    add(d9, q("2262-04-11 23:47:16.854775808"), None);
    add(d9, q("2262-04-12 00:00:00"), None);
    add(d9, "9223372036.854775808".into(), None);
    add(
        d9,
        q("2262-04-12T05:00:00+06:00"),
        text("2262-04-11 23:00:00.000000000"),
    );
    add(
        d9,
        q("1900-01-01 00:00:00"),
        text("1900-01-01 00:00:00.000000000"),
    );

    // Enums.
    let e = "Enum8('a' = 1, 'b' = -2, 'c d' = 3)";
    for (v, m) in [
        ("\"a\"", "a"),
        ("\"c d\"", "c d"),
        ("-2", "b"),
        ("\"3\"", "c d"),
        ("1", "a"),
    ] {
        add(e, v.into(), text(m));
    }
    for near in ["\"x\"", "4", "\" a\"", "\"A\"", "\"\"", "null", "true"] {
        add(e, near.into(), None);
    }
    let e16 = "Enum16('lo' = -32768, 'hi' = 32767)";
    add(e16, q("hi"), text("hi"));
    add(e16, "-32768".into(), text("lo"));
    add(e16, "0".into(), None);

    // Wrappers and composites.
    add("Nullable(UInt8)", "null".into(), Some(Meaning::Null));
    add("Nullable(UInt8)", "7".into(), text("7"));
    add("Nullable(UInt8)", "256".into(), None);
    add("LowCardinality(String)", q("x"), text("x"));
    add(
        "LowCardinality(Nullable(String))",
        "null".into(),
        Some(Meaning::Null),
    );
    add(
        "Array(Nullable(Int16))",
        "[1, null, -32768]".into(),
        text("[1,NULL,-32768]"),
    );
    add("Array(Nullable(Int16))", "[]".into(), text("[]"));
    add("Array(Nullable(Int16))", "[1, 32768]".into(), None);
    add("Array(Nullable(Int16))", "[1, \"x\"]".into(), None);
    add("Array(Nullable(Int16))", "1".into(), None);
    add("Array(Int16)", "[1, null]".into(), None);
    add(
        "Array(Array(String))",
        "[[\"a\"], [], [\"b\", \"c\"]]".into(),
        text("[['a'],[],['b','c']]"),
    );
    add(
        "Map(String, UInt8)",
        "{\"a\": 1, \"b\": 255}".into(),
        text("{'a':1,'b':255}"),
    );
    add("Map(String, UInt8)", "{}".into(), text("{}"));
    add("Map(String, UInt8)", "{\"a\": 256}".into(), None);
    add(
        "Map(UInt8, String)",
        "{\"7\": \"x\"}".into(),
        text("{7:'x'}"),
    );
    add("Map(UInt8, String)", "{\"300\": \"x\"}".into(), None);
    add(
        "Tuple(a UInt8, b String)",
        "[7, \"x\"]".into(),
        text("(7,'x')"),
    );
    add(
        "Tuple(a UInt8, b String)",
        "{\"b\": \"x\", \"a\": 7}".into(),
        text("(7,'x')"),
    );
    add("Tuple(a UInt8, b String)", "{\"a\": 7}".into(), None);
    add("Tuple(a UInt8, b String)", "[7]".into(), None);
    add("Tuple(a UInt8, b String)", "[7, \"x\", 1]".into(), None);
    add(
        "Tuple(a UInt8, b String)",
        "{\"a\": 7, \"b\": \"x\", \"c\": 1}".into(),
        None,
    );
    add(
        "Array(DateTime64(3, 'UTC'))",
        "[\"2026-01-01 10:00:00.123\", 0]".into(),
        text("['2026-01-01 10:00:00.123','1970-01-01 00:00:00.000']"),
    );
    add(
        "Array(DateTime64(3, 'UTC'))",
        "[\"2026-01-01 10:00:00.1234\"]".into(),
        None,
    );
    add(
        "Map(String, Array(Decimal(9, 2)))",
        "{\"k\": [1.5, \"2.25\"]}".into(),
        text("{'k':[1.5,2.25]}"),
    );
    add(
        "Map(String, Array(Decimal(9, 2)))",
        "{\"k\": [1.555]}".into(),
        None,
    );
    out
}

fn matches(meaning: &Meaning, stored: &Value) -> bool {
    match (meaning, stored) {
        (Meaning::Null, Value::Null) => true,
        (Meaning::Text(t), Value::String(s)) => t == s,
        (Meaning::Float(f, wide), Value::String(s)) => {
            let parsed = match s.as_str() {
                "inf" => Some(f64::INFINITY),
                "-inf" => Some(f64::NEG_INFINITY),
                "nan" | "-nan" => Some(f64::NAN),
                other if *wide => other.parse().ok(),
                other => other.parse::<f32>().ok().map(f64::from),
            };
            let want = if *wide { *f } else { f64::from(*f as f32) };
            parsed.is_some_and(|p| (want.is_nan() && p.is_nan()) || p == want)
        }
        (Meaning::Decimal(d), Value::String(s)) => {
            let norm = |t: &str| {
                let t = t.strip_prefix('+').unwrap_or(t);
                let neg = t.starts_with('-');
                let t = t.trim_start_matches('-');
                let t = if t.contains('.') {
                    t.trim_end_matches('0').trim_end_matches('.')
                } else {
                    t
                };
                let t = t.trim_start_matches('0');
                let t = if t.is_empty() || t.starts_with('.') {
                    format!("0{t}")
                } else {
                    t.to_string()
                };
                if neg && t != "0" {
                    format!("-{t}")
                } else {
                    t
                }
            };
            norm(d) == norm(s)
        }
        _ => false,
    }
}

fn table_for(db: &str, n: usize, ty: &str) -> String {
    let t = format!("t{n}");
    sql().exec(
        &format!(
            "CREATE TABLE {{db:Identifier}}.{{t:Identifier}} (k UInt32, v {ty}) ENGINE = MergeTree ORDER BY k"
        ),
        &[("db", db), ("t", &t)],
    );
    t
}

fn stored(db: &str, t: &str) -> Vec<(u64, Value)> {
    sql()
        .rows(
            "SELECT k, if(isNull(v), NULL, toString(v)) AS v FROM {db:Identifier}.{t:Identifier} ORDER BY k",
            &[("db", db), ("t", t)],
        )
        .into_iter()
        .map(|r| (r["k"].as_u64().unwrap(), r["v"].clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_covered_type_reads_exactly_or_refuses_before_any_request() {
    corpus_through(runtime(), Via::Json { with_server: true }).await;
}

/// The same corpus as packed rows (`send-packed`, the Python binding's path): each value as
/// the Python value `json.loads` makes of it would be packed (a str, an int, a bool, None; a
/// list or dict as its JSON), and a number that is not an i64 or u64 (a float, a decimal, a
/// big integer) or text that `json.loads` cannot read as its JSON text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn packed_rows_read_the_corpus_alike() {
    corpus_through(runtime(), Via::Packed).await;
}

/// How the corpus's rows are sent.
#[derive(Clone, Copy, PartialEq)]
enum Via {
    /// NDJSON (`send-json`); `with_server`: each value also sent as the server's own
    /// JSONEachRow, where it disagrees reported.
    Json { with_server: bool },
    /// Packed rows (`send-packed`).
    Packed,
}

/// Rows `{"k": k, "v": json}` as packed rows.
fn packed_rows(rows: &[(usize, &str)]) -> Vec<u8> {
    use clickhouse_component::host_api::rows::{PackedWriter, Tag};
    let mut w = PackedWriter::new();
    for (k, json) in rows {
        w.row(2);
        let key = w.key(b"k");
        w.key_index(key);
        w.int(*k as i64);
        let key = w.key(b"v");
        w.key_index(key);
        match serde_json::from_str::<Value>(json) {
            Ok(Value::Null) => w.null(),
            Ok(Value::Bool(b)) => w.bool(b),
            Ok(Value::String(s)) => w.bytes(Tag::Str, s.as_bytes()),
            Ok(Value::Number(n)) if n.as_i64().is_some_and(|i| i.to_string() == n.to_string()) => {
                w.int(n.as_i64().unwrap())
            }
            Ok(Value::Number(n)) if n.as_u64().is_some_and(|u| u.to_string() == n.to_string()) => {
                w.uint(n.as_u64().unwrap())
            }
            _ => {
                let (mark, buf) = w.start_json();
                buf.extend_from_slice(json.as_bytes());
                w.end_json(mark);
            }
        }
    }
    w.finish()
}

/// The same corpus through the library component, built for size without wasm's `simd128`
/// (the full component, above, has it): the JSON reader's scalar byte scans, and `memchr`'s.
/// What the server's JSONEachRow makes of the values is asked once, above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_library_components_scalar_reader_reads_the_corpus_alike() {
    let library = LIBRARY_COMPONENT_PATH.expect("built by host/build.rs");
    let runtime = Runtime::new(
        &ComponentSource::File(library.into()),
        &CachePolicy::Dir(cache_dir()),
    )
    .unwrap();
    corpus_through(&runtime, Via::Json { with_server: false }).await;
}

/// The library component, built for its size budget, leaves packed rows out: `send-packed`
/// is refused as invalid input that names what to send instead, and nothing is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_library_component_refuses_packed_rows_naming_send_json() {
    let library = LIBRARY_COMPONENT_PATH.expect("built by host/build.rs");
    let runtime = Runtime::new(
        &ComponentSource::File(library.into()),
        &CachePolicy::Dir(cache_dir()),
    )
    .unwrap();
    let db = unique_name("packed_library");
    sql().exec("CREATE DATABASE {db:Identifier}", &[("db", &db)]);
    sql().exec(
        "CREATE TABLE {db:Identifier}.t (k UInt64, v String) ENGINE = MergeTree ORDER BY k",
        &[("db", &db)],
    );
    let mut i = instance_for(&runtime, &clickhouse().connection()).await;
    let sink = i
        .open_sink(
            &clickhouse().connection(),
            &sink_options(&format!("{db}.t")),
        )
        .await
        .unwrap();
    let rows = packed_rows(&[(1, "\"a\"")]);
    for position in [None, Some("p")] {
        match i.sink_send_packed(sink, &rows, position).await {
            Err(CallError::Component(e)) => {
                assert_eq!(e.kind, ErrorKind::InvalidInput);
                assert!(e.message.contains("use send-json"), "{}", e.message);
            }
            other => panic!("send-packed on the library component: {other:?}"),
        }
    }
    // The same row as JSON goes in.
    i.sink_send_json(sink, b"{\"k\":1,\"v\":\"a\"}")
        .await
        .unwrap();
    let stored = sql().rows("SELECT count() AS n FROM {db:Identifier}.t", &[("db", &db)]);
    assert_eq!(stored[0]["n"], Value::from(1));
    sql().exec("DROP DATABASE {db:Identifier}", &[("db", &db)]);
}

/// The corpus through the component `runtime` runs, sent `via` NDJSON or packed rows: each
/// type's near-misses refused one by one, its valid values sent together and read back.
async fn corpus_through(runtime: &Runtime, via: Via) {
    let with_server = via == Via::Json { with_server: true };
    let seed = std::env::var("TYPED_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x7e57_0000_0000_0001u64);
    let entries = corpus(seed);
    let db = unique_name("typed");
    sql().exec("CREATE DATABASE {db:Identifier}", &[("db", &db)]);
    let mut types: Vec<String> = entries.iter().map(|e| e.ty.clone()).collect();
    types.sort();
    types.dedup();
    let mut wrong = Vec::new();
    let mut disagreements = Vec::new();
    let (mut accepted, mut refused, mut valid_total) = (0usize, 0usize, 0usize);
    let mut i = instance_for(runtime, &clickhouse().connection()).await;
    for (n, ty) in types.iter().enumerate() {
        let ours = table_for(&db, n, ty);
        let theirs = table_for(&db, n + 10_000, ty);
        let qualified = format!("{db}.{ours}");
        let sink = i
            .open_sink(&clickhouse().connection(), &sink_options(&qualified))
            .await
            .unwrap();
        let of_type: Vec<(usize, &Entry)> = entries
            .iter()
            .enumerate()
            .filter(|(_, e)| &e.ty == ty)
            .collect();
        // Near-misses one by one: each refused, invalid-input, nothing written.
        for (k, e) in of_type.iter().filter(|(_, e)| e.meaning.is_none()) {
            let row = format!("{{\"k\":{k},\"v\":{}}}\n", e.json);
            let sent = match via {
                Via::Json { .. } => i.sink_send_json(sink, row.as_bytes()).await,
                Via::Packed => {
                    let rows = packed_rows(&[(*k, &e.json)]);
                    i.sink_send_packed(sink, &rows, None).await
                }
            };
            match sent {
                Ok(receipt) => {
                    accepted += 1;
                    wrong.push(format!(
                        "{ty} {}: a near-miss accepted ({receipt:?})",
                        e.json
                    ));
                }
                Err(CallError::Component(err)) if err.kind == ErrorKind::InvalidInput => {
                    refused += 1;
                    if !err.message.contains("column 'v'") {
                        wrong.push(format!(
                            "{ty} {}: the refusal names no column: {}",
                            e.json, err.message
                        ));
                    }
                }
                Err(err) => wrong.push(format!(
                    "{ty} {}: refused with the wrong kind: {err}",
                    e.json
                )),
            }
        }
        // Valid values together, in one send.
        let valid: Vec<&(usize, &Entry)> = of_type
            .iter()
            .filter(|(_, e)| e.meaning.is_some())
            .collect();
        valid_total += valid.len();
        if !valid.is_empty() {
            let body: String = valid
                .iter()
                .map(|(k, e)| format!("{{\"k\":{k},\"v\":{}}}\n", e.json))
                .collect();
            let sent = match via {
                Via::Json { .. } => i.sink_send_json(sink, body.as_bytes()).await,
                Via::Packed => {
                    let rows: Vec<(usize, &str)> =
                        valid.iter().map(|(k, e)| (*k, e.json.as_str())).collect();
                    i.sink_send_packed(sink, &packed_rows(&rows), None).await
                }
            };
            match sent {
                Ok(_) => accepted += valid.len(),
                Err(err) => wrong.push(format!("{ty}: valid values refused: {err}")),
            }
        }
        let rows = stored(&db, &ours);
        let written: Vec<u64> = rows.iter().map(|(k, _)| *k).collect();
        let want: Vec<u64> = valid.iter().map(|(k, _)| *k as u64).collect();
        if written != want
            && wrong
                .iter()
                .all(|w| !w.starts_with(&format!("{ty}: valid")))
        {
            wrong.push(format!("{ty}: rows written {written:?}, want {want:?}"));
        }
        for ((k, v), (_, e)) in rows.iter().zip(&valid) {
            let meaning = e.meaning.as_ref().unwrap();
            if !matches(meaning, v) {
                wrong.push(format!(
                    "{ty} {} (k {k}): stored as {v}, meant {meaning:?}",
                    e.json
                ));
            }
        }
        // The server's own JSONEachRow, value by value: where it agrees.
        for (k, e) in of_type.iter().filter(|_| with_server) {
            let row = format!("{{\"k\":{k},\"v\":{}}}\n", e.json);
            let mut q = clickhouse_component::client::Query::write(
                "test",
                "INSERT INTO {db:Identifier}.{t:Identifier} FORMAT JSONEachRow",
            )
            .param("db", &db)
            .param("t", &theirs)
            .data(row.into_bytes());
            q = q.setting("input_format_null_as_default", "0");
            let result = sql().client().execute(&q);
            let theirs_stored = sql()
                .rows(
                    "SELECT if(isNull(v), NULL, toString(v)) AS v FROM {db:Identifier}.{t:Identifier} WHERE k = {k:UInt32}",
                    &[("db", &db), ("t", &theirs), ("k", &k.to_string())],
                )
                .first()
                .map(|r| r["v"].clone());
            // And a CAST of the text, for the strings (asked where the server disagrees).
            let cast = || -> Option<String> {
                if !e.json.starts_with('"') {
                    return None;
                }
                let content: String = serde_json::from_str(&e.json).unwrap_or_default();
                let mut q = clickhouse_component::client::Query::read(
                    "test",
                    format!("SELECT toString(CAST({{s:String}} AS {ty})) AS v"),
                )
                .format("JSONEachRow")
                .param("s", &content);
                q = q.setting("date_time_input_format", "basic");
                let answer = sql().client().execute(&q);
                Some(match answer {
                    Ok(r) => format!("; CAST gives {}", String::from_utf8_lossy(&r.body).trim()),
                    Err(e) => format!("; CAST refuses it ({})", e.kind.as_str()),
                })
            };
            match (&e.meaning, result, theirs_stored) {
                (Some(m), Ok(_), Some(v)) if !matches(m, &v) => disagreements.push(format!(
                    "{ty} {}: JSONEachRow stores {v}, meant {m:?}",
                    e.json
                )),
                (Some(_), Err(err), _) => disagreements.push(format!(
                    "{ty} {}: JSONEachRow refuses ({}) a value the sink takes{}",
                    e.json,
                    err.kind.as_str(),
                    cast().unwrap_or_default()
                )),
                (None, Ok(_), Some(v)) => disagreements.push(format!(
                    "{ty} {}: a near-miss JSONEachRow stores as {v}{}",
                    e.json,
                    cast().unwrap_or_default()
                )),
                _ => {}
            }
        }
        let _ = i.sink_close(sink).await;
        let _ = i.drop_sink(sink).await;
    }
    eprintln!(
        "typed corpus (seed {seed:#x}): {} values over {} types; {accepted} accepted (of {valid_total} valid), {refused} refused",
        entries.len(),
        types.len()
    );
    eprintln!(
        "{} disagreements with the server's JSONEachRow (declared spellings among them):",
        disagreements.len()
    );
    for d in &disagreements {
        eprintln!("  {d}");
    }
    sql().exec("DROP DATABASE {db:Identifier}", &[("db", &db)]);
    assert!(
        wrong.is_empty(),
        "{} wrong:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    assert_eq!(
        accepted, valid_total,
        "every valid value is accepted, and only those"
    );
    assert!(
        valid_total > 500 && refused > 300,
        "{valid_total} valid, {refused} refused"
    );
}

/// The one type model reads every type name the server prints and prints it back the same.
#[tokio::test]
async fn every_type_name_the_server_prints_round_trips() {
    let db = unique_name("types");
    sql().exec("CREATE DATABASE {db:Identifier}", &[("db", &db)]);
    let types = [
        "UInt8",
        "UInt16",
        "UInt32",
        "UInt64",
        "UInt128",
        "UInt256",
        "Int8",
        "Int16",
        "Int32",
        "Int64",
        "Int128",
        "Int256",
        "Float32",
        "Float64",
        "Bool",
        "Decimal(9, 2)",
        "Decimal32(3)",
        "Decimal64(4)",
        "Decimal128(10)",
        "Decimal256(20)",
        "Decimal(76, 76)",
        "String",
        "FixedString(16)",
        "UUID",
        "IPv4",
        "IPv6",
        "Date",
        "Date32",
        "DateTime",
        "DateTime('Asia/Tokyo')",
        "DateTime64(3)",
        "DateTime64(9, 'UTC')",
        "Enum8('a' = 1, 'b' = 2)",
        "Enum8('b' = -2, 'a' = 1)",
        "Enum16('it\\'s' = 1000, 'back\\\\slash' = -1000, 'tab\\there' = 5)",
        "Nullable(UInt32)",
        "LowCardinality(String)",
        "LowCardinality(Nullable(String))",
        "Array(Array(Nullable(Int8)))",
        "Map(String, Array(Decimal(9, 3)))",
        "Map(LowCardinality(String), UInt64)",
        "Tuple(UInt8, String)",
        "Tuple(a UInt8, b Tuple(c String, d Array(UInt8)))",
        "Tuple(`a b` UInt8, `1x` String)",
        "SimpleAggregateFunction(sum, UInt64)",
        "SimpleAggregateFunction(anyLast, Nullable(String))",
        "AggregateFunction(quantiles(0.5, 0.9), UInt64)",
        "JSON",
        "Dynamic",
        "Variant(String, UInt64)",
        "Point",
        "Array(Tuple(x Variant(String, UInt8), y JSON))",
        "Nested(x UInt8, y String)",
    ];
    let columns: Vec<String> = types
        .iter()
        .enumerate()
        .map(|(n, t)| format!("c{n} {t}"))
        .collect();
    sql().exec(
        &format!(
            "CREATE TABLE {{db:Identifier}}.t ({}) ENGINE = MergeTree ORDER BY tuple() SETTINGS allow_nullable_key = 1",
            columns.join(", ")
        ),
        &[("db", &db)],
    );
    let described = sql().rows(
        "SELECT name, type FROM system.columns WHERE database = {db:String} AND table = 't'",
        &[("db", &db)],
    );
    assert!(described.len() >= types.len(), "{described:?}");
    let mut covered = 0;
    for row in &described {
        let printed = row["type"].as_str().unwrap();
        let ty = clickhouse_component::sink::types::Type::parse(printed)
            .unwrap_or_else(|e| panic!("{printed}: {e}"));
        assert_eq!(ty.to_string(), printed, "{ty:?}");
        covered += usize::from(ty.is_covered());
    }
    assert!(covered >= 40, "{covered} covered");
    sql().exec("DROP DATABASE {db:Identifier}", &[("db", &db)]);
}
