//! The catalogsync binary as a child process: real signals, real exit codes, a log file.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;

use anyhow::{Context as _, Result};

use super::process::{ManagedProcess, TestDir};

/// Environment variable naming the catalogsync binary to run, overriding the lookup of
/// [`catalogsync_bin`].
pub const CATALOGSYNC_BIN_ENV: &str = "CATALOGSYNC_BIN";

/// The catalogsync binary: `$CATALOGSYNC_BIN` when set; else `catalogsync` in the target
/// directory of the running executable. That is the executable's own directory for a binary
/// (`target/<profile>/fleet`) and its parent for a test or an example
/// (`target/<profile>/deps/sync_e2e-...`, `target/<profile>/examples/...`); `cargo test` builds
/// the binary before it runs the integration tests.
pub fn catalogsync_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os(CATALOGSYNC_BIN_ENV) {
        return PathBuf::from(bin);
    }
    let exe = std::env::current_exe().ok();
    let candidates = exe.iter().flat_map(|exe| exe.ancestors().skip(1).take(2)).map(|dir| dir.join("catalogsync"));
    candidates
        .clone()
        .find(|bin| bin.is_file())
        .or_else(|| candidates.last())
        .unwrap_or_else(|| PathBuf::from("catalogsync"))
}

/// A running catalogsync. Killed on drop.
pub struct Catalogsync {
    process: ManagedProcess,
    dir: TestDir,
}

impl Catalogsync {
    /// Runs [`catalogsync_bin`] with `args` and `envs`, `KUBECONFIG=kubeconfig`, and its
    /// output in `catalogsync.log` of a new test directory.
    ///
    /// # Errors
    /// Fails when the directory or process cannot be created.
    pub fn spawn(args: &[&str], envs: &[(&str, &str)], kubeconfig: &Path) -> Result<Self> {
        Self::spawn_bin(&catalogsync_bin(), args, envs, kubeconfig, None)
    }

    /// [`Catalogsync::spawn`] with an explicit binary and parent directory. `RUST_LOG`
    /// defaults to `info,catalogsync=debug` unless `envs` sets it.
    ///
    /// # Errors
    /// Fails when the directory or process cannot be created.
    pub fn spawn_bin(
        bin: &Path,
        args: &[&str],
        envs: &[(&str, &str)],
        kubeconfig: &Path,
        parent: Option<&Path>,
    ) -> Result<Self> {
        Self::spawn_with_dir(bin, args, envs, kubeconfig, TestDir::new("catalogsync", parent)?)
    }

    /// [`Catalogsync::spawn_bin`] with its files in `dir` (created if needed, never
    /// deleted), for a replica whose log should be found by name.
    ///
    /// # Errors
    /// Fails when the directory or process cannot be created.
    pub fn spawn_in_dir(
        bin: &Path,
        args: &[&str],
        envs: &[(&str, &str)],
        kubeconfig: &Path,
        dir: &Path,
    ) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("failed to create {}", dir.display()))?;
        Self::spawn_with_dir(bin, args, envs, kubeconfig, TestDir::persistent(dir.to_path_buf()))
    }

    fn spawn_with_dir(
        bin: &Path,
        args: &[&str],
        envs: &[(&str, &str)],
        kubeconfig: &Path,
        dir: TestDir,
    ) -> Result<Self> {
        let mut cmd = Command::new(bin);
        cmd.args(args).env("KUBECONFIG", kubeconfig).env("RUST_LOG", "info,catalogsync=debug");
        for (key, value) in envs {
            cmd.env(key, value);
        }
        let process = ManagedProcess::spawn("catalogsync", cmd, &dir.path().join("catalogsync.log"))?;
        Ok(Self { process, dir })
    }

    /// The log file (stdout and stderr).
    pub fn log_path(&self) -> &Path {
        self.process.log_path()
    }

    /// The whole log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The process's directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The PID.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Whether it still runs (reaps it if it has exited).
    pub fn is_running(&mut self) -> bool {
        self.process.is_running()
    }

    /// Its exit status, if it has exited.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        self.process.exit_status()
    }

    /// Sends `signal` (a name such as `TERM`) without waiting; see [`ManagedProcess::signal`].
    ///
    /// # Errors
    /// Fails when `kill` cannot be run or reports an error.
    pub fn signal(&self, signal: &str) -> Result<()> {
        self.process.signal(signal)
    }

    /// Sends SIGTERM and waits up to `timeout` for a graceful exit. Returns the exit status.
    ///
    /// # Errors
    /// Fails when it did not exit in time (it is SIGKILLed then); the message carries the
    /// tail of its log.
    pub async fn terminate(&mut self, timeout: Duration) -> Result<ExitStatus> {
        match self.process.terminate(timeout).await {
            (Some(status), true) => Ok(status),
            _ => anyhow::bail!(
                "catalogsync did not exit within {}s of SIGTERM (killed); log {}:\n{}",
                timeout.as_secs_f64(),
                self.log_path().display(),
                self.process.log_tail(30)
            ),
        }
    }

    /// Sends SIGKILL and reaps it.
    pub fn kill(&mut self) -> Option<ExitStatus> {
        self.process.kill()
    }
}
