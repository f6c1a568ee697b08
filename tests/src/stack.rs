//! Starting the real processes of the stack for cross-process tests and
//! benchmarks: amd-gpud on a private bus, amd-device-plugin next to a fake
//! kubelet. Each process is killed and reaped when its guard drops.

use std::{
    ffi::OsStr,
    io,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::bus::{self, PrivateBus};

/// A child process killed and reaped on drop.
#[derive(Debug)]
pub struct Process(pub Child);

impl Process {
    /// Waits at most `limit` for the process to exit by itself.
    pub fn wait_exit(&mut self, limit: Duration) -> io::Result<std::process::ExitStatus> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.0.try_wait()? {
                return Ok(status);
            }
            if start.elapsed() > limit {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no exit within {limit:?}"),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the process now (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `fake-node gpud serve` (amd-gpud) on `bus` for the host root `root`,
/// without AMD SMI, re-reading the inventory every `rescan` seconds (0: only
/// on Rescan). Returns once the name is owned.
///
/// # Errors
/// When it cannot start or does not take its name within 20 s.
pub fn gpud(fake_node: &Path, bus: &PrivateBus, root: &Path, rescan: u64) -> io::Result<Process> {
    gpud_with(fake_node, bus, root, rescan, &[])
}

/// As [`gpud`], with `extra` arguments after `serve` (e.g. `--dmem-any-fs`).
///
/// # Errors
/// When it cannot start or does not take its name within 20 s.
pub fn gpud_with(
    fake_node: &Path,
    bus: &PrivateBus,
    root: &Path,
    rescan: u64,
    extra: &[&str],
) -> io::Result<Process> {
    let mut cmd = gpud_command(fake_node, bus, root, rescan);
    cmd.args(["--amdsmi", "none"]).args(extra);
    start_gpud(cmd, bus)
}

/// As [`gpud`], reading the fake AMD SMI `library` with its JSON `fixture`.
///
/// # Errors
/// When it cannot start or does not take its name within 20 s.
pub fn gpud_with_amdsmi(
    fake_node: &Path,
    bus: &PrivateBus,
    root: &Path,
    library: &Path,
    fixture: &Path,
) -> io::Result<Process> {
    gpud_with_amdsmi_and(fake_node, bus, root, (library, fixture), &[])
}

/// As [`gpud_with_amdsmi`] (`amdsmi` is the library and its fixture), with
/// `extra` arguments after `serve`.
///
/// # Errors
/// When it cannot start or does not take its name within 20 s.
pub fn gpud_with_amdsmi_and(
    fake_node: &Path,
    bus: &PrivateBus,
    root: &Path,
    amdsmi: (&Path, &Path),
    extra: &[&str],
) -> io::Result<Process> {
    let mut cmd = gpud_command(fake_node, bus, root, 0);
    cmd.arg("--amdsmi")
        .arg(amdsmi.0)
        .env("FAKE_AMDSMI_FIXTURE", amdsmi.1)
        .args(extra);
    start_gpud(cmd, bus)
}

fn gpud_command(fake_node: &Path, bus: &PrivateBus, root: &Path, rescan: u64) -> Command {
    let mut cmd = Command::new(fake_node);
    cmd.args(["gpud", "--log", "info", "serve", "--bus-address"])
        .arg(&bus.address)
        .arg("--host-root")
        .arg(root)
        .arg("--rescan-interval")
        .arg(rescan.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    cmd
}

/// Spawns `cmd` and returns once amd-gpud owns its name on `bus`.
fn start_gpud(mut cmd: Command, bus: &PrivateBus) -> io::Result<Process> {
    let mut process = Process(cmd.spawn()?);
    let start = Instant::now();
    while !name_has_owner(bus)? {
        if let Some(status) = process.0.try_wait()? {
            return Err(io::Error::other(format!("amd-gpud exited early: {status}")));
        }
        if start.elapsed() > Duration::from_secs(20) {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "amd-gpud did not take its name",
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(process)
}

/// Whether `io.hami.AmdGpu1` has an owner on `bus`.
///
/// # Errors
/// When busctl cannot be run.
pub fn name_has_owner(bus: &PrivateBus) -> io::Result<bool> {
    let out = bus::busctl(
        bus,
        0,
        &[
            "call",
            "org.freedesktop.DBus",
            "/org/freedesktop/DBus",
            "org.freedesktop.DBus",
            "NameHasOwner",
            "s",
            bus::BUS_NAME,
        ],
    )?;
    Ok(out.stdout.trim() == "b true")
}

/// `fake-node plugin` (amd-device-plugin) against `kubelet_dir` and `bus`,
/// without the Kubernetes API unless `extra` passes `--kube`, and without the
/// metrics and probe listeners unless `extra` passes `--metrics-address` or
/// `--probe-address` (plugins running side by side would fight over the
/// default ports).
///
/// # Errors
/// When it cannot be spawned.
pub fn plugin<I, S>(
    fake_node: &Path,
    bus: &PrivateBus,
    kubelet_dir: &Path,
    extra: I,
) -> io::Result<Process>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let child = Command::new(fake_node)
        // No Kubernetes API unless `extra` names one (the flag wins over the env twin).
        .env("AMDGPU_DP_KUBE", "none")
        .env("AMDGPU_DP_METRICS_ADDRESS", "none")
        .env("AMDGPU_DP_PROBE_ADDRESS", "none")
        .args(["plugin", "--bus-address"])
        .arg(&bus.address)
        .arg("--kubelet-dir")
        .arg(kubelet_dir)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()?;
    Ok(Process(child))
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
///
/// # Errors
/// When no port can be bound.
pub fn free_port() -> io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// One HTTP/1.1 GET of `path` on `address`: the status code and the body.
///
/// # Errors
/// When the connection fails or the answer is not HTTP.
pub fn http_get(address: std::net::SocketAddr, path: &str) -> io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&address, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    let bad = || io::Error::other(format!("not an HTTP answer: {answer:?}"));
    let (head, body) = answer.split_once("\r\n\r\n").ok_or_else(bad)?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(bad)?;
    Ok((status, body.to_owned()))
}

/// Reads a property of the node object (as root, with busctl): the value
/// part of busctl's answer, e.g. `42` for `t 42`.
///
/// # Errors
/// When the call fails.
pub fn node_property(bus: &PrivateBus, name: &str) -> io::Result<String> {
    let out = bus::busctl(
        bus,
        0,
        &[
            "get-property",
            bus::BUS_NAME,
            "/io/hami/AmdGpu1",
            "io.hami.AmdGpu1.Node",
            name,
        ],
    )?;
    if !out.success() {
        return Err(io::Error::other(format!("reading {name}: {}", out.stderr)));
    }
    let value = out.stdout.trim();
    Ok(value.split_once(' ').map_or(value, |(_, v)| v).to_owned())
}

/// Asks amd-gpud to read the inventory again now (as root, with busctl).
///
/// # Errors
/// When the call fails.
pub fn rescan(bus: &PrivateBus) -> io::Result<()> {
    let out = bus::busctl(
        bus,
        0,
        &[
            "call",
            bus::BUS_NAME,
            "/io/hami/AmdGpu1",
            "io.hami.AmdGpu1.Node",
            "Rescan",
        ],
    )?;
    if out.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!("Rescan failed: {}", out.stderr)))
    }
}

/// A builder fixture served by amd-gpud on a private bus with the shipped
/// policy, as the benchmarks start it; dropped together.
pub struct BenchNode {
    pub root: tempfile::TempDir,
    pub bus: PrivateBus,
    pub gpud: Process,
}

/// Builds fixture `name` (DRM, no AMD SMI) on tmpfs and serves it with
/// `fake_node gpud serve` and `gpud_args` (needs root: the shipped policy).
///
/// # Errors
/// When the plugin user, the fixture, the bus or amd-gpud cannot be had.
pub fn bench_node(fake_node: &Path, name: &str, gpud_args: &[&str]) -> io::Result<BenchNode> {
    crate::bus::ensure_plugin_user()?;
    let root = crate::fixture::scratch_dir()?;
    let spec = crate::fixture::named(name)
        .ok_or_else(|| io::Error::other(format!("no fixture named {name}")))?;
    let options = crate::fixture::BuildOptions {
        drm: true,
        amdsmi_abi: None,
    };
    crate::fixture::build(&spec, root.path(), &options)?;
    let bus = PrivateBus::start(crate::bus::Policy::Shipped)?;
    let gpud = gpud_with(fake_node, &bus, root.path(), 0, gpud_args)?;
    Ok(BenchNode { root, bus, gpud })
}
