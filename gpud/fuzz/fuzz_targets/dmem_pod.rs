//! Fuzz target: the dmem validators and the pod cgroup resolver.
//!
//! The input's first line is a pod UID, the second a GPU address; the whole
//! input is also parsed as a `dmem.capacity`/`dmem.max` file. Parsers must be
//! total, a UID must pass only in one of kubelet's two shapes, and any pod
//! cgroup the resolver finds must be a real directory beneath kubepods of a
//! fake tree planted with symlinks out of it.
#![no_main]

use std::{
    fs,
    os::{fd::AsFd, fd::AsRawFd, fd::OwnedFd, unix::fs::symlink},
    path::{Path, PathBuf},
    sync::OnceLock,
};

use gpud::testing::dmem::{
    beneath,
    layout::{Driver, Layout, Qos},
    region::{self, Bdf},
    resolve,
    uid::PodUid,
};
use libfuzzer_sys::fuzz_target;

/// UIDs that have a pod cgroup (some behind symlinks) in the fake tree.
const PODS: [&str; 3] = [
    "00000000-0000-4000-8000-000000000001",
    "00000000-0000-4000-8000-000000000002",
    "0123456789abcdef0123456789abcdef",
];

struct Tree {
    mount: PathBuf,
    fd: OwnedFd,
}

fn cgroup(mount: &Path, rel: &str) {
    let dir = mount.join(rel);
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("dmem.max"), "").unwrap();
}

/// Both drivers' kubepods with every pod in a QoS class, the second pod's
/// Guaranteed cgroup a symlink out of kubepods.
fn tree() -> &'static Tree {
    static TREE: OnceLock<Tree> = OnceLock::new();
    TREE.get_or_init(|| {
        let mount = std::env::temp_dir().join(format!("gpud-fuzz-dmem-{}", std::process::id()));
        let _ = fs::remove_dir_all(&mount);
        cgroup(&mount, "outside");
        for driver in [Driver::Systemd, Driver::Cgroupfs] {
            let layout = Layout::new(driver, "/").unwrap();
            let kubepods = layout.kubepods();
            for (i, uid) in PODS.iter().enumerate() {
                let uid = PodUid::parse(uid).unwrap();
                let qos = Qos::ALL[i % 3];
                let rel = kubepods.join(layout.pod_dir(qos, &uid));
                if i == 1 {
                    let link = mount.join(kubepods.join(layout.pod_dir(Qos::Guaranteed, &uid)));
                    fs::create_dir_all(link.parent().unwrap()).unwrap();
                    symlink(mount.join("outside"), link).unwrap();
                } else {
                    cgroup(&mount, &rel.to_string_lossy());
                }
            }
        }
        let fd = beneath::open_root(&mount).unwrap();
        let mount = mount.canonicalize().unwrap();
        Tree { mount, fd }
    })
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for line in text.lines() {
        if let Some((name, _)) = region::parse_line(line) {
            assert!(!name.is_empty() && !name.contains(char::is_whitespace));
        }
    }
    for bdf in region::amdgpu_capacity(&text).keys() {
        assert!(text.contains(&bdf.region()));
    }
    let mut lines = text.splitn(3, '\n');
    let uid_text = lines.next().unwrap_or("");
    let bdf_text = lines.next().unwrap_or("");
    if let Ok(bdf) = Bdf::parse(bdf_text) {
        assert_eq!(bdf.to_string(), bdf_text);
        assert_eq!(Bdf::from_region(&bdf.region()), Some(bdf));
    }
    let Ok(uid) = PodUid::parse(uid_text) else {
        return;
    };
    assert!(
        uid.as_str()
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f' | b'-'))
    );
    let tree = tree();
    for driver in [Driver::Systemd, Driver::Cgroupfs] {
        let layout = Layout::new(driver, "/").unwrap();
        let Ok(pod) = resolve::find_pod(tree.fd.as_fd(), &tree.mount, &layout, &uid) else {
            continue;
        };
        assert!(
            PODS.contains(&uid.as_str()) && uid.as_str() != PODS[1],
            "{uid}"
        );
        let real = fs::read_link(format!("/proc/self/fd/{}", pod.dir.fd.as_raw_fd())).unwrap();
        assert!(
            real.starts_with(tree.mount.join(layout.kubepods())),
            "{}",
            real.display()
        );
        assert!(pod.dir.rel.starts_with(layout.kubepods()));
    }
});
