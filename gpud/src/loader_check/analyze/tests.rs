use std::time::Duration;

use serde_json::json;

use super::*;
use crate::loader_check::testelf::{TestElf, old_libc};
use crate::loader_check::testimage::{
    MemSource, TAR, TAR_GZIP, TAR_ZSTD, TarLayer, digest_of, gzip, zstd,
};
use crate::loader_check::{Loader, run::RunSpec};

const TRUE: &str = "/usr/bin/true";
const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";
pub(super) const BUSYBOX: &str = "/bin/busybox";
const MUSL: &str = "/usr/lib/x86_64-linux-musl/libc.so";

pub(super) fn host() -> Platform {
    Platform {
        os: "linux".to_owned(),
        architecture: "amd64".to_owned(),
        variant: None,
    }
}

fn inspect(source: &mut MemSource, target: &Descriptor) -> Result<Finding, InspectError> {
    inspect_target(
        source,
        target,
        &host(),
        &RunSpec::default(),
        &Limits::default(),
    )
}

/// A Debian 12 style base layer: merged /usr, glibc's loader and libc.
pub(super) fn debian_base() -> Vec<u8> {
    TarLayer::new()
        .dir("./")
        .symlink("./bin", "usr/bin")
        .symlink("./lib", "usr/lib")
        .symlink("./lib64", "usr/lib64")
        .dir("./usr/")
        .dir("./usr/bin/")
        .host_file("./usr/bin/true", 0o755, TRUE)
        .dir("./usr/lib/")
        .dir("./usr/lib/x86_64-linux-gnu/")
        .host_file("./usr/lib/x86_64-linux-gnu/libc.so.6", 0o755, LIBC)
        .file(
            "./usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
            0o755,
            b"\x7fELF",
        )
        .dir("./usr/lib64/")
        .symlink(
            "./usr/lib64/ld-linux-x86-64.so.2",
            "../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
        )
        .finish()
}

fn debian(source: &mut MemSource, config: &serde_json::Value) -> Descriptor {
    source.image(config, vec![(TAR_GZIP, gzip(&debian_base()))])
}

#[test]
fn debian_glibc_2_36() {
    let mut s = MemSource::default();
    let target = debian(&mut s, &json!({"Entrypoint": ["/bin/true"]}));
    let f = inspect(&mut s, &target).unwrap();
    assert_eq!(f.digest, target.digest);
    assert_eq!(
        f.loader,
        Loader::Glibc {
            major: 2,
            minor: 36
        }
    );
    assert_eq!(
        f.evidence,
        "entrypoint /bin/true (-> /usr/bin/true) -> interpreter /lib64/ld-linux-x86-64.so.2; \
         /lib/x86_64-linux-gnu/libc.so.6 defines GLIBC_2.36"
    );
}

#[test]
fn cmd_found_in_path() {
    let mut s = MemSource::default();
    let config = json!({"Cmd": ["true", "-x"], "Env": ["PATH=/opt:/bin"], "WorkingDir": "/tmp"});
    let target = debian(&mut s, &config);
    let f = inspect(&mut s, &target).unwrap();
    assert_eq!(
        f.loader,
        Loader::Glibc {
            major: 2,
            minor: 36
        }
    );
    assert!(
        f.evidence.starts_with("entrypoint /bin/true"),
        "{}",
        f.evidence
    );
}

#[test]
fn whiteout_of_libc_makes_glibc_unknown() {
    let mut s = MemSource::default();
    let upper = TarLayer::new()
        .file("usr/lib/x86_64-linux-gnu/.wh.libc.so.6", 0o644, b"")
        .finish();
    let target = s.image(
        &json!({"Entrypoint": ["/usr/bin/true"]}),
        vec![(TAR_GZIP, gzip(&debian_base())), (TAR, upper)],
    );
    let f = inspect(&mut s, &target).unwrap();
    assert!(
        matches!(&f.loader, Loader::Unknown { why } if why.contains("no libc.so.6")),
        "{f:?}"
    );
}

#[test]
fn opaque_lib_dir_with_old_libc() {
    let mut s = MemSource::default();
    let upper = TarLayer::new()
        .dir("usr/lib/x86_64-linux-gnu/")
        .file("usr/lib/x86_64-linux-gnu/.wh..wh..opq", 0o644, b"")
        .file(
            "usr/lib/x86_64-linux-gnu/libc-2.33.so",
            0o755,
            &old_libc(33),
        )
        .symlink("usr/lib/x86_64-linux-gnu/libc.so.6", "libc-2.33.so")
        .finish();
    let target = s.image(
        &json!({"Entrypoint": ["/usr/bin/true"]}),
        vec![(TAR_GZIP, gzip(&debian_base())), (TAR_ZSTD, zstd(&upper))],
    );
    let f = inspect(&mut s, &target).unwrap();
    assert_eq!(
        f.loader,
        Loader::Glibc {
            major: 2,
            minor: 33
        },
        "{}",
        f.evidence
    );
}

#[test]
fn musl_image() {
    let mut s = MemSource::default();
    let app = TestElf {
        interp: Some("/lib/ld-musl-x86_64.so.1"),
        dynamic: true,
        ..TestElf::default()
    }
    .build();
    let layer = TarLayer::new()
        .host_file("lib/ld-musl-x86_64.so.1", 0o755, MUSL)
        .symlink("lib/libc.musl-x86_64.so.1", "ld-musl-x86_64.so.1")
        .file("usr/bin/app", 0o755, &app)
        .finish();
    let target = s.image(&json!({"Entrypoint": ["/usr/bin/app"]}), vec![(TAR, layer)]);
    let f = inspect(&mut s, &target).unwrap();
    assert_eq!(f.loader, Loader::Musl, "{}", f.evidence);
}

#[test]
fn static_busybox_and_its_scripts() {
    let mut s = MemSource::default();
    let layer = TarLayer::new()
        .host_file("bin/busybox", 0o755, BUSYBOX)
        .symlink("bin/sh", "/bin/busybox")
        .file("entry.sh", 0o755, b"#!/bin/sh\nexec sleep 1\n")
        .finish();
    let bytes = gzip(&layer);
    let plain = s.image(
        &json!({"Entrypoint": ["/bin/busybox"]}),
        vec![(TAR_GZIP, bytes.clone())],
    );
    assert_eq!(inspect(&mut s, &plain).unwrap().loader, Loader::Static);
    let script = s.image(
        &json!({"Entrypoint": ["/entry.sh"]}),
        vec![(TAR_GZIP, bytes.clone())],
    );
    let f = inspect(&mut s, &script).unwrap();
    assert_eq!(f.loader, Loader::Static);
    assert!(
        f.evidence
            .contains("script interpreter /bin/sh (-> /bin/busybox)"),
        "{}",
        f.evidence
    );
    // No command at all: no loader in the image either.
    let none = s.image(&json!({}), vec![(TAR_GZIP, bytes)]);
    assert_eq!(inspect(&mut s, &none).unwrap().loader, Loader::Static);
}

#[test]
fn missing_entrypoint_uses_the_loaders_present() {
    let mut s = MemSource::default();
    let target = debian(&mut s, &json!({"Entrypoint": ["/app/not-here"]}));
    let f = inspect(&mut s, &target).unwrap();
    assert_eq!(
        f.loader,
        Loader::Glibc {
            major: 2,
            minor: 36
        }
    );
    assert!(f.evidence.contains("only glibc's loader"), "{}", f.evidence);
}

#[test]
fn index_picks_the_host_platform() {
    let mut s = MemSource::default();
    let amd64 = debian(&mut s, &json!({"Entrypoint": ["/bin/true"]}));
    let layer = TarLayer::new()
        .host_file("bin/app", 0o755, BUSYBOX)
        .finish();
    let arm64 = s.image(&json!({"Entrypoint": ["/bin/app"]}), vec![(TAR, layer)]);
    let index = s.index(&[(&arm64, "linux/arm64/v8"), (&amd64, "linux/amd64")]);
    let f = inspect(&mut s, &index).unwrap();
    assert_eq!(f.digest, index.digest);
    assert_eq!(
        f.loader,
        Loader::Glibc {
            major: 2,
            minor: 36
        }
    );
    let arm = Platform {
        os: "linux".to_owned(),
        architecture: "arm64".to_owned(),
        variant: Some("v8".to_owned()),
    };
    let f = inspect_target(
        &mut s,
        &index,
        &arm,
        &RunSpec::default(),
        &Limits::default(),
    )
    .unwrap();
    assert_eq!(f.loader, Loader::Static);
    // One level of nesting, and an empty descriptor media type.
    let outer = s.index(&[(&index, "")]);
    let outer = Descriptor {
        media_type: String::new(),
        ..outer
    };
    assert_eq!(
        inspect(&mut s, &outer).unwrap().loader,
        Loader::Glibc {
            major: 2,
            minor: 36
        }
    );
}

#[test]
fn index_without_the_platform_lists_what_it_has() {
    let mut s = MemSource::default();
    let layer = TarLayer::new().finish();
    let m = s.image(&json!({}), vec![(TAR, layer)]);
    let index = s.index(&[(&m, "linux/arm64/v8"), (&m, "linux/s390x")]);
    let err = inspect(&mut s, &index).unwrap_err();
    let InspectError::NoPlatform { offered, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(offered, &["linux/arm64/v8", "linux/s390x"]);
    assert_eq!(err.reason(), "no_platform");
    assert!(err.to_string().contains("linux/amd64"), "{err}");
}

#[test]
fn nesting_is_bounded() {
    let mut s = MemSource::default();
    let m = s.image(&json!({}), vec![]);
    let mut d = m;
    for _ in 0..3 {
        d = s.index(&[(&d, "linux/amd64")]);
    }
    let err = inspect(&mut s, &d).unwrap_err();
    assert!(matches!(err, InspectError::TooDeep { .. }), "{err:?}");
}

#[test]
fn too_large_config() {
    let mut s = MemSource::default();
    let big = "x".repeat(5 << 20);
    let target = debian(
        &mut s,
        &json!({"Entrypoint": ["/bin/true"], "Labels": {"big": big}}),
    );
    let err = inspect(&mut s, &target).unwrap_err();
    assert_eq!(
        err,
        InspectError::Limit {
            limit: "max_json",
            value: 4 << 20
        }
    );
    assert_eq!(err.reason(), "limit");
}

#[test]
fn malformed_documents() {
    let mut s = MemSource::default();
    let junk = s.put(oci::OCI_MANIFEST, b"{not json".to_vec());
    let err = inspect(&mut s, &junk).unwrap_err();
    assert!(matches!(&err, InspectError::Malformed { digest, .. } if *digest == junk.digest));
    let other = s.put("application/json", b"{}".to_vec());
    assert_eq!(inspect(&mut s, &other).unwrap_err().reason(), "malformed");
}

#[test]
fn truncated_gzip_names_the_layer() {
    let mut s = MemSource::default();
    let gz = gzip(&debian_base());
    let cut = gz[..gz.len() / 3].to_vec();
    let target = s.image(
        &json!({"Entrypoint": ["/bin/true"]}),
        vec![(TAR_GZIP, cut.clone())],
    );
    let err = inspect(&mut s, &target).unwrap_err();
    let layer = digest_of(&cut);
    assert!(
        matches!(&err, InspectError::Layer { digest, .. } if *digest == layer),
        "{err:?}"
    );
    assert!(err.to_string().contains(&layer), "{err}");
}

#[test]
fn unsupported_layer_type() {
    let mut s = MemSource::default();
    let target = s.image(
        &json!({}),
        vec![("application/vnd.oci.image.layer.v1.tar+bz2", vec![])],
    );
    let err = inspect(&mut s, &target).unwrap_err();
    assert_eq!(err.reason(), "unsupported_layer");
}

#[test]
fn missing_blob_is_a_source_error() {
    let mut s = MemSource::default();
    let target = debian(&mut s, &json!({}));
    let layer_digests: Vec<String> = s
        .blobs
        .keys()
        .filter(|d| **d != target.digest)
        .cloned()
        .collect();
    for d in layer_digests {
        s.blobs.remove(&d);
    }
    let err = inspect(&mut s, &target).unwrap_err();
    assert_eq!(err.reason(), "missing_blob");
}

#[test]
fn deadline_in_the_past() {
    let mut s = MemSource::default();
    let target = debian(&mut s, &json!({"Entrypoint": ["/bin/true"]}));
    let limits = Limits {
        deadline: Instant::now(),
        ..Limits::default()
    };
    let err = inspect_target(&mut s, &target, &host(), &RunSpec::default(), &limits).unwrap_err();
    assert!(matches!(err, InspectError::OutOfTime { .. }), "{err:?}");
    assert_eq!(err.reason(), "out_of_time");
}

#[test]
fn host_platform_names() {
    let p = Platform::host();
    assert_eq!(p.os, "linux");
    #[cfg(target_arch = "x86_64")]
    assert_eq!(p.architecture, "amd64");
    #[cfg(target_arch = "aarch64")]
    assert_eq!(p.architecture, "arm64");
}

#[test]
fn fuzz_entry_reads_layers() {
    let layer = TarLayer::new()
        .host_file("bin/busybox", 0o755, BUSYBOX)
        .symlink("bin/sh", "busybox")
        .finish();
    assert_eq!(read_layer_for_fuzz(&layer).unwrap(), (2, Loader::Static));
    assert_eq!(read_layer_for_fuzz(&gzip(&layer)).unwrap().0, 2);
    assert_eq!(read_layer_for_fuzz(&zstd(&layer)).unwrap().0, 2);
    assert!(read_layer_for_fuzz(&[0x1f, 0x8b, 1]).is_err());
}

fn fuzz_seed() -> &'static [u8] {
    static SEED: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    SEED.get_or_init(|| {
        TarLayer::new()
            .dir("bin/")
            .file("bin/sh", 0o755, b"#!/bin/busybox\n")
            .symlink("bin/busybox", "../lib/x")
            .file("lib/.wh.y", 0o644, b"")
            .file("lib/x", 0o755, &old_libc(30))
            .hardlink("lib/libc.so.6", "lib/x")
            .finish()
    })
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    #[test]
    fn layer_reader_never_panics(
        edits in proptest::collection::vec((proptest::prelude::any::<proptest::sample::Index>(), proptest::prelude::any::<u8>()), 0..24),
        cut in proptest::prelude::any::<proptest::sample::Index>(),
        packing in 0u8..3,
    ) {
        let mut bytes = fuzz_seed().to_vec();
        for (at, b) in &edits {
            let i = at.index(bytes.len());
            bytes[i] = *b;
        }
        bytes.truncate(cut.index(bytes.len() + 1));
        let bytes = match packing {
            0 => bytes,
            1 => gzip(&bytes),
            _ => zstd(&bytes),
        };
        let _ = read_layer_for_fuzz(&bytes);
    }
}

#[test]
fn untyped_documents_are_told_by_their_fields() {
    let mut s = MemSource::default();
    let m = debian(&mut s, &json!({"Entrypoint": ["/bin/true"]}));
    let mut doc: serde_json::Value = serde_json::from_slice(&s.blobs[&m.digest]).unwrap();
    doc.as_object_mut().unwrap().remove("mediaType");
    let untyped = s.put("", serde_json::to_vec(&doc).unwrap());
    let f = inspect(&mut s, &untyped).unwrap();
    assert_eq!(
        f.loader,
        Loader::Glibc {
            major: 2,
            minor: 36
        }
    );
}

/// Runs `f` on a thread, failing the test if it has not finished within a
/// generous `limit` (an inspection that never ends fails instead of hanging).
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (send, answer) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = send.send(f());
    });
    answer
        .recv_timeout(limit)
        .unwrap_or_else(|e| panic!("no answer within {limit:?}: {e}"))
}

/// Issue 38, F1: an entrypoint 20,000 components deep (which took 28 s of
/// CPU to resolve, each PATH entry again) and PATHs of thousands of
/// entries are refused before any walk, naming the bound.
#[test]
fn deep_entrypoints_and_long_paths_are_refused_naming_the_bound() {
    let deep = format!("/{}true", "a/".repeat(20_000));
    let many = vec!["/a/b/c"; 10_000].join(":");
    let cases = [
        (
            json!({"Entrypoint": [deep], "Env": [format!("PATH={many}")]}),
            ("argv[0]", "MAX_PATH_BYTES", 40_005),
        ),
        (
            json!({"Cmd": ["true"], "Env": [format!("PATH={many}")]}),
            ("PATH", "MAX_PATH_VAR_BYTES", many.len()),
        ),
        (
            json!({"Cmd": ["true"], "Env": [format!("PATH={}", vec!["/b"; 1000].join(":"))]}),
            ("PATH", "MAX_PATH_ENTRIES", 1000),
        ),
        (
            json!({"Cmd": ["../true"], "WorkingDir": "x/".repeat(1000)}),
            ("WorkingDir", "MAX_COMPONENTS", 1000),
        ),
    ];
    for (config, (field, bound, found)) in cases {
        let err = within(Duration::from_secs(300), move || {
            let mut s = MemSource::default();
            let target = debian(&mut s, &config);
            inspect(&mut s, &target).unwrap_err()
        });
        let InspectError::Command(b) = &err else {
            panic!("{err:?}")
        };
        assert_eq!((b.field, b.bound, b.found), (field, bound, found), "{err}");
        assert_eq!(err.reason(), "command_bound");
        assert!(err.to_string().contains(bound), "{err}");
    }
}
