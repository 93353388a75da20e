//! The watchdog of `lock ID -- COMMAND`: a small process that kills the command's process group
//! (SIGKILL) when the `lock` process is gone, however it went, SIGKILL included, so that no
//! process of the group runs on without the lock. (`PR_SET_PDEATHSIG` would reach only the
//! direct child, and fires when the spawning thread exits.)
//!
//! Before starting the command, `lock` makes a pipe and starts its own binary again, with
//! [`ARG`], as the watchdog: the pipe's read end is the watchdog's standard input, the write end
//! stays in `lock` alone (close-on-exec). The command, between fork and exec, makes its own
//! process group and writes its pid (the group's id) into the pipe, so the watchdog knows the
//! group even if `lock` dies while starting it. Then the watchdog blocks reading: a further byte
//! is `lock` saying the group is gone (the watchdog exits quietly); end of file means the write
//! end closed without it, i.e. `lock` died: the watchdog kills the group and exits.
//!
//! The watchdog runs in a process group of its own, neither the command's (which the command
//! may signal as a whole) nor `lock`'s (which a terminal, `timeout` or a supervisor may signal
//! as a whole), and ignores SIGINT, SIGTERM, SIGHUP and SIGQUIT. Not covered: a process that
//! leaves the command's group (`setsid`, `setpgid`), and the watchdog itself being killed.
//!
//! Everything used is POSIX, so other unix systems behave the same; Linux starts the binary as
//! `/proc/self/exe` (which works even when the file was replaced or deleted), other systems by
//! the path [`std::env::current_exe`] gives. Without unix (no process groups) there is no
//! watchdog.

#[cfg(unix)]
pub use unix::{main, Watchdog, ARG};

#[cfg(unix)]
mod unix {
    use std::io::{Read, Write};
    use std::os::fd::{AsRawFd, RawFd};
    use std::process::{ExitCode, Stdio};

    /// The hidden first argument that makes the binary the watchdog.
    pub const ARG: &str = "__lock-watchdog";

    /// The byte `lock` writes once the group is gone.
    const DISARM: u8 = b'.';

    /// The running watchdog, armed until [`Watchdog::disarm`]; dropping it unarmed kills the
    /// group as `lock` dying would.
    pub struct Watchdog {
        write: std::io::PipeWriter,
        process: tokio::process::Child,
    }

    impl Watchdog {
        /// Starts the watchdog and makes `command` start in a process group of its own (its
        /// id is the command's pid) that it reports to the watchdog.
        pub fn arm(command: &mut tokio::process::Command) -> std::io::Result<Watchdog> {
            let (read, write) = std::io::pipe()?;
            let process = tokio::process::Command::new(exe()?)
                .arg(ARG)
                .stdin(read)
                .stdout(Stdio::null())
                .process_group(0)
                .spawn()?;
            // The command's own copy (close-on-exec as well) of the write end.
            let fd = write.try_clone()?;
            // SAFETY: `announce` makes only async-signal-safe calls.
            unsafe { command.pre_exec(move || announce(fd.as_raw_fd())) };
            Ok(Watchdog { write, process })
        }

        /// Tells the watchdog that the group is gone (no process of it runs any more) and
        /// waits for it to exit.
        pub async fn disarm(self) {
            let Watchdog {
                mut write,
                mut process,
            } = self;
            let _ = write.write_all(&[DISARM]);
            drop(write);
            let _ = process.wait().await;
        }
    }

    /// The binary to start as the watchdog.
    fn exe() -> std::io::Result<std::path::PathBuf> {
        if cfg!(target_os = "linux") {
            Ok("/proc/self/exe".into())
        } else {
            std::env::current_exe()
        }
    }

    /// In the command's process between fork and exec (only async-signal-safe calls): makes
    /// its process group and writes its id to the watchdog. The close-on-exec write end then
    /// closes at exec.
    fn announce(fd: RawFd) -> std::io::Result<()> {
        // SAFETY: setpgid, getpid and write on a descriptor we own; the buffer outlives the call.
        unsafe {
            if libc::setpgid(0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let pid = libc::getpid().to_ne_bytes();
            loop {
                let n = libc::write(fd, pid.as_ptr().cast(), pid.len());
                if n == pid.len() as isize {
                    return Ok(());
                }
                let e = std::io::Error::last_os_error();
                if n >= 0 || e.kind() != std::io::ErrorKind::Interrupted {
                    // A write of 4 bytes to a pipe is never partial (PIPE_BUF).
                    return Err(e);
                }
            }
        }
    }

    /// The watchdog process: its standard input is the pipe.
    pub fn main() -> ExitCode {
        for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
            // SAFETY: ignoring a signal installs no handler.
            unsafe { libc::signal(signal, libc::SIG_IGN) };
        }
        let mut input = std::io::stdin().lock();
        let mut pid = [0; 4];
        if input.read_exact(&mut pid).is_err() {
            // `lock` ended before the command started (or could not start it).
            return ExitCode::SUCCESS;
        }
        let group = i32::from_ne_bytes(pid);
        let mut byte = [0];
        // A byte: disarmed. End of file (or a failing pipe): `lock` is gone.
        if input.read_exact(&mut byte).is_ok() || group <= 1 {
            return ExitCode::SUCCESS;
        }
        // SAFETY: kill(2) on the command's process group (never -1: all processes).
        unsafe { libc::kill(-group, libc::SIGKILL) };
        let _ = writeln!(
            std::io::stderr(),
            "lock: watchdog: the lock process is gone; killed the command's process group {group} (SIGKILL)"
        );
        ExitCode::SUCCESS
    }
}

/// Without unix: no watchdog, and the command runs in the host's process group.
#[cfg(not(unix))]
pub struct Watchdog;

#[cfg(not(unix))]
impl Watchdog {
    pub fn arm(_command: &mut tokio::process::Command) -> std::io::Result<Watchdog> {
        Ok(Watchdog)
    }

    pub async fn disarm(self) {}
}
