//! Time from starting amd-device-plugin to kubelet's first ListAndWatch
//! answer, on the 8 x MI300X fixture (80 devices), with amd-gpud already on a
//! private bus; next to two floors from the same run: starting the same
//! binary to print its version, and reading all 8 GPUs over D-Bus from a
//! fresh connection (what the plugin must do before it can answer).
//!
//! Run (as root: the private bus loads the shipped policy):
//! `cargo bench -p tests --bench plugin_start`.

use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use tests::{bus::PrivateBus, kubelet::FakeKubelet, stack};

const ROUNDS: usize = 21;

fn main() -> anyhow::Result<()> {
    let fake_node = Path::new(env!("CARGO_BIN_EXE_fake-node"));
    let node = stack::bench_node(fake_node, "mi300x-8-spx", &[])?;
    let bus = &node.bus;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let (mut start, mut exec, mut read) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        start.push(rt.block_on(first_answer(fake_node, bus))?);
        let t = Instant::now();
        let status = Command::new(fake_node)
            .args(["plugin", "--version"])
            .output()?
            .status;
        anyhow::ensure!(status.success(), "plugin --version failed");
        exec.push(t.elapsed());
        read.push(rt.block_on(read_inventory(bus))?);
    }
    println!("| measure (mi300x-8-spx, 80 devices, {ROUNDS} rounds) | median | max |");
    println!("|---|---|---|");
    for (name, times) in [
        ("floor: start the binary for `--version`", &mut exec),
        ("floor: connect and read 8 GPUs over D-Bus", &mut read),
        ("plugin start to first ListAndWatch answer", &mut start),
    ] {
        times.sort_unstable();
        let median = times[times.len() / 2];
        let max = times[times.len() - 1];
        println!("| {name} | {} | {} |", ms(median), ms(max));
    }
    Ok(())
}

async fn first_answer(fake_node: &Path, bus: &PrivateBus) -> anyhow::Result<Duration> {
    let kubelet = FakeKubelet::start().await?;
    let t = Instant::now();
    let _plugin = stack::plugin(fake_node, bus, kubelet.dir(), ["--log", "warn"])?;
    kubelet
        .wait_devices(Duration::from_secs(30), |d| d.len() == 80)
        .await
        .map_err(anyhow::Error::msg)?;
    let took = t.elapsed();
    kubelet.stop().await;
    Ok(took)
}

async fn read_inventory(bus: &PrivateBus) -> anyhow::Result<Duration> {
    let t = Instant::now();
    let conn = zbus::connection::Builder::address(bus.address.as_str())?
        .build()
        .await?;
    let node = ipc::proxy::NodeProxy::builder(&conn)
        .cache_properties(zbus::proxy::CacheProperties::No)
        .build()
        .await?;
    for path in node.gpus().await? {
        ipc::proxy::read_gpu(&conn, &path.as_ref()).await?;
    }
    Ok(t.elapsed())
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}
