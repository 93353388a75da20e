//! The history checker (docs/verification.md): given the records of a run ([`crate::history`]),
//! finds the anomalies or says the history is legal. Four checks:
//!
//! 1. **Mutual exclusion.** A token's *confirmed lease* runs from its acquire's success to the
//!    earlier of the start of its first release and (the start of its last confirmed acquire or
//!    renewal + lease − fence margin). No two confirmed leases of different tokens on one id
//!    may overlap in time.
//! 2. **Fenced writes.** A fenced write (`lock.update`, `lock.set`) that succeeded must have
//!    started before its token's lease could have ended: before (the latest end of an acquire or
//!    renewal that succeeded) + lease − fence margin, and before its token's release completed.
//!    A token with a renewal that may have been applied without being confirmed (unknown, or
//!    failed with a kind other than `locked`) is not judged.
//! 3. **No lost update, no phantom.** Every key a read returns was written by an operation that
//!    started before the read ended and did not certainly fail; every key whose write succeeded
//!    before a read started is in that read, unless an operation that removes keys (`delete`,
//!    `lock.set`; succeeded or unknown) may have come between them.
//! 4. **Linearizability** of `get`, `update`, `lock.update`, `lock.set` and `delete` on each id
//!    against a map of keys (Wing & Gong's search with Lowe's memoisation of (operations done,
//!    state)): unknown operations may take effect at any time after their start, or never.
//!
//! The fence margin is the component's: a quarter of the lease, at most 2 s.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;

use crate::history::{Outcome, Record};

/// Steps the linearizability search may take per id before it gives up (inconclusive).
const SEARCH_BUDGET: u64 = 20_000_000;

/// The component's fence margin for a lease (ms).
pub fn fence_margin_ms(lease_ms: u64) -> u64 {
    (lease_ms / 4).min(2000)
}

/// What the checker found.
#[derive(Debug, Default)]
pub struct Report {
    /// Operations by kind: (ok, fail, unknown).
    pub ops: BTreeMap<String, (usize, usize, usize)>,
    /// Confirmed leases.
    pub leases: usize,
    /// The id of each lease that ended without a release before another holder took the lock
    /// (a takeover).
    pub taken_over: Vec<String>,
    /// Fenced writes refused because their lease was gone (`locked`).
    pub fenced_out: usize,
    /// Every anomaly, one line each.
    pub anomalies: Vec<String>,
    /// Ids whose linearizability search ran out of budget.
    pub inconclusive: Vec<String>,
    /// Steps the linearizability search took (all ids).
    pub search_steps: u64,
}

impl Report {
    /// Operations in all.
    pub fn total(&self) -> usize {
        self.ops.values().map(|(o, f, u)| o + f + u).sum()
    }

    /// Unknown outcomes in all.
    pub fn unknown(&self) -> usize {
        self.ops.values().map(|(_, _, u)| u).sum()
    }

    /// Whether the history is legal: no anomaly, and every search concluded.
    pub fn legal(&self) -> bool {
        self.anomalies.is_empty() && self.inconclusive.is_empty()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "operations: {} ({} unknown)",
            self.total(),
            self.unknown()
        )?;
        for (op, (ok, fail, unknown)) in &self.ops {
            writeln!(
                f,
                "  {op:<12} ok {ok:>5}  fail {fail:>5}  unknown {unknown:>5}"
            )?;
        }
        writeln!(
            f,
            "confirmed leases: {}, takeovers: {}, fenced writes refused: {}",
            self.leases,
            self.taken_over.len(),
            self.fenced_out
        )?;
        writeln!(f, "linearizability search: {} steps", self.search_steps)?;
        for id in &self.inconclusive {
            writeln!(f, "INCONCLUSIVE: the search on id {id:?} ran out of budget")?;
        }
        writeln!(f, "anomalies: {}", self.anomalies.len())?;
        for a in self.anomalies.iter().take(50) {
            writeln!(f, "  {a}")?;
        }
        if self.anomalies.len() > 50 {
            writeln!(f, "  ... {} more", self.anomalies.len() - 50)?;
        }
        Ok(())
    }
}

fn ms(ns: u64, t0: u64) -> String {
    format!("{:.1} ms", (ns.saturating_sub(t0)) as f64 / 1e6)
}

fn describe(r: &Record, t0: u64) -> String {
    let mut s = format!(
        "{} {} {:?} [{} .. {}] {:?}",
        r.process,
        r.op,
        r.id,
        ms(r.start, t0),
        ms(r.end, t0),
        r.outcome
    );
    if let Some(t) = &r.token {
        s.push_str(&format!(" token {}", &t[..t.len().min(8)]));
    }
    if let Some(k) = &r.key {
        s.push_str(&format!(" key {k}"));
    }
    s
}

/// A confirmed lease.
#[derive(Clone, Debug)]
struct Lease {
    token: String,
    id: String,
    process: String,
    begin: u64,
    end: u64,
    /// When the lease lapsed by time (no release had started by then).
    lapsed: bool,
    lease_end: u64,
}

/// Checks a history.
pub fn check(records: &[Record]) -> Report {
    let mut report = Report::default();
    let t0 = records.iter().map(|r| r.start).min().unwrap_or(0);
    for r in records {
        let entry = report.ops.entry(r.op.clone()).or_default();
        match r.outcome {
            Outcome::Ok => entry.0 += 1,
            Outcome::Fail => entry.1 += 1,
            Outcome::Unknown => entry.2 += 1,
        }
        if r.op.starts_with("lock.")
            && r.outcome == Outcome::Fail
            && r.error.as_deref().is_some_and(|e| e.contains("locked"))
        {
            report.fenced_out += 1;
        }
    }
    let leases = leases(records);
    report.leases = leases.len();
    mutual_exclusion(&leases, records, t0, &mut report);
    fenced_writes(records, t0, &mut report);
    lost_updates(records, t0, &mut report);
    let mut ids: Vec<&str> = records.iter().map(|r| r.id.as_str()).collect();
    ids.sort();
    ids.dedup();
    for id in ids {
        linearizable(records, id, t0, &mut report);
    }
    report
}

fn by_token(records: &[Record]) -> HashMap<&str, Vec<&Record>> {
    let mut map: HashMap<&str, Vec<&Record>> = HashMap::new();
    for r in records {
        if let Some(t) = r.token.as_deref() {
            map.entry(t).or_default().push(r);
        }
    }
    map
}

fn lease_ns(r: &Record) -> u64 {
    r.lease_ms.unwrap_or(0) * 1_000_000
}

fn leases(records: &[Record]) -> Vec<Lease> {
    let mut out = Vec::new();
    for (token, recs) in by_token(records) {
        let Some(acquire) = recs
            .iter()
            .find(|r| r.op == "acquire" && r.outcome == Outcome::Ok)
        else {
            continue;
        };
        let lease = lease_ns(acquire);
        let margin = fence_margin_ms(acquire.lease_ms.unwrap_or(0)) * 1_000_000;
        let last_confirmed = recs
            .iter()
            .filter(|r| (r.op == "acquire" || r.op == "renew") && r.outcome == Outcome::Ok)
            .map(|r| r.start)
            .max()
            .unwrap_or(acquire.start);
        let lease_end = last_confirmed + lease - margin;
        let release = recs
            .iter()
            .filter(|r| r.op == "release" && r.start >= acquire.end)
            .map(|r| r.start)
            .min();
        let end = release.map_or(lease_end, |r| r.min(lease_end));
        out.push(Lease {
            token: token.to_string(),
            id: acquire.id.clone(),
            process: acquire.process.clone(),
            begin: acquire.end,
            end,
            lapsed: release.is_none_or(|r| r > lease_end),
            lease_end,
        });
    }
    out.sort_by_key(|l| (l.id.clone(), l.begin));
    out
}

fn mutual_exclusion(leases: &[Lease], records: &[Record], t0: u64, report: &mut Report) {
    for (i, a) in leases.iter().enumerate() {
        for b in &leases[i + 1..] {
            if b.id != a.id {
                break;
            }
            if a.begin < a.end && b.begin < b.end && a.begin < b.end && b.begin < a.end {
                report.anomalies.push(format!(
                    "mutual exclusion on {:?}: {} held {} .. {} and {} held {} .. {} (token {} / {})",
                    a.id,
                    a.process,
                    ms(a.begin, t0),
                    ms(a.end, t0),
                    b.process,
                    ms(b.begin, t0),
                    ms(b.end, t0),
                    &a.token[..a.token.len().min(8)],
                    &b.token[..b.token.len().min(8)],
                ));
            }
        }
    }
    // A takeover: a lease that lapsed, after which another client acquired the id.
    for a in leases.iter().filter(|l| l.lapsed) {
        let taken = records.iter().any(|r| {
            r.op == "acquire"
                && r.outcome == Outcome::Ok
                && r.id == a.id
                && r.token.as_deref() != Some(a.token.as_str())
                && r.end >= a.lease_end
        });
        if taken {
            report.taken_over.push(a.id.clone());
        }
    }
}

fn fenced_writes(records: &[Record], t0: u64, report: &mut Report) {
    let tokens = by_token(records);
    for w in records
        .iter()
        .filter(|r| r.op.starts_with("lock.") && r.outcome == Outcome::Ok)
    {
        let Some(recs) = w.token.as_deref().and_then(|t| tokens.get(t)) else {
            continue;
        };
        let Some(acquire) = recs
            .iter()
            .find(|r| r.op == "acquire" && r.outcome == Outcome::Ok)
        else {
            report.anomalies.push(format!(
                "fenced write without a confirmed lock: {}",
                describe(w, t0)
            ));
            continue;
        };
        let lease = lease_ns(acquire);
        let margin = fence_margin_ms(acquire.lease_ms.unwrap_or(0)) * 1_000_000;
        if let Some(release) = recs
            .iter()
            .filter(|r| r.op == "release" && r.outcome == Outcome::Ok && r.end < w.start)
            .min_by_key(|r| r.end)
        {
            report.anomalies.push(format!(
                "fenced write accepted after its lock was released ({}): {}",
                ms(release.end, t0),
                describe(w, t0)
            ));
            continue;
        }
        // A renewal that may have been applied (unknown, or failed other than `locked`: a
        // keeper-map renewal whose confirming read failed was applied all the same) may have
        // extended the lease by any amount: not judged.
        if recs.iter().any(|r| {
            r.op == "renew"
                && (r.outcome == Outcome::Unknown
                    || (r.outcome == Outcome::Fail
                        && !r.error.as_deref().is_some_and(|e| e.starts_with("locked"))))
        }) {
            continue;
        }
        let possible_end = recs
            .iter()
            .filter(|r| (r.op == "acquire" || r.op == "renew") && r.outcome == Outcome::Ok)
            .map(|r| r.end)
            .max()
            .unwrap_or(acquire.end)
            + lease;
        if w.start + margin >= possible_end {
            report.anomalies.push(format!(
                "fenced write accepted after its lease ended (at the latest {} minus the fence margin): {}",
                ms(possible_end, t0),
                describe(w, t0)
            ));
        }
    }
}

/// Operations that write keys on an id.
fn is_write(op: &str) -> bool {
    matches!(op, "update" | "lock.update" | "lock.set")
}

/// Operations that may remove keys.
fn removes(op: &str) -> bool {
    matches!(op, "delete" | "lock.set" | "lock.delete")
}

fn lost_updates(records: &[Record], t0: u64, report: &mut Report) {
    let mut writers: HashMap<(&str, &str), &Record> = HashMap::new();
    for r in records.iter().filter(|r| is_write(&r.op)) {
        if let Some(k) = r.key.as_deref() {
            writers.insert((r.id.as_str(), k), r);
        }
    }
    let end = |r: &Record| {
        if r.outcome == Outcome::Unknown {
            u64::MAX
        } else {
            r.end
        }
    };
    for read in records
        .iter()
        .filter(|r| r.outcome == Outcome::Ok && (r.op == "get" || is_write(&r.op)))
    {
        let Some(keys) = &read.keys else { continue };
        let seen: BTreeSet<&str> = keys.iter().flatten().map(String::as_str).collect();
        for k in &seen {
            match writers.get(&(read.id.as_str(), *k)) {
                None => report.anomalies.push(format!(
                    "phantom: key {k} that no client wrote, read by {}",
                    describe(read, t0)
                )),
                Some(w) if w.outcome == Outcome::Fail => report.anomalies.push(format!(
                    "a write reported as failed took effect: {} (read by {})",
                    describe(w, t0),
                    describe(read, t0)
                )),
                Some(w) if w.start > read.end => report.anomalies.push(format!(
                    "key {k} read before it was written: {} (read by {})",
                    describe(w, t0),
                    describe(read, t0)
                )),
                Some(_) => {}
            }
        }
        for w in records.iter().filter(|w| {
            is_write(&w.op)
                && w.id == read.id
                && w.outcome == Outcome::Ok
                && w.end < read.start
                && !std::ptr::eq(*w, read)
        }) {
            let k = w.key.as_deref().unwrap_or_default();
            if seen.contains(k) {
                continue;
            }
            let excused = records.iter().any(|x| {
                removes(&x.op)
                    && x.id == read.id
                    && x.outcome != Outcome::Fail
                    && !std::ptr::eq(x, w)
                    && end(x) > w.start
                    && x.start < read.end
            });
            if !excused {
                report.anomalies.push(format!(
                    "lost update: {} acknowledged at {}, missing from {}",
                    describe(w, t0),
                    ms(w.end, t0),
                    describe(read, t0)
                ));
            }
        }
    }
}

/// The model's state: no state, or the set of partial keys (indices).
type State = Option<Vec<u32>>;

/// One operation of the search.
struct Op<'a> {
    record: &'a Record,
    key: Option<u32>,
    /// The keys it returned, when checked.
    returned: Option<State>,
}

impl Op<'_> {
    /// Applies the operation to `state`: the new state, or `None` when its result contradicts.
    fn apply(&self, state: &State) -> Option<State> {
        let unknown = self.record.outcome == Outcome::Unknown;
        let next = match self.record.op.as_str() {
            "get" => state.clone(),
            "delete" | "lock.delete" => None,
            "lock.set" => Some(vec![self.key?]),
            _ => {
                let mut keys = state.clone().unwrap_or_default();
                if let Err(at) = keys.binary_search(&self.key?) {
                    keys.insert(at, self.key?);
                }
                Some(keys)
            }
        };
        match &self.returned {
            Some(want) if !unknown && *want != next => None,
            _ => Some(next),
        }
    }
}

fn linearizable(records: &[Record], id: &str, t0: u64, report: &mut Report) {
    let mut index: HashMap<String, u32> = HashMap::new();
    let mut key_of = |k: &str| {
        let n = index.len() as u32;
        *index.entry(k.to_string()).or_insert(n)
    };
    // Keys some read saw: an unknown update of a key nobody saw can be left out (it may always
    // take effect last, or never; both leave every read as it is).
    let observed: HashSet<&str> = records
        .iter()
        .filter(|r| r.id == id && r.outcome == Outcome::Ok)
        .filter_map(|r| r.keys.as_ref())
        .flat_map(|k| k.iter().flatten().map(String::as_str))
        .collect();
    let mut ops = Vec::new();
    for r in records.iter().filter(|r| {
        r.id == id
            && r.outcome != Outcome::Fail
            && matches!(
                r.op.as_str(),
                "get" | "update" | "lock.update" | "lock.set" | "delete"
            )
    }) {
        if r.outcome == Outcome::Unknown
            && r.op != "lock.set"
            && r.op != "delete"
            && r.key.as_deref().is_some_and(|k| !observed.contains(k))
        {
            continue;
        }
        let returned = r.keys.as_ref().map(|keys| {
            keys.as_ref().map(|ks| {
                let mut v: Vec<u32> = ks.iter().map(|k| key_of(k)).collect();
                v.sort_unstable();
                v
            })
        });
        ops.push(Op {
            record: r,
            key: r.key.as_deref().map(&mut key_of),
            returned,
        });
    }
    if ops.len() > u16::MAX as usize {
        report.inconclusive.push(id.to_string());
        return;
    }
    let mut names: Vec<String> = vec![String::new(); index.len()];
    for (k, i) in &index {
        names[*i as usize] = k.clone();
    }
    let show = |state: &State| match state {
        None => "no state".to_string(),
        Some(keys) => format!(
            "{{{}}}",
            keys.iter()
                .map(|k| names[*k as usize].as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    match search(&ops, &mut report.search_steps) {
        Search::Linearizable => {}
        Search::Stuck {
            prefix,
            stuck,
            state,
        } => {
            let done: Vec<String> = prefix
                .iter()
                .rev()
                .take(6)
                .rev()
                .map(|&i| format!("    linearized: {}", describe(ops[i].record, t0)))
                .collect();
            let bad = ops[stuck].record;
            let returned = ops[stuck].returned.as_ref().map_or("-".to_string(), &show);
            let concurrent: Vec<String> = ops
                .iter()
                .filter(|o| {
                    !std::ptr::eq(o.record, bad)
                        && o.record.start < bad.end
                        && (o.record.outcome == Outcome::Unknown || o.record.end > bad.start)
                })
                .take(12)
                .map(|o| format!("    concurrent: {}", describe(o.record, t0)))
                .collect();
            report.anomalies.push(format!(
                "not linearizable on {id:?}: at most {} of its {} operations linearize; then {} (returned {returned}) cannot take effect on the state {} reached by the last of:\n{}\n{}",
                prefix.len(),
                ops.len(),
                describe(bad, t0),
                show(&state),
                done.join("\n"),
                concurrent.join("\n")
            ));
        }
        Search::Inconclusive => report.inconclusive.push(id.to_string()),
    }
}

/// What the search found.
enum Search {
    /// A linearization exists.
    Linearizable,
    /// None does; the deepest the search got: the operations linearized (in order), the
    /// operation that could not follow them (its return came first), and the state then.
    Stuck {
        prefix: Vec<usize>,
        stuck: usize,
        state: State,
    },
    /// The budget ran out.
    Inconclusive,
}

/// Wing & Gong's search with Lowe's cache.
fn search(ops: &[Op<'_>], steps: &mut u64) -> Search {
    // Events: calls and returns, in time order (a return at +inf for unknown outcomes); at
    // equal times calls first (real time cannot order them).
    #[derive(Clone, Copy)]
    struct Event {
        op: usize,
        call: bool,
        time: u64,
    }
    let mut events: Vec<Event> = Vec::with_capacity(ops.len() * 2);
    for (i, o) in ops.iter().enumerate() {
        events.push(Event {
            op: i,
            call: true,
            time: o.record.start,
        });
        let end = if o.record.outcome == Outcome::Unknown {
            u64::MAX
        } else {
            o.record.end
        };
        events.push(Event {
            op: i,
            call: false,
            time: end,
        });
    }
    events.sort_by_key(|e| (e.time, !e.call));
    const NIL: usize = usize::MAX;
    let n = events.len();
    // A doubly linked list over the events; index n is the head sentinel.
    let head = n;
    let mut next = vec![NIL; n + 1];
    let mut prev = vec![NIL; n + 1];
    next[head] = if n > 0 { 0 } else { NIL };
    for i in 0..n {
        next[i] = if i + 1 < n { i + 1 } else { NIL };
        prev[i] = if i == 0 { head } else { i - 1 };
    }
    let mut ret_of = vec![0usize; ops.len()];
    for (i, e) in events.iter().enumerate() {
        if !e.call {
            ret_of[e.op] = i;
        }
    }
    // An operation's call and return leave the list, and come back in the reverse order.
    let unlink = |call: usize, next: &mut [usize], prev: &mut [usize]| {
        for j in [call, ret_of[events[call].op]] {
            next[prev[j]] = next[j];
            if next[j] != NIL {
                prev[next[j]] = prev[j];
            }
        }
    };
    let relink = |call: usize, next: &mut [usize], prev: &mut [usize]| {
        for j in [ret_of[events[call].op], call] {
            next[prev[j]] = j;
            if next[j] != NIL {
                prev[next[j]] = j;
            }
        }
    };
    let words = ops.len().div_ceil(64);
    let mut done = vec![0u64; words];
    let mut state: State = None;
    // Configurations tried, as 128-bit fingerprints of (operations done, state): a full copy
    // each would take gigabytes on long histories.
    let mut cache: HashSet<u128> = HashSet::new();
    let fingerprint = |done: &[u64], state: &State| -> u128 {
        use std::hash::{Hash, Hasher};
        let mut a = std::collections::hash_map::DefaultHasher::new();
        let mut b = std::collections::hash_map::DefaultHasher::new();
        0xa5u8.hash(&mut b);
        (done, state).hash(&mut a);
        (state, done).hash(&mut b);
        (u128::from(a.finish()) << 64) | u128::from(b.finish())
    };
    let mut stack: Vec<(usize, State)> = Vec::new();
    let mut entry = next[head];
    let mut taken = 0u64;
    let mut deepest: Option<(Vec<usize>, usize, State)> = None;
    loop {
        taken += 1;
        if taken > SEARCH_BUDGET {
            *steps += taken;
            return Search::Inconclusive;
        }
        if next[head] == NIL {
            *steps += taken;
            return Search::Linearizable;
        }
        if entry != NIL && events[entry].call {
            let op = events[entry].op;
            if let Some(new_state) = ops[op].apply(&state) {
                let mut new_done = done.clone();
                new_done[op / 64] |= 1 << (op % 64);
                if cache.insert(fingerprint(&new_done, &new_state)) {
                    stack.push((entry, std::mem::replace(&mut state, new_state)));
                    done = new_done;
                    unlink(entry, &mut next, &mut prev);
                    entry = next[head];
                    continue;
                }
            }
            entry = next[entry];
        } else {
            // The return of an operation not linearized yet: undo the last choice.
            if entry != NIL && deepest.as_ref().is_none_or(|d| stack.len() > d.0.len()) {
                let prefix = stack.iter().map(|(call, _)| events[*call].op).collect();
                deepest = Some((prefix, events[entry].op, state.clone()));
            }
            let Some((call, previous)) = stack.pop() else {
                *steps += taken;
                let (prefix, stuck, state) = deepest.unwrap_or_default();
                return Search::Stuck {
                    prefix,
                    stuck,
                    state,
                };
            };
            state = previous;
            let op = events[call].op;
            done[op / 64] &= !(1 << (op % 64));
            relink(call, &mut next, &mut prev);
            entry = next[call];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(process: &str, op: &str, start: u64, end: u64, outcome: Outcome) -> Record {
        Record {
            start: start * 1_000_000,
            end: end * 1_000_000,
            ..Record::new(process, op, "s", 0, outcome)
        }
    }

    fn lock(process: &str, op: &str, token: &str, start: u64, end: u64) -> Record {
        Record {
            token: Some(token.into()),
            lease_ms: Some(1000),
            ..rec(process, op, start, end, Outcome::Ok)
        }
    }

    fn write(process: &str, op: &str, key: &str, start: u64, end: u64, o: Outcome) -> Record {
        Record {
            key: Some(key.into()),
            ..rec(process, op, start, end, o)
        }
    }

    fn get(process: &str, keys: Option<&[&str]>, start: u64, end: u64) -> Record {
        Record {
            keys: Some(keys.map(|k| k.iter().map(|s| s.to_string()).collect())),
            ..rec(process, "get", start, end, Outcome::Ok)
        }
    }

    #[test]
    fn overlapping_confirmed_leases_are_found_and_lapsed_ones_counted() {
        // a: acquired at 10, lease 1000 ms, margin 250: confirmed until 750. b acquires at 800.
        let legal = [
            lock("a", "acquire", "ta", 0, 10),
            lock("b", "acquire", "tb", 700, 800),
            lock("b", "release", "tb", 900, 910),
        ];
        let r = check(&legal);
        assert!(r.legal(), "{r}");
        assert_eq!((r.leases, r.taken_over.len()), (2, 1));
        // a renews at 500 (confirmed until 1250): b's lease overlaps it.
        let mut overlap = legal.to_vec();
        overlap.push(lock("a", "renew", "ta", 500, 510));
        let r = check(&overlap);
        assert_eq!(r.anomalies.len(), 1, "{r}");
        assert!(r.anomalies[0].contains("mutual exclusion"), "{r}");
    }

    #[test]
    fn a_fenced_write_after_the_lease_is_found() {
        let mut h = vec![
            lock("a", "acquire", "ta", 0, 10),
            Record {
                token: Some("ta".into()),
                ..write("a", "lock.update", "k1", 400, 420, Outcome::Ok)
            },
        ];
        assert!(check(&h).legal());
        h.push(Record {
            token: Some("ta".into()),
            ..write("a", "lock.update", "k2", 900, 920, Outcome::Ok)
        });
        let r = check(&h);
        assert!(
            r.anomalies
                .iter()
                .any(|a| a.contains("after its lease ended")),
            "{r}"
        );
    }

    #[test]
    fn lost_updates_phantoms_and_failed_writes_that_landed_are_found() {
        let base = [
            write("a", "update", "k1", 0, 10, Outcome::Ok),
            write("b", "update", "k2", 5, 20, Outcome::Ok),
        ];
        let mut ok = base.to_vec();
        ok.push(get("c", Some(&["k1", "k2"]), 30, 40));
        assert!(check(&ok).legal(), "{}", check(&ok));

        let mut lost = base.to_vec();
        lost.push(get("c", Some(&["k2"]), 30, 40));
        let r = check(&lost);
        assert!(r.anomalies.iter().any(|a| a.contains("lost update")), "{r}");
        assert!(
            r.anomalies.iter().any(|a| a.contains("not linearizable")),
            "{r}"
        );

        let mut phantom = base.to_vec();
        phantom.push(get("c", Some(&["k1", "k2", "zz"]), 30, 40));
        assert!(check(&phantom).anomalies[0].contains("phantom"));

        let mut failed = base.to_vec();
        failed.push(write("d", "update", "k3", 0, 10, Outcome::Fail));
        failed.push(get("c", Some(&["k1", "k2", "k3"]), 30, 40));
        assert!(check(&failed).anomalies[0].contains("reported as failed"));

        // A delete between excuses the missing keys; an unknown update may land or not.
        let mut deleted = base.to_vec();
        deleted.push(rec("d", "delete", 22, 25, Outcome::Ok));
        deleted.push(write("e", "update", "k4", 26, 27, Outcome::Unknown));
        deleted.push(get("c", None, 30, 40));
        deleted.push(get("c", Some(&["k4"]), 41, 42));
        assert!(check(&deleted).legal(), "{}", check(&deleted));
    }

    #[test]
    fn a_stale_read_is_not_linearizable() {
        // k1 written (ok) before the first read; the second read, after it, misses it while the
        // first saw it. The concurrent delete can only come once.
        let h = [
            write("a", "update", "k1", 0, 10, Outcome::Ok),
            get("b", Some(&["k1"]), 20, 30),
            rec("d", "delete", 15, 100, Outcome::Ok),
            get("b", None, 40, 50),
            get("b", Some(&["k1"]), 60, 70),
        ];
        let r = check(&h);
        assert!(
            r.anomalies.iter().any(|a| a.contains("not linearizable")),
            "{r}"
        );
        // Without the last read it is legal (the delete lands between the reads).
        let r = check(&h[..4]);
        assert!(r.legal(), "{r}");
    }
}
