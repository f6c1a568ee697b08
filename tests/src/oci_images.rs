//! OCI image archives built from this host's files, for `ctr images import`.
//!
//! An archive is a tar of an OCI image layout (image-spec `image-layout.md`):
//! `oci-layout`, `index.json` and `blobs/sha256/<hex>`. `index.json` lists
//! one manifest, named by the annotation `io.containerd.image.name` (the
//! full reference containerd records) and `org.opencontainers.image.ref.name`
//! (the tag). The manifest has one gzip layer and a config with
//! `Entrypoint`, `Env` and `rootfs.diff_ids`.
//!
//! Layers copy host files with the symlinks on their way, so a path like
//! `/lib64/ld-linux-x86-64.so.2` lands in the image the way Debian lays it
//! out (merged `/usr`: `lib64 -> usr/lib64`, then the loader's own symlink).
//! Each builder writes its archive into a cache directory and returns it with
//! the image's name.

mod native;

use std::{
    collections::BTreeMap,
    fs,
    io::{self, Write as _},
    path::{Component, Path, PathBuf},
};

use flate2::{Compression, write::GzEncoder};
use serde_json::json;
use sha2::{Digest as _, Sha256};

/// Why an archive could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("host path {path}: {why}")]
    HostPath { path: PathBuf, why: String },
    #[error("{command} failed: {why}")]
    Tool { command: String, why: String },
}

fn io_error(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> ImageError {
    let path = path.to_owned();
    move |source| ImageError::Io { what, path, source }
}

/// An archive on disk and the name `ctr images import` gives its image.
#[derive(Debug, Clone)]
pub struct BuiltImage {
    pub archive: PathBuf,
    pub name: String,
}

/// The name of an image that no test ever imports.
pub const ABSENT_IMAGE: &str = "docker.io/library/hami-test-absent:1";

/// One entry of a layer, by its path in the image (relative, no leading `/`).
#[derive(Debug, Clone)]
enum Entry {
    Dir,
    File { data: Vec<u8>, mode: u32 },
    Symlink { target: String },
}

/// The files of one layer, sorted so that directories precede their contents.
#[derive(Debug, Default)]
struct Layer {
    entries: BTreeMap<String, Entry>,
}

/// Longest symlink chain [`Layer::copy_host`] follows (the kernel's limit).
const MAX_SYMLINKS: usize = 40;

impl Layer {
    /// Adds the parents of `path` as directories, unless already present.
    fn add_parents(&mut self, path: &str) {
        let mut parent = String::new();
        for part in path.split('/').filter(|p| !p.is_empty()) {
            if !parent.is_empty() {
                self.entries.entry(parent.clone()).or_insert(Entry::Dir);
                parent.push('/');
            }
            parent.push_str(part);
        }
    }

    fn add(&mut self, path: &str, entry: Entry) {
        let path = path.trim_start_matches('/').to_owned();
        self.add_parents(&path);
        self.entries.insert(path, entry);
    }

    fn add_file(&mut self, path: &str, data: Vec<u8>, mode: u32) {
        self.add(path, Entry::File { data, mode });
    }

    fn add_symlink(&mut self, path: &str, target: &str) {
        let target = target.to_owned();
        self.add(path, Entry::Symlink { target });
    }

    /// Copies the host's `path` into the same place in the image, with every
    /// symlink met while resolving it (each as a symlink, its target as on
    /// the host) and the regular file it ends at.
    fn copy_host(&mut self, path: &str) -> Result<(), ImageError> {
        let mut pending: Vec<String> = split(path);
        let mut done: Vec<String> = Vec::new();
        let mut links = 0;
        while !pending.is_empty() {
            let part = pending.remove(0);
            match part.as_str() {
                "." => continue,
                ".." => {
                    done.pop();
                    continue;
                }
                _ => done.push(part),
            }
            let here = format!("/{}", done.join("/"));
            let host = Path::new(&here);
            let meta = fs::symlink_metadata(host).map_err(io_error("inspecting", host))?;
            if meta.file_type().is_symlink() {
                links += 1;
                if links > MAX_SYMLINKS {
                    let why = format!("more than {MAX_SYMLINKS} symlinks resolving {path}");
                    return Err(ImageError::HostPath {
                        path: host.into(),
                        why,
                    });
                }
                let target = fs::read_link(host).map_err(io_error("reading link", host))?;
                let target = target.to_string_lossy().into_owned();
                self.add_symlink(&here, &target);
                done.pop();
                if target.starts_with('/') {
                    done.clear();
                }
                let rest = std::mem::take(&mut pending);
                pending = split(&target).into_iter().chain(rest).collect();
            } else if pending.is_empty() {
                return self.copy_file(host, &here, &meta);
            }
        }
        Err(ImageError::HostPath {
            path: path.into(),
            why: "resolves to no regular file".into(),
        })
    }

    fn copy_file(&mut self, host: &Path, at: &str, meta: &fs::Metadata) -> Result<(), ImageError> {
        use std::os::unix::fs::PermissionsExt as _;
        if !meta.is_file() {
            let why = "is not a regular file".into();
            return Err(ImageError::HostPath {
                path: host.into(),
                why,
            });
        }
        let data = fs::read(host).map_err(io_error("reading", host))?;
        self.add_file(at, data, meta.permissions().mode() & 0o7777);
        Ok(())
    }

    /// The layer as an uncompressed tar.
    fn tar(&self) -> io::Result<Vec<u8>> {
        let mut builder = tar::Builder::new(Vec::new());
        for (path, entry) in &self.entries {
            let mut header = tar::Header::new_gnu();
            header.set_mtime(0);
            header.set_uid(0);
            header.set_gid(0);
            match entry {
                Entry::Dir => {
                    header.set_entry_type(tar::EntryType::Directory);
                    header.set_mode(0o755);
                    header.set_size(0);
                    builder.append_data(&mut header, format!("{path}/"), io::empty())?;
                }
                Entry::File { data, mode } => {
                    header.set_entry_type(tar::EntryType::Regular);
                    header.set_mode(*mode);
                    header.set_size(data.len() as u64);
                    builder.append_data(&mut header, path, data.as_slice())?;
                }
                Entry::Symlink { target } => {
                    header.set_entry_type(tar::EntryType::Symlink);
                    header.set_mode(0o777);
                    header.set_size(0);
                    builder.append_link(&mut header, path, target)?;
                }
            }
        }
        builder.into_inner()
    }
}

/// The normal components of `path`, `.` and `..` kept for the resolver.
fn split(path: &str) -> Vec<String> {
    Path::new(path)
        .components()
        .filter_map(|c| match c {
            Component::Normal(p) => Some(p.to_string_lossy().into_owned()),
            Component::ParentDir => Some("..".to_owned()),
            Component::CurDir => Some(".".to_owned()),
            Component::RootDir | Component::Prefix(_) => None,
        })
        .collect()
}

/// `sha256:<hex>` of `data`.
pub fn sha256_digest(data: &[u8]) -> String {
    let hash = Sha256::digest(data);
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// The blobs of an image layout, by digest.
#[derive(Default)]
struct Blobs(BTreeMap<String, Vec<u8>>);

impl Blobs {
    /// Stores `data`, returning its descriptor as JSON.
    fn put(&mut self, media_type: &str, data: Vec<u8>) -> serde_json::Value {
        let digest = sha256_digest(&data);
        let desc = json!({"mediaType": media_type, "digest": digest, "size": data.len()});
        self.0.insert(digest, data);
        desc
    }
}

/// Writes an archive of `layer` named `name` (`<repository>:<tag>`) with
/// `entrypoint` to `<cache>/<file>.tar`.
fn write_archive(
    cache: &Path,
    file: &str,
    name: &str,
    layer: &Layer,
    entrypoint: &[&str],
) -> Result<BuiltImage, ImageError> {
    let archive = cache.join(format!("{file}.tar"));
    let tar = layer
        .tar()
        .map_err(io_error("building the layer of", &archive))?;
    let diff_id = sha256_digest(&tar);
    let gz = gzip(&tar).map_err(io_error("compressing the layer of", &archive))?;
    write_gz_archive(cache, file, name, (gz, diff_id), entrypoint)
}

const LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// `bytes` as one gzip member.
fn gzip(bytes: &[u8]) -> io::Result<Vec<u8>> {
    let mut gz = GzEncoder::new(Vec::new(), Compression::fast());
    gz.write_all(bytes)?;
    gz.finish()
}

/// As [`write_archive`], for a layer already compressed: `layer` is the
/// gzip blob and its `diff_id`.
fn write_gz_archive(
    cache: &Path,
    file: &str,
    name: &str,
    layer: (Vec<u8>, String),
    entrypoint: &[&str],
) -> Result<BuiltImage, ImageError> {
    write_layer_archive(
        cache,
        (file, name),
        (LAYER_GZIP, layer.0, layer.1),
        entrypoint,
    )
}

/// As [`write_gz_archive`], the layer of any media type: `layer` is its
/// media type, its blob and its `diff_id`; `names` the file and the image.
fn write_layer_archive(
    cache: &Path,
    names: (&str, &str),
    layer: (&str, Vec<u8>, String),
    entrypoint: &[&str],
) -> Result<BuiltImage, ImageError> {
    let (file, name) = names;
    let archive = cache.join(format!("{file}.tar"));
    let (media_type, blob, diff_id) = layer;
    let mut blobs = Blobs::default();
    let layer_desc = blobs.put(media_type, blob);
    let config = json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Entrypoint": entrypoint,
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    });
    let config_desc = blobs.put("application/vnd.oci.image.config.v1+json", to_vec(&config));
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config_desc,
        "layers": [layer_desc],
    });
    let mut manifest_desc = blobs.put(
        "application/vnd.oci.image.manifest.v1+json",
        to_vec(&manifest),
    );
    let tag = name.rsplit_once(':').map_or("latest", |(_, tag)| tag);
    manifest_desc["platform"] = json!({"architecture": "amd64", "os": "linux"});
    manifest_desc["annotations"] = json!({
        "io.containerd.image.name": name,
        "org.opencontainers.image.ref.name": tag,
    });
    let index = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [manifest_desc],
    });
    let layout = layout_tar(&blobs, &index).map_err(io_error("building", &archive))?;
    fs::write(&archive, layout).map_err(io_error("writing", &archive))?;
    Ok(BuiltImage {
        archive,
        name: name.to_owned(),
    })
}

fn to_vec(value: &serde_json::Value) -> Vec<u8> {
    // A Value always serializes.
    serde_json::to_vec(value).unwrap_or_default()
}

/// The image layout as a tar: `oci-layout`, `index.json`, `blobs/sha256/*`.
fn layout_tar(blobs: &Blobs, index: &serde_json::Value) -> io::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut add = |path: &str, data: &[u8]| {
        let mut header = tar::Header::new_gnu();
        header.set_mode(0o644);
        header.set_mtime(0);
        header.set_size(data.len() as u64);
        builder.append_data(&mut header, path, data)
    };
    add("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    add("index.json", &to_vec(index))?;
    for (digest, data) in &blobs.0 {
        let hex = digest.trim_start_matches("sha256:");
        add(&format!("blobs/sha256/{hex}"), data)?;
    }
    builder.into_inner()
}

/// The host's glibc loader and `libc.so.6`, as Debian lays them out.
fn glibc_files(layer: &mut Layer, with_libc: bool) -> Result<(), ImageError> {
    layer.copy_host("/lib64/ld-linux-x86-64.so.2")?;
    if with_libc {
        layer.copy_host("/lib/x86_64-linux-gnu/libc.so.6")?;
    }
    layer.copy_host("/usr/bin/true")
}

/// `docker.io/library/hami-test-glibc:1`: the host's glibc (2.36 on Debian
/// 12) and `/usr/bin/true` as the entrypoint.
///
/// # Errors
/// A host file is missing or the archive cannot be written.
pub fn glibc_image(cache: &Path) -> Result<BuiltImage, ImageError> {
    let mut layer = Layer::default();
    glibc_files(&mut layer, true)?;
    let name = "docker.io/library/hami-test-glibc:1";
    write_archive(cache, "glibc", name, &layer, &["/usr/bin/true"])
}

/// `docker.io/library/hami-test-glibc-static:1`: the glibc image with the
/// host's static busybox beside it (`/bin/busybox`): a glibc entrypoint,
/// and a static binary a pod's `command` can run instead.
///
/// # Errors
/// As [`glibc_image`].
pub fn glibc_with_static_image(cache: &Path) -> Result<BuiltImage, ImageError> {
    let mut layer = Layer::default();
    glibc_files(&mut layer, true)?;
    layer.copy_host("/bin/busybox")?;
    let name = "docker.io/library/hami-test-glibc-static:1";
    write_archive(cache, "glibc-static", name, &layer, &["/usr/bin/true"])
}

/// `docker.io/library/hami-test-oldglibc:1`: glibc's loader and
/// `/usr/bin/true` from the host, and a `libc.so.6` built here that defines
/// the version nodes `GLIBC_2.2.5` to `GLIBC_2.33` (and `GLIBC_PRIVATE`)
/// only, as glibc 2.33 does.
///
/// # Errors
/// As [`glibc_image`], or `cc` fails.
pub fn old_glibc_image(cache: &Path) -> Result<BuiltImage, ImageError> {
    let mut layer = Layer::default();
    glibc_files(&mut layer, false)?;
    let libc = native::old_libc(cache)?;
    layer.add_file("usr/lib/x86_64-linux-gnu/libc.so.6", libc, 0o755);
    let name = "docker.io/library/hami-test-oldglibc:1";
    write_archive(cache, "oldglibc", name, &layer, &["/usr/bin/true"])
}

/// `docker.io/library/hami-test-musl:1`: Debian's musl (`/lib/ld-musl-x86_64.so.1
/// -> x86_64-linux-musl/libc.so`) and `/usr/bin/app`, a program built here
/// whose ELF interpreter is `/lib/ld-musl-x86_64.so.1`.
///
/// # Errors
/// As [`glibc_image`] (install Debian's `musl` package), or `cc` fails.
pub fn musl_image(cache: &Path) -> Result<BuiltImage, ImageError> {
    let mut layer = Layer::default();
    layer.copy_host("/lib/ld-musl-x86_64.so.1")?;
    layer.add_file("usr/bin/app", native::musl_app(cache)?, 0o755);
    let name = "docker.io/library/hami-test-musl:1";
    write_archive(cache, "musl", name, &layer, &["/usr/bin/app"])
}

/// `docker.io/library/hami-test-static:1`: Debian's static `/bin/busybox`
/// and `/bin/sh -> busybox` as the entrypoint.
///
/// # Errors
/// As [`glibc_image`] (install Debian's `busybox-static` package).
pub fn static_image(cache: &Path) -> Result<BuiltImage, ImageError> {
    let mut layer = Layer::default();
    layer.copy_host("/bin/busybox")?;
    layer.add_symlink("usr/bin/sh", "busybox");
    layer.add_symlink("bin", "usr/bin");
    let name = "docker.io/library/hami-test-static:1";
    write_archive(cache, "static", name, &layer, &["/bin/sh"])
}

/// `docker.io/library/hami-test-greedy:1`: the glibc image with a
/// `libc.so.6` of `size` zero bytes, which the loader check reads whole (up
/// to its bound of 32 MiB): an image that needs that much memory to judge.
///
/// # Errors
/// A host file is missing or the archive cannot be written.
pub fn greedy_image(cache: &Path, size: usize) -> Result<BuiltImage, ImageError> {
    let mut layer = Layer::default();
    glibc_files(&mut layer, true)?;
    for (path, entry) in &mut layer.entries {
        if let (true, Entry::File { data, .. }) = (path.ends_with("/libc.so.6"), entry) {
            *data = vec![0; size];
        }
    }
    let name = "docker.io/library/hami-test-greedy:1";
    write_archive(cache, "greedy", name, &layer, &["/usr/bin/true"])
}

/// `docker.io/library/hami-test-endless:1`: one layer holding one file of
/// `gib` GiB of zeros, as a few MiB of gzip members (each MiB of zeros
/// compressed once and repeated): reading it takes the loader check long.
///
/// # Errors
/// The archive cannot be written.
pub fn endless_image(cache: &Path, gib: u64) -> Result<BuiltImage, ImageError> {
    let archive = cache.join("endless.tar");
    let fail = io_error("building the layer of", &archive);
    let size = gib << 30;
    let mut header = tar::Header::new_gnu();
    header.set_mode(0o755);
    header.set_mtime(0);
    header.set_size(size);
    header.set_entry_type(tar::EntryType::Regular);
    header
        .set_path("big")
        .map_err(io_error("building the layer of", &archive))?;
    header.set_cksum();
    let mut gz = gzip(header.as_bytes()).map_err(io_error("building the layer of", &archive))?;
    let mib = gzip(&vec![0; 1 << 20]).map_err(io_error("building the layer of", &archive))?;
    for _ in 0..(size >> 20) {
        gz.extend_from_slice(&mib);
    }
    gz.extend(gzip(&[0; 1024]).map_err(fail)?);
    // Not unpacked by `import --no-unpack`: nothing checks the diff_id.
    let diff_id = sha256_digest(b"endless");
    let name = "docker.io/library/hami-test-endless:1";
    write_gz_archive(cache, "endless", name, (gz, diff_id), &["/big"])
}

/// `docker.io/library/hami-test-crowded:1`: one uncompressed layer of
/// `entries` empty files with 90-byte names: a file tree that takes memory
/// to hold (each entry a few hundred bytes of tar, well within the loader
/// check's bounds of entries and tree bytes).
///
/// # Errors
/// The archive cannot be written.
pub fn crowded_image(cache: &Path, entries: usize) -> Result<BuiltImage, ImageError> {
    let archive = cache.join("crowded.tar");
    let mut builder = tar::Builder::new(Vec::with_capacity(entries * 512 + 1024));
    for i in 0..entries {
        let mut header = tar::Header::new_ustar();
        header.set_mode(0o644);
        header.set_mtime(0);
        header.set_size(0);
        header.set_entry_type(tar::EntryType::Regular);
        let path = format!("many/{i:010}-{}", "x".repeat(74));
        builder
            .append_data(&mut header, &path, io::empty())
            .map_err(io_error("building the layer of", &archive))?;
    }
    let tar = builder
        .into_inner()
        .map_err(io_error("building the layer of", &archive))?;
    let diff_id = sha256_digest(&tar);
    let layer = ("application/vnd.oci.image.layer.v1.tar", tar, diff_id);
    let names = ("crowded", "docker.io/library/hami-test-crowded:1");
    write_layer_archive(cache, names, layer, &["/many/0000000000"])
}
