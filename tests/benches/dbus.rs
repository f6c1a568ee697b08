//! D-Bus benchmark: reading one GPU's properties through the `ipc` proxy
//! (one `GetAll`) against a `org.freedesktop.DBus.Peer.Ping` round trip to the
//! same daemon on the same bus, interleaved in one run; then the daemon's
//! idle RSS and the CPU time it uses while idle, on the 64-partition MI300X
//! CPX fixture. amd-gpud runs with the environment its systemd unit gives
//! it; `BENCH_AMD_GPUD` names another build to measure instead.
//!
//! Run (as root: the private bus loads the shipped policy):
//! `cargo bench -p tests --bench dbus`. Prints a Markdown table for
//! docs/benchmarks.md.

use std::{
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use tests::{
    bus::{self, Policy, PrivateBus},
    fixture::{self, BuildOptions},
};

const ROUNDS: usize = 2000;
const IDLE: Duration = Duration::from_secs(10);

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn main() -> anyhow::Result<()> {
    bus::ensure_plugin_user()?;
    let gpud = tests::release::amd_gpud()?;
    let root = fixture::scratch_dir()?;
    let spec = fixture::named("mi300x-8-cpx").ok_or_else(|| anyhow::anyhow!("no fixture"))?;
    fixture::build(
        &spec,
        root.path(),
        &BuildOptions {
            drm: true,
            amdsmi_abi: None,
        },
    )?;
    let bus = PrivateBus::start(Policy::Shipped)?;
    let daemon = Daemon(
        Command::new(&gpud)
            .args([
                "serve",
                "--amdsmi",
                "none",
                "--bus-address",
                &bus.address,
                "--host-root",
            ])
            .arg(root.path())
            // As systemd starts it: the unit's Environment= (one malloc
            // arena, docs/benchmarks.md).
            .envs(tests::release::unit_environment()?)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?,
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (ping, read) = rt.block_on(round_trips(&bus))?;
    let pid = daemon.0.id();
    let (rss_kib, hwm_kib) = memory(pid)?;
    let before = cpu_ticks(pid)?;
    std::thread::sleep(IDLE);
    let idle_ticks = cpu_ticks(pid)? - before;
    let (rss_after, _) = memory(pid)?;
    println!(
        "| measure (mi300x-8-cpx: 8 GPUs, 64 partitions; {ROUNDS} interleaved rounds) | median | p99 |"
    );
    println!("|---|---|---|");
    println!(
        "| floor: `Peer.Ping` round trip to amd-gpud | {} | {} |",
        us(ping.0),
        us(ping.1)
    );
    println!(
        "| `ipc::proxy::read_gpu` (one GetAll, {} properties) | {} | {} |",
        ipc::types::GpuInfo::PROPERTY_NAMES.len(),
        us(read.0),
        us(read.1)
    );
    println!(
        "| ratio of medians (target <= 2.0) | {:.2} | |",
        read.0.as_secs_f64() / ping.0.as_secs_f64()
    );
    println!(
        "| amd-gpud RSS after the run / peak (target <= 8 MiB) | {} / {} | |",
        mib(rss_kib),
        mib(hwm_kib)
    );
    println!(
        "| amd-gpud RSS after {}s idle | {} | |",
        IDLE.as_secs(),
        mib(rss_after)
    );
    println!(
        "| CPU time used in {}s idle (clock ticks of 10 ms) | {idle_ticks} | |",
        IDLE.as_secs()
    );
    Ok(())
}

type Stats = (Duration, Duration);

async fn round_trips(bus: &PrivateBus) -> anyhow::Result<(Stats, Stats)> {
    let conn = zbus::connection::Builder::address(bus.address.as_str())?
        .build()
        .await?;
    let dbus = zbus::fdo::DBusProxy::new(&conn).await?;
    let start = Instant::now();
    while !dbus.name_has_owner(ipc::BUS_NAME.try_into()?).await? {
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(30),
            "amd-gpud did not start"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let peer = zbus::fdo::PeerProxy::builder(&conn)
        .destination(ipc::BUS_NAME)?
        .path(ipc::ROOT_PATH)?
        .build()
        .await?;
    let path = ipc::gpu_path("0000:05:00.0");
    let (mut ping, mut read) = (Vec::with_capacity(ROUNDS), Vec::with_capacity(ROUNDS));
    for round in 0..ROUNDS + 100 {
        let t = Instant::now();
        peer.ping().await?;
        let p = t.elapsed();
        let t = Instant::now();
        let gpu = ipc::proxy::read_gpu(&conn, &path.as_ref()).await?;
        let r = t.elapsed();
        anyhow::ensure!(gpu.partitions.len() == 8, "unexpected GPU: {gpu:?}");
        if round >= 100 {
            ping.push(p);
            read.push(r);
        }
    }
    Ok((stats(&mut ping), stats(&mut read)))
}

fn stats(v: &mut [Duration]) -> Stats {
    v.sort_unstable();
    (v[v.len() / 2], v[v.len() * 99 / 100])
}

/// VmRSS and VmHWM of `pid`, KiB.
fn memory(pid: u32) -> anyhow::Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| anyhow::anyhow!("no {name} in /proc/{pid}/status"))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the parenthesised command name; utime and stime are 14 and 15.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let get = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok());
    match (get(11), get(12)) {
        (Some(u), Some(s)) => Ok(u + s),
        _ => anyhow::bail!("cannot parse /proc/{pid}/stat"),
    }
}

fn us(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

#[allow(clippy::cast_precision_loss)] // display only
fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}
