//! An image's file tree, merged from its layers without unpacking them.
//!
//! Each layer is a tar archive, possibly gzip- or zstd-compressed
//! (`opencontainers/image-spec:layer.md`, "Distributable Format"); layers
//! are applied bottom first, and an upper layer hides lower files with
//! whiteouts: `.wh.<name>` hides `<name>` and all beneath it,
//! `.wh..wh..opq` hides everything lower in its directory ("Whiteouts",
//! "Opaque Whiteout"). Only a summary of each regular file is kept (what
//! [`super::elf`] tells of its first bytes), never its content; everything
//! read is bounded by [`Limits`]: the bytes decompressed, the entries
//! kept and the bytes of text they keep (`max_tree_bytes`), the deadline,
//! and tar extension records larger than their bound are refused before
//! they are read ([`guard`]).

mod budget;
mod guard;

use std::{
    collections::BTreeMap,
    io::{self, BufReader, Read},
};

use super::elf::{self, ElfSummary, GlibcVersion, Interp, Shebang};
use super::inspection::{InspectError, Limits};
use super::zstd::ZstdFrames;
pub(crate) use budget::Budget;
use budget::{Counted, Trip};
use guard::TarGuard;

/// Bytes read from the start of an executable to summarise it.
pub(crate) const PREFIX_LEN: usize = 64 * 1024;
const PREFIX: u64 = PREFIX_LEN as u64;
const WHITEOUT: &str = ".wh.";
/// Paths and link targets longer than Linux's `PATH_MAX` are not kept.
pub(crate) const MAX_PATH: usize = 4096;
const OPAQUE: &str = ".wh..wh..opq";

/// What one path of the merged tree is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Node {
    Dir,
    /// The link's target, as stored (relative or absolute).
    Symlink(String),
    /// The normalised path of the file this is a hard link to.
    Hardlink(String),
    File(FileSummary),
    /// A device, FIFO or other entry that no loader runs.
    Other,
}

/// What is known of a regular file without keeping it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FileSummary {
    pub(crate) mode: u32,
    pub(crate) kind: FileKind,
    /// For a `libc.so.6` (or `libc-2.*.so`): the `GLIBC_*` versions it
    /// defines, or why they could not be read.
    pub(crate) glibc: Option<Result<Vec<GlibcVersion>, String>>,
}

/// What a regular file's first bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FileKind {
    /// Neither executable nor named like a loader or libc: not looked at.
    NotRead,
    Elf(ElfSummary),
    /// ELF magic but headers that could not be read (why).
    BadElf(String),
    Script(Shebang),
    Other,
}

impl FileSummary {
    pub(crate) fn executable(&self) -> bool {
        self.mode & 0o111 != 0
    }
}

/// The merged file tree: normalised absolute path (`/usr/bin/true`) to node.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tree {
    nodes: BTreeMap<String, Node>,
    /// What the nodes keep, as [`cost`] counts it.
    bytes: u64,
}

impl Node {
    /// Bytes of text this node keeps besides its path.
    fn kept_bytes(&self) -> usize {
        match self {
            Self::Dir | Self::Other => 0,
            Self::Symlink(to) | Self::Hardlink(to) => to.len(),
            Self::File(f) => f.kept_bytes(),
        }
    }
}

impl FileSummary {
    fn kept_bytes(&self) -> usize {
        let kind = match &self.kind {
            FileKind::Elf(ElfSummary {
                interp: Interp::Path(p),
                ..
            }) => p.len(),
            FileKind::BadElf(why) => why.len(),
            FileKind::Script(s) => s.interpreter.len() + s.arg.as_ref().map_or(0, String::len),
            _ => 0,
        };
        let glibc = match &self.glibc {
            Some(Ok(v)) => v.len() * size_of::<GlibcVersion>(),
            Some(Err(why)) => why.len(),
            None => 0,
        };
        kind + glibc
    }
}

/// The bytes of text an entry of the tree keeps: its path and its node's.
fn cost(path: &str, node: &Node) -> u64 {
    (path.len() + node.kept_bytes()) as u64
}

impl Tree {
    pub(crate) fn get(&self, path: &str) -> Option<&Node> {
        self.nodes.get(path)
    }

    pub(crate) fn len(&self) -> usize {
        self.nodes.len()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &Node)> {
        self.nodes.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Bytes of text the tree keeps (`max_tree_bytes`).
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Sets `path` (normalised) to `node`.
    pub(crate) fn insert(&mut self, path: &str, node: Node) {
        self.bytes += cost(path, &node);
        if let Some(old) = self.nodes.insert(path.to_owned(), node) {
            self.bytes -= cost(path, &old);
        }
    }

    fn remove(&mut self, path: &str) {
        if let Some(old) = self.nodes.remove(path) {
            self.bytes -= cost(path, &old);
        }
    }

    /// Removes `path` itself, if asked, and everything beneath it.
    fn remove_tree(&mut self, path: &str, itself: bool) {
        if itself {
            self.remove(path);
        }
        let prefix = if path == "/" {
            "/".to_owned()
        } else {
            format!("{path}/")
        };
        let doomed: Vec<String> = self
            .nodes
            .range(prefix.clone()..)
            .map(|(k, _)| k)
            .take_while(|k| k.starts_with(&prefix))
            .cloned()
            .collect();
        for k in doomed {
            self.remove(&k);
        }
    }

    /// Applies one layer's changes on top of the tree.
    fn apply(&mut self, layer: Changes) {
        for dir in &layer.opaque {
            self.remove_tree(dir, false);
        }
        for path in &layer.whiteouts {
            self.remove_tree(path, true);
        }
        for (path, node) in layer.entries {
            if node != Node::Dir {
                self.remove_tree(&path, false);
            }
            self.insert(&path, node);
        }
    }
}

/// `raw` as an absolute path without `.`, `..` or repeated slashes (`..`
/// stops at the root); `None` for the root itself.
pub(crate) fn normalize(raw: &str) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    for c in raw.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    if parts.is_empty() {
        return None;
    }
    Some(format!("/{}", parts.join("/")))
}

/// The last component of a normalised path.
pub(crate) fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// The directory of a normalised path (`/` for a top-level entry).
pub(crate) fn parent(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => path.get(..i).unwrap_or("/"),
    }
}

/// Whether glibc's C library may be in a file of this name.
pub(crate) fn is_libc_name(name: &str) -> bool {
    name == "libc.so.6" || (name.starts_with("libc-2.") && name.ends_with(".so"))
}

/// How a layer blob is compressed, from its media type; `None` when it is
/// not a layer type this reader knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Compression {
    None,
    Gzip,
    Zstd,
}

impl Compression {
    pub(crate) fn of(media_type: &str) -> Option<Self> {
        const KNOWN: [&str; 4] = [
            "application/vnd.oci.image.layer.v1.",
            "application/vnd.oci.image.layer.nondistributable.v1.",
            "application/vnd.docker.image.rootfs.diff.",
            "application/vnd.docker.image.rootfs.foreign.diff.",
        ];
        let kind = KNOWN.iter().find_map(|k| media_type.strip_prefix(k))?;
        match kind {
            "tar" => Some(Self::None),
            "tar+gzip" | "tar.gzip" => Some(Self::Gzip),
            "tar+zstd" => Some(Self::Zstd),
            _ => None,
        }
    }
}

/// One layer's changes, gathered before they are applied: whiteouts apply
/// only to lower layers, whatever their place in the archive.
#[derive(Default)]
struct Changes {
    opaque: Vec<String>,
    whiteouts: Vec<String>,
    entries: Vec<(String, Node)>,
    /// Bytes of text kept, as [`cost`] counts it.
    bytes: u64,
}

impl Changes {
    fn len(&self) -> usize {
        self.opaque.len() + self.whiteouts.len() + self.entries.len()
    }

    fn entry(&mut self, path: String, node: Node) {
        self.bytes += cost(&path, &node);
        self.entries.push((path, node));
    }

    fn hide(&mut self, path: String, opaque: bool) {
        self.bytes += path.len() as u64;
        if opaque {
            self.opaque.push(path);
        } else {
            self.whiteouts.push(path);
        }
    }
}

/// A read error or a refusal, sorted out by [`Budget::failure`].
enum Failure {
    Io(io::Error),
    Inspect(InspectError),
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

/// Reads the layer `blob` (compressed as `compression`) and applies it to
/// `tree`.
///
/// # Errors
/// A limit or the deadline reached, or a read error naming `digest`.
pub(crate) fn apply_layer(
    tree: &mut Tree,
    blob: impl Read,
    compression: Compression,
    digest: &str,
    budget: &Budget,
    limits: &Limits,
) -> Result<(), InspectError> {
    let blob = BufReader::new(blob);
    let decoded: Box<dyn Read + '_> = match compression {
        Compression::None => Box::new(blob),
        Compression::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(blob)),
        Compression::Zstd => Box::new(ZstdFrames::new(blob)),
    };
    let counted = Counted {
        inner: decoded,
        budget,
    };
    let mut archive = tar::Archive::new(TarGuard::new(counted, budget));
    let kept = (tree.len(), tree.bytes());
    let changes = match read_changes(&mut archive, kept, budget, limits) {
        Ok(c) => c,
        Err(Failure::Inspect(e)) => return Err(e),
        Err(Failure::Io(e)) => return Err(budget.failure(digest, &e)),
    };
    tree.apply(changes);
    Ok(())
}

fn read_changes<R: Read>(
    archive: &mut tar::Archive<R>,
    (kept, kept_bytes): (usize, u64),
    budget: &Budget,
    limits: &Limits,
) -> Result<Changes, Failure> {
    let mut changes = Changes::default();
    for entry in archive.entries()? {
        budget.check_time().map_err(Failure::Inspect)?;
        let mut entry = entry?;
        let raw = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        if raw.len() > MAX_PATH {
            continue; // no file system the container runs on has it
        }
        let Some(path) = normalize(&raw) else {
            continue; // the root directory itself
        };
        let name = basename(&path);
        if name == OPAQUE {
            changes.hide(parent(&path).to_owned(), true);
        } else if let Some(hidden) = name.strip_prefix(WHITEOUT) {
            let dir = parent(&path);
            if let Some(hidden) = normalize(&format!("{dir}/{hidden}"))
                && parent(&hidden) == dir
            {
                changes.hide(hidden, false);
            }
        } else {
            let node = entry_node(&mut entry, &path, limits)?;
            changes.entry(path, node);
        }
        if kept.saturating_add(changes.len()) > limits.max_entries {
            return Err(Failure::Inspect(InspectError::Limit {
                limit: "max_entries",
                value: limits.max_entries as u64,
            }));
        }
        if kept_bytes.saturating_add(changes.bytes) > limits.max_tree_bytes {
            return Err(Failure::Inspect(InspectError::Limit {
                limit: "max_tree_bytes",
                value: limits.max_tree_bytes,
            }));
        }
    }
    Ok(changes)
}

fn entry_node<R: Read>(
    entry: &mut tar::Entry<'_, R>,
    path: &str,
    limits: &Limits,
) -> Result<Node, Failure> {
    use tar::EntryType as T;
    let header = entry.header();
    let kind = header.entry_type();
    let mode = header.mode().unwrap_or(0);
    let size = header.size().unwrap_or(0);
    let link = entry
        .link_name_bytes()
        .map(|l| String::from_utf8_lossy(&l).into_owned())
        .filter(|l| l.len() <= MAX_PATH);
    Ok(match (kind, link) {
        (T::Directory, _) => Node::Dir,
        (T::Symlink, Some(to)) => Node::Symlink(to),
        (T::Link, Some(to)) => Node::Hardlink(normalize(&to).unwrap_or_else(|| "/".to_owned())),
        (T::Regular | T::Continuous, _) => Node::File(summarize(entry, path, mode, size, limits)?),
        _ => Node::Other,
    })
}

/// The summary of a regular file whose data `data` is about to be read.
fn summarize(
    data: &mut impl Read,
    path: &str,
    mode: u32,
    size: u64,
    limits: &Limits,
) -> Result<FileSummary, Failure> {
    let name = basename(path);
    let libc = is_libc_name(name);
    let wanted = if libc {
        if size > limits.max_libc {
            return Err(Failure::Inspect(InspectError::Limit {
                limit: "max_libc",
                value: limits.max_libc,
            }));
        }
        limits.max_libc
    } else if mode & 0o111 != 0 || name.starts_with("ld-") {
        PREFIX
    } else {
        return Ok(FileSummary {
            mode,
            kind: FileKind::NotRead,
            glibc: None,
        });
    };
    let mut bytes = Vec::new();
    data.take(wanted).read_to_end(&mut bytes)?;
    let prefix = bytes.get(..bytes.len().min(PREFIX_LEN)).unwrap_or(&bytes);
    let glibc = libc.then(|| elf::glibc_versions(&bytes).map_err(|e| e.to_string()));
    Ok(FileSummary {
        mode,
        kind: kind_of(prefix),
        glibc,
    })
}

/// What a file's first bytes say it is.
pub(crate) fn kind_of(prefix: &[u8]) -> FileKind {
    if let Some(s) = elf::shebang(prefix) {
        return FileKind::Script(s);
    }
    match elf::elf_summary(prefix) {
        Ok(s) => FileKind::Elf(s),
        Err(elf::ElfError::NotElf) => FileKind::Other,
        Err(e) => FileKind::BadElf(e.to_string()),
    }
}

#[cfg(test)]
mod tests;
