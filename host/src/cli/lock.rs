//! `lock ID -- COMMAND ARGS...`: hold the advisory lock on a state id while a command runs,
//! renewing its lease, release it after, and exit with the command's status. Only the host can
//! start processes, so this one command runs here, through the component's library exports;
//! `lock ID --hold D` runs in the component like every other command.
//!
//! The command never outlives the lease. The lease is counted conservatively from the start of
//! the last call that extended it (the server starts it later). Renewals are due every third of
//! the lease; a failed one is retried with capped exponential backoff and jitter, each attempt's
//! requests cut off when the lease could no longer be guaranteed. Once renewals have failed
//! until the lease has less than `--stop-before` left (or a renewal says the lock is lost), the
//! command's process group gets SIGTERM, then SIGKILL after `--term-grace`, so it is gone
//! `--stop-before` minus `--term-grace` before the lease can end; the host then exits with
//! [`LEASE_LOST_EXIT_CODE`]. SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to the host are passed on
//! to the command (which runs in a process group of its own); a command still running
//! `--term-grace` after the first of them gets SIGKILL, and the host exits with its status
//! (128 + 9; `killed` in the report). When the command exits, whatever else still runs in its
//! process group gets SIGKILL, then the lock is released; a failed release is a warning (the
//! lease then ends by itself).
//!
//! Should the host itself die, SIGKILL included, its [watchdog](super::watchdog) (a process of
//! its own, started before the command) kills the command's process group: no process of it
//! runs on without the lock.

use std::cell::Cell;
use std::time::{Duration, Instant};

use clickhouse_component::host_api::backoff;
use clickhouse_component::host_api::cli::sanitize;
use clickhouse_component::host_api::cli::LockArgs;
use clickhouse_component::host_api::cli::{GlobalArgs, StoreArgs};
use clickhouse_component::host_api::{Error, ErrorKind};
use clickhouse_component_host::config::{withheld_credentials, HostArgs};
use clickhouse_component_host::{
    CallError, Instance, LockEngine, LockHandle, RequestDeadline, Runtime, StoreOptions,
};
use serde_json::json;
use tokio::sync::{mpsc, oneshot, watch};

use super::record::{monotonic_ns, Recorder};
use super::watchdog::Watchdog;

/// Exit code when the command was stopped because its lease could no longer be guaranteed
/// (the error kinds use 2-10).
pub const LEASE_LOST_EXIT_CODE: i32 = 11;

/// Default lease when none is configured (the component's default stale window).
const DEFAULT_LEASE: Duration = Duration::from_secs(300);
/// Default `--term-grace`: a tenth of the lease, at most this.
const MAX_DEFAULT_TERM_GRACE: Duration = Duration::from_secs(10);
/// Time a release gets at least, even when the lease may already have ended.
const MIN_RELEASE_TIME: Duration = Duration::from_secs(1);

/// The WIT store options for the shared store arguments.
fn store_options(store: &StoreArgs) -> Result<StoreOptions, CallError> {
    let o = store.options().map_err(CallError::Component)?;
    let ms = |d: Duration| Some(u32::try_from(d.as_millis()).unwrap_or(u32::MAX));
    Ok(StoreOptions {
        database: Some(o.database),
        table: Some(o.table),
        lock_table: o.lock_table,
        create_schema: Some(o.create_schema),
        lock_timeout_ms: ms(o.lock.timeout),
        lock_retry_ms: ms(o.lock.retry),
        stale_after_ms: ms(o.lock.stale_after),
        lock_engine: Some(LockEngine::from(o.lock_engine)),
        retries: Some(o.retries),
        cluster: o.cluster,
    })
}

/// When to renew, retry and stop, derived from the lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// The lease (stale window).
    pub lease: Duration,
    /// A renewal is due this long after the last successful one.
    pub renew_every: Duration,
    /// SIGTERM once the lease could end within this time.
    pub stop_before: Duration,
    /// SIGKILL this long after SIGTERM.
    pub term_grace: Duration,
    /// First pause after a failed renewal (doubles up to `max_backoff`; jittered as every
    /// backoff is, [`clickhouse_component::host_api::backoff`]).
    pub first_backoff: Duration,
    /// Longest pause between renewal attempts.
    pub max_backoff: Duration,
}

impl Timing {
    /// The timing for `lease` and the `--stop-before` / `--term-grace` options.
    pub fn new(
        lease: Duration,
        stop_before: Option<Duration>,
        term_grace: Option<Duration>,
    ) -> Result<Timing, Error> {
        if lease.is_zero() {
            return Err(Error::invalid(
                "running a command under the lock needs a lease above 0 (--stale-after-seconds)",
            ));
        }
        let term_grace = term_grace.unwrap_or((lease / 10).min(MAX_DEFAULT_TERM_GRACE));
        let renew_every = lease / 3;
        let (stop_before, which) = match stop_before {
            Some(d) => (d, ""),
            None => (term_grace * 2, ", by default twice --term-grace,"),
        };
        if stop_before >= lease - renew_every {
            return Err(Error::invalid(format!(
                "--stop-before{which} ({}) must be under 2/3 of the lease ({}) to leave time to renew",
                secs(stop_before),
                secs(lease)
            )));
        }
        if term_grace >= stop_before {
            return Err(Error::invalid(format!(
                "--term-grace ({}) must be under --stop-before ({}) so that the command is gone before the lease can end",
                secs(term_grace),
                secs(stop_before)
            )));
        }
        let first_backoff =
            (lease / 30).clamp(Duration::from_millis(10), Duration::from_millis(500));
        let max_backoff = (lease / 10).clamp(first_backoff, Duration::from_secs(5));
        Ok(Timing {
            lease,
            renew_every,
            stop_before,
            term_grace,
            first_backoff,
            max_backoff,
        })
    }

    /// When the command gets SIGTERM unless the lease is renewed.
    fn term_at(&self, last_ok: Instant) -> Instant {
        last_ok + (self.lease - self.stop_before)
    }

    /// The earliest the lease can end.
    fn lease_end(&self, last_ok: Instant) -> Instant {
        last_ok + self.lease
    }
}

fn secs(d: Duration) -> String {
    format!("{:.3} s", d.as_secs_f64())
}

/// Runs `lock ID -- COMMAND`; returns the exit code and the JSON report.
pub async fn run(
    host: &HostArgs,
    global: &GlobalArgs,
    args: &LockArgs,
) -> Result<(i32, serde_json::Value), CallError> {
    // Refused here as the component would refuse it, before anything starts.
    clickhouse_component::host_api::check_new_id(&args.id).map_err(CallError::Component)?;
    let options = store_options(&args.store)?;
    let lease = options
        .stale_after_ms
        .map_or(DEFAULT_LEASE, |ms| Duration::from_millis(u64::from(ms)));
    let timing =
        Timing::new(lease, args.stop_before, args.term_grace).map_err(CallError::Component)?;
    let recorder = Recorder::from_env(lease);
    let mut held = acquire(host, global, args, &options, timing, &recorder).await?;
    let (id, token, waited, last_ok) = (
        held.id.clone(),
        held.token.clone(),
        held.waited,
        held.last_ok,
    );
    let deadline = held.deadline.clone();
    let mut signals = match Signals::new() {
        Ok(signals) => signals,
        Err(e) => {
            held.release_early().await;
            return Err(CallError::Runner(e.into()));
        }
    };
    let mut command = command(host, args, &token);
    let watchdog = match Watchdog::arm(&mut command) {
        Ok(watchdog) => watchdog,
        Err(e) => {
            held.release_early().await;
            return Err(CallError::Runner(
                anyhow::Error::from(e).context("starting the watchdog of the command"),
            ));
        }
    };
    let held_from = Instant::now();
    let spawned = command.spawn();
    drop(command);
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            watchdog.disarm().await;
            held.release_early().await;
            eprintln!("lock: cannot run '{}': {e}", args.command[0]);
            return Ok((
                127,
                json!({"ok": false, "error": {"kind": "command", "message": e.to_string()}}),
            ));
        }
    };
    let group = child.id().map(|pid| pid as i32);

    let (status_tx, status_rx) = watch::channel(RenewStatus {
        last_ok,
        failures: 0,
        last_error: None,
        in_flight: None,
    });
    let (lost_tx, lost_rx) = mpsc::unbounded_channel();
    let (release_tx, release_rx) = mpsc::unbounded_channel();
    let stopping = Cell::new(false);
    let agent = RenewAgent {
        instance: &mut held.instance,
        lock: held.lock,
        timing,
        deadline: &held.deadline,
        stopping: &stopping,
        status: status_tx,
        lost: lost_tx,
        release: release_rx,
        recorder: &recorder,
        id: &args.id,
        token: &token,
    }
    .run();
    let supervisor = async {
        let outcome = supervise(
            &id,
            &mut child,
            group,
            timing,
            status_rx.clone(),
            lost_rx,
            &mut signals,
        )
        .await?;
        // Whatever else runs in its process group goes too: it would run without the lock.
        send_signal(&mut child, group, SIGKILL);
        watchdog.disarm().await;
        let held = held_from.elapsed();
        // Cut short a renewal in flight, then release.
        stopping.set(true);
        deadline.set(Some(Instant::now()));
        let last_ok = status_rx.borrow().last_ok;
        let released = release(&id, timing, last_ok, &release_tx, &mut signals).await;
        Ok::<_, CallError>((outcome, held, released))
    };
    let (outcome, held, released) = {
        tokio::pin!(agent);
        tokio::select! {
            result = supervisor => result?,
            never = &mut agent => match never {},
        }
    };
    let report = json!({
        "id": args.id,
        "token": token,
        "waited_ms": waited.as_secs_f64() * 1e3,
        "held_ms": held.as_secs_f64() * 1e3,
        "released": released,
    });
    Ok(finish(&id, timing, outcome, report))
}

/// The lock, held, before the command starts.
struct Held {
    instance: Instance,
    lock: LockHandle,
    deadline: RequestDeadline,
    token: String,
    /// The id as printed.
    id: String,
    /// How long acquiring took.
    waited: Duration,
    /// The start of the last call that set the lease.
    last_ok: Instant,
    /// Where the lock calls are recorded.
    recorder: Recorder,
    /// The id as given.
    raw_id: String,
}

impl Held {
    /// Releases the lock when the command did not run, bounded (the component repeats a
    /// failing release until the lease ends).
    async fn release_early(&mut self) {
        self.deadline.set(Some(Instant::now() + MIN_RELEASE_TIME));
        let start = monotonic_ns();
        let released =
            tokio::time::timeout(MIN_RELEASE_TIME * 2, self.instance.lock_release(self.lock)).await;
        let released = released.unwrap_or_else(|e| Err(CallError::Runner(e.into())));
        self.recorder
            .record("release", &self.raw_id, Some(&self.token), start, &released);
    }
}

/// Acquires the lock on `args.id`, renewing it at once when the wait took much of the lease.
async fn acquire(
    host: &HostArgs,
    global: &GlobalArgs,
    args: &LockArgs,
    options: &StoreOptions,
    timing: Timing,
    recorder: &Recorder,
) -> Result<Held, CallError> {
    let connection = global.connection().map_err(CallError::Component)?;
    let allow = host.allow_list(&connection).map_err(CallError::Component)?;
    let runtime = Runtime::new(&host.component_source(), &host.cache_policy())?
        .with_limits(host.limits().map_err(CallError::Component)?)
        .with_network(host.network().map_err(CallError::Component)?);
    let mut instance = runtime.instantiate(allow).await?;
    let deadline = instance.request_deadline();
    let store = instance.open_store(&connection, options).await?;
    let started = Instant::now();
    let start = monotonic_ns();
    let acquired = match instance.lock(store, &args.id).await {
        Ok(lock) => instance.lock_token(lock).await.map(|token| (lock, token)),
        Err(e) => Err(e),
    };
    let token = acquired.as_ref().ok().map(|(_, token)| token.as_str());
    recorder.record("acquire", &args.id, token, start, &acquired);
    let (lock, token) = acquired?;
    let waited = started.elapsed();
    let id = clickhouse_component::host_api::escape_id(&args.id).into_owned();
    eprintln!(
        "lock: acquired '{id}' (token {token}) after {:.1} ms",
        waited.as_secs_f64() * 1e3
    );
    let mut held = Held {
        instance,
        lock,
        deadline,
        token,
        id,
        waited,
        // The lease began after `started`, when the winning acquire row was written.
        last_ok: started,
        recorder: recorder.clone(),
        raw_id: args.id.clone(),
    };
    if waited >= timing.renew_every {
        // A long wait may have used up much of it: renew before the command starts (the
        // component refuses a renewal that comes too late, so only time bounds this one).
        let attempt = Instant::now();
        held.deadline.set(Some(timing.term_at(attempt)));
        let start = monotonic_ns();
        let renewed = held.instance.lock_renew(held.lock).await;
        recorder.record("renew", &args.id, Some(&held.token), start, &renewed);
        held.deadline.set(None);
        if let Err(e) = renewed {
            held.release_early().await;
            return Err(e);
        }
        held.last_ok = attempt;
    }
    Ok(held)
}

/// The command to run under the lock, with its environment.
fn command(host: &HostArgs, args: &LockArgs, token: &str) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(&args.command[0]);
    // The command's own `state set/merge/clear` on this id write fenced by this lock instead
    // of waiting for it (see StoreArgs::held_lock).
    command
        .args(&args.command[1..])
        .env("CLICKHOUSE_LOCK_ID", &args.id)
        .env("CLICKHOUSE_LOCK_TOKEN", token)
        .kill_on_drop(true);
    // The host's environment minus the ClickHouse password, unless --pass-credentials.
    if !host.pass_credentials {
        for (name, value) in withheld_credentials(|name| std::env::var_os(name)) {
            match value {
                Some(value) => command.env(name, value),
                None => command.env_remove(name),
            };
        }
    }
    command
}

/// Asks the renewal agent to release the lock (at the latest when the lease ends, and at least
/// [`MIN_RELEASE_TIME`]); a failure, a signal or no answer in time is a warning. Whether it
/// was released.
async fn release(
    id: &str,
    timing: Timing,
    last_ok: Instant,
    agent: &mpsc::UnboundedSender<ReleaseRequest>,
    signals: &mut Signals,
) -> bool {
    let until = timing
        .lease_end(last_ok)
        .max(Instant::now() + MIN_RELEASE_TIME);
    let (reply_tx, reply_rx) = oneshot::channel();
    let _ = agent.send((until, reply_tx));
    let released = tokio::select! {
        reply = reply_rx => match reply {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("the component stopped".to_string()),
        },
        signal = signals.recv() => Err(format!("gave up on {}", signal_name(signal))),
        _ = tokio::time::sleep_until((until + MIN_RELEASE_TIME).into()) => {
            Err("it did not finish in time".to_string())
        }
    };
    if let Err(e) = &released {
        let left = timing
            .lease_end(last_ok)
            .saturating_duration_since(Instant::now());
        let when = if left.is_zero() {
            "its lease has ended".to_string()
        } else {
            format!("it frees itself when its lease ends, within {}", secs(left))
        };
        eprintln!(
            "lock: warning: could not release '{id}' ({}); {when}",
            sanitize(e)
        );
    }
    released.is_ok()
}

/// The exit code, and `report` completed, for how the command ended.
fn finish(
    id: &str,
    timing: Timing,
    outcome: Outcome,
    mut report: serde_json::Value,
) -> (i32, serde_json::Value) {
    match outcome {
        Outcome::Exited { status, killed } => {
            let code = exit_code(status);
            report["ok"] = json!(code == 0);
            report["exit_code"] = json!(code);
            report["killed"] = json!(killed);
            (code, report)
        }
        Outcome::Stopped {
            status,
            reason,
            killed,
        } => {
            let how = if killed {
                format!(
                    "SIGTERM, then SIGKILL after {} (--term-grace)",
                    secs(timing.term_grace)
                )
            } else {
                "SIGTERM".to_string()
            };
            let message = format!(
                "stopped the command ({how}) because the lock on '{id}' could no longer be guaranteed: {reason}"
            );
            eprintln!(
                "lock: stopped the command ({how}): its lock could no longer be guaranteed; exit code {LEASE_LOST_EXIT_CODE}"
            );
            report["ok"] = json!(false);
            report["exit_code"] = json!(LEASE_LOST_EXIT_CODE);
            report["command_exit_code"] = json!(exit_code(status));
            report["killed"] = json!(killed);
            report["error"] = json!({"kind": "lease-lost", "message": message});
            (LEASE_LOST_EXIT_CODE, report)
        }
    }
}

/// What the renewals have achieved so far.
#[derive(Clone, Debug)]
struct RenewStatus {
    /// Start of the last call that extended the lease.
    last_ok: Instant,
    /// Failed attempts since then.
    failures: u32,
    /// The last failure.
    last_error: Option<String>,
    /// Start of the attempt waiting for an answer, if one is.
    in_flight: Option<Instant>,
}

/// A release request: its deadline and where to answer.
type ReleaseRequest = (Instant, oneshot::Sender<Result<(), CallError>>);

/// Renews the lease while the command runs; the only user of the instance once the command
/// started. Reports progress on `status`, a definite loss on `lost`; on a release request it
/// releases, answers, and then idles forever (the caller drops it).
struct RenewAgent<'a> {
    instance: &'a mut Instance,
    lock: LockHandle,
    timing: Timing,
    /// Cuts the component's requests off (when the lease can no longer be guaranteed).
    deadline: &'a RequestDeadline,
    /// Set once the command has ended: no more renewals.
    stopping: &'a Cell<bool>,
    status: watch::Sender<RenewStatus>,
    lost: mpsc::UnboundedSender<String>,
    release: mpsc::UnboundedReceiver<ReleaseRequest>,
    /// Where the lock calls are recorded, with the id and token to record.
    recorder: &'a Recorder,
    id: &'a str,
    token: &'a str,
}

impl RenewAgent<'_> {
    async fn run(self) -> std::convert::Infallible {
        let RenewAgent {
            instance,
            lock,
            timing,
            deadline,
            stopping,
            status,
            lost,
            mut release,
            recorder,
            id,
            token,
        } = self;
        let mut last_ok = status.borrow().last_ok;
        let mut next = last_ok + timing.renew_every;
        let mut failures = 0u32;
        let mut gave_up = false;
        loop {
            tokio::select! {
                biased;
                request = release.recv() => {
                    if let Some((until, reply)) = request {
                        deadline.set(Some(until));
                        let start = monotonic_ns();
                        let result = instance.lock_release(lock).await;
                        recorder.record("release", id, Some(token), start, &result);
                        deadline.set(None);
                        let _ = reply.send(result);
                    }
                    return std::future::pending().await;
                }
                _ = tokio::time::sleep_until(next.into()), if !gave_up => {}
            }
            if stopping.get() {
                continue;
            }
            let term_at = timing.term_at(last_ok);
            if Instant::now() >= term_at {
                // Too late: the supervisor stops the command.
                gave_up = true;
                continue;
            }
            // Each attempt is cut off when the lease can no longer be guaranteed.
            deadline.set(Some(term_at));
            let attempt = Instant::now();
            status.send_modify(|s| s.in_flight = Some(attempt));
            let start = monotonic_ns();
            let result = instance.lock_renew(lock).await;
            recorder.record("renew", id, Some(token), start, &result);
            deadline.set(None);
            status.send_modify(|s| s.in_flight = None);
            if stopping.get() {
                continue;
            }
            match result {
                Ok(()) => {
                    if failures > 0 {
                        eprintln!("lock: renewed the lease after {failures} failed attempt(s)");
                    }
                    last_ok = attempt;
                    failures = 0;
                    next = attempt + timing.renew_every;
                    status.send_replace(RenewStatus {
                        last_ok,
                        failures,
                        last_error: None,
                        in_flight: None,
                    });
                }
                Err(e) if !worth_retrying(&e) => {
                    let _ = lost.send(format!("renewing the lease failed: {e}"));
                    gave_up = true;
                }
                Err(e) => {
                    failures += 1;
                    status.send_modify(|s| {
                        s.failures = failures;
                        s.last_error = Some(e.to_string());
                    });
                    if Instant::now() >= term_at {
                        // Cut off at the last moment: the supervisor stops the command.
                        gave_up = true;
                        continue;
                    }
                    if failures == 1 {
                        let left = timing
                            .lease_end(last_ok)
                            .saturating_duration_since(Instant::now());
                        eprintln!(
                        "lock: warning: renewing the lease failed ({}); retrying (it lasts at least {} more)",
                        sanitize(&e.to_string()),
                        secs(left)
                    );
                    }
                    next = Instant::now()
                        + backoff(
                            timing.first_backoff,
                            timing.max_backoff,
                            failures,
                            random_u64(),
                        );
                }
            }
        }
    }
}

/// Whether a failed renewal may succeed if tried again (else the lock is lost for good).
fn worth_retrying(e: &CallError) -> bool {
    match e {
        CallError::Runner(_) => false,
        CallError::Component(e) => e.kind.is_retryable() || e.kind == ErrorKind::Uncertain,
    }
}

/// A random number for the backoff's jitter (std's per-process random hash keys, which
/// change with each `RandomState`: no time-derived seed).
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}

/// How the command ended.
enum Outcome {
    /// By itself, or by a signal passed on to it (then SIGKILL if it outlived the signal by
    /// `--term-grace`: `killed`).
    Exited {
        status: std::process::ExitStatus,
        killed: bool,
    },
    /// Stopped because the lease could no longer be guaranteed.
    Stopped {
        status: std::process::ExitStatus,
        reason: String,
        /// SIGKILL was needed.
        killed: bool,
    },
}

/// Waits for the command, passing signals on. When the lease is in danger it sends SIGTERM;
/// `--term-grace` after that or after the first signal passed on, SIGKILL.
async fn supervise(
    id: &str,
    child: &mut tokio::process::Child,
    group: Option<i32>,
    timing: Timing,
    mut status: watch::Receiver<RenewStatus>,
    mut lost: mpsc::UnboundedReceiver<String>,
    signals: &mut Signals,
) -> Result<Outcome, CallError> {
    let mut reason: Option<String> = None;
    // When to send SIGKILL, and the signal that started the grace (none: the lease's SIGTERM).
    let mut kill: Option<(tokio::time::Instant, Option<i32>)> = None;
    let mut killed = false;
    let status = loop {
        let now = status.borrow_and_update().clone();
        let term_at = timing.term_at(now.last_ok);
        let guarding = reason.is_none();
        let (kill_at, cause) = kill.unwrap_or((term_at.into(), None));
        let mut stop = None;
        tokio::select! {
            exited = child.wait() => break exited.map_err(|e| CallError::Runner(e.into()))?,
            signal = signals.recv() => {
                eprintln!("lock: passing {} on to the command", signal_name(signal));
                send_signal(child, group, signal);
                kill.get_or_insert((tokio::time::Instant::now() + timing.term_grace, Some(signal)));
            }
            _ = status.changed(), if guarding => {}
            Some(why) = lost.recv(), if guarding => stop = Some(why),
            _ = tokio::time::sleep_until(term_at.into()), if guarding => {
                stop = Some(no_renewal(&now, timing));
            }
            _ = tokio::time::sleep_until(kill_at), if kill.is_some() && !killed => {
                if let Some(signal) = cause {
                    eprintln!(
                        "lock: the command did not exit within {} (--term-grace) of {}; killing its process group (SIGKILL)",
                        secs(timing.term_grace),
                        signal_name(signal)
                    );
                }
                killed = true;
                send_signal(child, group, SIGKILL);
            }
        }
        if let Some(why) = stop {
            // SIGTERM, then SIGKILL after the grace period; signals meanwhile are passed on.
            eprintln!(
                "lock: the lock on '{id}' can no longer be guaranteed: {}; stopping the command (SIGTERM, then SIGKILL after {})",
                sanitize(&why),
                secs(timing.term_grace)
            );
            send_signal(child, group, SIGTERM);
            kill.get_or_insert((tokio::time::Instant::now() + timing.term_grace, None));
            reason = Some(why);
        }
    };
    Ok(match reason {
        Some(reason) => Outcome::Stopped {
            status,
            reason,
            killed,
        },
        None => Outcome::Exited { status, killed },
    })
}

/// Why the lease is in danger when no renewal succeeded in time.
fn no_renewal(now: &RenewStatus, timing: Timing) -> String {
    let mut attempts = Vec::new();
    if let Some(error) = &now.last_error {
        attempts.push(format!(
            "{} attempt(s) failed, the last with: {error}",
            now.failures
        ));
    }
    if let Some(started) = now.in_flight {
        attempts.push(format!("one unanswered after {}", secs(started.elapsed())));
    }
    if attempts.is_empty() {
        attempts.push("none was attempted".to_string());
    }
    format!(
        "no renewal succeeded for {} ({}) and the lease of {} could end within {} (--stop-before)",
        secs(now.last_ok.elapsed()),
        attempts.join("; "),
        secs(timing.lease),
        secs(timing.stop_before),
    )
}

#[cfg(unix)]
use libc::{SIGKILL, SIGTERM};
#[cfg(not(unix))]
const SIGTERM: i32 = 15;
#[cfg(not(unix))]
const SIGKILL: i32 = 9;

/// Sends `signal` to the command's process group (or, without one, the command).
fn send_signal(child: &mut tokio::process::Child, group: Option<i32>, signal: i32) {
    #[cfg(unix)]
    if let Some(group) = group {
        // SAFETY: kill(2) with a process group id we created; no memory is involved.
        unsafe { libc::kill(-group, signal) };
        return;
    }
    let _ = group;
    if signal == SIGKILL || cfg!(not(unix)) {
        let _ = child.start_kill();
    }
}

fn signal_name(signal: i32) -> &'static str {
    #[cfg(unix)]
    match signal {
        libc::SIGINT => return "SIGINT",
        libc::SIGTERM => return "SIGTERM",
        libc::SIGHUP => return "SIGHUP",
        libc::SIGQUIT => return "SIGQUIT",
        _ => {}
    }
    let _ = signal;
    "a signal"
}

/// The signals passed on to the command.
#[cfg(unix)]
struct Signals(Vec<(i32, tokio::signal::unix::Signal)>);

#[cfg(unix)]
impl Signals {
    fn new() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals(vec![
            (libc::SIGINT, signal(SignalKind::interrupt())?),
            (libc::SIGTERM, signal(SignalKind::terminate())?),
            (libc::SIGHUP, signal(SignalKind::hangup())?),
            (libc::SIGQUIT, signal(SignalKind::quit())?),
        ]))
    }

    /// The next signal received.
    async fn recv(&mut self) -> i32 {
        std::future::poll_fn(|cx| {
            for (number, signal) in self.0.iter_mut() {
                if signal.poll_recv(cx).is_ready() {
                    return std::task::Poll::Ready(*number);
                }
            }
            std::task::Poll::Pending
        })
        .await
    }
}

#[cfg(not(unix))]
struct Signals;

#[cfg(not(unix))]
impl Signals {
    fn new() -> std::io::Result<Signals> {
        Ok(Signals)
    }

    async fn recv(&mut self) -> i32 {
        std::future::pending().await
    }
}

#[cfg(unix)]
fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

#[cfg(not(unix))]
fn exit_code(status: std::process::ExitStatus) -> i32 {
    status.code().unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);
    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn defaults_stop_the_command_before_the_lease_ends() {
        let t = Timing::new(3 * S, None, None).unwrap();
        assert_eq!(
            (t.renew_every, t.stop_before, t.term_grace),
            (S, 600 * MS, 300 * MS)
        );
        // SIGTERM at 2.4 s, SIGKILL at 2.7 s: 0.3 s before the lease can end.
        let t = Timing::new(300 * S, None, None).unwrap();
        assert_eq!(
            (t.renew_every, t.stop_before, t.term_grace),
            (100 * S, 20 * S, 10 * S)
        );
        assert_eq!((t.first_backoff, t.max_backoff), (500 * MS, 5 * S));
        let t = Timing::new(3 * S, Some(S), Some(500 * MS)).unwrap();
        assert_eq!((t.stop_before, t.term_grace), (S, 500 * MS));
        // Only --term-grace: SIGTERM comes twice as early.
        let t = Timing::new(60 * S, None, Some(2 * S)).unwrap();
        assert_eq!(t.stop_before, 4 * S);
    }

    #[test]
    fn options_that_cannot_keep_the_promise_are_refused() {
        let e = Timing::new(3 * S, Some(2 * S), None).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidInput);
        assert!(e.message.contains("--stop-before"), "{}", e.message);
        let e = Timing::new(3 * S, Some(S), Some(S)).unwrap_err();
        assert!(e.message.contains("--term-grace"), "{}", e.message);
        // A grace longer than the default SIGTERM lead needs a larger --stop-before.
        assert!(Timing::new(3 * S, None, Some(5 * S)).is_err());
        assert!(Timing::new(Duration::ZERO, None, None).is_err());
    }

    #[test]
    fn only_passing_failures_are_retried() {
        let kind = |k| CallError::Component(Error::new(k, "x"));
        assert!(worth_retrying(&kind(ErrorKind::Disconnected)));
        assert!(worth_retrying(&kind(ErrorKind::Transient)));
        assert!(worth_retrying(&kind(ErrorKind::Uncertain)));
        assert!(!worth_retrying(&kind(ErrorKind::Locked)));
        assert!(!worth_retrying(&kind(ErrorKind::Misconfigured)));
        assert!(!worth_retrying(&CallError::Runner(anyhow::anyhow!("trap"))));
    }

    #[test]
    fn renewal_pauses_are_the_shared_backoff_with_random_jitter() {
        let t = Timing::new(30 * S, None, None).unwrap();
        let pauses: std::collections::HashSet<Duration> = (0..50)
            .map(|_| backoff(t.first_backoff, t.max_backoff, 1, random_u64()))
            .collect();
        assert!(pauses
            .iter()
            .all(|p| *p >= t.first_backoff / 2 && *p <= t.first_backoff));
        assert!(pauses.len() > 10, "not random: {pauses:?}");
    }
}
