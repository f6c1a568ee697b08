use std::path::Path;

use super::*;

const POD: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
const CID: &str = "4e5d6c7b8a9f0e1d2c3b4a5f6e7d8c9b0a1f2e3d4c5b6a7f8e9d0c1b2a3f4e5d";

fn write(path: &Path, text: &str) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
}

fn process(paths: &HostPaths, pid: u32, cgroup: &str, vram: &[(u64, u64)]) {
    write(
        &paths.proc.join(pid.to_string()).join("cgroup"),
        &format!("0::{cgroup}\n"),
    );
    let dir = paths.kfd_proc().join(pid.to_string());
    fs::create_dir_all(&dir).unwrap();
    for (gpu_id, bytes) in vram {
        write(&dir.join(format!("vram_{gpu_id}")), &format!("{bytes}\n"));
    }
}

fn systemd() -> Vec<Layout> {
    vec![Layout::new(Driver::Systemd, "/").unwrap()]
}

#[test]
fn vram_is_summed_per_container_and_gpu_and_outsiders_are_left_out() {
    let tmp = tempfile::tempdir().unwrap();
    let paths = HostPaths::under(tmp.path());
    let u = POD.replace('-', "_");
    let pod = format!("/kubepods.slice/kubepods-pod{u}.slice");
    let container = format!("{pod}/cri-containerd-{CID}.scope");
    process(&paths, 100, &container, &[(7, 1000), (9, 0)]);
    process(&paths, 101, &container, &[(7, 24), (9, 5)]);
    // A service holding VRAM is no pod's, whatever its VRAM.
    process(&paths, 200, "/system.slice/ollama.service", &[(7, 1 << 30)]);
    // A look-alike outside kubepods neither.
    process(&paths, 201, &format!("/system.slice{pod}/x"), &[(7, 1)]);
    write(
        &paths.cgroup.join(&pod[1..]).join("dmem.current"),
        "drm/0000:05:00.0/vram 1024\n",
    );
    write(
        &paths.pci_device("0000:05:00.0").join("mem_info_vram_used"),
        "4096\n",
    );
    let targets = Targets {
        gpus: vec!["0000:05:00.0".to_owned()],
        gpu_ids: vec![7, 9],
    };
    let got = read(&paths, &systemd(), &targets);
    assert_eq!(got.outside, 2);
    let c = &got.usage.containers;
    assert_eq!(c.len(), 2, "{c:?}");
    assert_eq!(
        (c[0].pod_uid.as_str(), c[0].container_id.as_str()),
        (POD, CID)
    );
    assert_eq!((c[0].gpu_id, c[0].processes, c[0].vram_bytes), (7, 2, 1024));
    assert_eq!((c[1].gpu_id, c[1].processes, c[1].vram_bytes), (9, 1, 5));
    assert_eq!(got.usage.dmem.len(), 1);
    assert_eq!(got.usage.dmem[0].current_bytes, 1024);
    assert_eq!(got.usage.gpus[0].vram_used_bytes, 4096);
}

#[test]
fn a_process_that_ended_is_gone_and_odd_entries_are_skipped() {
    let tmp = tempfile::tempdir().unwrap();
    let paths = HostPaths::under(tmp.path());
    let cgroup = format!(
        "/kubepods.slice/kubepods-pod{}.slice",
        POD.replace('-', "_")
    );
    process(&paths, 100, &cgroup, &[(7, 10)]);
    fs::create_dir_all(paths.kfd_proc().join("not-a-pid")).unwrap();
    // No /proc entry: the process is gone (or hidden): never attributed.
    fs::create_dir_all(paths.kfd_proc().join("300")).unwrap();
    write(&paths.kfd_proc().join("300/vram_7"), "99\n");
    let targets = Targets {
        gpus: Vec::new(),
        gpu_ids: vec![7],
    };
    let got = read(&paths, &systemd(), &targets);
    assert_eq!(got.usage.containers.len(), 1);
    assert_eq!(got.usage.containers[0].container_id, "");
    assert_eq!(got.outside, 1);
    fs::remove_dir_all(paths.kfd_proc().join("100")).unwrap();
    assert!(
        read(&paths, &systemd(), &targets)
            .usage
            .containers
            .is_empty()
    );
}

#[test]
fn layouts_follow_the_kubelet_config() {
    let tmp = tempfile::tempdir().unwrap();
    let paths = HostPaths::under(tmp.path());
    assert_eq!(layouts(&paths, &DmemConfig::default()).len(), 2);
    write(
        &paths.kubelet_config(),
        "cgroupDriver: cgroupfs\ncgroupRoot: /k\n",
    );
    let got = layouts(&paths, &DmemConfig::default());
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].kubepods(), PathBuf::from("k/kubepods"));
}

fn occupancy(paths: &HostPaths, pid: u32, gpu_id: u64, text: &str) {
    let dir = paths.kfd_proc().join(pid.to_string());
    write(&dir.join(format!("stats_{gpu_id}/cu_occupancy")), text);
}

#[test]
fn occupied_cus_are_summed_per_container_where_the_kernel_counts_them() {
    let tmp = tempfile::tempdir().unwrap();
    let paths = HostPaths::under(tmp.path());
    let u = POD.replace('-', "_");
    let pod = format!("/kubepods.slice/kubepods-pod{u}.slice");
    let container = format!("{pod}/cri-containerd-{CID}.scope");
    process(&paths, 100, &container, &[(7, 1000), (9, 10), (11, 10)]);
    process(&paths, 101, &container, &[(7, 24), (9, 0)]);
    occupancy(&paths, 100, 7, "30\n");
    occupancy(&paths, 101, 7, "12\n");
    // No VRAM on gpu 9 for 101: its counter is not read.
    occupancy(&paths, 101, 9, "99\n");
    occupancy(&paths, 100, 9, "0\n");
    // Gpu 11 has no counter (an older kernel): no entry, not zero.
    // A service's waves are no pod's.
    process(&paths, 200, "/system.slice/x.service", &[(7, 1)]);
    occupancy(&paths, 200, 7, "80\n");
    let targets = Targets {
        gpus: Vec::new(),
        gpu_ids: vec![7, 9, 11],
    };
    let got = read(&paths, &systemd(), &targets).usage.compute;
    let seen: Vec<_> = got
        .iter()
        .map(|c| (c.container_id.as_str(), c.gpu_id, c.processes, c.cus))
        .collect();
    assert_eq!(seen, [(CID, 7, 2, 42), (CID, 9, 1, 0)], "{got:?}");
}

#[test]
fn an_odd_or_oversized_counter_is_left_out() {
    let tmp = tempfile::tempdir().unwrap();
    let paths = HostPaths::under(tmp.path());
    let cgroup = format!(
        "/kubepods.slice/kubepods-pod{}.slice",
        POD.replace('-', "_")
    );
    process(&paths, 100, &cgroup, &[(7, 10), (9, 10), (11, 10)]);
    occupancy(&paths, 100, 7, "lots\n");
    occupancy(&paths, 100, 9, &format!("{}\n", MAX_CUS + 1));
    // A file past the read bound is read up to it only.
    let long = "1".repeat(usize::try_from(sysfs::MAX_FILE).unwrap() * 4);
    occupancy(&paths, 100, 11, &long);
    let targets = Targets {
        gpus: Vec::new(),
        gpu_ids: vec![7, 9, 11],
    };
    let got = read(&paths, &systemd(), &targets);
    assert!(got.usage.compute.is_empty(), "{:?}", got.usage.compute);
    assert_eq!(got.usage.containers.len(), 3);
}
