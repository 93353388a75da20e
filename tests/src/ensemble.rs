//! A three-node ZooKeeper ensemble on loopback ports (Debian's `zookeeper` package, through
//! `scripts/zookeeper quorum`), for the local ClickHouse (`LocalClickHouse::start` with
//! [`Ensemble::connect_string`]) and the nemesis of the history tests: each node can be killed
//! (`SIGKILL`), started again on its data directory, paused (`SIGSTOP`) and resumed.
//!
//! Timing is tuned down for tests: `tickTime` 100 ms, so a session lasts at most 20 ticks (the
//! server's `maxSessionTimeout` default): ClickHouse asks for 30 s and is granted 2 s, and a
//! paused node or a dead leader costs seconds, not half a minute. `initLimit`/`syncLimit` (in
//! ticks) give a restarted follower 4 s to sync and a live one 2 s to answer.
//!
//! Every node dies with this process: the nodes are spawned by one thread that lives as long as
//! the process, with `PR_SET_PDEATHSIG`, and dropping the [`Ensemble`] kills them and removes
//! their data.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::repo_root;

/// ZooKeeper's tick for the tests (see the module documentation).
pub const TICK: Duration = Duration::from_millis(100);
/// The longest session the ensemble grants (ZooKeeper's default: 20 ticks).
pub const MAX_SESSION: Duration = Duration::from_millis(2000);

/// One node.
struct Node {
    id: usize,
    client_port: u16,
    dir: PathBuf,
    child: Option<Child>,
    paused: bool,
}

/// A running (or partly stopped) ensemble.
pub struct Ensemble {
    nodes: Vec<Node>,
    dir: PathBuf,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Spawns `cmd` from a thread that lives as long as this process, with the parent-death signal
/// set (it is tied to the spawning thread), so the child gets SIGKILL when this process dies.
fn spawn_dying_with_process(mut cmd: Command) -> std::io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::spawn(move || {
            for (mut cmd, reply) in rx {
                let _ = reply.send(cmd.spawn());
            }
        });
        Mutex::new(tx)
    });
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let (tx, rx) = mpsc::channel();
    spawner.lock().unwrap().send((cmd, tx)).unwrap();
    rx.recv().unwrap()
}

/// A ZooKeeper four-letter command's answer ("" when the node does not answer).
pub fn four_letter(port: u16, command: &str) -> String {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(300)) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    if s.write_all(command.as_bytes()).is_err() {
        return String::new();
    }
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    answer
}

impl Ensemble {
    /// Starts `n` nodes (3 for a real quorum) in a new directory under `parent` and waits until
    /// they have elected a leader and every node serves.
    pub fn start(n: usize, parent: &Path) -> Ensemble {
        let dir = parent.join(format!("zk-ensemble-{}", crate::unique_name("zk")));
        let ports: Vec<(u16, u16, u16)> = (0..n)
            .map(|_| (free_port(), free_port(), free_port()))
            .collect();
        let servers: String = ports
            .iter()
            .enumerate()
            .map(|(i, (_, quorum, election))| {
                format!("server.{}=127.0.0.1:{quorum}:{election}\n", i + 1)
            })
            .collect();
        let mut nodes = Vec::new();
        for (i, (client, _, _)) in ports.iter().enumerate() {
            let node_dir = dir.join(format!("node{}", i + 1));
            std::fs::create_dir_all(node_dir.join("data")).unwrap();
            std::fs::write(node_dir.join("data/myid"), format!("{}\n", i + 1)).unwrap();
            let config = format!(
                "tickTime={}\ninitLimit=40\nsyncLimit=20\ndataDir={}\nclientPort={client}\n\
                 clientPortAddress=127.0.0.1\nmaxClientCnxns=0\nadmin.enableServer=false\n\
                 4lw.commands.whitelist=ruok,srvr,mntr\n{servers}",
                TICK.as_millis(),
                node_dir.join("data").display()
            );
            std::fs::write(node_dir.join("zoo.cfg"), config).unwrap();
            nodes.push(Node {
                id: i + 1,
                client_port: *client,
                dir: node_dir,
                child: None,
                paused: false,
            });
        }
        let mut ensemble = Ensemble { nodes, dir };
        for i in 0..n {
            ensemble.start_node(i);
        }
        ensemble.wait_serving(Duration::from_secs(60));
        ensemble
    }

    /// `127.0.0.1:P1,127.0.0.1:P2,...`: what the local ClickHouse's `--zookeeper` takes.
    pub fn connect_string(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.client_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// How many nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether it has no nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The node's `srvr` mode (`leader`, `follower`, `standalone`), if it answers.
    pub fn mode(&self, i: usize) -> Option<String> {
        let answer = four_letter(self.nodes[i].client_port, "srvr");
        answer
            .lines()
            .find_map(|l| l.strip_prefix("Mode: "))
            .map(|m| m.trim().to_string())
    }

    /// The index of the current leader, if a running node says it is.
    pub fn leader(&self) -> Option<usize> {
        (0..self.nodes.len()).find(|&i| self.is_up(i) && self.mode(i).as_deref() == Some("leader"))
    }

    /// Whether node `i` runs and is not paused.
    pub fn is_up(&self, i: usize) -> bool {
        self.nodes[i].child.is_some() && !self.nodes[i].paused
    }

    /// Starts node `i` (on its data directory) if it is not running.
    pub fn start_node(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        if node.child.is_some() {
            return;
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(node.dir.join("zookeeper.log"))
            .unwrap();
        let mut cmd = Command::new(repo_root().join("scripts/zookeeper"));
        cmd.arg("quorum")
            .arg(node.dir.join("zoo.cfg"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        let child = spawn_dying_with_process(cmd)
            .unwrap_or_else(|e| panic!("starting ZooKeeper node {}: {e}", node.id));
        node.child = Some(child);
        node.paused = false;
    }

    /// Kills node `i` (`SIGKILL`, as a crash) and waits for it to exit.
    pub fn kill(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        if let Some(mut child) = node.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        node.paused = false;
    }

    /// Pauses node `i` (`SIGSTOP`): its sockets stay open, nothing answers.
    pub fn pause(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        if let Some(child) = &node.child {
            // SAFETY: signalling our own child, which has not been reaped.
            unsafe { libc::kill(child.id() as i32, libc::SIGSTOP) };
            node.paused = true;
        }
    }

    /// Resumes a paused node (`SIGCONT`).
    pub fn resume(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        if let Some(child) = &node.child {
            // SAFETY: as in `pause`.
            unsafe { libc::kill(child.id() as i32, libc::SIGCONT) };
        }
        node.paused = false;
    }

    /// Starts and resumes every node, then waits until a leader is elected and every node
    /// serves (`ruok` says `imok` and `srvr` names a mode), or panics after `timeout`.
    pub fn heal(&mut self, timeout: Duration) {
        for i in 0..self.nodes.len() {
            if self.nodes[i].paused {
                self.resume(i);
            }
            self.start_node(i);
        }
        self.wait_serving(timeout);
    }

    fn wait_serving(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let modes: Vec<Option<String>> = (0..self.nodes.len()).map(|i| self.mode(i)).collect();
            let leaders = modes
                .iter()
                .filter(|m| m.as_deref() == Some("leader"))
                .count();
            if leaders == 1 && modes.iter().all(Option::is_some) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the ZooKeeper ensemble did not form within {timeout:?} (modes {modes:?}); logs in {}",
                self.dir.display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Ensemble {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.resume(i);
            self.kill(i);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
