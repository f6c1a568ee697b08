//! Issue 38, F2: tar extension records and a tree's text, bounded.

use std::io::{self, Read};

use tar::{EntryType, Header};

use super::{MAX_LONG_NAME, MAX_PAX};
use crate::loader_check::inspection::{InspectError, Limits};
use crate::loader_check::layers::{Budget, Compression, Node, Tree, apply_layer};
use crate::loader_check::testimage::{TarLayer, zstd};

fn apply(bytes: impl Read, limits: &Limits) -> Result<Tree, InspectError> {
    let budget = Budget::new(limits);
    let mut tree = Tree::default();
    apply_layer(
        &mut tree,
        bytes,
        Compression::None,
        "layer0",
        &budget,
        limits,
    )?;
    Ok(tree)
}

fn header(kind: EntryType, path: &str, size: u64) -> Header {
    let mut h = Header::new_gnu();
    h.set_entry_type(kind);
    h.set_path(path).unwrap();
    h.set_mode(0o644);
    h.set_size(size);
    h.set_mtime(0);
    h.set_cksum();
    h
}

/// A header block, then a body that never ends: it counts what was read
/// of it and fails past 16 MiB (a reader that read the record whole would
/// get that error, not the refusal).
struct Endless {
    head: Vec<u8>,
    read: u64,
}

impl Read for Endless {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.read >= 16 << 20 {
            return Err(io::Error::other("read 16 MiB of a record's body"));
        }
        let n = buf.len().min(4096);
        for (i, b) in buf[..n].iter_mut().enumerate() {
            let at = usize::try_from(self.read).unwrap() + i;
            *b = self.head.get(at).copied().unwrap_or(b'a');
        }
        self.read += n as u64;
        Ok(n)
    }
}

#[test]
fn a_long_name_declaring_a_gib_is_refused_before_its_body_is_read() {
    for (kind, record, limit, bound) in [
        (
            EntryType::GNULongName,
            "GNU long name",
            MAX_LONG_NAME,
            "MAX_LONG_NAME",
        ),
        (
            EntryType::GNULongLink,
            "GNU long link",
            MAX_LONG_NAME,
            "MAX_LONG_NAME",
        ),
        (
            EntryType::XHeader,
            "PAX extended header",
            MAX_PAX,
            "MAX_PAX",
        ),
        (
            EntryType::XGlobalHeader,
            "PAX global header",
            MAX_PAX,
            "MAX_PAX",
        ),
    ] {
        let mut blob = Endless {
            head: header(kind, "././@LongLink", 1 << 30).as_bytes().to_vec(),
            read: 0,
        };
        let err = apply(&mut blob, &Limits::default()).unwrap_err();
        assert_eq!(
            err,
            InspectError::TarRecord {
                digest: "layer0".to_owned(),
                record,
                offset: 0,
                size: 1 << 30,
                limit,
                bound,
            }
        );
        assert_eq!(err.reason(), "tar_record");
        assert!(err.to_string().contains(bound), "{err}");
        // The header and what the buffered reader below it took at once.
        assert!(blob.read <= 16 << 10, "read {} bytes", blob.read);
    }
}

/// A real record, zstd-compressed as the 33,798-byte layer of the issue
/// was: a name of 64 KiB (which the layer reader used to read whole, then
/// drop as longer than `PATH_MAX`).
#[test]
fn a_long_name_carrying_64_kib_is_refused() {
    let name = format!("{}/x", "n".repeat(64 << 10));
    let layer = TarLayer::new()
        .file("ok", 0o644, b"")
        .file(&name, 0o755, b"#!/bin/sh\n")
        .finish();
    let limits = Limits::default();
    let budget = Budget::new(&limits);
    let mut tree = Tree::default();
    let compressed = zstd(&layer);
    let err = apply_layer(
        &mut tree,
        compressed.as_slice(),
        Compression::Zstd,
        "layer0",
        &budget,
        &limits,
    )
    .unwrap_err();
    assert_eq!(
        err,
        InspectError::TarRecord {
            digest: "layer0".to_owned(),
            record: "GNU long name",
            offset: 512,
            size: name.len() as u64 + 1,
            limit: MAX_LONG_NAME,
            bound: "MAX_LONG_NAME",
        }
    );
}

#[test]
fn a_pax_record_carrying_64_kib_is_refused() {
    let value = "p".repeat(64 << 10);
    let body = format!("{} path={value}\n", value.len() + 13);
    let mut b = tar::Builder::new(Vec::new());
    let h = header(EntryType::XHeader, "PaxHeaders/x", body.len() as u64);
    b.append(&h, body.as_bytes()).unwrap();
    b.append(&header(EntryType::Regular, "x", 0), &[][..])
        .unwrap();
    let err = apply(b.into_inner().unwrap().as_slice(), &Limits::default()).unwrap_err();
    assert!(
        matches!(
            err,
            InspectError::TarRecord {
                record: "PAX extended header",
                offset: 0,
                bound: "MAX_PAX",
                ..
            }
        ),
        "{err:?}"
    );
}

/// An oversized long-name record after `entries`: refused at `offset`
/// only if the guard kept in step with `tar` through them.
fn refused_after(mut entries: Vec<u8>, offset: u64) {
    assert_eq!(entries.len() as u64, offset);
    entries.extend_from_slice(header(EntryType::GNULongName, "././@LongLink", 1 << 20).as_bytes());
    entries.resize(entries.len() + (1 << 20) + 1024, b'a');
    let err = apply(entries.as_slice(), &Limits::default()).unwrap_err();
    assert!(
        matches!(err, InspectError::TarRecord { offset: at, record: "GNU long name", .. } if at == offset),
        "{err:?}"
    );
}

/// The guard follows the archive as `tar` does: through long names and
/// links within their bounds, a PAX `size` overriding the next header's,
/// and GNU sparse extension blocks.
#[test]
fn the_guard_keeps_in_step_with_tar() {
    let long = format!("usr/{}/tool", "d".repeat(300));
    let target = format!("/{}", "t".repeat(300));
    let mut names = TarLayer::new()
        .file(&long, 0o755, b"#!/bin/sh\n")
        .symlink("bin/link", &target)
        .finish();
    names.truncate(names.len() - 1024); // the end-of-archive blocks
    let at = names.len() as u64;
    let tree = apply(
        TarLayer::new()
            .file(&long, 0o755, b"#!/bin/sh\n")
            .symlink("bin/link", &target)
            .finish()
            .as_slice(),
        &Limits::default(),
    )
    .unwrap();
    assert!(tree.get(&format!("/{long}")).is_some());
    assert_eq!(tree.get("/bin/link"), Some(&Node::Symlink(target)));
    refused_after(names, at);

    // A PAX size of 10 over a header that says 0: tar reads 10 bytes.
    let mut pax = header(EntryType::XHeader, "PaxHeaders/a", 11)
        .as_bytes()
        .to_vec();
    pax.extend_from_slice(b"11 size=10\n");
    pax.resize(1024, 0);
    pax.extend_from_slice(header(EntryType::Regular, "a", 0).as_bytes());
    pax.extend_from_slice(b"0123456789");
    pax.resize(2048, 0);
    refused_after(pax, 2048);

    // A sparse file whose map goes on in one extension block.
    let mut sparse = header(EntryType::GNUSparse, "s", 512);
    let gnu = sparse.as_gnu_mut().unwrap();
    gnu.sparse[0].set_offset(0);
    gnu.sparse[0].set_length(512);
    gnu.set_real_size(512);
    gnu.set_is_extended(true);
    sparse.set_cksum();
    let mut bytes = sparse.as_bytes().to_vec();
    bytes.extend_from_slice(tar::GnuExtSparseHeader::new().as_bytes());
    bytes.resize(bytes.len() + 512, b'z');
    refused_after(bytes, 1536);
}

/// 200,000 symlinks of 4,000-byte targets, made as they are read (the
/// issue's 900 KB layer held 1.68 GB): refused at `max_tree_bytes`, long
/// before the end.
struct Links {
    made: usize,
    buf: Vec<u8>,
    at: usize,
    target: String,
}

const LINKS: usize = 200_000;

impl Read for Links {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.at == self.buf.len() {
            if self.made == LINKS {
                return Ok(0);
            }
            let mut b = tar::Builder::new(Vec::new());
            let mut h = header(EntryType::Symlink, "x", 0);
            b.append_link(&mut h, format!("l/{}", self.made), &self.target)?;
            self.buf = std::mem::take(b.get_mut());
            self.at = 0;
            self.made += 1;
        }
        let n = out.len().min(self.buf.len() - self.at);
        out[..n].copy_from_slice(&self.buf[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

#[test]
fn many_long_symlinks_exceed_the_tree_budget() {
    let mut links = Links {
        made: 0,
        buf: Vec::new(),
        at: 0,
        target: format!("/{}", "abcdefg/".repeat(500)),
    };
    let limits = Limits::default();
    let err = apply(&mut links, &limits).map(|t| t.len()).unwrap_err();
    assert_eq!(
        err,
        InspectError::Limit {
            limit: "max_tree_bytes",
            value: 128 << 20
        }
    );
    let bound = usize::try_from(limits.max_tree_bytes).unwrap() / 4000;
    assert!(links.made <= bound + 2, "{} links read", links.made);
}

#[test]
fn the_tree_counts_what_it_keeps() {
    let lower = TarLayer::new()
        .symlink("a/link", "/target")
        .file("a/f", 0o644, b"")
        .finish();
    let upper = TarLayer::new().file("a/.wh.link", 0o644, b"").finish();
    let limits = Limits::default();
    let budget = Budget::new(&limits);
    let mut tree = Tree::default();
    apply_layer(
        &mut tree,
        lower.as_slice(),
        Compression::None,
        "l",
        &budget,
        &limits,
    )
    .unwrap();
    assert_eq!(
        tree.bytes(),
        ("/a/link".len() + "/target".len() + "/a/f".len()) as u64
    );
    apply_layer(
        &mut tree,
        upper.as_slice(),
        Compression::None,
        "u",
        &budget,
        &limits,
    )
    .unwrap();
    assert_eq!(tree.bytes(), "/a/f".len() as u64);
}
