//! Finding and opening `libamd_smi.so` (docs/amd-hardware.md §1.1, §12.8).

use std::{
    ffi::OsStr,
    path::{Path, PathBuf},
};

use tracing::{debug, info};

use super::{
    LibrarySource,
    dynlib::{Library, OpenError},
    report::ProbeFailure,
};

/// File names tried in every directory, newest ABI first.
const FILE_NAMES: [&str; 5] = [
    "libamd_smi.so.27",
    "libamd_smi.so.26",
    "libamd_smi.so.25",
    "libamd_smi.so.24",
    "libamd_smi.so",
];

/// Sonames handed to the dynamic loader after the directories.
const SONAMES: [&str; 5] = FILE_NAMES;

/// One place to look for the library.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Candidate {
    /// A file that must exist.
    File(PathBuf),
    /// A bare soname for the dynamic loader's own search path.
    Soname(&'static str),
}

/// Every candidate, in order: `env_dir` first, then `dirs`, then the bare sonames.
pub fn candidates(dirs: &[PathBuf], env_dir: Option<&Path>) -> Vec<Candidate> {
    let dirs = env_dir.into_iter().chain(dirs.iter().map(PathBuf::as_path));
    let files = dirs.flat_map(|dir| {
        FILE_NAMES
            .iter()
            .map(move |name| Candidate::File(dir.join(name)))
    });
    files
        .chain(SONAMES.iter().copied().map(Candidate::Soname))
        .collect()
}

/// Opens the library `source` names, returning it with the name it was loaded by.
pub fn open(
    source: &LibrarySource,
    env_dir: Option<&Path>,
) -> Result<(Library, String), ProbeFailure> {
    match source {
        LibrarySource::Disabled => Err(ProbeFailure::Disabled),
        LibrarySource::Path(path) => {
            let library = path.display().to_string();
            open_one(path.as_os_str(), &library).map(|lib| (lib, library))
        }
        LibrarySource::Search { dirs } => search(&candidates(dirs, env_dir)),
    }
}

fn open_one(name: &OsStr, library: &str) -> Result<Library, ProbeFailure> {
    let lib = Library::open(name).map_err(|e| failure(e, library))?;
    info!(library, "loaded AMD SMI library");
    Ok(lib)
}

fn failure(err: OpenError, library: &str) -> ProbeFailure {
    let library = library.to_owned();
    match err {
        OpenError::Load(reason) => ProbeFailure::Load { library, reason },
        OpenError::MissingSymbol(symbol) => ProbeFailure::MissingSymbol {
            library,
            symbol: symbol.to_owned(),
        },
    }
}

/// Tries each candidate. An absent file or an unknown soname moves on; a file that exists but
/// fails to load is remembered and reported (verbatim) if nothing else loads; a library that
/// loads but lacks a required symbol stops the search.
fn search(candidates: &[Candidate]) -> Result<(Library, String), ProbeFailure> {
    let mut tried = Vec::new();
    let mut load_error = None;
    for candidate in candidates {
        let (name, library, absent) = match candidate {
            Candidate::File(path) => (path.as_os_str(), path.display().to_string(), !path.exists()),
            Candidate::Soname(soname) => (OsStr::new(*soname), (*soname).to_owned(), false),
        };
        tried.push(library.clone());
        if absent {
            continue;
        }
        match open_one(name, &library) {
            Ok(lib) => return Ok((lib, library)),
            Err(ProbeFailure::Load { reason, .. }) if is_not_found(candidate, &reason) => {
                debug!(library, reason, "no such library");
            }
            Err(ProbeFailure::Load { reason, .. }) => {
                debug!(library, reason, "library exists but does not load");
                load_error.get_or_insert(ProbeFailure::Load { library, reason });
            }
            Err(other) => return Err(other),
        }
    }
    Err(load_error.unwrap_or(ProbeFailure::NotFound { tried }))
}

/// Whether a loader error for a bare soname only says the soname itself was not found (as
/// opposed to, say, a missing dependency such as libdrm).
fn is_not_found(candidate: &Candidate, reason: &str) -> bool {
    match candidate {
        Candidate::Soname(soname) => {
            reason.contains(&format!("{soname}: cannot open shared object file"))
        }
        Candidate::File(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    #[test]
    fn candidate_order() {
        let c = candidates(&["/opt/rocm/lib".into()], Some(Path::new("/env")));
        let want_prefix = [
            Candidate::File("/env/libamd_smi.so.27".into()),
            Candidate::File("/env/libamd_smi.so.26".into()),
            Candidate::File("/env/libamd_smi.so.25".into()),
            Candidate::File("/env/libamd_smi.so.24".into()),
            Candidate::File("/env/libamd_smi.so".into()),
            Candidate::File("/opt/rocm/lib/libamd_smi.so.27".into()),
        ];
        assert_eq!(c[..6], want_prefix);
        assert_eq!(c.len(), 15);
        assert_eq!(c[10], Candidate::Soname("libamd_smi.so.27"));
        assert_eq!(c[14], Candidate::Soname("libamd_smi.so"));
        assert_eq!(candidates(&[], None).len(), 5);
    }

    #[test]
    fn nothing_found_lists_what_was_tried() {
        let dir = tempfile::tempdir().unwrap();
        let files = candidates(&[dir.path().to_path_buf()], None);
        let only_files: Vec<Candidate> = files
            .into_iter()
            .filter(|c| matches!(c, Candidate::File(_)))
            .collect();
        let Err(ProbeFailure::NotFound { tried }) = search(&only_files) else {
            panic!("expected NotFound");
        };
        assert_eq!(tried.len(), 5);
        assert!(tried[0].ends_with("libamd_smi.so.27"), "{tried:?}");
    }

    #[test]
    fn a_file_that_does_not_load_is_reported_verbatim() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("libamd_smi.so.26"), b"not an ELF file").unwrap();
        // Directory candidates only: the loader's own path may hold a real
        // (or, under cargo, the fake) library.
        let only_files: Vec<Candidate> = candidates(&[dir.path().to_path_buf()], None)
            .into_iter()
            .filter(|c| matches!(c, Candidate::File(_)))
            .collect();
        let Err(ProbeFailure::Load { library, reason }) = search(&only_files) else {
            panic!("expected a load error");
        };
        assert!(library.ends_with("libamd_smi.so.26"), "{library}");
        assert!(!reason.is_empty());
    }

    #[test]
    fn unknown_sonames_are_not_load_errors() {
        let c = Candidate::Soname("libamd_smi.so.27");
        let msg = "libamd_smi.so.27: cannot open shared object file: No such file or directory";
        assert!(is_not_found(&c, msg));
        assert!(!is_not_found(
            &c,
            "libdrm.so.2: cannot open shared object file: No such file"
        ));
        assert!(matches!(
            search(&[Candidate::Soname("libamd_smi_does_not_exist.so.99")]),
            Err(ProbeFailure::NotFound { .. })
        ));
    }

    #[test]
    fn disabled_loads_nothing() {
        assert!(matches!(
            open(&LibrarySource::Disabled, None),
            Err(ProbeFailure::Disabled)
        ));
    }
}
