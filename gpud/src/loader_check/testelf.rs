//! A tiny ELF64 little-endian writer for the tests: program headers
//! (`PT_INTERP`, `PT_DYNAMIC`) and an `SHT_GNU_verdef` section with its
//! string table, laid out as the gABI describes, and nothing else.

/// What to put in the file.
#[derive(Default)]
pub(crate) struct TestElf<'a> {
    pub(crate) interp: Option<&'a str>,
    pub(crate) dynamic: bool,
    /// Version node names, e.g. `GLIBC_2.2.5`; none: no verdef section.
    pub(crate) verdefs: &'a [&'a str],
}

fn put16(v: &mut Vec<u8>, x: u16) {
    v.extend_from_slice(&x.to_le_bytes());
}
fn put32(v: &mut Vec<u8>, x: u32) {
    v.extend_from_slice(&x.to_le_bytes());
}
fn put64(v: &mut Vec<u8>, x: u64) {
    v.extend_from_slice(&x.to_le_bytes());
}
fn len64(v: &[u8]) -> u64 {
    u64::try_from(v.len()).expect("small")
}
fn len32(v: &[u8]) -> u32 {
    u32::try_from(v.len()).expect("small")
}

/// The verdef section and its string table for `names`.
fn verdef(names: &[&str]) -> (Vec<u8>, Vec<u8>) {
    let mut strtab = vec![0u8];
    let mut defs = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let name_at = len32(&strtab);
        strtab.extend_from_slice(name.as_bytes());
        strtab.push(0);
        let last = i + 1 == names.len();
        put16(&mut defs, 1); // vd_version
        put16(&mut defs, u16::from(i == 0)); // vd_flags: VER_FLG_BASE on the first
        put16(&mut defs, u16::try_from(i + 1).expect("small")); // vd_ndx
        put16(&mut defs, 1); // vd_cnt
        put32(&mut defs, 0); // vd_hash (not checked)
        put32(&mut defs, 20); // vd_aux
        put32(&mut defs, if last { 0 } else { 28 }); // vd_next
        put32(&mut defs, name_at); // vda_name
        put32(&mut defs, 0); // vda_next
    }
    (defs, strtab)
}

fn phdr(out: &mut Vec<u8>, kind: u32, offset: u64, size: u64) {
    put32(out, kind);
    put32(out, 4); // p_flags
    put64(out, offset);
    put64(out, offset); // p_vaddr
    put64(out, offset); // p_paddr
    put64(out, size);
    put64(out, size);
    put64(out, 1);
}

fn shdr(out: &mut Vec<u8>, kind: u32, offset: u64, size: u64, link: u32, info: u32) {
    put32(out, 0); // sh_name
    put32(out, kind);
    put64(out, 0); // sh_flags
    put64(out, 0); // sh_addr
    put64(out, offset);
    put64(out, size);
    put32(out, link);
    put32(out, info);
    put64(out, 8); // sh_addralign
    put64(out, 0); // sh_entsize
}

impl TestElf<'_> {
    /// The file's bytes.
    pub(crate) fn build(&self) -> Vec<u8> {
        let interp = self.interp.map(|p| {
            let mut v = p.as_bytes().to_vec();
            v.push(0);
            v
        });
        let phnum = u16::from(interp.is_some()) + u16::from(self.dynamic);
        let (defs, strtab) = verdef(self.verdefs);
        let data_at = 64 + 56 * u64::from(phnum);
        let interp_len = interp.as_deref().map_or(0, len64);
        let defs_at = data_at + interp_len;
        let strtab_at = defs_at + len64(&defs);
        let shoff = strtab_at + len64(&strtab);
        let shnum: u16 = if self.verdefs.is_empty() { 0 } else { 3 };

        let mut out = b"\x7fELF\x02\x01\x01".to_vec();
        out.resize(16, 0);
        put16(&mut out, 3); // e_type ET_DYN
        put16(&mut out, 62); // e_machine x86-64
        put32(&mut out, 1);
        put64(&mut out, 0); // e_entry
        put64(&mut out, 64); // e_phoff
        put64(&mut out, if shnum == 0 { 0 } else { shoff });
        put32(&mut out, 0); // e_flags
        for x in [64, 56, phnum, 64, shnum, 0] {
            put16(&mut out, x);
        }
        if let Some(i) = &interp {
            phdr(&mut out, 3, data_at, len64(i));
        }
        if self.dynamic {
            phdr(&mut out, 2, defs_at, 0);
        }
        out.extend_from_slice(interp.as_deref().unwrap_or_default());
        out.extend_from_slice(&defs);
        out.extend_from_slice(&strtab);
        if shnum != 0 {
            shdr(&mut out, 0, 0, 0, 0, 0);
            let count = u32::try_from(self.verdefs.len()).expect("small");
            shdr(&mut out, 0x6fff_fffd, defs_at, len64(&defs), 2, count);
            shdr(&mut out, 3, strtab_at, len64(&strtab), 0, 0);
        }
        out
    }
}

/// A `libc.so.6` defining `GLIBC_2.2.5` .. `GLIBC_2.<newest>` (the x86-64
/// series: 2.2.5, 2.2.6, 2.3, 2.3.2, ... simplified to 2.2.5 then 2.3..).
pub(crate) fn old_libc(newest: u32) -> Vec<u8> {
    let mut names = vec!["GLIBC_2.2.5".to_owned()];
    names.extend((3..=newest).map(|m| format!("GLIBC_2.{m}")));
    names.push("GLIBC_PRIVATE".to_owned());
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    TestElf {
        dynamic: true,
        verdefs: &refs,
        ..TestElf::default()
    }
    .build()
}
