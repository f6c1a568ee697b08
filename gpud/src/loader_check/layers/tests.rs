use std::time::Instant;

use super::*;
use crate::loader_check::testimage::{TarLayer, gzip, zstd};

fn apply_all(layers: &[(Compression, Vec<u8>)], limits: &Limits) -> Result<Tree, InspectError> {
    let budget = Budget::new(limits);
    let mut tree = Tree::default();
    for (i, (c, bytes)) in layers.iter().enumerate() {
        apply_layer(
            &mut tree,
            bytes.as_slice(),
            *c,
            &format!("layer{i}"),
            &budget,
            limits,
        )?;
    }
    Ok(tree)
}

fn paths(tree: &Tree) -> Vec<&str> {
    tree.iter().map(|(p, _)| p).collect()
}

fn base() -> Vec<u8> {
    TarLayer::new()
        .dir("./")
        .dir("./etc/")
        .file("./etc/keep", 0o644, b"x")
        .dir("./lib/")
        .file("./lib/libc.so.6", 0o755, b"not elf")
        .file("./lib/other", 0o644, b"y")
        .dir("./lib/sub/")
        .file("./lib/sub/deep", 0o644, b"z")
        .finish()
}

#[test]
fn normalises_paths() {
    assert_eq!(normalize("./usr//bin/./x"), Some("/usr/bin/x".to_owned()));
    assert_eq!(normalize("../../etc/x"), Some("/etc/x".to_owned()));
    assert_eq!(normalize("./"), None);
    assert_eq!(parent("/a"), "/");
    assert_eq!(parent("/a/b"), "/a");
    assert_eq!(basename("/a/b"), "b");
}

#[test]
fn media_types() {
    assert_eq!(Compression::of(TAR_MT), Some(Compression::None));
    assert_eq!(
        Compression::of("application/vnd.docker.image.rootfs.diff.tar.gzip"),
        Some(Compression::Gzip)
    );
    assert_eq!(
        Compression::of("application/vnd.oci.image.layer.v1.tar+zstd"),
        Some(Compression::Zstd)
    );
    assert_eq!(
        Compression::of("application/vnd.oci.image.layer.v1.tar+bz2"),
        None
    );
    assert_eq!(Compression::of("application/octet-stream"), None);
}
const TAR_MT: &str = "application/vnd.oci.image.layer.v1.tar";

#[test]
fn whiteout_hides_lower_file_and_subtree() {
    let upper = TarLayer::new()
        .file("lib/.wh.libc.so.6", 0o644, b"")
        .file("lib/.wh.sub", 0o644, b"")
        .finish();
    let tree = apply_all(
        &[
            (Compression::None, base()),
            (Compression::Gzip, gzip(&upper)),
        ],
        &Limits::default(),
    )
    .unwrap();
    assert_eq!(paths(&tree), ["/etc", "/etc/keep", "/lib", "/lib/other"]);
}

#[test]
fn opaque_dir_hides_lower_entries_only() {
    let upper = TarLayer::new()
        .dir("lib/")
        .file("lib/new", 0o644, b"n")
        .file("lib/.wh..wh..opq", 0o644, b"")
        .finish();
    let tree = apply_all(
        &[
            (Compression::None, base()),
            (Compression::Zstd, zstd(&upper)),
        ],
        &Limits::default(),
    )
    .unwrap();
    assert_eq!(paths(&tree), ["/etc", "/etc/keep", "/lib", "/lib/new"]);
}

#[test]
fn file_replaces_a_lower_directory() {
    let upper = TarLayer::new().symlink("lib", "usr/lib").finish();
    let tree = apply_all(
        &[(Compression::None, base()), (Compression::None, upper)],
        &Limits::default(),
    )
    .unwrap();
    assert_eq!(paths(&tree), ["/etc", "/etc/keep", "/lib"]);
    assert_eq!(tree.get("/lib"), Some(&Node::Symlink("usr/lib".to_owned())));
}

#[test]
fn summaries() {
    let layer = TarLayer::new()
        .host_file("bin/true", 0o755, "/usr/bin/true")
        .host_file("lib/libc.so.6", 0o755, "/lib/x86_64-linux-gnu/libc.so.6")
        .file("bin/script", 0o755, b"#!/bin/sh -e\n")
        .file("etc/conf", 0o644, b"#!/bin/sh\n")
        .hardlink("bin/alias", "bin/true")
        .finish();
    let tree = apply_all(&[(Compression::Gzip, gzip(&layer))], &Limits::default()).unwrap();
    let Some(Node::File(t)) = tree.get("/bin/true") else {
        panic!()
    };
    assert!(matches!(&t.kind, FileKind::Elf(e) if e.interp != elf::Interp::Absent));
    let Some(Node::File(libc)) = tree.get("/lib/libc.so.6") else {
        panic!()
    };
    let versions = libc.glibc.clone().unwrap().unwrap();
    assert_eq!(versions.iter().max().unwrap().to_string(), "GLIBC_2.36");
    assert!(matches!(
        tree.get("/bin/script"),
        Some(Node::File(FileSummary {
            kind: FileKind::Script(_),
            ..
        }))
    ));
    assert!(matches!(
        tree.get("/etc/conf"),
        Some(Node::File(FileSummary {
            kind: FileKind::NotRead,
            ..
        }))
    ));
    assert_eq!(
        tree.get("/bin/alias"),
        Some(&Node::Hardlink("/bin/true".to_owned()))
    );
}

#[test]
fn limits() {
    let layer = base();
    let small = Limits {
        max_entries: 3,
        ..Limits::default()
    };
    let err = apply_all(&[(Compression::None, layer.clone())], &small).unwrap_err();
    assert_eq!(
        err,
        InspectError::Limit {
            limit: "max_entries",
            value: 3
        }
    );
    let small = Limits {
        max_layer_bytes: 1024,
        ..Limits::default()
    };
    let err = apply_all(&[(Compression::None, layer.clone())], &small).unwrap_err();
    assert_eq!(
        err,
        InspectError::Limit {
            limit: "max_layer_bytes",
            value: 1024
        }
    );
    let small = Limits {
        max_libc: 3,
        ..Limits::default()
    };
    let err = apply_all(&[(Compression::None, layer)], &small).unwrap_err();
    assert_eq!(
        err,
        InspectError::Limit {
            limit: "max_libc",
            value: 3
        }
    );
}

#[test]
fn truncated_gzip_names_the_layer() {
    let layer = TarLayer::new()
        .host_file("bin/true", 0o755, "/usr/bin/true")
        .finish();
    let gz = gzip(&layer);
    let cut = gz[..gz.len() / 2].to_vec();
    let err = apply_all(&[(Compression::Gzip, cut)], &Limits::default()).unwrap_err();
    assert!(
        matches!(&err, InspectError::Layer { digest, offset: Some(_), .. } if digest == "layer0"),
        "{err:?}"
    );
    assert_eq!(err.reason(), "layer_read");
}

#[test]
fn deadline_in_the_past() {
    let limits = Limits {
        deadline: Instant::now(),
        ..Limits::default()
    };
    let err = apply_all(&[(Compression::None, base())], &limits).unwrap_err();
    assert!(matches!(err, InspectError::OutOfTime { .. }), "{err:?}");
}

#[test]
fn zstd_with_several_frames() {
    let a = zstd(&base()[..1024]);
    let b = zstd(&base()[1024..]);
    let skippable = [0x50, 0x2a, 0x4d, 0x18, 2, 0, 0, 0, 0xaa, 0xbb];
    let joined = [a, skippable.to_vec(), b].concat();
    let tree = apply_all(&[(Compression::Zstd, joined)], &Limits::default()).unwrap();
    assert!(tree.get("/lib/sub/deep").is_some());
}

#[test]
fn odd_whiteouts_hide_nothing_else() {
    let upper = TarLayer::new()
        .file(".wh.", 0o644, b"")
        .file("lib/.wh...", 0o644, b"")
        .file("lib/.wh.", 0o644, b"")
        .finish();
    let tree = apply_all(
        &[(Compression::None, base()), (Compression::None, upper)],
        &Limits::default(),
    )
    .unwrap();
    assert_eq!(tree.len(), 7);
}

#[test]
fn whiteouts_count_against_max_entries() {
    let mut upper = TarLayer::new();
    for i in 0..10 {
        upper = upper.file(&format!("gone/.wh.f{i}"), 0o644, b"");
    }
    let limits = Limits {
        max_entries: 5,
        ..Limits::default()
    };
    let err = apply_all(&[(Compression::None, upper.finish())], &limits).unwrap_err();
    assert_eq!(err.reason(), "limit");
}
