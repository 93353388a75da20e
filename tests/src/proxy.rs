//! A fault-injecting HTTP/1.1 proxy for tests: listens on a free loopback port, forwards to a
//! loopback server (keep-alive, one upstream connection per client connection), and can break any
//! chosen request — refuse it, cut it, lose or cut its reply, stall or pause it — switchable at
//! run time through a thread-safe handle.
//!
//! It reads each request whole (head plus `Content-Length` or chunked body) before deciding what
//! to do, and each reply whole (head plus `Content-Length`, chunked or read-to-close body) before
//! passing it on, so a fault happens at a known point of one request:
//!
//! ```no_run
//! use std::time::Duration;
//! use clickhouse_component_tests::proxy::{Fault, Match, Proxy, Rule};
//! let proxy = Proxy::start(&clickhouse_component_tests::clickhouse().url);
//! let server = proxy.server(clickhouse_component_tests::clickhouse()); // same creds, proxy URL
//! proxy.add(Rule::any(Fault::DropReply).times(1)); // the next request: executed, reply lost
//! let renew = proxy.add(Rule::head_contains("x-component-operation: renew", Fault::Pause));
//! let held = proxy.wait_held(1, Duration::from_secs(5)); // a renewal is waiting
//! proxy.release(held[0].id); // ... let it go on
//! proxy.stop_answering(); // everything stalls until `resume`
//! assert!(proxy.hits(renew) >= 1);
//! ```
//!
//! Threads: one acceptor plus one per open client connection (at most [`MAX_CONNECTIONS`]; more
//! are reset). Dropping the [`Proxy`] shuts every socket down, wakes every held request and joins
//! all its threads.

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Most client connections served at once; further ones are reset.
pub const MAX_CONNECTIONS: usize = 64;
/// Longest request or response head accepted.
const MAX_HEAD: usize = 64 * 1024;
/// Time allowed to connect to the upstream server.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// What the proxy does with one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Forward the request and deliver its reply unchanged.
    Pass,
    /// Reset the client's connection without forwarding anything: nothing reaches the server.
    Refuse,
    /// Forward the head and half of the body (half of the head if there is no body), then close
    /// the upstream connection and reset the client's: the server never gets a whole request.
    CutRequest,
    /// Forward the whole request, read the server's whole reply, and reset the client's
    /// connection instead of delivering it: the server executed it, the client sees a reset.
    DropReply,
    /// Forward the request; deliver the reply's head and half of its body (half of the head if
    /// there is no body), then close the client's connection.
    CutReply,
    /// Forward the request and hold the reply this long (or until released), then deliver it.
    Stall(Duration),
    /// Forward the request and hold the reply until released.
    StallUntilReleased,
    /// Hold the request before forwarding it until released, then forward it normally.
    Pause,
    /// Answer with these bytes (a whole HTTP reply, as a misbehaving server would send it)
    /// without forwarding anything, then close the client's connection.
    Respond(std::sync::Arc<Vec<u8>>),
}

/// One request as the proxy saw it.
#[derive(Clone, Debug)]
pub struct RequestInfo {
    /// 1-based order of arrival (all connections).
    pub seq: u64,
    /// Request method.
    pub method: String,
    /// Request target as sent (percent-encoded).
    pub target: String,
    /// The whole request head (request line and headers, `\r\n` separated).
    pub head: String,
    /// The request body (de-chunked if it was chunked).
    pub body: Vec<u8>,
    /// What the proxy did with it.
    pub fault: Fault,
}

impl RequestInfo {
    /// The target percent-decoded (`+` as space), e.g. to look for SQL in `?query=`.
    pub fn target_decoded(&self) -> String {
        percent_decode(&self.target)
    }

    /// The value of a header (first occurrence, name case-insensitive).
    pub fn header(&self, name: &str) -> Option<String> {
        header_value(&self.head, name)
    }
}

/// Which requests a [`Rule`] applies to.
#[derive(Clone)]
pub enum Match {
    /// Every request.
    Any,
    /// The request head contains this text (ASCII case-insensitive), e.g.
    /// `"x-component-operation: renew"`.
    HeadContains(String),
    /// The target, raw or percent-decoded, contains this text (case-sensitive), e.g. a table name
    /// or `"INSERT INTO"`.
    UrlContains(String),
    /// The body contains this text (case-sensitive).
    BodyContains(String),
    /// Any predicate on the request (its `fault` field is not decided yet: `Pass`).
    Fn(Arc<dyn Fn(&RequestInfo) -> bool + Send + Sync>),
}

impl std::fmt::Debug for Match {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Match::Any => write!(f, "Any"),
            Match::HeadContains(s) => write!(f, "HeadContains({s:?})"),
            Match::UrlContains(s) => write!(f, "UrlContains({s:?})"),
            Match::BodyContains(s) => write!(f, "BodyContains({s:?})"),
            Match::Fn(_) => write!(f, "Fn(..)"),
        }
    }
}

impl Match {
    fn matches(&self, request: &RequestInfo) -> bool {
        match self {
            Match::Any => true,
            Match::HeadContains(s) => request
                .head
                .to_ascii_lowercase()
                .contains(&s.to_ascii_lowercase()),
            Match::UrlContains(s) => {
                request.target.contains(s.as_str()) || request.target_decoded().contains(s.as_str())
            }
            Match::BodyContains(s) => String::from_utf8_lossy(&request.body).contains(s.as_str()),
            Match::Fn(f) => f(request),
        }
    }
}

/// A fault for the requests that match, optionally only some of them: the first matching,
/// unexhausted rule (in the order added) decides; requests no rule takes pass.
#[derive(Clone, Debug)]
pub struct Rule {
    matcher: Match,
    fault: Fault,
    skip: usize,
    times: Option<usize>,
}

impl Rule {
    /// `fault` for every request `matcher` takes.
    pub fn new(matcher: Match, fault: Fault) -> Rule {
        Rule {
            matcher,
            fault,
            skip: 0,
            times: None,
        }
    }

    /// `fault` for every request.
    pub fn any(fault: Fault) -> Rule {
        Rule::new(Match::Any, fault)
    }

    /// `fault` for requests whose head contains `text` (case-insensitive).
    pub fn head_contains(text: &str, fault: Fault) -> Rule {
        Rule::new(Match::HeadContains(text.into()), fault)
    }

    /// `fault` for requests whose target (raw or decoded) contains `text`.
    pub fn url_contains(text: &str, fault: Fault) -> Rule {
        Rule::new(Match::UrlContains(text.into()), fault)
    }

    /// `fault` for requests whose body contains `text`.
    pub fn body_contains(text: &str, fault: Fault) -> Rule {
        Rule::new(Match::BodyContains(text.into()), fault)
    }

    /// `fault` for requests the predicate takes.
    pub fn when(f: impl Fn(&RequestInfo) -> bool + Send + Sync + 'static, fault: Fault) -> Rule {
        Rule::new(Match::Fn(Arc::new(f)), fault)
    }

    /// Only the next `n` matching requests (after any skipped ones); then the rule is spent.
    pub fn times(mut self, n: usize) -> Rule {
        self.times = Some(n);
        self
    }

    /// Let the first `k` matching requests pass (they still count as matched).
    pub fn after(mut self, k: usize) -> Rule {
        self.skip = k;
        self
    }
}

/// The seed of a run of random faults: the environment variable `var` if set (to repeat a
/// run), else the clock. Printed, with how to reuse it.
pub fn fault_seed(var: &str) -> u64 {
    let seed = std::env::var(var)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("fault seed: {seed} ({var}={seed} reuses it)");
    seed
}

/// A well-mixed 64-bit hash of a seed and a request's sequence number (splitmix64's
/// finaliser, applied twice): which requests a seeded run faults.
pub fn seeded_hash(seed: u64, seq: u64) -> u64 {
    fn mix(mut z: u64) -> u64 {
        z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    mix(seed ^ mix(seq))
}

/// A rule added to a proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RuleId(u64);

/// Where a held request waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Not forwarded yet ([`Fault::Pause`]).
    BeforeForward,
    /// Executed; its reply is held ([`Fault::Stall`], [`Fault::StallUntilReleased`]).
    ReplyHeld,
}

/// A request the proxy holds until released (or, for a timed stall, until its time is up).
#[derive(Clone, Debug)]
pub struct Held {
    /// Pass to [`Proxy::release`].
    pub id: u64,
    /// Where it waits.
    pub stage: Stage,
    /// The request.
    pub request: RequestInfo,
}

struct RuleEntry {
    id: RuleId,
    rule: Rule,
    matched: usize,
    applied: usize,
}

struct HeldEntry {
    held: Held,
    released: bool,
}

#[derive(Default)]
struct State {
    rules: Vec<RuleEntry>,
    next_rule: u64,
    refusing: bool,
    stopped: bool,
    held: Vec<HeldEntry>,
    next_held: u64,
    log: Vec<RequestInfo>,
    connections: usize,
    active: usize,
    sockets: HashMap<u64, Vec<TcpStream>>,
    next_conn: u64,
    workers: Vec<JoinHandle<()>>,
}

struct Shared {
    upstream: SocketAddr,
    state: Mutex<State>,
    changed: Condvar,
    shutdown: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn is_shutdown(&self) -> bool {
        self.shutdown.load(Ordering::SeqCst)
    }

    /// Registers a socket to shut down when the proxy drops (at once if it already did).
    fn register(&self, conn: u64, socket: &TcpStream) {
        let mut state = self.lock();
        if self.is_shutdown() {
            let _ = socket.shutdown(Shutdown::Both);
            return;
        }
        if let Ok(clone) = socket.try_clone() {
            state.sockets.entry(conn).or_default().push(clone);
        }
    }

    /// Waits while the proxy is stopped or (with `hold`) the held request is not released and
    /// its `until` has not come; false if the proxy shut down meanwhile.
    fn wait(&self, hold: Option<u64>, until: Option<Instant>) -> bool {
        let mut state = self.lock();
        loop {
            if self.is_shutdown() {
                return false;
            }
            let now = Instant::now();
            let held = hold.is_some_and(|id| {
                state.held.iter().any(|h| h.held.id == id && !h.released)
                    && until.is_none_or(|u| now < u)
            });
            if !state.stopped && !held {
                if let Some(id) = hold {
                    state.held.retain(|h| h.held.id != id);
                    self.changed.notify_all();
                }
                return true;
            }
            let timeout = match until {
                Some(u) if held => u.saturating_duration_since(now),
                _ => Duration::from_secs(3600),
            };
            state = self
                .changed
                .wait_timeout(state, timeout)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn hold(&self, stage: Stage, request: &RequestInfo) -> u64 {
        let mut state = self.lock();
        state.next_held += 1;
        let id = state.next_held;
        state.held.push(HeldEntry {
            held: Held {
                id,
                stage,
                request: request.clone(),
            },
            released: false,
        });
        self.changed.notify_all();
        id
    }
}

/// The proxy; dropping it stops it.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Starts a proxy in front of `upstream` (`http://host:port[/...]` or `host:port`, a
    /// loopback address). Panics if it cannot.
    pub fn start(upstream: &str) -> Proxy {
        let authority = upstream
            .strip_prefix("http://")
            .unwrap_or(upstream)
            .split(['/', '?'])
            .next()
            .unwrap_or_default();
        let upstream: SocketAddr = authority
            .to_socket_addrs()
            .unwrap_or_else(|e| panic!("proxy upstream {authority:?}: {e}"))
            .find(|a| a.ip().is_loopback())
            .unwrap_or_else(|| panic!("proxy upstream {authority:?} is not a loopback address"));
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding the proxy");
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            upstream,
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            shutdown: AtomicBool::new(false),
        });
        let acceptor = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("proxy-accept".into())
                .spawn(move || accept_loop(listener, shared))
                .expect("starting the proxy")
        };
        Proxy {
            addr,
            shared,
            acceptor: Some(acceptor),
        }
    }

    /// The proxy's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `server` reached through this proxy (same credentials).
    pub fn server(&self, server: &crate::Server) -> crate::Server {
        crate::Server {
            url: self.url(),
            ..server.clone()
        }
    }

    /// Adds a rule (after the existing ones).
    pub fn add(&self, rule: Rule) -> RuleId {
        let mut state = self.shared.lock();
        state.next_rule += 1;
        let id = RuleId(state.next_rule);
        state.rules.push(RuleEntry {
            id,
            rule,
            matched: 0,
            applied: 0,
        });
        id
    }

    /// `fault` for the next `n` requests.
    pub fn next(&self, n: usize, fault: Fault) -> RuleId {
        self.add(Rule::any(fault).times(n))
    }

    /// Removes a rule (requests already under its fault keep it).
    pub fn remove(&self, id: RuleId) {
        self.shared.lock().rules.retain(|r| r.id != id);
    }

    /// Removes every rule.
    pub fn clear_rules(&self) {
        self.shared.lock().rules.clear();
    }

    /// How many requests a rule's fault was applied to (0 for a removed rule).
    pub fn hits(&self, id: RuleId) -> usize {
        let state = self.shared.lock();
        state
            .rules
            .iter()
            .find(|r| r.id == id)
            .map_or(0, |r| r.applied)
    }

    /// Refuse (reset) new connections, and every request on open ones, until `false`.
    pub fn refuse_connections(&self, on: bool) {
        self.shared.lock().refusing = on;
    }

    /// Stop answering: every request (new or on its way) stalls until [`Proxy::resume`].
    pub fn stop_answering(&self) {
        self.shared.lock().stopped = true;
    }

    /// Answers again (ends [`Proxy::stop_answering`] and [`Proxy::refuse_connections`]); what
    /// was stalled goes on.
    pub fn resume(&self) {
        let mut state = self.shared.lock();
        state.stopped = false;
        state.refusing = false;
        self.shared.changed.notify_all();
    }

    /// The requests held now.
    pub fn held(&self) -> Vec<Held> {
        let state = self.shared.lock();
        state
            .held
            .iter()
            .filter(|h| !h.released)
            .map(|h| h.held.clone())
            .collect()
    }

    /// Waits until at least `n` requests are held; panics after `timeout`.
    pub fn wait_held(&self, n: usize, timeout: Duration) -> Vec<Held> {
        let deadline = Instant::now() + timeout;
        let mut state = self.shared.lock();
        loop {
            let held: Vec<Held> = state
                .held
                .iter()
                .filter(|h| !h.released)
                .map(|h| h.held.clone())
                .collect();
            if held.len() >= n {
                return held;
            }
            let now = Instant::now();
            assert!(
                now < deadline,
                "proxy: {} of {n} requests held after {timeout:?}",
                held.len()
            );
            state = self
                .shared
                .changed
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Lets a held request go on.
    pub fn release(&self, id: u64) {
        let mut state = self.shared.lock();
        for h in state.held.iter_mut().filter(|h| h.held.id == id) {
            h.released = true;
        }
        self.shared.changed.notify_all();
    }

    /// Lets every held request go on.
    pub fn release_all(&self) {
        let mut state = self.shared.lock();
        for h in state.held.iter_mut() {
            h.released = true;
        }
        self.shared.changed.notify_all();
    }

    /// Requests seen so far (read whole from a client).
    pub fn requests(&self) -> usize {
        self.shared.lock().log.len()
    }

    /// Every request seen so far, with the fault applied to it.
    pub fn log(&self) -> Vec<RequestInfo> {
        self.shared.lock().log.clone()
    }

    /// Client connections accepted so far (including refused ones).
    pub fn connections(&self) -> usize {
        self.shared.lock().connections
    }

    /// Waits until at least `n` requests have been seen; panics after `timeout`.
    pub fn wait_requests(&self, n: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut state = self.shared.lock();
        while state.log.len() < n {
            let now = Instant::now();
            assert!(
                now < deadline,
                "proxy: {} of {n} requests seen after {timeout:?}",
                state.log.len()
            );
            state = self
                .shared
                .changed
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let workers = {
            let mut state = self.shared.lock();
            self.shared.shutdown.store(true, Ordering::SeqCst);
            for socket in state.sockets.values().flatten() {
                let _ = socket.shutdown(Shutdown::Both);
            }
            self.shared.changed.notify_all();
            std::mem::take(&mut state.workers)
        };
        // Wake the acceptor.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        for worker in workers {
            let _ = worker.join();
        }
        // Workers started while the acceptor was stopping.
        let late = std::mem::take(&mut self.shared.lock().workers);
        for worker in late {
            let _ = worker.join();
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for stream in listener.incoming() {
        if shared.is_shutdown() {
            break;
        }
        let Ok(stream) = stream else { continue };
        let _ = stream.set_nodelay(true);
        let mut state = shared.lock();
        state.connections += 1;
        state.workers.retain(|w| !w.is_finished());
        if state.refusing || state.active >= MAX_CONNECTIONS {
            drop(state);
            reset(stream);
            continue;
        }
        state.active += 1;
        state.next_conn += 1;
        let conn = state.next_conn;
        let worker = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name(format!("proxy-conn-{conn}"))
                .spawn(move || {
                    let _ = serve(&shared, conn, stream);
                    let mut state = shared.lock();
                    state.active -= 1;
                    state.sockets.remove(&conn);
                })
        };
        match worker {
            Ok(worker) => state.workers.push(worker),
            Err(_) => state.active -= 1,
        }
    }
}

/// Closes a connection with a reset (RST) rather than an orderly FIN.
fn reset(stream: TcpStream) {
    #[cfg(unix)]
    {
        use std::os::unix::io::AsRawFd;
        let linger = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: a valid socket descriptor and a correctly sized `linger` value.
        unsafe {
            libc::setsockopt(
                stream.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&linger as *const libc::linger).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            );
        }
    }
    drop(stream);
}

/// What ends a connection's loop.
enum End {
    /// Close normally (FIN).
    Close,
    /// Close with a reset (RST).
    Reset,
}

/// One upstream connection, opened when first needed.
struct Upstream {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
}

fn serve(shared: &Shared, conn: u64, client: TcpStream) -> io::Result<()> {
    shared.register(conn, &client);
    let mut reader = BufReader::new(client.try_clone()?);
    let mut writer = client;
    let mut upstream: Option<Upstream> = None;
    let end = session(shared, conn, &mut reader, &mut writer, &mut upstream).unwrap_or(End::Reset);
    // Drop the registered clones first so that closing `writer` really closes the socket.
    shared.lock().sockets.remove(&conn);
    drop(reader);
    drop(upstream);
    match end {
        End::Close => drop(writer),
        End::Reset => reset(writer),
    }
    Ok(())
}

/// Serves one client connection's requests until it ends.
fn session(
    shared: &Shared,
    conn: u64,
    reader: &mut BufReader<TcpStream>,
    writer: &mut TcpStream,
    upstream: &mut Option<Upstream>,
) -> io::Result<End> {
    loop {
        let Some(head) = read_head(reader)? else {
            return Ok(End::Close);
        };
        let (method, target) = request_line(&head);
        let body = read_body(reader, Framing::request(&head))?;
        let mut request = RequestInfo {
            seq: 0,
            method,
            target,
            head: String::from_utf8_lossy(&head).into_owned(),
            body: body.decoded,
            fault: Fault::Pass,
        };
        let fault = decide(shared, &mut request);
        let close_after = header_has_token(&request.head, "connection", "close");
        let hold = match &fault {
            Fault::Refuse => return Ok(End::Reset),
            Fault::Pause => Some(shared.hold(Stage::BeforeForward, &request)),
            Fault::Respond(reply) => {
                writer.write_all(reply)?;
                writer.flush()?;
                let _ = writer.shutdown(Shutdown::Write);
                return Ok(End::Close);
            }
            _ => None,
        };
        if !shared.wait(hold, None) || shared.lock().refusing {
            return Ok(End::Reset);
        }
        // A kept-alive upstream connection the server has closed meanwhile is replaced.
        if upstream.as_ref().is_some_and(|up| is_closed(&up.stream)) {
            *upstream = None;
        }
        if upstream.is_none() {
            let Ok(stream) = TcpStream::connect_timeout(&shared.upstream, CONNECT_TIMEOUT) else {
                return Ok(End::Reset);
            };
            let _ = stream.set_nodelay(true);
            shared.register(conn, &stream);
            *upstream = Some(Upstream {
                reader: BufReader::new(stream.try_clone()?),
                stream,
            });
        }
        let up = upstream.as_mut().unwrap();
        if fault == Fault::CutRequest {
            let part = if body.raw.is_empty() {
                &head[..head.len() / 2]
            } else {
                up.stream.write_all(&head)?;
                &body.raw[..body.raw.len() / 2]
            };
            let _ = up.stream.write_all(part);
            let _ = up.stream.flush();
            let _ = up.stream.shutdown(Shutdown::Both);
            *upstream = None;
            return Ok(End::Reset);
        }
        up.stream.write_all(&head)?;
        up.stream.write_all(&body.raw)?;
        // The reply (after any interim 1xx replies, passed on with it).
        let mut reply = Vec::new();
        let (reply_head, reply_body, reply_closes) = loop {
            let Some(h) = read_head(&mut up.reader)? else {
                // The server closed without answering.
                return Ok(End::Reset);
            };
            let status = status_code(&h);
            if (100..200).contains(&status) && status != 101 {
                reply.extend_from_slice(&h);
                continue;
            }
            let framing = Framing::response(&h, &request.method, status);
            let closes = framing == Framing::UntilClose
                || header_has_token(&String::from_utf8_lossy(&h), "connection", "close");
            let b = read_body(&mut up.reader, framing)?;
            break (h, b.raw, closes);
        };
        if reply_closes {
            *upstream = None;
        }
        let hold = match fault {
            Fault::DropReply => return Ok(End::Reset),
            Fault::Stall(d) => Some((
                shared.hold(Stage::ReplyHeld, &request),
                Some(Instant::now() + d),
            )),
            Fault::StallUntilReleased => Some((shared.hold(Stage::ReplyHeld, &request), None)),
            _ => None,
        };
        // Also holds the reply while the proxy is stopped.
        if !shared.wait(hold.map(|h| h.0), hold.and_then(|h| h.1)) {
            return Ok(End::Reset);
        }
        if fault == Fault::CutReply {
            if reply_body.is_empty() {
                reply.extend_from_slice(&reply_head[..reply_head.len() / 2]);
            } else {
                reply.extend_from_slice(&reply_head);
                reply.extend_from_slice(&reply_body[..reply_body.len() / 2]);
            }
            writer.write_all(&reply)?;
            writer.flush()?;
            let _ = writer.shutdown(Shutdown::Write);
            return Ok(End::Close);
        }
        reply.extend_from_slice(&reply_head);
        reply.extend_from_slice(&reply_body);
        writer.write_all(&reply)?;
        writer.flush()?;
        if close_after || reply_closes {
            return Ok(End::Close);
        }
    }
}

/// Whether the peer has closed an idle connection (or it failed).
fn is_closed(stream: &TcpStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return true;
    }
    let mut byte = [0u8; 1];
    let closed = match stream.peek(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != io::ErrorKind::WouldBlock,
    };
    closed || stream.set_nonblocking(false).is_err()
}

/// Logs the request and picks its fault.
fn decide(shared: &Shared, request: &mut RequestInfo) -> Fault {
    let mut state = shared.lock();
    request.seq = state.log.len() as u64 + 1;
    let mut fault = if state.refusing {
        Fault::Refuse
    } else {
        Fault::Pass
    };
    if fault == Fault::Pass {
        for entry in state.rules.iter_mut() {
            if entry.rule.times.is_some_and(|t| entry.applied >= t) {
                continue;
            }
            if !entry.rule.matcher.matches(request) {
                continue;
            }
            entry.matched += 1;
            if entry.matched <= entry.rule.skip {
                break;
            }
            entry.applied += 1;
            fault = entry.rule.fault.clone();
            break;
        }
    }
    request.fault = fault.clone();
    state.log.push(request.clone());
    shared.changed.notify_all();
    fault
}

/// How a message's body is delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Framing {
    None,
    Length(usize),
    Chunked,
    UntilClose,
}

impl Framing {
    fn request(head: &[u8]) -> Framing {
        let head = String::from_utf8_lossy(head);
        if header_has_token(&head, "transfer-encoding", "chunked") {
            Framing::Chunked
        } else {
            content_length(&head).map_or(Framing::None, Framing::Length)
        }
    }

    fn response(head: &[u8], method: &str, status: u16) -> Framing {
        if method.eq_ignore_ascii_case("HEAD") || status == 204 || status == 304 {
            return Framing::None;
        }
        let head = String::from_utf8_lossy(head);
        if header_has_token(&head, "transfer-encoding", "chunked") {
            Framing::Chunked
        } else {
            content_length(&head).map_or(Framing::UntilClose, Framing::Length)
        }
    }
}

/// A body as it was on the wire and as its payload.
struct Body {
    raw: Vec<u8>,
    decoded: Vec<u8>,
}

/// Reads a message head (through the empty line); `None` at a clean end of stream before it.
fn read_head(reader: &mut impl BufRead) -> io::Result<Option<Vec<u8>>> {
    let mut head = Vec::new();
    loop {
        let start = head.len();
        let n = reader.read_until(b'\n', &mut head)?;
        if n == 0 {
            return if head.is_empty() {
                Ok(None)
            } else {
                Err(io::ErrorKind::UnexpectedEof.into())
            };
        }
        let line = &head[start..];
        if line == b"\r\n" || line == b"\n" {
            if start == 0 {
                // Tolerate stray empty lines between messages.
                head.clear();
                continue;
            }
            return Ok(Some(head));
        }
        if head.len() > MAX_HEAD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "message head too long",
            ));
        }
    }
}

fn read_body(reader: &mut impl BufRead, framing: Framing) -> io::Result<Body> {
    match framing {
        Framing::None => Ok(Body {
            raw: Vec::new(),
            decoded: Vec::new(),
        }),
        Framing::Length(n) => {
            let mut raw = vec![0; n];
            reader.read_exact(&mut raw)?;
            Ok(Body {
                decoded: raw.clone(),
                raw,
            })
        }
        Framing::UntilClose => {
            let mut raw = Vec::new();
            reader.read_to_end(&mut raw)?;
            Ok(Body {
                decoded: raw.clone(),
                raw,
            })
        }
        Framing::Chunked => {
            let mut raw = Vec::new();
            let mut decoded = Vec::new();
            loop {
                let start = raw.len();
                if reader.read_until(b'\n', &mut raw)? == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                let line = String::from_utf8_lossy(&raw[start..]);
                let size = line.split(';').next().unwrap_or_default().trim();
                let size = usize::from_str_radix(size, 16)
                    .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad chunk size"))?;
                if size == 0 {
                    // Trailers, then the empty line.
                    loop {
                        let start = raw.len();
                        if reader.read_until(b'\n', &mut raw)? == 0 {
                            return Err(io::ErrorKind::UnexpectedEof.into());
                        }
                        if matches!(&raw[start..], b"\r\n" | b"\n") {
                            return Ok(Body { raw, decoded });
                        }
                    }
                }
                let mut chunk = vec![0; size + 2];
                reader.read_exact(&mut chunk)?;
                decoded.extend_from_slice(&chunk[..size]);
                raw.extend_from_slice(&chunk);
            }
        }
    }
}

fn request_line(head: &[u8]) -> (String, String) {
    let text = String::from_utf8_lossy(head);
    let mut parts = text.lines().next().unwrap_or_default().split_whitespace();
    (
        parts.next().unwrap_or_default().to_string(),
        parts.next().unwrap_or_default().to_string(),
    )
}

fn status_code(head: &[u8]) -> u16 {
    let text = String::from_utf8_lossy(head);
    text.lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn header_values<'a>(head: &'a str, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    head.lines().skip(1).filter_map(move |line| {
        let (n, v) = line.split_once(':')?;
        n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

fn header_value(head: &str, name: &str) -> Option<String> {
    header_values(head, name).next().map(str::to_string)
}

fn header_has_token(head: &str, name: &str, token: &str) -> bool {
    header_values(head, name).any(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
}

fn content_length(head: &str) -> Option<usize> {
    header_value(head, "content-length").and_then(|v| v.parse().ok())
}

fn percent_decode(text: &str) -> String {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// A tiny keep-alive HTTP/1.1 server: records each request it read whole ("METHOD target
    /// body-length") and answers `ok TARGET LEN` (Content-Length), or chunked for `/chunked`, or
    /// read-until-close for `/close`.
    struct TestServer {
        addr: SocketAddr,
        executed: Arc<Mutex<Vec<String>>>,
        stop: Arc<AtomicBool>,
        thread: Option<JoinHandle<()>>,
    }

    impl TestServer {
        fn start() -> TestServer {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let executed = Arc::new(Mutex::new(Vec::new()));
            let stop = Arc::new(AtomicBool::new(false));
            let thread = {
                let (executed, stop) = (executed.clone(), stop.clone());
                std::thread::spawn(move || {
                    for stream in listener.incoming() {
                        if stop.load(Ordering::SeqCst) {
                            break;
                        }
                        let Ok(stream) = stream else { continue };
                        let executed = executed.clone();
                        std::thread::spawn(move || {
                            let _ = Self::serve(stream, &executed);
                        });
                    }
                })
            };
            TestServer {
                addr,
                executed,
                stop,
                thread: Some(thread),
            }
        }

        fn serve(stream: TcpStream, executed: &Mutex<Vec<String>>) -> io::Result<()> {
            let mut reader = BufReader::new(stream.try_clone()?);
            let mut writer = stream;
            while let Some(head) = read_head(&mut reader)? {
                let (method, target) = request_line(&head);
                let body = read_body(&mut reader, Framing::request(&head))?;
                executed
                    .lock()
                    .unwrap()
                    .push(format!("{method} {target} {}", body.decoded.len()));
                let text = format!("ok {target} {}", body.decoded.len());
                if target == "/chunked" {
                    let half = text.len() / 2;
                    write!(
                        writer,
                        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{}\r\n{:x}\r\n{}\r\n0\r\n\r\n",
                        half,
                        &text[..half],
                        text.len() - half,
                        &text[half..]
                    )?;
                } else if target == "/close" {
                    write!(writer, "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{text}")?;
                    return Ok(());
                } else {
                    write!(
                        writer,
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{text}",
                        text.len()
                    )?;
                }
                writer.flush()?;
            }
            Ok(())
        }

        fn url(&self) -> String {
            format!("http://{}", self.addr)
        }

        fn executed(&self) -> Vec<String> {
            self.executed.lock().unwrap().clone()
        }
    }

    impl Drop for TestServer {
        fn drop(&mut self) {
            self.stop.store(true, Ordering::SeqCst);
            let _ = TcpStream::connect(self.addr);
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }

    /// A raw keep-alive client.
    struct Client {
        reader: BufReader<TcpStream>,
        writer: TcpStream,
    }

    impl Client {
        fn connect(proxy: &Proxy) -> Client {
            let stream = TcpStream::connect(proxy.addr()).unwrap();
            stream
                .set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            Client {
                reader: BufReader::new(stream.try_clone().unwrap()),
                writer: stream,
            }
        }

        /// Sends a request; returns the reply's status and body, or the error that ended it.
        fn send(&mut self, target: &str, headers: &str, body: &[u8]) -> io::Result<(u16, String)> {
            write!(
                self.writer,
                "POST {target} HTTP/1.1\r\nHost: test\r\n{headers}Content-Length: {}\r\n\r\n",
                body.len()
            )?;
            self.writer.write_all(body)?;
            let head = read_head(&mut self.reader)?.ok_or(io::ErrorKind::UnexpectedEof)?;
            let status = status_code(&head);
            let body = read_body(&mut self.reader, Framing::response(&head, "POST", status))?;
            Ok((status, String::from_utf8(body.decoded).unwrap()))
        }
    }

    fn once(proxy: &Proxy, target: &str) -> io::Result<(u16, String)> {
        Client::connect(proxy).send(target, "", b"hello")
    }

    fn setup() -> (TestServer, Proxy) {
        let server = TestServer::start();
        let proxy = Proxy::start(&server.url());
        (server, proxy)
    }

    /// Lets the test server finish reading what it was sent.
    fn settle() {
        std::thread::sleep(Duration::from_millis(100));
    }

    #[test]
    fn passes_requests_on_a_kept_alive_connection_and_counts_them() {
        let (server, proxy) = setup();
        let mut client = Client::connect(&proxy);
        assert_eq!(
            client.send("/a", "", b"12345").unwrap(),
            (200, "ok /a 5".into())
        );
        assert_eq!(
            client.send("/chunked", "", b"").unwrap(),
            (200, "ok /chunked 0".into())
        );
        assert_eq!(client.send("/b", "", b"").unwrap(), (200, "ok /b 0".into()));
        assert_eq!(
            client.send("/close", "", b"xy").unwrap(),
            (200, "ok /close 2".into())
        );
        assert_eq!(proxy.requests(), 4);
        assert_eq!(proxy.connections(), 1);
        assert_eq!(
            server.executed(),
            ["POST /a 5", "POST /chunked 0", "POST /b 0", "POST /close 2"]
        );
        let log = proxy.log();
        assert_eq!(log[0].seq, 1);
        assert_eq!(log[0].body, b"12345");
        assert_eq!(log[0].header("host").as_deref(), Some("test"));
        assert!(log.iter().all(|r| r.fault == Fault::Pass));
    }

    #[test]
    fn chunked_request_bodies_are_forwarded() {
        let (server, proxy) = setup();
        let mut client = Client::connect(&proxy);
        client
            .writer
            .write_all(
                b"POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n",
            )
            .unwrap();
        let head = read_head(&mut client.reader).unwrap().unwrap();
        assert_eq!(status_code(&head), 200);
        assert_eq!(server.executed(), ["POST /c 5"]);
        assert_eq!(proxy.log()[0].body, b"abcde");
    }

    #[test]
    fn refused_connections_are_reset_and_reach_nothing() {
        let (server, proxy) = setup();
        let mut idle = Client::connect(&proxy);
        idle.send("/warm", "", b"").unwrap();
        proxy.refuse_connections(true);
        assert!(once(&proxy, "/x").is_err());
        // A request on an already open connection is refused too.
        assert!(idle.send("/y", "", b"").is_err());
        proxy.resume();
        assert!(once(&proxy, "/z").is_ok());
        settle();
        assert_eq!(server.executed(), ["POST /warm 0", "POST /z 5"]);
    }

    #[test]
    fn refuse_one_request() {
        let (server, proxy) = setup();
        let rule = proxy.next(1, Fault::Refuse);
        let err = once(&proxy, "/x").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset, "{err}");
        assert!(once(&proxy, "/y").is_ok());
        assert_eq!(proxy.hits(rule), 1);
        settle();
        assert_eq!(server.executed(), ["POST /y 5"]);
        assert_eq!(proxy.log()[0].fault, Fault::Refuse);
    }

    #[test]
    fn a_cut_request_never_reaches_the_server_whole() {
        let (server, proxy) = setup();
        proxy.next(2, Fault::CutRequest);
        assert!(Client::connect(&proxy)
            .send("/cut", "", &[b'x'; 1000])
            .is_err());
        // Without a body the head is cut.
        assert!(Client::connect(&proxy).send("/cut2", "", b"").is_err());
        settle();
        assert!(server.executed().is_empty(), "{:?}", server.executed());
        assert!(once(&proxy, "/after").is_ok());
    }

    #[test]
    fn a_dropped_reply_was_executed_but_the_client_sees_a_reset() {
        let (server, proxy) = setup();
        proxy.next(1, Fault::DropReply);
        let err = once(&proxy, "/drop").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset, "{err}");
        assert_eq!(server.executed(), ["POST /drop 5"]);
    }

    #[test]
    fn a_cut_reply_stops_mid_body() {
        let (server, proxy) = setup();
        proxy.next(1, Fault::CutReply);
        let mut client = Client::connect(&proxy);
        write!(
            client.writer,
            "POST /cut HTTP/1.1\r\nContent-Length: 0\r\n\r\n"
        )
        .unwrap();
        let mut raw = Vec::new();
        client.reader.read_to_end(&mut raw).unwrap();
        let raw = String::from_utf8(raw).unwrap();
        // "ok /cut 0" is 9 bytes: the head whole, then 4 of them.
        assert!(raw.starts_with("HTTP/1.1 200 OK\r\n"), "{raw}");
        assert!(raw.ends_with("\r\n\r\nok /"), "{raw:?}");
        assert_eq!(server.executed(), ["POST /cut 0"]);
        // Through the parser it is an incomplete body.
        proxy.next(1, Fault::CutReply);
        let err = once(&proxy, "/cut").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{err}");
    }

    #[test]
    fn a_stalled_reply_comes_late() {
        let (server, proxy) = setup();
        proxy.next(1, Fault::Stall(Duration::from_millis(400)));
        let started = Instant::now();
        assert_eq!(once(&proxy, "/slow").unwrap().0, 200);
        assert!(started.elapsed() >= Duration::from_millis(400));
        assert_eq!(server.executed(), ["POST /slow 5"]);
        // A timed stall can be cut short.
        proxy.next(1, Fault::Stall(Duration::from_secs(60)));
        let started = Instant::now();
        let waiter = {
            let addr = proxy.addr();
            std::thread::spawn(move || {
                let mut c = Client::connect_addr(addr);
                c.send("/slow2", "", b"").map(|r| r.0)
            })
        };
        let held = proxy.wait_held(1, Duration::from_secs(5));
        proxy.release(held[0].id);
        assert_eq!(waiter.join().unwrap().unwrap(), 200);
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn a_reply_stalled_until_released_was_executed_and_waits() {
        let (server, proxy) = setup();
        proxy.add(Rule::url_contains("/held", Fault::StallUntilReleased));
        let addr = proxy.addr();
        let waiter = std::thread::spawn(move || Client::connect_addr(addr).send("/held", "", b""));
        let held = proxy.wait_held(1, Duration::from_secs(5));
        assert_eq!(held[0].stage, Stage::ReplyHeld);
        assert_eq!(held[0].request.target, "/held");
        assert_eq!(server.executed(), ["POST /held 0"]);
        std::thread::sleep(Duration::from_millis(200));
        assert!(!waiter.is_finished());
        proxy.release_all();
        assert_eq!(waiter.join().unwrap().unwrap().0, 200);
        assert!(proxy.held().is_empty());
    }

    #[test]
    fn a_paused_request_reaches_the_server_only_when_released() {
        let (server, proxy) = setup();
        proxy.add(Rule::head_contains("X-Op: renew", Fault::Pause));
        let addr = proxy.addr();
        let waiter = std::thread::spawn(move || {
            Client::connect_addr(addr).send("/renew", "x-op: RENEW\r\n", b"abc")
        });
        let held = proxy.wait_held(1, Duration::from_secs(5));
        assert_eq!(held[0].stage, Stage::BeforeForward);
        // Other requests go on meanwhile.
        assert!(once(&proxy, "/other").is_ok());
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(server.executed(), ["POST /other 5"]);
        assert!(!waiter.is_finished());
        proxy.release(held[0].id);
        assert_eq!(waiter.join().unwrap().unwrap().1, "ok /renew 3");
        assert_eq!(server.executed(), ["POST /other 5", "POST /renew 3"]);
    }

    #[test]
    fn a_stopped_proxy_answers_nothing_until_resumed() {
        let (server, proxy) = setup();
        let mut open = Client::connect(&proxy);
        open.send("/before", "", b"").unwrap();
        proxy.stop_answering();
        let addr = proxy.addr();
        let fresh = std::thread::spawn(move || Client::connect_addr(addr).send("/new", "", b""));
        let kept = std::thread::spawn(move || open.send("/kept", "", b""));
        proxy.wait_requests(3, Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(300));
        assert!(!fresh.is_finished() && !kept.is_finished());
        assert_eq!(server.executed(), ["POST /before 0"]);
        proxy.resume();
        assert_eq!(fresh.join().unwrap().unwrap().0, 200);
        assert_eq!(kept.join().unwrap().unwrap().0, 200);
        assert_eq!(server.executed().len(), 3);
    }

    #[test]
    fn rules_match_by_head_url_body_and_count() {
        let (_server, proxy) = setup();
        // The second renewal only.
        let renew = proxy.add(
            Rule::head_contains("x-component-operation: renew", Fault::DropReply)
                .after(1)
                .times(1),
        );
        let insert = proxy.add(Rule::url_contains("INSERT INTO t", Fault::Refuse));
        let body = proxy.add(Rule::body_contains("poison", Fault::Refuse));
        let custom = proxy.add(Rule::when(|r| r.target.ends_with("/fn"), Fault::Refuse));
        let h = "X-Component-Operation: renew\r\n";
        assert!(Client::connect(&proxy).send("/r1", h, b"").is_ok());
        assert!(Client::connect(&proxy).send("/plain", "", b"").is_ok());
        assert!(Client::connect(&proxy).send("/r2", h, b"").is_err());
        assert!(Client::connect(&proxy).send("/r3", h, b"").is_ok());
        assert!(once(&proxy, "/?query=INSERT%20INTO%20t+FORMAT").is_err());
        assert!(once(&proxy, "/?query=SELECT+1").is_ok());
        assert!(Client::connect(&proxy)
            .send("/b", "", b"a poison b")
            .is_err());
        assert!(once(&proxy, "/x/fn").is_err());
        assert_eq!(
            [
                proxy.hits(renew),
                proxy.hits(insert),
                proxy.hits(body),
                proxy.hits(custom)
            ],
            [1, 1, 1, 1]
        );
        assert_eq!(
            proxy.log()[4].target_decoded(),
            "/?query=INSERT INTO t FORMAT"
        );
        proxy.clear_rules();
        assert!(once(&proxy, "/x/fn").is_ok());
        assert_eq!(proxy.requests(), 9);
    }

    #[test]
    fn an_upstream_that_closed_an_idle_connection_is_reconnected() {
        let (server, proxy) = setup();
        let mut client = Client::connect(&proxy);
        // The server closes after this reply; the proxy's next request needs a new connection.
        assert!(client.send("/close", "", b"").is_ok());
        let mut client = Client::connect(&proxy);
        assert!(client.send("/a", "", b"").is_ok());
        assert!(client.send("/b", "", b"").is_ok());
        assert_eq!(server.executed().len(), 3);
    }

    #[test]
    fn dropping_the_proxy_stops_it_and_its_threads() {
        let (_server, proxy) = setup();
        let mut idle = Client::connect(&proxy);
        idle.send("/a", "", b"").unwrap();
        proxy.add(Rule::any(Fault::Pause));
        let addr = proxy.addr();
        let paused = std::thread::spawn(move || Client::connect_addr(addr).send("/p", "", b""));
        proxy.wait_held(1, Duration::from_secs(5));
        let started = Instant::now();
        drop(proxy);
        assert!(started.elapsed() < Duration::from_secs(3));
        assert!(paused.join().unwrap().is_err());
        assert!(idle.send("/b", "", b"").is_err());
        assert!(TcpStream::connect(addr).is_err());
    }

    #[test]
    fn only_loopback_upstreams() {
        let result = std::panic::catch_unwind(|| Proxy::start("http://192.0.2.1:8123"));
        assert!(result.is_err());
    }

    impl Client {
        fn connect_addr(addr: SocketAddr) -> Client {
            let stream = TcpStream::connect(addr).unwrap();
            stream
                .set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            Client {
                reader: BufReader::new(stream.try_clone().unwrap()),
                writer: stream,
            }
        }
    }
}
