use super::*;
use crate::loader_check::testelf::{TestElf, old_libc};
use proptest::prelude::*;

const TRUE: &str = "/usr/bin/true";
const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";
const BUSYBOX: &str = "/bin/busybox";
const MUSL: &str = "/usr/lib/x86_64-linux-musl/libc.so";

fn read(path: &str) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("fixture {path}: {e}"))
}

fn prefix(bytes: &[u8]) -> &[u8] {
    &bytes[..bytes.len().min(64 * 1024)]
}

#[test]
fn glibc_binary_names_its_loader() {
    let s = elf_summary(prefix(&read(TRUE))).unwrap();
    assert_eq!(s.class, ElfClass::Elf64);
    assert_eq!(s.machine, 62);
    assert_eq!(s.interp, Interp::Path("/lib64/ld-linux-x86-64.so.2".into()));
    assert!(s.dynamic);
}

#[test]
fn static_busybox_has_no_interpreter() {
    let s = elf_summary(prefix(&read(BUSYBOX))).unwrap();
    assert_eq!(s.interp, Interp::Absent);
}

#[test]
fn musl_libc_is_dynamic_without_interpreter() {
    let s = elf_summary(prefix(&read(MUSL))).unwrap();
    assert_eq!(s.interp, Interp::Absent);
    assert!(s.dynamic);
}

#[test]
fn debian_libc_defines_2_36() {
    let v = glibc_versions(&read(LIBC)).unwrap();
    let newest = *v.iter().max().unwrap();
    assert_eq!((newest.major, newest.minor), (2, 36));
    assert!(v.contains(&GlibcVersion::parse("GLIBC_2.2.5").unwrap()));
}

#[test]
fn musl_defines_no_versions() {
    assert_eq!(glibc_versions(&read(MUSL)), Err(ElfError::NoVerdef));
}

#[test]
fn built_old_libc_is_read() {
    let v = glibc_versions(&old_libc(33)).unwrap();
    assert_eq!(v.first().unwrap().to_string(), "GLIBC_2.2.5");
    assert_eq!(v.last().unwrap().to_string(), "GLIBC_2.33");
}

#[test]
fn interp_past_prefix_is_reported() {
    let bytes = TestElf {
        interp: Some("/lib/ld-musl-x86_64.so.1"),
        ..TestElf::default()
    }
    .build();
    let full = elf_summary(&bytes).unwrap();
    assert_eq!(full.interp, Interp::Path("/lib/ld-musl-x86_64.so.1".into()));
    let cut = elf_summary(&bytes[..bytes.len() - 4]).unwrap();
    assert_eq!(cut.interp, Interp::BeyondPrefix);
}

#[test]
fn not_elf() {
    assert_eq!(elf_summary(b"#!/bin/sh\n"), Err(ElfError::NotElf));
    assert_eq!(elf_summary(b""), Err(ElfError::NotElf));
    assert!(elf_summary(b"\x7fELF\x02\x01").is_err());
}

#[test]
fn shebang_lines() {
    let s = shebang(b"#!/bin/sh -e\necho").unwrap();
    assert_eq!(s.interpreter, "/bin/sh");
    assert_eq!(s.arg.as_deref(), Some("-e"));
    let s = shebang(b"#! /usr/bin/env  python3 \r\n").unwrap();
    assert_eq!(s.interpreter, "/usr/bin/env");
    assert_eq!(s.arg.as_deref(), Some("python3"));
    assert_eq!(shebang(b"#!\n"), None);
    assert_eq!(shebang(b"echo"), None);
}

#[test]
fn version_names() {
    assert_eq!(
        GlibcVersion::parse("GLIBC_2.2.5"),
        Some(GlibcVersion {
            major: 2,
            minor: 2,
            patch: 5
        })
    );
    assert_eq!(GlibcVersion::parse("GLIBC_PRIVATE"), None);
    assert_eq!(GlibcVersion::parse("GLIBC_2"), None);
    assert_eq!(GlibcVersion::parse("GLIBC_2.3.4.5"), None);
}

fn fixtures() -> &'static [Vec<u8>] {
    static FIXTURES: std::sync::OnceLock<Vec<Vec<u8>>> = std::sync::OnceLock::new();
    FIXTURES.get_or_init(|| {
        vec![
            prefix(&read(TRUE)).to_vec(),
            read(LIBC),
            prefix(&read(BUSYBOX)).to_vec(),
            old_libc(33),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        let _ = elf_summary(&bytes);
        let _ = glibc_versions(&bytes);
        let _ = shebang(&bytes);
    }

    #[test]
    fn mutated_elf_never_panics(
        which in 0usize..4,
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..16),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut bytes = fixtures()[which].clone();
        // Mutate the ELF header and the end of the file (where linkers put
        // the section table) more often than the body: that is where the
        // offsets are.
        for (i, (at, b)) in edits.iter().enumerate() {
            let len = bytes.len();
            let at = match i % 3 {
                0 => at.index(len.min(256)),
                1 => len - 1 - at.index(len.min(4096)),
                _ => at.index(len),
            };
            bytes[at] = *b;
        }
        let _ = elf_summary(&bytes);
        let _ = glibc_versions(&bytes);
        let short = &bytes[..cut.index(bytes.len() + 1)];
        let _ = elf_summary(short);
        let _ = glibc_versions(short);
    }
}
