//! A private containerd for tests of amd-gpud's loader check.
//!
//! [`Containerd::start`] runs Debian's `containerd` with a generated
//! `config.toml` (version 2) in a temp dir: its own root, state and sockets,
//! no debug or metrics listener, and without the CRI plugin or any
//! snapshotter that needs a particular filesystem. Images are imported with
//! `ctr images import --no-unpack`, so no snapshotter is ever used. Needs
//! root (containerd refuses to start otherwise).

use std::{
    fs::{self, File},
    io,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use tempfile::TempDir;

/// How long [`Containerd::start`] waits for the socket to answer.
pub const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long one `ctr` command may run.
pub const CTR_TIMEOUT: Duration = Duration::from_secs(30);

const CONTAINERD: &str = "containerd";
const CTR: &str = "ctr";
/// Parent of the temp dir: short, as socket paths are limited to 108 bytes.
const DIR_PARENT: &str = "/tmp";
const POLL: Duration = Duration::from_millis(50);
/// How much of containerd's log an error carries.
const LOG_TAIL: usize = 4000;

/// Plugins left out: CRI (it wants CNI and a runtime), snapshotters that need
/// their own filesystem or device, and tracing exporters.
const DISABLED_PLUGINS: &[&str] = &[
    "io.containerd.grpc.v1.cri",
    "io.containerd.snapshotter.v1.aufs",
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.snapshotter.v1.zfs",
    "io.containerd.tracing.processor.v1.otlp",
    "io.containerd.internal.v1.tracing",
];

/// A running containerd; killed and reaped on drop.
pub struct Containerd {
    dir: TempDir,
    child: Child,
    /// The gRPC socket.
    pub socket: PathBuf,
}

impl Containerd {
    /// Starts containerd and waits (at most [`START_TIMEOUT`]) until
    /// `ctr version` gets an answer from it.
    ///
    /// # Errors
    /// containerd is not installed (the error says to install Debian's
    /// `containerd`), exits early, or does not answer in time; the error
    /// carries the tail of its log.
    pub fn start() -> io::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("amd-gpud-containerd.")
            .tempdir_in(DIR_PARENT)?;
        let socket = dir.path().join("containerd.sock");
        let config = dir.path().join("config.toml");
        fs::write(&config, config_toml(dir.path(), &socket))?;
        let log = File::create(dir.path().join("containerd.log"))?;
        let child = Command::new(CONTAINERD)
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "cannot run {CONTAINERD}: {e}; install Debian's containerd \
                         (apt-get install containerd; CI does)"
                    ),
                )
            })?;
        let mut containerd = Self { dir, child, socket };
        containerd.wait_answering()?;
        Ok(containerd)
    }

    /// The temp dir holding the config, state, sockets and log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// containerd's log so far (stdout and stderr).
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default()
    }

    fn log_tail(&self) -> String {
        let log = self.log();
        let mut start = log.len().saturating_sub(LOG_TAIL);
        while !log.is_char_boundary(start) {
            start += 1;
        }
        log[start..].to_owned()
    }

    fn wait_answering(&mut self) -> io::Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Err(io::Error::other(format!(
                    "{CONTAINERD} exited with {status} while starting; log:\n{}",
                    self.log_tail()
                )));
            }
            if self.socket.exists() && self.ctr(None, &["version"]).is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "{CONTAINERD} did not answer on {} within {START_TIMEOUT:?}; log:\n{}",
                        self.socket.display(),
                        self.log_tail()
                    ),
                ));
            }
            thread::sleep(POLL);
        }
    }

    /// Runs `ctr -a <socket> [-n namespace] args...` (at most
    /// [`CTR_TIMEOUT`]) and returns its stdout.
    ///
    /// # Errors
    /// `ctr` cannot run, fails (the error has its stderr) or times out.
    pub fn ctr(&self, namespace: Option<&str>, args: &[&str]) -> io::Result<String> {
        let mut command = Command::new(CTR);
        command.arg("-a").arg(&self.socket);
        if let Some(namespace) = namespace {
            command.args(["-n", namespace]);
        }
        command.args(["--timeout", "10s"]).args(args);
        let shown = format!("{CTR} {}", args.join(" "));
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot run {shown}: {e}")))?;
        let deadline = Instant::now() + CTR_TIMEOUT;
        while child.try_wait()?.is_none() {
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                let why = format!("{shown} ran longer than {CTR_TIMEOUT:?}");
                return Err(io::Error::new(io::ErrorKind::TimedOut, why));
            }
            thread::sleep(POLL);
        }
        let output = child.wait_with_output()?;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let why = format!("{shown}: {}: {}", output.status, stderr.trim());
            return Err(io::Error::other(why));
        }
        Ok(stdout)
    }

    /// Imports the OCI archive `archive` into `namespace` without unpacking
    /// it, and returns the names of the images in the namespace after it.
    ///
    /// # Errors
    /// As [`Self::ctr`].
    pub fn import(&self, archive: &Path, namespace: &str) -> io::Result<Vec<String>> {
        let archive = archive.to_string_lossy();
        self.ctr(
            Some(namespace),
            &["images", "import", "--no-unpack", archive.as_ref()],
        )?;
        let names = self.ctr(Some(namespace), &["images", "list", "--quiet"])?;
        Ok(names.lines().map(str::to_owned).collect())
    }
}

impl Containerd {
    /// Kills containerd (SIGKILL, as a crash) and reaps it; its socket file
    /// stays behind, refusing connections. Idempotent.
    pub fn kill(&mut self) {
        // Errors mean it is already dead and reaped.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.kill();
    }
}

/// containerd's configuration (version 2) for a private instance in `dir`.
fn config_toml(dir: &Path, socket: &Path) -> String {
    let quoted: Vec<String> = DISABLED_PLUGINS.iter().map(|p| format!("{p:?}")).collect();
    format!(
        "version = 2\n\
         root = {root:?}\n\
         state = {state:?}\n\
         disabled_plugins = [{disabled}]\n\
         \n\
         [grpc]\n  address = {grpc:?}\n\
         [ttrpc]\n  address = {ttrpc:?}\n\
         [debug]\n  address = \"\"\n\
         [metrics]\n  address = \"\"\n",
        root = dir.join("root").display().to_string(),
        state = dir.join("state").display().to_string(),
        disabled = quoted.join(", "),
        grpc = socket.display().to_string(),
        ttrpc = socket.with_extension("ttrpc").display().to_string(),
    )
}
