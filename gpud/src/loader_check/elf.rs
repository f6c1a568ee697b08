//! What an image file is, told from its first bytes: an ELF object (its
//! class, machine, `PT_INTERP` and whether it links dynamically), a `#!`
//! script, or something else; and, for a `libc.so.6`, which `GLIBC_x.y`
//! version nodes it defines.
//!
//! Layouts follow the System V gABI (`refspecs.linuxfoundation.org:elf/gabi4+`,
//! "ELF Header", "Program Header", "Section Header") and the LSB's symbol
//! versioning chapter (`refspecs.linuxfoundation.org:LSB_5.0.0/LSB-Core-generic/
//! symversion.html`, `Elf*_Verdef` / `Elf*_Verdaux`). Every offset and count
//! read from the file is checked against the bytes at hand: these parsers
//! are fuzzed (`gpud/fuzz/fuzz_targets/elf.rs`).

use std::fmt;

/// The longest `PT_INTERP` string kept (Linux itself refuses a longer one
/// than `PATH_MAX`).
pub const MAX_INTERP: usize = 4096;
/// The longest `#!` line the kernel reads (`BINPRM_BUF_SIZE`).
const MAX_SHEBANG: usize = 256;
/// Program headers, sections and version definitions looked at, at most.
const MAX_PHDRS: usize = 4096;
const MAX_SECTIONS: usize = 65_536;
const MAX_VERDEFS: usize = 4096;

const PT_DYNAMIC: u32 = 2;
const PT_INTERP: u32 = 3;
const SHT_GNU_VERDEF: u32 = 0x6fff_fffd;
/// `e_phnum` saying the real count is elsewhere (section 0's `sh_info`).
const PN_XNUM: u16 = 0xffff;

/// ELF class: the width of the file's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElfClass {
    Elf32,
    Elf64,
}

/// What a file's `PT_INTERP` segment says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Interp {
    /// No `PT_INTERP`: the kernel runs the file without a loader.
    Absent,
    /// The loader's path, as the file names it.
    Path(String),
    /// There is a `PT_INTERP` but its string lies past the bytes read.
    BeyondPrefix,
}

/// What the headers of an ELF file say about how it is started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElfSummary {
    pub class: ElfClass,
    /// `e_machine` (62 is x86-64, 183 is AArch64).
    pub machine: u16,
    pub interp: Interp,
    /// Whether there is a `PT_DYNAMIC` segment.
    pub dynamic: bool,
}

/// Why bytes could not be read as the ELF structure asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ElfError {
    #[error("not an ELF file")]
    NotElf,
    #[error("ELF {what} out of bounds (offset {offset}, {len} bytes available)")]
    OutOfBounds {
        what: &'static str,
        offset: u64,
        len: usize,
    },
    #[error("malformed ELF: {0}")]
    Malformed(String),
    #[error("no symbol version definitions (SHT_GNU_verdef)")]
    NoVerdef,
}

/// A `GLIBC_major.minor[.patch]` version node name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GlibcVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl fmt::Display for GlibcVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GLIBC_{}.{}", self.major, self.minor)?;
        if self.patch != 0 {
            write!(f, ".{}", self.patch)?;
        }
        Ok(())
    }
}

impl GlibcVersion {
    /// `GLIBC_2.36` -> 2.36; anything else (e.g. `GLIBC_PRIVATE`) -> `None`.
    #[must_use]
    pub fn parse(name: &str) -> Option<Self> {
        let rest = name.strip_prefix("GLIBC_")?;
        let mut parts = rest.split('.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        let patch = match parts.next() {
            Some(p) => p.parse().ok()?,
            None => 0,
        };
        if parts.next().is_some() {
            return None;
        }
        Some(Self {
            major,
            minor,
            patch,
        })
    }
}

/// Bounds-checked reads of ELF fields in the file's byte order and class.
struct Reader<'a> {
    bytes: &'a [u8],
    big: bool,
    class: ElfClass,
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Result<Self, ElfError> {
        if bytes.get(..4) != Some(b"\x7fELF".as_slice()) {
            return Err(ElfError::NotElf);
        }
        let class = match bytes.get(4) {
            Some(1) => ElfClass::Elf32,
            Some(2) => ElfClass::Elf64,
            other => return Err(ElfError::Malformed(format!("EI_CLASS {other:?}"))),
        };
        let big = match bytes.get(5) {
            Some(1) => false,
            Some(2) => true,
            other => return Err(ElfError::Malformed(format!("EI_DATA {other:?}"))),
        };
        Ok(Self { bytes, big, class })
    }

    fn slice(&self, what: &'static str, offset: u64, len: u64) -> Result<&'a [u8], ElfError> {
        let oob = || ElfError::OutOfBounds {
            what,
            offset,
            len: self.bytes.len(),
        };
        let start = usize::try_from(offset).map_err(|_| oob())?;
        let len = usize::try_from(len).map_err(|_| oob())?;
        let end = start.checked_add(len).ok_or_else(oob)?;
        self.bytes.get(start..end).ok_or_else(oob)
    }

    fn uint(&self, what: &'static str, offset: u64, width: usize) -> Result<u64, ElfError> {
        let raw = self.slice(what, offset, width as u64)?;
        let mut v: u64 = 0;
        for i in 0..raw.len() {
            let b = if self.big {
                raw.get(i)
            } else {
                raw.get(raw.len() - 1 - i)
            };
            v = (v << 8) | u64::from(b.copied().unwrap_or(0));
        }
        Ok(v)
    }

    fn u16(&self, what: &'static str, offset: u64) -> Result<u16, ElfError> {
        let v = self.uint(what, offset, 2)?;
        u16::try_from(v).map_err(|_| ElfError::Malformed(what.to_owned()))
    }

    fn u32(&self, what: &'static str, offset: u64) -> Result<u32, ElfError> {
        let v = self.uint(what, offset, 4)?;
        u32::try_from(v).map_err(|_| ElfError::Malformed(what.to_owned()))
    }

    /// An address-sized field (`Elf32_Off`/`Elf64_Off`, `Elf*_Addr`, ...).
    fn word(&self, what: &'static str, offset: u64) -> Result<u64, ElfError> {
        self.uint(what, offset, self.word_len())
    }

    fn word_len(&self) -> usize {
        match self.class {
            ElfClass::Elf32 => 4,
            ElfClass::Elf64 => 8,
        }
    }

    /// `base + index * stride`, or an error naming `what` on overflow.
    fn at(what: &'static str, base: u64, index: usize, stride: u64) -> Result<u64, ElfError> {
        (index as u64)
            .checked_mul(stride)
            .and_then(|o| o.checked_add(base))
            .ok_or_else(|| ElfError::Malformed(format!("{what} offset overflows")))
    }
}

/// Where the program headers are: (offset, entry size, count).
fn program_headers(r: &Reader<'_>) -> Result<(u64, u64, usize), ElfError> {
    let (phoff_at, phentsize_at, phnum_at, min_entry) = match r.class {
        ElfClass::Elf32 => (28, 42, 44, 32),
        ElfClass::Elf64 => (32, 54, 56, 56),
    };
    let phoff = r.word("e_phoff", phoff_at)?;
    let phentsize = u64::from(r.u16("e_phentsize", phentsize_at)?);
    let phnum = r.u16("e_phnum", phnum_at)?;
    if phnum == PN_XNUM {
        return Err(ElfError::Malformed("e_phnum is PN_XNUM".to_owned()));
    }
    if phnum > 0 && phentsize < min_entry {
        return Err(ElfError::Malformed(format!("e_phentsize {phentsize}")));
    }
    Ok((phoff, phentsize, usize::from(phnum).min(MAX_PHDRS)))
}

/// The ELF headers of a file from its first bytes (`prefix`): class,
/// machine, `PT_INTERP` (bounded by [`MAX_INTERP`], and only if it lies
/// inside `prefix`) and whether a `PT_DYNAMIC` segment is present.
///
/// # Errors
/// [`ElfError::NotElf`] without the ELF magic; otherwise an error when the
/// headers are malformed or the program headers lie past `prefix`.
pub fn elf_summary(prefix: &[u8]) -> Result<ElfSummary, ElfError> {
    let r = Reader::new(prefix)?;
    let machine = r.u16("e_machine", 18)?;
    let (phoff, phentsize, phnum) = program_headers(&r)?;
    let mut interp = Interp::Absent;
    let mut dynamic = false;
    for i in 0..phnum {
        let ph = Reader::at("program header", phoff, i, phentsize)?;
        match r.u32("p_type", ph)? {
            PT_DYNAMIC => dynamic = true,
            PT_INTERP if interp == Interp::Absent => interp = read_interp(&r, ph)?,
            _ => {}
        }
    }
    Ok(ElfSummary {
        class: r.class,
        machine,
        interp,
        dynamic,
    })
}

/// The string a `PT_INTERP` program header at `ph` points at.
fn read_interp(r: &Reader<'_>, ph: u64) -> Result<Interp, ElfError> {
    let (off_at, size_at) = match r.class {
        ElfClass::Elf32 => (4, 16),
        ElfClass::Elf64 => (8, 32),
    };
    let offset = r.word("p_offset", ph.saturating_add(off_at))?;
    let filesz = r.word("p_filesz", ph.saturating_add(size_at))?;
    if filesz > MAX_INTERP as u64 {
        return Err(ElfError::Malformed(format!("PT_INTERP of {filesz} bytes")));
    }
    let Ok(raw) = r.slice("PT_INTERP", offset, filesz) else {
        return Ok(Interp::BeyondPrefix);
    };
    let raw = raw.split(|b| *b == 0).next().unwrap_or_default();
    if raw.is_empty() {
        return Err(ElfError::Malformed("empty PT_INTERP".to_owned()));
    }
    Ok(Interp::Path(String::from_utf8_lossy(raw).into_owned()))
}

/// A `#!` line: the interpreter and its one optional argument, split the
/// way Linux's `binfmt_script` does (first blank after the path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shebang {
    pub interpreter: String,
    pub arg: Option<String>,
}

/// The `#!` line of a script, if `prefix` starts with one.
#[must_use]
pub fn shebang(prefix: &[u8]) -> Option<Shebang> {
    let rest = prefix.strip_prefix(b"#!")?;
    let line = rest.get(..rest.len().min(MAX_SHEBANG - 2))?;
    let line = line.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let line = line.trim_matches(|c| c == ' ' || c == '\t' || c == '\r');
    let (interpreter, arg) = match line.split_once([' ', '\t']) {
        Some((i, a)) => (i, Some(a.trim_matches([' ', '\t']))),
        None => (line, None),
    };
    if interpreter.is_empty() {
        return None;
    }
    Some(Shebang {
        interpreter: interpreter.to_owned(),
        arg: arg.filter(|a| !a.is_empty()).map(str::to_owned),
    })
}

/// A section header's fields that matter here.
struct Section {
    kind: u32,
    link: u32,
    info: u32,
    offset: u64,
    size: u64,
}

fn section(r: &Reader<'_>, shoff: u64, shentsize: u64, index: usize) -> Result<Section, ElfError> {
    let sh = Reader::at("section header", shoff, index, shentsize)?;
    let w = r.word_len() as u64;
    // sh_name, sh_type, sh_flags(word), sh_addr(word), sh_offset(word),
    // sh_size(word), sh_link, sh_info: the same order in both classes.
    let offset_at = sh.saturating_add(8).saturating_add(2 * w);
    let size_at = offset_at.saturating_add(w);
    let link_at = size_at.saturating_add(w);
    Ok(Section {
        kind: r.u32("sh_type", sh.saturating_add(4))?,
        offset: r.word("sh_offset", offset_at)?,
        size: r.word("sh_size", size_at)?,
        link: r.u32("sh_link", link_at)?,
        info: r.u32("sh_info", link_at.saturating_add(4))?,
    })
}

/// The section table: (offset, entry size, count).
fn section_table(r: &Reader<'_>) -> Result<(u64, u64, usize), ElfError> {
    let (shoff_at, shentsize_at, shnum_at, min_entry) = match r.class {
        ElfClass::Elf32 => (32, 46, 48, 40),
        ElfClass::Elf64 => (40, 58, 60, 64),
    };
    let shoff = r.word("e_shoff", shoff_at)?;
    let shentsize = u64::from(r.u16("e_shentsize", shentsize_at)?);
    let mut shnum = usize::from(r.u16("e_shnum", shnum_at)?);
    if shoff == 0 {
        return Err(ElfError::NoVerdef);
    }
    if shentsize < min_entry {
        return Err(ElfError::Malformed(format!("e_shentsize {shentsize}")));
    }
    if shnum == 0 {
        // More than SHN_LORESERVE sections: the count is section 0's sh_size.
        let first = section(r, shoff, shentsize, 0)?;
        shnum = usize::try_from(first.size).unwrap_or(MAX_SECTIONS);
    }
    Ok((shoff, shentsize, shnum.min(MAX_SECTIONS)))
}

/// The `GLIBC_x.y[.z]` version nodes a shared object defines, read from its
/// `SHT_GNU_verdef` section and the string table that section links to;
/// sorted, without repeats. `whole` must be the whole file.
///
/// # Errors
/// [`ElfError::NoVerdef`] when the file defines no versions, or an error
/// naming the structure that is malformed or out of bounds.
pub fn glibc_versions(whole: &[u8]) -> Result<Vec<GlibcVersion>, ElfError> {
    let r = Reader::new(whole)?;
    let (shoff, shentsize, shnum) = section_table(&r)?;
    let mut verdef = None;
    for i in 0..shnum {
        let s = section(&r, shoff, shentsize, i)?;
        if s.kind == SHT_GNU_VERDEF {
            verdef = Some(s);
            break;
        }
    }
    let verdef = verdef.ok_or(ElfError::NoVerdef)?;
    let strtab_index = usize::try_from(verdef.link).unwrap_or(usize::MAX);
    if strtab_index >= shnum {
        return Err(ElfError::Malformed(format!(
            "verdef sh_link {strtab_index}"
        )));
    }
    let strtab = section(&r, shoff, shentsize, strtab_index)?;
    let defs = r.slice("SHT_GNU_verdef", verdef.offset, verdef.size)?;
    let strings = r.slice("verdef string table", strtab.offset, strtab.size)?;
    let count = usize::try_from(verdef.info).unwrap_or(MAX_VERDEFS);
    let mut found = verdef_names(&r, defs, strings, count.min(MAX_VERDEFS))?
        .iter()
        .filter_map(|n| GlibcVersion::parse(n))
        .collect::<Vec<_>>();
    found.sort_unstable();
    found.dedup();
    Ok(found)
}

/// The names of the version definitions in `defs` (the section's bytes):
/// each `Elf*_Verdef` (20 bytes in both classes) names itself in its first
/// `Elf*_Verdaux`; `vd_next`/`vd_aux` are byte offsets.
fn verdef_names(
    r: &Reader<'_>,
    defs: &[u8],
    strings: &[u8],
    count: usize,
) -> Result<Vec<String>, ElfError> {
    let d = Reader {
        bytes: defs,
        big: r.big,
        class: r.class,
    };
    let mut names = Vec::new();
    let mut at: u64 = 0;
    for _ in 0..count {
        if d.u16("vd_version", at)? != 1 {
            return Err(ElfError::Malformed(format!("vd_version at {at}")));
        }
        let aux = u64::from(d.u32("vd_aux", at.saturating_add(12))?);
        let next = u64::from(d.u32("vd_next", at.saturating_add(16))?);
        let name_at = at
            .checked_add(aux)
            .ok_or_else(|| ElfError::Malformed("vd_aux overflows".to_owned()))?;
        let name = d.u32("vda_name", name_at)?;
        names.push(string_at(strings, name)?);
        if next == 0 {
            break;
        }
        at = at
            .checked_add(next)
            .ok_or_else(|| ElfError::Malformed("vd_next overflows".to_owned()))?;
    }
    Ok(names)
}

/// The NUL-terminated string at `offset` of a string table.
fn string_at(strings: &[u8], offset: u32) -> Result<String, ElfError> {
    let oob = || ElfError::OutOfBounds {
        what: "version name",
        offset: u64::from(offset),
        len: strings.len(),
    };
    let start = usize::try_from(offset).map_err(|_| oob())?;
    let tail = strings.get(start..).ok_or_else(oob)?;
    let tail = tail.get(..tail.len().min(MAX_INTERP)).unwrap_or(tail);
    let end = tail.iter().position(|b| *b == 0).ok_or_else(oob)?;
    let raw = tail.get(..end).ok_or_else(oob)?;
    Ok(String::from_utf8_lossy(raw).into_owned())
}

#[cfg(test)]
mod tests;
