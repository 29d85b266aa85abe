//! Child processes that cannot outlive the test binary, their log files, and test
//! directories.
//!
//! # How leaks are prevented
//! The shared environment lives in a `static`, which Rust never drops, and a test binary
//! may also die from a panic in another thread, an abort or a SIGKILL. So every server is
//! paired with a *watchdog*: a `/bin/sh` whose stdin is a pipe whose only write end this
//! process holds. The kernel closes that end however this process ends, the watchdog's
//! `read` returns, and it SIGKILLs the server's process group. No polling, no PID files, and
//! no `unsafe` (`PR_SET_PDEATHSIG` would need it).
//!
//! Each server runs in its own process group (`process_group(0)`), so Ctrl-C in a terminal
//! reaches only the test binary (or `local-up`), which then stops the servers in order; the
//! watchdog has its own group too, so Ctrl-C cannot kill it before it has done its job.
//! When a server is stopped on purpose, its watchdog is killed and reaped *before* the
//! server is reaped, so the watchdog can never signal a recycled PID.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{Read as _, Seek as _, SeekFrom};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};

/// Environment variable that, set to `1`, keeps test directories (logs, audit logs, etcd
/// data) instead of deleting them.
pub const KEEP_DIRS_ENV: &str = "CATALOGSYNC_KEEP_TEST_DIRS";

/// The watchdog script: wait for EOF on stdin, then kill process group `$1` (falling back
/// to the PID) if given, then remove directory `$2` if given (after the other watchdogs
/// have had time to kill the servers writing into it).
const WATCHDOG_SCRIPT: &str = r#"read -r _ignored
if [ -n "$1" ]; then kill -KILL -- "-$1" 2>/dev/null || kill -KILL "$1" 2>/dev/null; fi
if [ -n "$2" ]; then sleep 2; rm -rf -- "$2"; fi"#;

/// Set by [`keep_dirs_quietly`].
static KEEP_QUIETLY: AtomicBool = AtomicBool::new(false);

/// Whether [`KEEP_DIRS_ENV`] asks to keep test directories.
pub fn keep_dirs() -> bool {
    std::env::var(KEEP_DIRS_ENV).is_ok_and(|v| v == "1")
}

/// Keeps every [`TestDir`] created from now on, without printing each path (for
/// `local-up`, which prints its own summary; setting the env var needs `unsafe` in 2024).
pub fn keep_dirs_quietly() {
    KEEP_QUIETLY.store(true, Ordering::Relaxed);
}

/// A directory for one component's files. Deleted on drop unless [`KEEP_DIRS_ENV`] is set,
/// in which case its path is printed when it is created.
pub struct TestDir {
    dir: Option<tempfile::TempDir>,
    path: PathBuf,
}

impl TestDir {
    /// Creates `catalogsync-<name>-XXXX` under `parent`, or under the system temp dir.
    ///
    /// # Errors
    /// Fails when the directory cannot be created.
    pub fn new(name: &str, parent: Option<&Path>) -> Result<Self> {
        let prefix = format!("catalogsync-{name}-");
        let mut builder = tempfile::Builder::new();
        builder.prefix(&prefix);
        let dir = match parent {
            Some(parent) => builder.tempdir_in(parent),
            None => builder.tempdir(),
        }
        .with_context(|| format!("failed to create a test directory for {name}"))?;
        let path = dir.path().to_path_buf();
        if KEEP_QUIETLY.load(Ordering::Relaxed) {
            return Ok(Self { dir: None, path: dir.keep() });
        }
        if keep_dirs() {
            eprintln!("{KEEP_DIRS_ENV}=1: files of {name} are kept in {}", path.display());
            return Ok(Self { dir: None, path: dir.keep() });
        }
        Ok(Self { dir: Some(dir), path })
    }

    /// Uses an existing directory, which is never deleted.
    pub fn persistent(path: PathBuf) -> Self {
        Self { dir: None, path }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the directory is deleted on drop.
    pub fn is_temporary(&self) -> bool {
        self.dir.is_some()
    }

    /// Makes sure the directory is removed after this process exits even though `self` is
    /// never dropped (it lives in a `static`): a watchdog with no server removes it.
    ///
    /// # Errors
    /// Fails when the watchdog cannot be spawned.
    pub fn remove_at_exit(&self) -> Result<Option<Watchdog>> {
        if !self.is_temporary() {
            return Ok(None);
        }
        Watchdog::spawn(None, Some(&self.path)).map(Some)
    }
}

/// The watchdog of one server; see the module docs. Dropping it without
/// [`Watchdog::disarm`] fires it, like this process exiting would.
pub struct Watchdog {
    child: Child,
    disarmed: bool,
}

impl Watchdog {
    /// Spawns a watchdog that SIGKILLs process group `pid` and then removes `cleanup` (each
    /// if given) once this process has exited or the watchdog is dropped.
    ///
    /// # Errors
    /// Fails when `/bin/sh` cannot be spawned.
    pub fn spawn(pid: Option<u32>, cleanup: Option<&Path>) -> Result<Self> {
        let target = pid.map(|p| p.to_string()).unwrap_or_default();
        let cleanup = cleanup.map(|p| p.as_os_str().to_owned()).unwrap_or_default();
        Self::spawn_script(WATCHDOG_SCRIPT, [OsString::from(target), cleanup])
    }

    /// Spawns a watchdog that runs `script` with `/bin/sh` once this process has exited or
    /// the watchdog is dropped (for cleanups beyond killing one process group).
    ///
    /// # Errors
    /// Fails when `/bin/sh` cannot be spawned.
    pub fn run_at_exit(script: &Path) -> Result<Self> {
        Self::spawn_script(r#"read -r _ignored; exec /bin/sh "$1""#, [script.as_os_str().to_owned()])
    }

    /// A `/bin/sh -c script` with `args` as `$1`...; its stdin is the pipe whose end closes.
    fn spawn_script(script: &str, args: impl IntoIterator<Item = OsString>) -> Result<Self> {
        let child = Command::new("/bin/sh")
            .arg("-c")
            .arg(script)
            .arg("catalogsync-watchdog")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .context("failed to spawn a watchdog (/bin/sh)")?;
        Ok(Self { child, disarmed: false })
    }

    /// Stops the watchdog without it doing anything, and reaps it.
    /// Idempotent. While armed the script sits in the `read` builtin, so it has no children.
    pub fn disarm(&mut self) {
        if !self.disarmed {
            self.disarmed = true;
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A server or controller child process with a watchdog and a log file. Killed on drop.
pub struct ManagedProcess {
    name: String,
    child: Child,
    watchdog: Watchdog,
    log_path: PathBuf,
    exit: Option<ExitStatus>,
}

impl ManagedProcess {
    /// Spawns `command` in its own process group with stdout and stderr appended to
    /// `log_path`, and arms its watchdog.
    ///
    /// # Errors
    /// Fails when the log file cannot be opened or the process cannot be spawned.
    pub fn spawn(name: &str, mut command: Command, log_path: &Path) -> Result<Self> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log_path)
            .with_context(|| format!("failed to open the log file {}", log_path.display()))?;
        let log_err = log.try_clone().context("failed to duplicate a log file handle")?;
        command.stdin(Stdio::null()).stdout(log).stderr(log_err).process_group(0);
        let mut child = command.spawn().with_context(|| format!("failed to spawn {name} ({command:?})"))?;
        let watchdog = match Watchdog::spawn(Some(child.id()), None) {
            Ok(w) => w,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e);
            }
        };
        Ok(Self { name: name.to_owned(), child, watchdog, log_path: log_path.to_path_buf(), exit: None })
    }

    /// The process name given to [`ManagedProcess::spawn`].
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The PID (also the process group ID).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The log file (stdout and stderr).
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log_path, lines)
    }

    /// The exit status, if the process has exited (reaping it, and disarming its watchdog
    /// right away).
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none()
            && let Ok(Some(status)) = self.child.try_wait()
        {
            self.watchdog.disarm();
            self.exit = Some(status);
        }
        self.exit
    }

    /// Whether the process still runs.
    pub fn is_running(&mut self) -> bool {
        self.exit_status().is_none()
    }

    /// Sends `signal` (a name such as `TERM`) to the process.
    ///
    /// # Errors
    /// Fails when `kill` cannot be run or reports an error.
    pub fn signal(&self, signal: &str) -> Result<()> {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()
            .context("failed to run kill")?;
        anyhow::ensure!(status.success(), "kill -{signal} {} ({}) failed: {status}", self.pid(), self.name);
        Ok(())
    }

    /// Sends SIGTERM and waits up to `timeout` for the process to exit; SIGKILLs it after
    /// that. Returns the exit status and whether it exited within the timeout.
    pub async fn terminate(&mut self, timeout: Duration) -> (Option<ExitStatus>, bool) {
        if self.exit.is_some() {
            return (self.exit, true);
        }
        let _ = self.signal("TERM");
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.exit_status() {
                return (Some(status), true);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        (self.kill(), false)
    }

    /// SIGKILLs the process group and reaps the process (and its watchdog).
    pub fn kill(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.watchdog.disarm();
            let pid = self.pid();
            let _ = Command::new("kill").args(["-KILL", "--", &format!("-{pid}")]).stderr(Stdio::null()).status();
            let _ = self.child.kill();
            self.exit = self.child.wait().ok();
        }
        self.exit
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last `lines` lines of the file at `path` (reads at most its last 64 KiB).
pub fn log_tail(path: &Path, lines: usize) -> String {
    let Ok(mut file) = File::open(path) else {
        return format!("(no log at {})", path.display());
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let mut buf = Vec::new();
    let _ = file.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
///
/// # Errors
/// Fails when no port can be bound.
pub fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("failed to bind 127.0.0.1:0")?;
    Ok(listener.local_addr().context("failed to read a bound address")?.port())
}

/// Resident memory of process `pid` in KiB: `(VmRSS, VmHWM)` (now and peak) from
/// `/proc/<pid>/status`.
///
/// # Errors
/// Fails when the file cannot be read (e.g. the process is gone) or lacks either field.
pub fn rss_kib(pid: u32) -> Result<(u64, u64)> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("failed to read {path}"))?;
    let field = |name: &str| -> Result<u64> {
        let line = status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .with_context(|| format!("no {name} in {path}"))?;
        let kib = line.trim().trim_end_matches("kB").trim();
        kib.parse().with_context(|| format!("failed to parse {name} {line:?} in {path}"))
    };
    Ok((field("VmRSS")?, field("VmHWM")?))
}

/// The repository root (where the workspace's Cargo.toml is): two levels above this crate.
pub fn repo_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.ancestors().nth(2).unwrap_or(manifest_dir).to_path_buf()
}

/// Path of a Kubernetes test binary: `$<env_var>`, else `$KUBEBUILDER_ASSETS/<name>`.
///
/// # Errors
/// Fails with a hint at `hack/k8s-bins.sh` when neither is set or the file is missing.
pub fn k8s_binary(env_var: &str, name: &str) -> Result<PathBuf> {
    let path = std::env::var_os(env_var)
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("KUBEBUILDER_ASSETS").map(|dir| PathBuf::from(dir).join(name)));
    match path {
        Some(path) if path.is_file() => Ok(path),
        Some(path) => anyhow::bail!(
            "{name} not found at {} (from {env_var} or KUBEBUILDER_ASSETS); run `eval \"$(hack/k8s-bins.sh)\"` to build it",
            path.display()
        ),
        None => anyhow::bail!(
            "{name} is not configured: set {env_var} (or KUBEBUILDER_ASSETS); run `eval \"$(hack/k8s-bins.sh)\"` to build and export it"
        ),
    }
}

/// The libfaketime library to `LD_PRELOAD` into a process whose wall clock a test offsets
/// (`FAKETIME=+120`, with `FAKETIME_DONT_FAKE_MONOTONIC=1` so its monotonic clock stays true).
/// `hack/test.sh` installs it (Debian package `libfaketime`).
///
/// # Errors
/// Fails when it is not installed.
pub fn libfaketime() -> Result<PathBuf> {
    let candidates = [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
        "/usr/local/lib/faketime/libfaketime.so.1",
    ];
    candidates
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .with_context(|| format!("libfaketime not found in {candidates:?}: apt-get install libfaketime"))
}
