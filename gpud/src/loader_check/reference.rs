//! Image references as containerd's CRI plugin records them: a pod's
//! `image: rocm/pytorch` is stored as `docker.io/rocm/pytorch:latest`
//! (the normalisation of `distribution/reference`'s `ParseNormalizedNamed`:
//! a first component with no `.` or `:` that is not `localhost` is a Docker
//! Hub path, one-component Hub paths are under `library/`, and a reference
//! with neither tag nor digest means `:latest`).

/// The longest reference accepted (Docker's limit on a name is 255
/// characters; a tag and a digest add under 200).
pub const MAX_REFERENCE: usize = 512;

const HUB: &str = "docker.io";

/// Why a reference is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceError {
    #[error("image reference is empty")]
    Empty,
    #[error("image reference is {len} bytes, more than {MAX_REFERENCE}")]
    TooLong { len: usize },
    #[error("image reference {excerpt} has a character outside printable ASCII")]
    Character { excerpt: String },
    #[error("image reference {excerpt} has an empty path component")]
    EmptyComponent { excerpt: String },
}

/// The name containerd's CRI plugin gives the image `reference`.
///
/// # Errors
/// [`ReferenceError`] for an empty, overlong or unprintable reference.
pub fn normalize(reference: &str) -> Result<String, ReferenceError> {
    if reference.is_empty() {
        return Err(ReferenceError::Empty);
    }
    if reference.len() > MAX_REFERENCE {
        return Err(ReferenceError::TooLong {
            len: reference.len(),
        });
    }
    let excerpt = || crate::dmem::uid::excerpt(reference);
    if !reference.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ReferenceError::Character { excerpt: excerpt() });
    }
    let (name, digest) = match reference.split_once('@') {
        Some((name, digest)) => (name, Some(digest)),
        None => (reference, None),
    };
    if name.split('/').any(str::is_empty) {
        return Err(ReferenceError::EmptyComponent { excerpt: excerpt() });
    }
    let (domain, path) = match name.split_once('/') {
        Some((first, rest)) if is_domain(first) => (first, rest.to_owned()),
        _ => (HUB, name.to_owned()),
    };
    let domain = if domain == "index.docker.io" {
        HUB
    } else {
        domain
    };
    let path = if domain == HUB && !path.contains('/') {
        format!("library/{path}")
    } else {
        path
    };
    let last = path.rsplit('/').next().unwrap_or_default();
    let tagged = last.contains(':');
    let mut full = format!("{domain}/{path}");
    match digest {
        Some(digest) => {
            full.push('@');
            full.push_str(digest);
        }
        None if !tagged => full.push_str(":latest"),
        None => {}
    }
    Ok(full)
}

/// Whether a reference's first component names a registry.
fn is_domain(first: &str) -> bool {
    first.contains('.') || first.contains(':') || first == "localhost"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_are_spelt_as_cri_records_them() {
        let cases = [
            ("debian", "docker.io/library/debian:latest"),
            ("debian:12", "docker.io/library/debian:12"),
            ("rocm/pytorch", "docker.io/rocm/pytorch:latest"),
            (
                "index.docker.io/rocm/pytorch:v1",
                "docker.io/rocm/pytorch:v1",
            ),
            ("ghcr.io/a/b/c:1.0", "ghcr.io/a/b/c:1.0"),
            ("localhost/app", "localhost/app:latest"),
            ("registry:5000/app", "registry:5000/app:latest"),
            (
                "busybox@sha256:0123",
                "docker.io/library/busybox@sha256:0123",
            ),
            ("quay.io/x/y:t@sha256:0123", "quay.io/x/y:t@sha256:0123"),
        ];
        for (given, recorded) in cases {
            assert_eq!(normalize(given).as_deref(), Ok(recorded), "{given}");
        }
    }

    #[test]
    fn hostile_references_are_refused_with_their_excerpt() {
        assert_eq!(normalize(""), Err(ReferenceError::Empty));
        let long = "a".repeat(MAX_REFERENCE + 1);
        assert_eq!(
            normalize(&long),
            Err(ReferenceError::TooLong {
                len: MAX_REFERENCE + 1
            })
        );
        for bad in ["de bian", "a\nb", "caf\u{e9}"] {
            let err = normalize(bad).unwrap_err();
            assert!(matches!(err, ReferenceError::Character { .. }), "{bad:?}");
        }
        assert!(matches!(
            normalize("ghcr.io//x"),
            Err(ReferenceError::EmptyComponent { .. })
        ));
    }
}
