//! The host's outgoing network path, through the real component in the real host: IPv6
//! addresses over plain HTTP, HTTPS with a custom CA over kept-alive connections, and a cap on
//! the bytes read from one response.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clickhouse_component::client::{ConnectionOptions, ErrorKind};
use clickhouse_component_host::{default_allow_list, CallError, Limits, Network, TlsOptions};
use clickhouse_component_tests::{clickhouse, raw_http_server, runtime};
use tokio::net::{TcpListener, TcpStream};

/// The address of the test ClickHouse (its URL must be plain `http://host:port`).
async fn clickhouse_addr() -> SocketAddr {
    let url = &clickhouse().url;
    let authority = url
        .strip_prefix("http://")
        .unwrap_or_else(|| panic!("these tests need a plain-HTTP ClickHouse, not {url}"))
        .trim_end_matches('/');
    tokio::net::lookup_host(authority)
        .await
        .unwrap()
        .next()
        .unwrap_or_else(|| panic!("{authority} does not resolve"))
}

/// The test ClickHouse's connection options, at another URL.
fn connection_at(url: String) -> ConnectionOptions {
    ConnectionOptions {
        url,
        ..clickhouse().connection()
    }
}

/// Forwards every connection accepted on `listener` to `upstream`, after `wrap` (e.g. a TLS
/// handshake) on the accepted side. Returns the count of accepted connections.
fn forward<W, S, F>(listener: TcpListener, upstream: SocketAddr, wrap: W) -> Arc<AtomicUsize>
where
    W: Fn(TcpStream) -> F + Send + 'static,
    F: std::future::Future<Output = Option<S>> + Send + 'static,
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let wrapped = wrap(stream);
            tokio::spawn(async move {
                let Some(mut client) = wrapped.await else {
                    return;
                };
                let Ok(mut server) = TcpStream::connect(upstream).await else {
                    return;
                };
                let _ = server.set_nodelay(true);
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            });
        }
    });
    accepted
}

#[tokio::test]
async fn ipv6_addresses_work_over_plain_http() {
    let upstream = clickhouse_addr().await;
    // The local ClickHouse listens on 127.0.0.1 only: a forwarder on [::1] in front of it.
    let listener = TcpListener::bind("[::1]:0")
        .await
        .expect("this test needs the IPv6 loopback address");
    let port = listener.local_addr().unwrap().port();
    let accepted = forward(listener, upstream, |s| async move { Some(s) });
    let connection = connection_at(format!("http://[::1]:{port}"));
    let mut instance = runtime()
        .instantiate(default_allow_list(&connection).unwrap())
        .await
        .unwrap();
    let info = instance
        .ping(&connection)
        .await
        .unwrap_or_else(|e| panic!("ping over http://[::1]:{port}: {e}"));
    assert!(!info.version.is_empty());
    instance.ping(&connection).await.unwrap();
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "one kept-alive connection"
    );
}

/// A new CA (PEM) and a TLS server configuration for `localhost` signed by it.
fn test_pki() -> (String, Arc<rustls::ServerConfig>) {
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "host_network test CA");
    ca.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    let ca = rcgen::CertifiedIssuer::self_signed(ca, rcgen::KeyPair::generate().unwrap()).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut leaf = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    leaf.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let leaf = leaf.signed_by(&key, &ca).unwrap();
    let mut server = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![leaf.der().clone()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    )
    .unwrap();
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    (ca.pem(), Arc::new(server))
}

#[tokio::test]
async fn https_with_a_custom_ca_over_one_kept_alive_connection() {
    let upstream = clickhouse_addr().await;
    let (ca_pem, server) = test_pki();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let acceptor = tokio_rustls::TlsAcceptor::from(server);
    let accepted = forward(listener, upstream, move |stream| {
        let acceptor = acceptor.clone();
        async move { acceptor.accept(stream).await.ok() }
    });
    let connection = connection_at(format!("https://localhost:{port}"));
    let allow = default_allow_list(&connection).unwrap();

    // Without the CA file the server's certificate is rejected: misconfigured, said so.
    let mut instance = runtime().instantiate(allow.clone()).await.unwrap();
    let e = instance.ping(&connection).await.unwrap_err();
    assert_eq!(e.kind(), Some(ErrorKind::Misconfigured), "{e}");
    assert!(e.to_string().contains("certificate"), "{e}");

    // With it: two pings over one TLS connection.
    let dir = std::env::temp_dir().join(format!("host-network-ca-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, ca_pem).unwrap();
    let network = Network::new(&TlsOptions {
        ca_file: Some(ca_file),
    })
    .unwrap();
    let trusting = runtime().clone().with_network(network);
    let mut instance = trusting.instantiate(allow).await.unwrap();
    let before = accepted.load(Ordering::SeqCst);
    let info = instance
        .ping(&connection)
        .await
        .unwrap_or_else(|e| panic!("ping over https with the CA: {e}"));
    assert!(!info.version.is_empty());
    instance.ping(&connection).await.unwrap();
    assert_eq!(
        accepted.load(Ordering::SeqCst) - before,
        1,
        "two pings, one TLS connection"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A server answering every request with a 200 whose chunked body never ends (each connection
/// stops by itself after 60 s or 4 GiB). Returns its URL.
fn endless_server() -> String {
    raw_http_server(|mut stream| {
        let _ = stream.write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n",
        );
        let chunk = format!("10000\r\n{}\r\n", "x".repeat(0x10000));
        let started = Instant::now();
        for _ in 0..(1 << 16) {
            if started.elapsed() > Duration::from_secs(60)
                || stream.write_all(chunk.as_bytes()).is_err()
            {
                return;
            }
        }
    })
}

/// This process's resident memory, in bytes.
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .expect("VmRSS in /proc/self/status");
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap();
    kib * 1024
}

#[tokio::test]
async fn an_endless_response_body_is_cut_at_the_cap() {
    let url = endless_server();
    let connection = ConnectionOptions {
        request_timeout_ms: Some(30_000),
        ..ConnectionOptions::from_url(&url)
    };
    // Under ping's own cap (64 KiB), so that the host's cap is what ends it.
    let limited = runtime().clone().with_limits(Limits {
        max_response_bytes: 32 << 10,
        ..Limits::default()
    });
    let mut instance = limited
        .instantiate(default_allow_list(&connection).unwrap())
        .await
        .unwrap();
    let before = rss_bytes();
    let started = Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(60), instance.ping(&connection))
        .await
        .expect("the call did not end");
    let took = started.elapsed();
    let grown = rss_bytes().saturating_sub(before);
    let e = match outcome {
        Err(CallError::Component(e)) => e,
        other => panic!("expected a component error, got {other:?}"),
    };
    assert!(
        e.message.contains("body size exceeds limit") && e.message.contains("--max-response-mib"),
        "the error should name the cap: {e}"
    );
    // Asking again gets the same answer: not worth retrying.
    assert_eq!(e.kind, ErrorKind::Permanent, "{e}");
    assert!(took < Duration::from_secs(20), "took {took:?}");
    assert!(
        grown < 256 << 20,
        "the host's memory grew by {} MiB",
        grown >> 20
    );
}
