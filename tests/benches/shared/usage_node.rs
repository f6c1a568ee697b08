//! The node both usage benches (`usage`, `usage_amdsmi`) read: KFD
//! processes of 110 pods on the builder's `mi300x-8-cpx` node, each in its
//! pod's container cgroup, with their `vram_<gpu_id>` files, each pod's
//! `dmem.current`, and each GPU's sysfs usage values.

use std::{
    fs,
    path::{Path, PathBuf},
    time::Duration,
};

use gpud::{
    HostPaths,
    testing::dmem::layout::{Driver, Layout},
    testing::usage::Targets,
};
use tests::fixture::{self, BuildOptions};

pub const PODS: usize = 110;
/// Timed rounds, each bench's floor and work interleaved.
pub const ROUNDS: usize = 41;
/// Rounds run first and not counted.
pub const WARMUP: usize = 3;
pub const MIB: u64 = 1 << 20;

pub fn write(path: &Path, text: &str) -> std::io::Result<()> {
    fs::create_dir_all(path.parent().unwrap_or(Path::new("/")))?;
    fs::write(path, text)
}

pub fn uid(i: usize) -> String {
    format!("00000000-0000-4000-8000-{i:012x}")
}

pub fn cid(i: usize) -> String {
    format!("{i:064x}")
}

/// KFD `gpu_id`s of the topology's GPU nodes.
fn gpu_ids(root: &Path) -> anyhow::Result<Vec<u64>> {
    let mut ids = Vec::new();
    for node in fs::read_dir(root.join("sys/class/kfd/kfd/topology/nodes"))? {
        let text = fs::read_to_string(node?.path().join("gpu_id"))?;
        let id: u64 = text.trim().parse()?;
        if id != 0 {
            ids.push(id);
        }
    }
    ids.sort_unstable();
    Ok(ids)
}

/// The node's processes, pods and GPU files; returns every file a read opens.
fn populate(root: &Path, ids: &[u64], bdfs: &[String]) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for i in 0..PODS {
        let pid = 10_000 + i;
        let pod = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
            uid(i).replace('-', "_")
        );
        let cgroup = root.join(format!("proc/{pid}/cgroup"));
        write(
            &cgroup,
            &format!("0::{pod}/cri-containerd-{}.scope\n", cid(i)),
        )?;
        files.push(cgroup);
        let dir = root.join(format!("sys/class/kfd/kfd/proc/{pid}"));
        for (n, id) in ids.iter().enumerate() {
            let bytes = if n == i % ids.len() {
                (i as u64 + 1) * MIB
            } else {
                0
            };
            let file = dir.join(format!("vram_{id}"));
            write(&file, &format!("{bytes}\n"))?;
            files.push(file);
        }
        let bdf = &bdfs[i % bdfs.len()];
        let dmem = root.join(format!("sys/fs/cgroup{pod}/dmem.current"));
        write(&dmem, &format!("drm/{bdf}/vram {}\n", (i as u64 + 1) * MIB))?;
        files.push(dmem);
    }
    for bdf in bdfs {
        let dir = root.join(format!("sys/bus/pci/devices/{bdf}"));
        for (name, value) in [
            ("mem_info_vram_used", "1073741824"),
            ("gpu_busy_percent", "42"),
            ("hwmon/hwmon0/temp1_input", "45000"),
            ("hwmon/hwmon0/power1_average", "250000000"),
        ] {
            write(&dir.join(name), &format!("{value}\n"))?;
            files.push(dir.join(name));
        }
    }
    Ok(files)
}

/// The builder's `mi300x-8-cpx` node under a scratch root, with the 110
/// pods' files, and what `gpud::testing::usage::read` needs to read it.
pub struct Node {
    root: tempfile::TempDir,
    /// Every file a read opens.
    pub files: Vec<PathBuf>,
    pub paths: HostPaths,
    pub layouts: Vec<Layout>,
    /// The 8 GPUs' PCI addresses and the 64 partitions' KFD gpu_ids, in
    /// order.
    pub targets: Targets,
}

impl Node {
    /// The node's host root.
    #[allow(dead_code, reason = "the usage bench only keeps the root alive")]
    pub fn root(&self) -> &Path {
        self.root.path()
    }

    /// Builds the node; `amdsmi_abi` adds the fake AMD SMI's fixture.
    pub fn build(amdsmi_abi: Option<&str>) -> anyhow::Result<Self> {
        let root = fixture::scratch_dir()?;
        let spec = fixture::named("mi300x-8-cpx").ok_or_else(|| anyhow::anyhow!("no fixture"))?;
        let opts = BuildOptions {
            drm: true,
            amdsmi_abi: amdsmi_abi.map(str::to_owned),
        };
        fixture::build(&spec, root.path(), &opts)?;
        let bdfs: Vec<String> = spec.gpus.iter().map(|g| g.bdf()).collect();
        let ids = gpu_ids(root.path())?;
        anyhow::ensure!(ids.len() == 64, "{} KFD GPUs", ids.len());
        let files = populate(root.path(), &ids, &bdfs)?;
        let targets = Targets {
            gpus: bdfs,
            gpu_ids: ids,
        };
        Ok(Self {
            paths: HostPaths::under(root.path()),
            layouts: vec![Layout::new(Driver::Systemd, "/")?],
            root,
            files,
            targets,
        })
    }
}

/// A floor and the work measured against it, round by round.
pub struct Samples {
    floor: Vec<Duration>,
    work: Vec<Duration>,
}

impl Samples {
    pub fn new() -> Self {
        Self {
            floor: Vec::new(),
            work: Vec::new(),
        }
    }

    /// Keeps round `round`'s times unless it is a warm-up round.
    pub fn push(&mut self, round: usize, floor: Duration, work: Duration) {
        if round >= WARMUP {
            self.floor.push(floor);
            self.work.push(work);
        }
    }

    /// Prints the floor's row, the work's and the ratio of their medians.
    pub fn row(mut self, floor: &str, work: &str) {
        self.floor.sort_unstable();
        self.work.sort_unstable();
        let median = |v: &[Duration]| v[v.len() / 2];
        let p90 = |v: &[Duration]| v[v.len() * 9 / 10];
        let (f, w) = (median(&self.floor), median(&self.work));
        println!("| floor: {floor} | {} | {} |", ms(f), ms(p90(&self.floor)));
        println!("| {work} | {} | {} |", ms(w), ms(p90(&self.work)));
        println!(
            "| ratio of medians | {:.2} | |",
            w.as_secs_f64() / f.as_secs_f64()
        );
    }
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}
