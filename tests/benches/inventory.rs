//! Inventory benchmark: `gpud::testing::inventory::discover` on the MI300X CPX capture
//! (64 GPU nodes, about 4,100 files) against its floor, opening and reading
//! each of the same files once, measured interleaved in one run; then the peak
//! RSS of a release `amd-gpud inspect` on the same tree.
//!
//! Run: `cargo bench -p tests --bench inventory`. Prints a Markdown table for
//! docs/benchmarks.md. Without the captures folder beside the clone the builder's
//! `mi300x-8-cpx` stands in for the capture (the table says which was used).

use std::{
    fs,
    io::Read,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use gpud::HostPaths;
use tests::fixture;

const ROUNDS: usize = 41;

fn main() -> anyhow::Result<()> {
    if let Some(gpud) = std::env::var_os(RSS_CHILD) {
        return rss_child(Path::new(&gpud));
    }
    let dir = fixture::scratch_dir()?;
    let (source, paths) = host_root(dir.path())?;
    let files = every_file(&paths.kfd_topology())?;
    let mut floor = Vec::with_capacity(ROUNDS);
    let mut inventory = Vec::with_capacity(ROUNDS);
    let mut buf = Vec::with_capacity(8192);
    for round in 0..ROUNDS + 3 {
        let t = Instant::now();
        read_each(&files, &mut buf)?;
        let f = t.elapsed();
        let t = Instant::now();
        let inv = gpud::testing::inventory::discover(&paths, None)?;
        let i = t.elapsed();
        assert!(!inv.gpus.is_empty(), "no GPU in the benchmark tree");
        if round >= 3 {
            floor.push(f);
            inventory.push(i);
        }
    }
    let (f50, i50) = (median(&mut floor), median(&mut inventory));
    println!(
        "| measure ({source}, {} files, {ROUNDS} interleaved rounds) | median | p90 |",
        files.len()
    );
    println!("|---|---|---|");
    println!(
        "| floor: open + read each file once | {} | {} |",
        ms(f50),
        ms(p90(&floor))
    );
    println!(
        "| `inventory::discover` (sysfs only) | {} | {} |",
        ms(i50),
        ms(p90(&inventory))
    );
    println!(
        "| ratio of medians (target <= 3.0) | {:.2} | |",
        i50.as_secs_f64() / f50.as_secs_f64()
    );
    let rss = peak_rss_of_inspect(dir.path())?;
    println!(
        "| `amd-gpud inspect --json` peak RSS (release, target <= 10 MiB) | {:.1} MiB | |",
        rss
    );
    Ok(())
}

/// A host root around the MI300X CPX capture, or the builder's stand-in.
fn host_root(dir: &Path) -> anyhow::Result<(String, HostPaths)> {
    let capture = fixture::captures_dir().join("mi300x-8gpu-cpx");
    if capture.is_dir() {
        fixture::link_capture(&capture.canonicalize()?, dir)?;
        return Ok(("MI300X CPX capture".into(), HostPaths::under(dir)));
    }
    let spec = fixture::named("mi300x-8-cpx").ok_or_else(|| anyhow::anyhow!("no mi300x-8-cpx"))?;
    let opts = fixture::BuildOptions {
        drm: false,
        amdsmi_abi: None,
    };
    fixture::build(&spec, dir, &opts)?;
    Ok(("builder mi300x-8-cpx".into(), HostPaths::under(dir)))
}

fn every_file(root: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![root.canonicalize()?];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir)? {
            let entry = entry?;
            let kind = entry.file_type()?;
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_file() {
                out.push(entry.path());
            }
        }
    }
    Ok(out)
}

fn read_each(files: &[PathBuf], buf: &mut Vec<u8>) -> std::io::Result<()> {
    for file in files {
        buf.clear();
        fs::File::open(file)?.read_to_end(buf)?;
    }
    Ok(())
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort_unstable();
    v[v.len() / 2]
}

fn p90(sorted: &[Duration]) -> Duration {
    sorted[sorted.len() * 9 / 10]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// Builds a release amd-gpud (own target dir) and returns the peak RSS in MiB
/// of `amd-gpud inspect --json --amdsmi none` on the tree under `root`.
fn peak_rss_of_inspect(root: &Path) -> anyhow::Result<f64> {
    let gpud = tests::release::amd_gpud()?;
    // ru_maxrss of RUSAGE_CHILDREN covers every child ever waited for, the
    // cargo build above included; so a fresh copy of this binary runs the
    // inspection as its only child and reports that.
    let output = Command::new(std::env::current_exe()?)
        .env(RSS_CHILD, &gpud)
        .arg(root)
        .output()?;
    anyhow::ensure!(
        output.status.success(),
        "inspect failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let kib: f64 = String::from_utf8_lossy(&output.stdout).trim().parse()?;
    Ok(kib / 1024.0)
}

const RSS_CHILD: &str = "BENCH_INSPECT_RSS_OF";

/// In the re-executed copy: run `amd-gpud inspect` on the root in argv[1] and
/// print its peak RSS in KiB.
fn rss_child(gpud: &Path) -> anyhow::Result<()> {
    let root = std::env::args_os()
        .nth(1)
        .ok_or_else(|| anyhow::anyhow!("no root"))?;
    let output = Command::new(gpud)
        .args(["inspect", "--json", "--amdsmi", "none", "--host-root"])
        .arg(root)
        .output()?;
    anyhow::ensure!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)?;
    println!("{}", usage.max_rss());
    Ok(())
}
