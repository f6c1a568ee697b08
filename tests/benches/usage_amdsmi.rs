//! What AMD SMI adds to a `GetUsage` read (issue 23, scope item 2), each
//! figure against its floor in the same run, on the builder's `mi300x-8-cpx`
//! node (8 GPUs, 64 KFD partitions) with the fake AMD SMI library answering
//! every GPU's activity and VRAM used:
//!
//! 110 pods' KFD processes are on it, as in the `usage` bench (7,292
//! files), so the reads are those of a busy node.
//!
//! - a read as `GetUsage` does it with AMD SMI on: the `amdsmi-probe --usage`
//!   child started on a thread of its own beside `gpud::testing::usage::read`, both
//!   waited for, against the floor of the sysfs read alone (what `GetUsage`
//!   costs with `--amdsmi none`);
//! - the child alone against the floor of the same child that loads no
//!   library (spawn, exec, argument parsing, one failed `dlopen`, its JSON
//!   answer and the parent's decoding: the fixed cost of a process).
//!
//! The fake library stands in for `libamd_smi.so`: the real one's
//! `amdsmi_init` walks the devices and costs more, so the second ratio is
//! a lower bound for a real node. Run: `cargo bench -p tests --bench
//! usage_amdsmi`. Prints a Markdown table for docs/benchmarks.md.

use std::{
    ffi::OsString,
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use gpud::{
    testing::amdsmi::{self, AmdSmiConfig, LibrarySource, report::GpuUsage},
    testing::usage,
};
use serde_json::Value;
use tests::fixture;

#[path = "shared/usage_node.rs"]
mod usage_node;
use usage_node::{Node, PODS, ROUNDS, Samples, WARMUP};

/// `GetUsage`'s limit on the child (`gpud::testing::usage::amdsmi::PROBE_TIMEOUT`).
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
const GPUS: usize = 8;

/// Gives every processor of the fake library's fixture usage figures.
fn add_figures(fixture: &Path) -> anyhow::Result<()> {
    let mut smi: Value = serde_json::from_slice(&fs::read(fixture)?)?;
    let sockets = smi["sockets"]
        .as_array_mut()
        .ok_or_else(|| anyhow::anyhow!("{}: no sockets", fixture.display()))?;
    for (n, socket) in sockets.iter_mut().enumerate() {
        for p in socket["processors"].as_array_mut().into_iter().flatten() {
            p["gfx_activity"] = (10 + n).into();
            p["umc_activity"] = 3.into();
            p["vram_used_mib"] = (1000 * (n + 1)).into();
        }
    }
    fs::write(fixture, serde_json::to_vec_pretty(&smi)?)?;
    Ok(())
}

fn config(library: PathBuf, fixture: &Path) -> AmdSmiConfig {
    AmdSmiConfig {
        library: LibrarySource::Path(library),
        helper: vec![env!("CARGO_BIN_EXE_fake-node").into()],
        timeout: PROBE_TIMEOUT,
        child_env: vec![(
            OsString::from("FAKE_AMDSMI_FIXTURE"),
            fixture.as_os_str().to_owned(),
        )],
    }
}

/// The figures the child reported for some GPU, or why there are none.
fn probe(cfg: &AmdSmiConfig) -> anyhow::Result<Vec<GpuUsage>> {
    let list = amdsmi::gpu_usage(cfg, PROBE_TIMEOUT)?;
    let with = list
        .iter()
        .filter(|g| g.vram_used_bytes.is_some() && g.gfx_activity_percent.is_some())
        .count();
    anyhow::ensure!(with == GPUS, "{with} GPUs with figures: {list:?}");
    Ok(list)
}

/// The child that loads no library: it must fail, having loaded nothing.
fn probe_nothing(cfg: &AmdSmiConfig) -> anyhow::Result<()> {
    match amdsmi::gpu_usage(cfg, PROBE_TIMEOUT) {
        Err(amdsmi::AmdSmiError::Load { .. }) => Ok(()),
        other => anyhow::bail!("the library-less child answered {other:?}"),
    }
}

fn timed<T>(f: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<(Duration, T)> {
    let t = Instant::now();
    let value = f()?;
    Ok((t.elapsed(), value))
}

fn main() -> anyhow::Result<()> {
    let node = Node::build(Some("7.0"))?;
    let smi_fixture = node.root().join(fixture::FIXTURE_FILE);
    add_figures(&smi_fixture)?;
    let library = tests::fake_amdsmi::try_library_for("7.0").map_err(anyhow::Error::msg)?;
    let with_smi = config(library.to_owned(), &smi_fixture);
    let no_library = config(node.root().join("no-such/libamd_smi.so"), &smi_fixture);
    let Node {
        files,
        paths,
        layouts,
        targets,
        ..
    } = &node;
    let sysfs = || Ok(usage::read(paths, layouts, targets));
    let (mut read, mut child) = (Samples::new(), Samples::new());
    for round in 0..ROUNDS + WARMUP {
        let (alone, _) = timed(sysfs)?;
        let (both, ()) = timed(|| {
            std::thread::scope(|s| {
                let child = s.spawn(|| probe(&with_smi));
                let reading = usage::read(paths, layouts, targets);
                let pods = reading.usage.containers.len();
                anyhow::ensure!(
                    pods == PODS && reading.usage.gpus.len() == GPUS,
                    "{pods} pods"
                );
                child
                    .join()
                    .map_err(|_| anyhow::anyhow!("the probe thread panicked"))?
                    .map(drop)
            })
        })?;
        read.push(round, alone, both);
        let (empty, ()) = timed(|| probe_nothing(&no_library))?;
        let (full, _) = timed(|| probe(&with_smi))?;
        child.push(round, empty, full);
    }
    println!(
        "| measure (mi300x-8-cpx: 8 GPUs, 64 partitions, {PODS} pods, {} files; fake AMD SMI; {ROUNDS} interleaved rounds) | median | p90 |",
        files.len()
    );
    println!("|---|---|---|");
    read.row(
        "`usage::read` alone (GetUsage with `--amdsmi none`)",
        "`usage::read` beside the `amdsmi-probe --usage` child (GetUsage with AMD SMI)",
    );
    child.row(
        "the child loading no library (spawn, exec, JSON)",
        "the child with AMD SMI's usage calls for 8 GPUs",
    );
    Ok(())
}
