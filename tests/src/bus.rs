//! A private system-type D-Bus for policy and credential tests.
//!
//! [`PrivateBus::start`] runs `dbus-daemon` with a system-type config (the default-context
//! rules of Debian's `/usr/share/dbus-1/system.conf`) that `<include>`s the shipped
//! `systemd/io.hami.AmdGpu1.conf`, on a socket in a world-searchable temp dir. Callers run
//! as other UIDs through `setpriv` ([`run_as`], [`busctl`]); [`NameHolder`] owns a name on
//! the bus and answers every call, so send rules can be tested without `amd-gpud`.
//!
//! Most of this needs root: `setpriv` to switch UID, and `systemd-sysusers` to create the
//! users. dbus-daemon looks every policy user up through NSS: a `<policy user=...>` naming
//! an unknown user is dropped with a log line, and a connection from a UID that does not
//! resolve is closed during authentication. Hence [`ensure_plugin_user`] and
//! [`ensure_other_user`].

mod holder;
mod run;
mod users;

use std::{
    fmt::Write as _,
    fs::{self, File, Permissions},
    io::{self, BufRead, BufReader},
    os::unix::{fs::PermissionsExt, net::UnixStream},
    path::{Path, PathBuf},
    process::{Child, ChildStdout, Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

pub use holder::{Call, NameHolder};
pub use run::{RunOutput, run_as};
use tempfile::TempDir;
pub use users::{effective_uid, ensure_other_user, ensure_plugin_user};

/// The name `amd-gpud` owns.
pub const BUS_NAME: &str = "io.hami.AmdGpu1";
/// The device plugin's system user, from `systemd/amd-gpud.sysusers.conf`.
pub const PLUGIN_USER: &str = "amdgpu-plugin";
/// Its fixed UID (and GID).
pub const PLUGIN_UID: u32 = 60700;
/// A test user the shipped policy knows nothing about. It must exist all the same: the
/// bus closes connections from UIDs it cannot resolve, which would make every "refused"
/// check pass for the wrong reason.
pub const OTHER_USER: &str = "amdgpu-test-other";
/// Its UID (and GID).
pub const OTHER_UID: u32 = 60701;
/// How long [`PrivateBus::start`] waits for the socket to accept.
pub const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long [`busctl`] may run.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

const DBUS_DAEMON: &str = "dbus-daemon";
const BUSCTL: &str = "busctl";
/// Parent of the bus directories: short (socket paths are limited to 108 bytes) and
/// searchable by every UID, unlike a `$TMPDIR` under `/root`.
const BUS_DIR_PARENT: &str = "/tmp";
const SOCKET_NAME: &str = "system_bus_socket";
const CONFIG_NAME: &str = "bus.conf";
const LOG_NAME: &str = "dbus-daemon.log";
/// The shipped policy and sysusers entry, relative to the workspace root.
const SHIPPED_POLICY: &str = "systemd/io.hami.AmdGpu1.conf";
const SHIPPED_SYSUSERS: &str = "systemd/amd-gpud.sysusers.conf";
/// How often waits poll.
const POLL: Duration = Duration::from_millis(10);

/// The workspace root (the parent of this crate).
pub fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// Absolute path of the shipped D-Bus policy file.
pub fn shipped_policy() -> PathBuf {
    workspace_root().join(SHIPPED_POLICY)
}

/// Absolute path of the shipped sysusers.d entry.
pub fn shipped_sysusers() -> PathBuf {
    workspace_root().join(SHIPPED_SYSUSERS)
}

/// Which bus policy [`PrivateBus::start`] loads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// The shipped `systemd/io.hami.AmdGpu1.conf`, as on a node.
    Shipped,
    /// The shipped file plus a final `<policy context="default"><allow
    /// send_destination="io.hami.AmdGpu1"/></policy>`: anyone may call `amd-gpud`, so
    /// only its in-method UID check stands between other UIDs and its methods.
    Relaxed,
    /// The shipped file plus a final default-context rule letting anyone own
    /// [`BUS_NAME`], call it and receive its signals: amd-gpud and the plugin
    /// run as an ordinary user (the node simulator without root). Never a
    /// node's policy.
    Unprivileged,
}

/// A running private `dbus-daemon`; killed and reaped on drop.
pub struct PrivateBus {
    dir: TempDir,
    child: Child,
    /// The address `dbus-daemon` printed (`unix:path=...,guid=...`).
    pub address: String,
    /// The listening socket.
    pub socket: PathBuf,
}

impl PrivateBus {
    /// Starts `dbus-daemon --nofork --print-address --config-file <generated>` and waits
    /// (at most [`START_TIMEOUT`]) until its socket accepts connections.
    ///
    /// # Errors
    /// When the daemon cannot be spawned, exits early (the error carries its log, e.g. a
    /// malformed policy file), or does not accept in time.
    pub fn start(policy: Policy) -> io::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("amd-gpud-bus.")
            .tempdir_in(BUS_DIR_PARENT)?;
        // setpriv'd callers must reach the socket.
        fs::set_permissions(dir.path(), Permissions::from_mode(0o755))?;
        let socket = dir.path().join(SOCKET_NAME);
        let config = dir.path().join(CONFIG_NAME);
        fs::write(&config, bus_config(&socket, &shipped_policy(), policy))?;
        let log = File::create(dir.path().join(LOG_NAME))?;
        let mut child = spawn_daemon(&config, log)?;
        let address = read_first_line(child.stdout.take());
        let mut bus = Self {
            dir,
            child,
            address: String::new(),
            socket,
        };
        let deadline = Instant::now() + START_TIMEOUT;
        bus.wait_accepting(deadline)?;
        let left = deadline.saturating_duration_since(Instant::now());
        let line = address.recv_timeout(left.max(Duration::from_secs(1)));
        bus.address = line.unwrap_or_default().trim().to_owned();
        if bus.address.is_empty() {
            return Err(io::Error::other(format!(
                "{DBUS_DAEMON} printed no address; log:\n{}",
                bus.log_or_error()
            )));
        }
        Ok(bus)
    }

    /// [`Self::socket`] as an address without the daemon's GUID, as a node's
    /// clients name the system bus (`unix:path=/run/dbus/system_bus_socket`):
    /// it still holds after [`Self::restart`], whose daemon has a new GUID
    /// (a client given [`Self::address`] refuses it: the D-Bus
    /// specification's "Server Addresses" has clients check the GUID).
    pub fn path_address(&self) -> String {
        format!("unix:path={}", self.socket.display())
    }

    /// Kills the daemon (SIGKILL, as a broker crash) and starts a new one
    /// with the same configuration on the same socket, as systemd would
    /// after `dbus.service` died; returns once it accepts connections.
    /// [`Self::address`] becomes the new daemon's (new GUID); its log is
    /// appended to the old one. Nothing of the old daemon's state survives:
    /// every client lost its connection and its names.
    ///
    /// # Errors
    /// As [`Self::start`].
    pub fn restart(&mut self) -> io::Result<()> {
        self.kill();
        // A socket file left by the killed daemon.
        let _ = fs::remove_file(&self.socket);
        let log = fs::OpenOptions::new()
            .append(true)
            .open(self.dir.path().join(LOG_NAME))?;
        self.child = spawn_daemon(&self.config_path(), log)?;
        let address = read_first_line(self.child.stdout.take());
        let deadline = Instant::now() + START_TIMEOUT;
        self.wait_accepting(deadline)?;
        let left = deadline.saturating_duration_since(Instant::now());
        let line = address.recv_timeout(left.max(Duration::from_secs(1)));
        self.address = line.unwrap_or_default().trim().to_owned();
        if self.address.is_empty() {
            return Err(io::Error::other(format!(
                "{DBUS_DAEMON} printed no address after a restart; log:\n{}",
                self.log_or_error()
            )));
        }
        Ok(())
    }

    /// The dbus-daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the daemon with SIGKILL and reaps it, as a broker crash would. Idempotent.
    pub fn kill(&mut self) {
        // Errors mean it is already dead and reaped.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// What the daemon has written to stderr so far (config warnings such as
    /// `Unknown username "..."`).
    ///
    /// # Errors
    /// When the log file cannot be read.
    pub fn log(&self) -> io::Result<String> {
        fs::read_to_string(self.dir.path().join(LOG_NAME))
    }

    /// The generated config file, for debugging.
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join(CONFIG_NAME)
    }

    fn log_or_error(&self) -> String {
        self.log()
            .unwrap_or_else(|e| format!("(log unreadable: {e})"))
    }

    fn wait_accepting(&mut self, deadline: Instant) -> io::Result<()> {
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Err(io::Error::other(format!(
                    "{DBUS_DAEMON} exited with {status}; config {}; log:\n{}",
                    self.config_path().display(),
                    self.log_or_error()
                )));
            }
            if UnixStream::connect(&self.socket).is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "{} did not accept within {START_TIMEOUT:?}; log:\n{}",
                        self.socket.display(),
                        self.log_or_error()
                    ),
                ));
            }
            thread::sleep(POLL);
        }
    }
}

impl Drop for PrivateBus {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `dbus-daemon --nofork --print-address --config-file=<config>`, stderr to `log`.
fn spawn_daemon(config: &Path, log: File) -> io::Result<Child> {
    Command::new(DBUS_DAEMON)
        .arg("--nofork")
        .arg("--print-address")
        .arg(format!("--config-file={}", config.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .map_err(|e| context(e, &format!("cannot run {DBUS_DAEMON}")))
}

/// Reads the first line of `out` on a thread; the receiver gets it (empty on EOF).
fn read_first_line(out: Option<ChildStdout>) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut line = String::new();
        if let Some(out) = out {
            // A read error leaves the line empty, which start() reports.
            let _ = BufReader::new(out).read_line(&mut line);
        }
        let _ = tx.send(line);
    });
    rx
}

/// The system-type config: Debian's default context, root's monitoring rule, the shipped
/// policy, and for [`Policy::Relaxed`] the final allow-all for sends to [`BUS_NAME`].
fn bus_config(socket: &Path, policy_file: &Path, policy: Policy) -> String {
    let socket = xml_escape(&socket.to_string_lossy());
    let policy_file = xml_escape(&policy_file.to_string_lossy());
    let relaxed = match policy {
        Policy::Shipped => String::new(),
        Policy::Relaxed => format!(
            "  <policy context=\"default\">\n    <allow send_destination=\"{BUS_NAME}\"/>\n  \
             </policy>\n"
        ),
        Policy::Unprivileged => format!(
            "  <policy context=\"default\">\n    <allow own=\"{BUS_NAME}\"/>\n    \
             <allow send_destination=\"{BUS_NAME}\"/>\n    <allow receive_sender=\"{BUS_NAME}\"/>\n  \
             </policy>\n"
        ),
    };
    format!(
        r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={socket}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <deny own="*"/>
    <deny send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_requested_reply="true" send_type="method_return"/>
    <allow send_requested_reply="true" send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
    <allow receive_type="signal"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus"/>
    <allow send_destination="org.freedesktop.DBus"
           send_interface="org.freedesktop.DBus.Introspectable"/>
    <allow send_destination="org.freedesktop.DBus"
           send_interface="org.freedesktop.DBus.Properties"/>
    <deny send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus"
          send_member="UpdateActivationEnvironment"/>
    <deny send_destination="org.freedesktop.DBus"
          send_interface="org.freedesktop.DBus.Debug.Stats"/>
  </policy>
  <policy user="root">
    <allow send_destination="org.freedesktop.DBus"
           send_interface="org.freedesktop.DBus.Monitoring"/>
  </policy>
  <include>{policy_file}</include>
{relaxed}</busconfig>
"#
    )
}

fn xml_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// `busctl --address=<bus address> <args...>` as `uid` (group `uid` too, which holds for
/// root, [`PLUGIN_UID`] and [`OTHER_UID`]), with [`CALL_TIMEOUT`].
///
/// # Errors
/// As [`run_as`].
pub fn busctl(bus: &PrivateBus, uid: u32, args: &[&str]) -> io::Result<RunOutput> {
    let address = format!("--address={}", bus.address);
    let mut all = vec![address.as_str()];
    all.extend_from_slice(args);
    run_as(uid, uid, BUSCTL, &all, CALL_TIMEOUT)
}

/// amd-gpud's root object (`ipc::ROOT_PATH`; the tests' library does not
/// link `ipc`).
pub const ROOT_PATH: &str = "/io/hami/AmdGpu1";

/// The loader check's interface on amd-gpud's root object.
pub const LOADER_INTERFACE: &str = "io.hami.AmdGpu1.Loader";

/// amd-gpud's `Loader.InspectImage(image)`, called with [`busctl`] as `uid`.
///
/// # Errors
/// As [`busctl`].
pub fn inspect_image(bus: &PrivateBus, uid: u32, image: &str) -> io::Result<RunOutput> {
    let args = [
        "call",
        BUS_NAME,
        ROOT_PATH,
        LOADER_INTERFACE,
        "InspectImage",
        "s",
        image,
    ];
    busctl(bus, uid, &args)
}

/// amd-gpud's `Loader.InspectContainer(image, command, args, working_dir,
/// path)`, called with [`busctl`] as `uid`.
///
/// # Errors
/// As [`busctl`].
pub fn inspect_container(
    bus: &PrivateBus,
    uid: u32,
    image: &str,
    command: &[&str],
    args: &[&str],
) -> io::Result<RunOutput> {
    let (n_command, n_args) = (command.len().to_string(), args.len().to_string());
    // `--`: arguments that start with `-` are the method's, not busctl's.
    let mut call = vec![
        "--",
        "call",
        BUS_NAME,
        ROOT_PATH,
        LOADER_INTERFACE,
        "InspectContainer",
        "sasasssb",
        image,
        &n_command,
    ];
    call.extend(command);
    call.push(&n_args);
    call.extend(args);
    call.extend(["", "", "false"]);
    busctl(bus, uid, &call)
}

fn context(err: io::Error, what: &str) -> io::Error {
    io::Error::new(err.kind(), format!("{what}: {err}"))
}

/// The log without lines known to be harmless: a system-type bus tries to raise its fd
/// limit, which fails without CAP_SYS_RESOURCE (containers).
pub fn unexpected_log_lines(log: &str) -> String {
    log.lines()
        .filter(|l| !l.contains("Failed to set fd limit"))
        .fold(String::new(), |mut acc, l| {
            let _ = writeln!(acc, "{l}");
            acc
        })
}

#[cfg(test)]
mod tests;
