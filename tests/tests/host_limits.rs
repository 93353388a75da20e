//! The host's per-instance limits, through the real component in the real host: a call has a
//! deadline even when a server keeps every timeout from firing (one byte at a time), and the
//! guest's memory is capped.

use std::io::Write;
use std::time::{Duration, Instant};

use clickhouse_component::client::{ConnectionOptions, ErrorKind};
use clickhouse_component_host::{
    default_allow_list, CachePolicy, CallError, ComponentSource, Limits, Runtime,
};
use clickhouse_component_tests::{
    cache_dir, clickhouse, raw_http_server, runtime, sink_options, trickling_server,
};

/// A server that answers every request with a 500 whose body never ends (as fast as it can).
fn endless_error_server() -> String {
    raw_http_server(|mut stream| {
        // Chunked, so no length announces it: only reading it shows how long it is.
        let text = b"Code: 999. DB::Exception: endless (KEEPER_EXCEPTION) ";
        let mut head = b"HTTP/1.1 500 Internal Server Error\r\nX-ClickHouse-Exception-Code: 999\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        head.extend_from_slice(format!("{:x}\r\n", text.len()).as_bytes());
        head.extend_from_slice(text);
        head.extend_from_slice(b"\r\n");
        let _ = stream.write_all(&head);
        let mut chunk = format!("{:x}\r\n", 64 * 1024).into_bytes();
        chunk.extend_from_slice(&[b'x'; 64 * 1024]);
        chunk.extend_from_slice(b"\r\n");
        while stream.write_all(&chunk).is_ok() {}
    })
}

#[tokio::test]
async fn an_error_answer_is_read_only_as_far_as_its_message_needs() {
    let url = endless_error_server();
    let connection = ConnectionOptions::from_url(&url);
    let mut instance = runtime()
        .instantiate(default_allow_list(&connection).unwrap())
        .await
        .unwrap();
    let started = Instant::now();
    let e = tokio::time::timeout(Duration::from_secs(60), instance.ping(&connection))
        .await
        .expect("the call did not end")
        .unwrap_err()
        .into_component();
    // The server's own error, not the response size limit (256 MiB of it would be read first).
    assert_eq!(e.kind, ErrorKind::Transient, "{e}");
    assert_eq!(e.server.as_ref().map(|s| s.code), Some(999), "{e}");
    assert!(e.message.contains("endless"), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_call_ends_at_its_deadline_even_when_the_server_trickles() {
    let url = trickling_server();
    // A request timeout far past the call's deadline: the component's own deadline on a small
    // answer (the request timeout) is not what ends this call.
    let connection = ConnectionOptions {
        request_timeout_ms: Some(60_000),
        ..ConnectionOptions::from_url(&url)
    };
    let limited = runtime().clone().with_limits(Limits {
        call_timeout: Some(Duration::from_millis(1_500)),
        ..Limits::default()
    });
    let mut instance = limited
        .instantiate(default_allow_list(&connection).unwrap())
        .await
        .unwrap();
    let started = Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(30), instance.ping(&connection))
        .await
        .expect("the call outlived its deadline by far");
    let took = started.elapsed();
    assert!(outcome.is_err(), "a trickling answer cannot be a ping");
    assert!(
        took < Duration::from_secs(5),
        "the call took {took:?} (deadline 1.5 s)"
    );
    assert!(took >= Duration::from_millis(1_400), "{took:?}");

    // Without a deadline the same call is still running when we stop waiting: the test above
    // would fail without the limit.
    let mut unlimited = runtime()
        .instantiate(default_allow_list(&connection).unwrap())
        .await
        .unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(4), unlimited.ping(&connection)).await;
    assert!(outcome.is_err(), "without a call deadline the call goes on");
}

/// A runtime whose guest code carries no epoch checks (the CLI's, without a call timeout) runs
/// the component, and refuses an instance with a call timeout: nothing could end a running
/// call at it.
#[tokio::test]
async fn a_runtime_without_interruption_refuses_a_call_timeout() {
    let connection = clickhouse().connection();
    let fast =
        Runtime::new_uninterruptible(&ComponentSource::Embedded, &CachePolicy::Dir(cache_dir()))
            .unwrap();
    let mut instance = fast
        .instantiate(default_allow_list(&connection).unwrap())
        .await
        .unwrap();
    instance.ping(&connection).await.unwrap();
    let limited = fast.with_limits(Limits {
        call_timeout: Some(Duration::from_secs(1)),
        ..Limits::default()
    });
    let refused = limited
        .instantiate(default_allow_list(&connection).unwrap())
        .await
        .err()
        .expect("a call timeout on a runtime that cannot interrupt is refused");
    assert!(
        refused
            .to_string()
            .contains("a call timeout needs a runtime that can interrupt a running call"),
        "{refused}"
    );
}

#[tokio::test]
async fn guest_memory_is_capped() {
    let connection = clickhouse().connection();
    // 48 MiB of input (not valid rows): validating it needs it in guest memory.
    let data = vec![b'x'; 48 << 20];
    let options = sink_options("never_written");
    // With the default limit (1 GiB) the input is read and refused as bad rows.
    let mut instance = runtime()
        .instantiate(default_allow_list(&connection).unwrap())
        .await
        .unwrap();
    let sink = instance.open_sink(&connection, &options).await.unwrap();
    let e = instance.sink_send_json(sink, &data).await.unwrap_err();
    assert_eq!(e.kind(), Some(ErrorKind::InvalidInput), "{e}");

    // With 32 MiB the guest cannot even take the input: the call traps, naming the memory.
    let limited = runtime().clone().with_limits(Limits {
        max_memory_bytes: 32 << 20,
        ..Limits::default()
    });
    let mut instance = limited
        .instantiate(default_allow_list(&connection).unwrap())
        .await
        .unwrap();
    let sink = instance.open_sink(&connection, &options).await.unwrap();
    match instance.sink_send_json(sink, &data).await {
        Err(CallError::Runner(e)) => {
            let text = format!("{e:#}");
            assert!(text.contains("memory"), "{text}");
        }
        other => panic!("expected a runner failure, got {other:?}"),
    }
}
