//! `ContainerdSource` against Debian's containerd: images imported from OCI
//! archives built of this host's files, read back through the gRPC API.
//!
//! Needs root and Debian's `containerd` package (CI installs it): without
//! them the test fails, saying so.

// An integration-test file is itself the test module.
#![allow(clippy::tests_outside_test_module)]

mod common;

use std::{
    io::Read as _,
    path::{Path, PathBuf},
    time::Duration,
};

use gpud::testing::loader_check::{
    Descriptor, ImageSource, SourceError, containerd::ContainerdSource,
};
use serde_json::Value;
use tests::{
    containerd::Containerd,
    oci_images::{self, ABSENT_IMAGE, BuiltImage},
};

const NAMESPACE: &str = "k8s.io";
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
const TEST_LIMIT: Duration = Duration::from_secs(120);
const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";

fn containerd_on_path() -> bool {
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| dir.join("containerd").is_file())
    })
}

/// Runs `body` with a source connected to `socket` in `namespace`, on a
/// blocking thread of the current runtime.
async fn with_source<T: Send + 'static>(
    socket: PathBuf,
    namespace: &'static str,
    body: impl FnOnce(Result<ContainerdSource, SourceError>) -> T + Send + 'static,
) -> T {
    let handle = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        body(ContainerdSource::connect(
            &socket,
            namespace,
            handle,
            CALL_TIMEOUT,
        ))
    })
    .await
    .expect("blocking task")
}

/// The manifest, its config and its first layer (returned, still gzipped),
/// checked along the way.
fn check_image(source: &mut ContainerdSource, image: &BuiltImage) -> Vec<u8> {
    let target = source.target(&image.name).expect("target");
    assert_eq!(target.media_type, MANIFEST_MEDIA_TYPE, "{}", image.name);
    assert!(target.digest.starts_with("sha256:"), "{target:?}");
    let manifest = source.read_blob(&target, 1 << 20).expect("manifest");
    assert_eq!(oci_images::sha256_digest(&manifest), target.digest);
    let manifest: Value = serde_json::from_slice(&manifest).expect("manifest is JSON");
    let config = descriptor(&manifest["config"]);
    let small = source.read_blob(&config, config.size - 1);
    assert_eq!(
        small,
        Err(SourceError::TooLarge {
            digest: config.digest.clone(),
            size: config.size,
            max: config.size - 1
        })
    );
    let config_json = source.read_blob(&config, config.size).expect("config");
    let config_json: Value = serde_json::from_slice(&config_json).expect("config is JSON");
    assert!(
        config_json["config"]["Entrypoint"].is_array(),
        "{config_json}"
    );
    let layer = descriptor(&manifest["layers"][0]);
    let mut bytes = Vec::new();
    let mut reader = source.open_blob(&layer).expect("open layer");
    reader.read_to_end(&mut bytes).expect("read layer");
    drop(reader);
    assert_eq!(bytes.len() as u64, layer.size, "{}", image.name);
    assert_eq!(oci_images::sha256_digest(&bytes), layer.digest);
    bytes
}

/// (path, symlink target) of every entry of a gzipped layer.
fn layer_entries(gz: &[u8]) -> Vec<(String, Option<String>)> {
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(gz));
    let entries = archive.entries().expect("layer is a tar");
    entries
        .map(|entry| {
            let entry = entry.expect("tar entry");
            let path = entry.path().expect("path").to_string_lossy().into_owned();
            let link = entry.link_name().expect("link name");
            (path, link.map(|l| l.to_string_lossy().into_owned()))
        })
        .collect()
}

/// The glibc image is laid out as Debian 12's merged /usr.
fn check_glibc_layout(gz: &[u8]) {
    let entries = layer_entries(gz);
    let link = |path: &str, target: &str| (path.to_owned(), Some(target.to_owned()));
    let file = |path: &str| (path.to_owned(), None);
    for want in [
        link("lib64", "usr/lib64"),
        link("lib", "usr/lib"),
        link(
            "usr/lib64/ld-linux-x86-64.so.2",
            "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
        ),
        file("usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"),
        file("usr/lib/x86_64-linux-gnu/libc.so.6"),
        file("usr/bin/true"),
    ] {
        assert!(entries.contains(&want), "{want:?} not in {entries:#?}");
    }
}

/// An image never imported and a blob not in the store.
fn check_absent(source: &mut ContainerdSource) {
    let absent = source.target(ABSENT_IMAGE);
    let image = ABSENT_IMAGE.to_owned();
    assert_eq!(absent, Err(SourceError::NotPresent { image }));
    let digest = format!("sha256:{}", "0".repeat(64));
    let missing = Descriptor {
        media_type: MANIFEST_MEDIA_TYPE.into(),
        digest: digest.clone(),
        size: 10,
    };
    let err = source.read_blob(&missing, 100).err();
    let want = SourceError::MissingBlob { digest };
    assert_eq!(err.as_ref(), Some(&want));
    assert_eq!(source.open_blob(&missing).err(), Some(want));
}

fn descriptor(value: &Value) -> Descriptor {
    Descriptor {
        media_type: value["mediaType"].as_str().expect("mediaType").to_owned(),
        digest: value["digest"].as_str().expect("digest").to_owned(),
        size: value["size"].as_u64().expect("size"),
    }
}

fn build_images(cache: &Path) -> Vec<BuiltImage> {
    let builders = [
        oci_images::glibc_image,
        oci_images::musl_image,
        oci_images::static_image,
        oci_images::old_glibc_image,
    ];
    builders
        .iter()
        .map(|build| build(cache).expect("image archive"))
        .collect()
}

#[test]
fn containerd_source_reads_imported_images() {
    assert!(
        containerd_on_path(),
        "containerd is not on PATH: install Debian's containerd (apt-get install containerd; \
         .ci/run installs it)"
    );
    let started = std::time::Instant::now();
    let containerd = Containerd::start().expect("containerd starts");
    let cache = tempfile::tempdir().expect("cache dir");
    let images = build_images(cache.path());
    for image in &images {
        let names = containerd
            .import(&image.archive, NAMESPACE)
            .expect("ctr import");
        assert!(
            names.contains(&image.name),
            "{names:?} lacks {}",
            image.name
        );
    }
    eprintln!(
        "containerd up, 4 images imported in {:?}",
        started.elapsed()
    );
    let socket = containerd.socket.clone();
    common::run_async(TEST_LIMIT, async move {
        let checked = images.clone();
        with_source(socket.clone(), NAMESPACE, move |source| {
            let mut source = source.expect("connect");
            for image in &checked {
                let layer = check_image(&mut source, image);
                if image.name.contains("hami-test-glibc") {
                    check_glibc_layout(&layer);
                }
            }
            check_absent(&mut source);
        })
        .await;
        let name = images[0].name.clone();
        let wrong = with_source(socket, "default", move |source| {
            source.expect("connect").target(&name)
        })
        .await;
        let image = images[0].name.clone();
        assert_eq!(wrong, Err(SourceError::NotPresent { image }));
    });
    eprintln!("done in {:?}", started.elapsed());
    drop(containerd);
}

#[test]
fn containerd_gone_after_connecting_is_no_runtime() {
    assert!(containerd_on_path(), "install Debian's containerd");
    let mut containerd = Containerd::start().expect("containerd starts");
    let socket = containerd.socket.clone();
    let (connected, source) = std::sync::mpsc::channel();
    let (killed, gone) = std::sync::mpsc::channel::<()>();
    common::run_async(TEST_LIMIT, async move {
        let task = with_source(socket.clone(), NAMESPACE, move |source| {
            let mut source = source.expect("connect");
            let absent = source.target(ABSENT_IMAGE);
            assert!(matches!(absent, Err(SourceError::NotPresent { .. })));
            connected.send(()).expect("test waits");
            gone.recv().expect("killed");
            source.target(ABSENT_IMAGE)
        });
        let kill = async {
            tokio::task::spawn_blocking(move || {
                source.recv().expect("connected");
                containerd.kill();
                killed.send(()).expect("task waits");
                // Kept until the call is over: its dir holds the dead socket.
                containerd
            })
            .await
            .expect("kill task")
        };
        let (result, dead) = tokio::join!(task, kill);
        drop(dead);
        let Err(SourceError::NoRuntime { socket: got, why }) = result else {
            panic!("{result:?}");
        };
        assert_eq!(got, socket);
        assert!(why.contains("Connection refused"), "{why}");
    });
}

#[test]
fn nothing_listening_is_no_runtime() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("containerd.sock");
    // A socket file nobody listens on: connection refused.
    drop(std::os::unix::net::UnixListener::bind(&socket).expect("bind"));
    let absent = dir.path().join("absent.sock");
    common::run_async(Duration::from_secs(30), async move {
        for (path, errno) in [
            (socket, "Connection refused"),
            (absent, "No such file or directory"),
        ] {
            let result = with_source(path.clone(), NAMESPACE, |source| source.map(|_| ())).await;
            let Err(SourceError::NoRuntime { socket, why }) = result else {
                panic!("{}: {result:?}", path.display());
            };
            assert_eq!(socket, path);
            assert!(why.contains(errno), "{why}");
        }
    });
}
