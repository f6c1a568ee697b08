//! The loader check end to end (`dp.muslFailClosed`, docs/loader-check.md):
//! a real containerd (Debian's, on private sockets) holding five image
//! cases built from files of Debian packages, amd-gpud reading them through
//! containerd's API, and the plugin with `--loader-check true` answering the
//! fake kubelet's Allocate and PreStartContainer for one sliced pod per
//! image. Without the dmem backend only glibc 2.34+ starts; with it, musl,
//! static and old glibc start without the hook and with their VRAM capped.
//! Needs root (private bus, containerd).

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use common::world::{Gpu, NODE, Setup, World, grant, world_with};
use proto::v1beta1::ContainerAllocateResponse;
use tests::{
    apiserver::Kind,
    containerd::Containerd,
    fixture::{
        self,
        cgroup::{CgroupDriver, QosClass, add_pod, write_dmem_cgroups},
    },
    hami_emulator::HamiEmulator,
    oci_images::{self, ABSENT_IMAGE, BuiltImage},
};

const MIB: u64 = 1 << 20;
/// The placeholder hook `install_hook` writes on the fake host.
const HOOK_BYTES: &[u8] = b"placeholder";

/// The four images, imported into containerd's `k8s.io` namespace.
struct Images {
    glibc: BuiltImage,
    old_glibc: BuiltImage,
    musl: BuiltImage,
    static_binary: BuiltImage,
}

fn import_all(containerd: &Containerd, cache: &Path) -> Images {
    let images = Images {
        glibc: oci_images::glibc_image(cache).unwrap(),
        old_glibc: oci_images::old_glibc_image(cache).unwrap(),
        musl: oci_images::musl_image(cache).unwrap(),
        static_binary: oci_images::static_image(cache).unwrap(),
    };
    for image in [
        &images.glibc,
        &images.old_glibc,
        &images.musl,
        &images.static_binary,
    ] {
        let names = containerd.import(&image.archive, "k8s.io").unwrap();
        assert!(
            names.contains(&image.name),
            "{names:?} lacks {}",
            image.name
        );
    }
    images
}

async fn checked_world(containerd: &Containerd, dmem: &str) -> World {
    let socket = containerd.socket.display().to_string();
    let gpud_args = ["--dmem-any-fs", "--containerd-socket", socket.as_str()];
    let plugin_args = [
        "--loader-check".to_owned(),
        "true".to_owned(),
        "--dmem-backend".to_owned(),
        dmem.to_owned(),
    ];
    let dmem_tree = |root: &Path| {
        let spec = fixture::named("mi300x-8-spx").unwrap();
        write_dmem_cgroups(&spec, root, CgroupDriver::Systemd).unwrap();
    };
    let no_tree = |_: &Path| {};
    world_with(&Setup {
        fixture: "mi300x-8-spx",
        devices: 80,
        gpud_args: &gpud_args,
        plugin_args: &plugin_args,
        prepare: if dmem == "on" { &dmem_tree } else { &no_tree },
    })
    .await
}

/// A pod `name` running `image` in one container granted a slice of `gpu`;
/// returns its device ids and Allocate's answer.
async fn allocate_slice(
    w: &World,
    name: &str,
    image: &str,
    gpu: &Gpu,
    bind_time: u64,
) -> (Vec<String>, ContainerAllocateResponse) {
    let hami = HamiEmulator {
        node: NODE.to_owned(),
    };
    hami.bind_image(
        &w.api,
        name,
        &[vec![grant(gpu, 2048, 38)]],
        bind_time,
        image,
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ids = vec![format!("{}#0", gpu.id)];
    let answer = w.kubelet.allocate(ids.clone()).await.unwrap();
    (ids, answer)
}

/// As [`allocate_slice`], for a container written out (`image`, `command`,
/// `args`, ...).
async fn allocate_container(
    w: &World,
    name: &str,
    container: serde_json::Value,
    gpu: &Gpu,
    bind_time: u64,
) -> (Vec<String>, ContainerAllocateResponse) {
    let hami = HamiEmulator {
        node: NODE.to_owned(),
    };
    hami.bind_container(&w.api, name, &[grant(gpu, 2048, 38)], bind_time, container);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let ids = vec![format!("{}#0", gpu.id)];
    let answer = w.kubelet.allocate(ids.clone()).await.unwrap();
    (ids, answer)
}

fn uid_of(w: &World, pod: &str) -> String {
    let pod = w.api.get(Kind::Pod, "default", pod).unwrap();
    pod["metadata"]["uid"].as_str().unwrap().to_owned()
}

/// The staged directory Allocate mounted at /usr/local/vgpu, on the fake
/// host: the plugin names the host's path, amd-gpud works under its root.
fn staged_dir(w: &World, pod: &str, answer: &ContainerAllocateResponse) -> PathBuf {
    assert_eq!(
        answer.envs.get("LD_AUDIT").map(String::as_str),
        Some("/usr/local/vgpu/libamvgpu.so")
    );
    let mount = answer
        .mounts
        .iter()
        .find(|m| m.container_path == "/usr/local/vgpu")
        .unwrap_or_else(|| panic!("no hook directory mounted: {:?}", answer.mounts));
    assert!(mount.read_only);
    let prefix = format!("/var/lib/amd-gpud/loader-hook/{}/", uid_of(w, pod));
    assert!(mount.host_path.starts_with(&prefix), "{}", mount.host_path);
    w.root().join(mount.host_path.trim_start_matches('/'))
}

async fn wait_event(w: &World, pod: &str, reason: &str) -> String {
    let start = Instant::now();
    loop {
        let found = w
            .api
            .events()
            .into_iter()
            .find(|e| e["reason"] == reason && e["regarding"]["name"] == pod);
        if let Some(event) = found {
            return event["note"].as_str().unwrap_or_default().to_owned();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no {reason} Event for {pod}: {:?}",
            w.api.events()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn without_dmem_only_glibc_2_34_or_newer_starts() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(300), without_dmem());
}

async fn without_dmem() {
    let containerd = Containerd::start().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let images = import_all(&containerd, cache.path());
    let w = checked_world(&containerd, "off").await;
    let options = w.kubelet.options().await.unwrap();
    assert!(
        options.pre_start_required,
        "the loader check needs PreStartContainer"
    );

    let (ids, answer) = allocate_slice(&w, "glibc", &images.glibc.name, &w.gpus[0], 600).await;
    let dir = staged_dir(&w, "glibc", &answer);
    assert!(
        !dir.exists(),
        "Allocate only names the directory; PreStartContainer fills it"
    );
    w.kubelet.pre_start(ids).await.unwrap();
    assert_eq!(std::fs::read(dir.join("libamvgpu.so")).unwrap(), HOOK_BYTES);

    let refused = [
        ("musl", &images.musl.name, "musl"),
        ("static", &images.static_binary.name, "static"),
        ("old-glibc", &images.old_glibc.name, "glibc 2.33"),
        ("absent", &ABSENT_IMAGE.to_owned(), "not in"),
    ];
    for (i, (pod, image, found)) in refused.into_iter().enumerate() {
        let gpu = &w.gpus[i + 1];
        let (ids, answer) = allocate_slice(&w, pod, image, gpu, 601 + i as u64).await;
        let dir = staged_dir(&w, pod, &answer);
        let err = w.kubelet.pre_start(ids).await.unwrap_err();
        assert_eq!(
            err.code(),
            tonic::Code::FailedPrecondition,
            "{pod}: {err:?}"
        );
        for part in [found, image.as_str()] {
            assert!(
                err.message().contains(part),
                "{pod}: {part:?} not in {err:?}"
            );
        }
        assert!(
            !dir.join("libamvgpu.so").exists(),
            "{pod}: a refusal stages nothing"
        );
        let reason = if pod == "absent" {
            "LoaderCheckFailed"
        } else {
            "MemoryHookRefused"
        };
        let note = wait_event(&w, pod, reason).await;
        assert!(note.contains(image.as_str()), "{pod}: {note}");
        if pod != "absent" {
            assert!(
                note.contains("glibc 2.34 or newer") && note.contains("dmem"),
                "{note}"
            );
        }
    }
}

#[test]
fn with_dmem_other_loaders_start_capped_without_the_hook() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(300), with_dmem());
}

async fn with_dmem() {
    let containerd = Containerd::start().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let images = import_all(&containerd, cache.path());
    let w = checked_world(&containerd, "on").await;
    let cases = [
        ("glibc", &images.glibc.name, true),
        ("musl", &images.musl.name, false),
        ("static", &images.static_binary.name, false),
        ("old-glibc", &images.old_glibc.name, false),
    ];
    for (i, (pod, image, hook)) in cases.into_iter().enumerate() {
        let gpu = &w.gpus[i];
        let (ids, answer) = allocate_slice(&w, pod, image, gpu, 700 + i as u64).await;
        let dir = staged_dir(&w, pod, &answer);
        let uid = uid_of(&w, pod);
        let cgroup = add_pod(w.root(), CgroupDriver::Systemd, QosClass::Burstable, &uid).unwrap();
        w.kubelet.pre_start(ids).await.unwrap();
        assert!(dir.is_dir(), "{pod}: the mounted directory exists");
        assert_eq!(dir.join("libamvgpu.so").exists(), hook, "{pod}");
        let dmem_max = std::fs::read_to_string(cgroup.join("dmem.max")).unwrap();
        assert!(
            dmem_max.contains(&format!("vram {}", 2048 * MIB)),
            "{pod}: {dmem_max}"
        );
        if !hook {
            let note = wait_event(&w, pod, "MemoryHookLeftOut").await;
            assert!(note.contains("dmem"), "{pod}: {note}");
        }
    }
    // The image that is not there is refused even with the cap.
    let (ids, _) = allocate_slice(&w, "absent", ABSENT_IMAGE, &w.gpus[4], 710).await;
    let err = w.kubelet.pre_start(ids).await.unwrap_err();
    assert!(err.message().contains("not in"), "{err:?}");
}

/// Issue 38, F8, the attack: a glibc image (its entrypoint `/usr/bin/true`)
/// whose pod runs the image's static busybox through `command`. Judged by
/// the image's entrypoint, it got the hook, which a static binary never
/// loads, and ran without a VRAM limit. Now the pod's program is judged:
/// refused without dmem; `args` alone leave the entrypoint (glibc) in place.
#[test]
fn a_pods_command_is_judged_not_the_images_entrypoint() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(Duration::from_secs(300), pods_command());
}

async fn pods_command() {
    let containerd = Containerd::start().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let image = oci_images::glibc_with_static_image(cache.path()).unwrap();
    let names = containerd.import(&image.archive, "k8s.io").unwrap();
    assert!(names.contains(&image.name), "{names:?}");
    let w = checked_world(&containerd, "off").await;

    let evading =
        serde_json::json!({"image": image.name, "command": ["/bin/busybox", "sleep", "1d"]});
    let (ids, answer) = allocate_container(&w, "evading", evading, &w.gpus[0], 700).await;
    let dir = staged_dir(&w, "evading", &answer);
    let err = w.kubelet.pre_start(ids).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("static"), "{err:?}");
    assert!(err.message().contains("the pod's command"), "{err:?}");
    assert!(!dir.join("libamvgpu.so").exists(), "no hook staged");
    let note = wait_event(&w, "evading", "MemoryHookRefused").await;
    assert!(note.contains("/bin/busybox"), "{note}");

    let args_only = serde_json::json!({"image": image.name, "args": ["/bin/busybox"]});
    let (ids, answer) = allocate_container(&w, "args-only", args_only, &w.gpus[1], 701).await;
    let dir = staged_dir(&w, "args-only", &answer);
    w.kubelet.pre_start(ids).await.unwrap();
    assert_eq!(std::fs::read(dir.join("libamvgpu.so")).unwrap(), HOOK_BYTES);
}
