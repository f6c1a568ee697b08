//! Pod UIDs as callers send them, checked before anything is built from them.
//!
//! Two forms exist (kubernetes/kubernetes:pkg/kubelet/config/common.go): API pods carry a
//! lowercase RFC 4122 UUID (`8-4-4-4-12` hex digits with dashes), static pods
//! the 32 hex digits of an MD5 that kubelet computes. Anything else, uppercase
//! included, is refused; the check looks at the length first, so a 10 KiB
//! string costs nothing.

use std::fmt;

/// Why a string is not a pod UID. Carries a bounded, escaped excerpt of the
/// input, never the input itself (it may be huge or hold control characters).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UidError {
    #[error("pod UID {excerpt} has {len} bytes; a UUID has 36, a static pod UID 32")]
    Length { excerpt: String, len: usize },
    #[error(
        "pod UID {excerpt} is neither a lowercase UUID (8-4-4-4-12 hex digits) nor 32 lowercase hex digits"
    )]
    Form { excerpt: String },
}

/// A validated pod UID: only `[0-9a-f-]`, in one of the two shapes kubelet
/// uses, so it can never spell a path component other than itself.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodUid(String);

/// Where the dashes of a UUID are.
const DASHES: [usize; 4] = [8, 13, 18, 23];
const UUID_LEN: usize = 36;
const STATIC_LEN: usize = 32;

impl PodUid {
    /// Checks `text`.
    ///
    /// # Errors
    /// [`UidError`] for any other length or character.
    pub fn parse(text: &str) -> Result<Self, UidError> {
        let len = text.len();
        if len != UUID_LEN && len != STATIC_LEN {
            return Err(UidError::Length {
                excerpt: excerpt(text),
                len,
            });
        }
        let hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
        let ok = text.bytes().enumerate().all(|(i, b)| {
            if len == UUID_LEN && DASHES.contains(&i) {
                b == b'-'
            } else {
                hex(b)
            }
        });
        if ok {
            Ok(Self(text.to_owned()))
        } else {
            Err(UidError::Form {
                excerpt: excerpt(text),
            })
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The UID as the systemd cgroup driver spells it: every `-` becomes `_`
    /// (kubelet's `escapeSystemdCgroupName`).
    pub fn systemd_escaped(&self) -> String {
        self.0.replace('-', "_")
    }
}

impl fmt::Display for PodUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// At most 40 characters of `text`, escaped and quoted, for messages and logs.
pub fn excerpt(text: &str) -> String {
    const MAX: usize = 40;
    let mut out: String = text
        .chars()
        .take(MAX)
        .flat_map(char::escape_debug)
        .collect();
    if text.chars().nth(MAX).is_some() {
        out.push('…');
    }
    format!("\"{out}\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_two_kubelet_forms() {
        let api = PodUid::parse("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0").unwrap();
        assert_eq!(
            api.systemd_escaped(),
            "0f1e2d3c_4b5a_6978_8796_a5b4c3d2e1f0"
        );
        let stat = PodUid::parse("6f1e3a0e0c8b2d9f7a6b5c4d3e2f1a0b").unwrap();
        assert_eq!(stat.systemd_escaped(), stat.as_str());
    }

    #[test]
    fn refuses_everything_else() {
        let long = "a".repeat(10 * 1024);
        for bad in [
            "",
            "../../../../etc/passwd",
            "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f/",
            "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1..",
            "0F1E2D3C-4B5A-6978-8796-A5B4C3D2E1F0",
            "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f\0",
            "0f1e2d3c 4b5a 6978 8796 a5b4c3d2e1f0",
            "0f1e2d3c4b5a-6978-8796-a5b4c3d2e1f0-",
            "6f1e3a0e0c8b2d9f7a6b5c4d3e2f1a0g",
            "6f1e3a0e0c8b2d9f7a6b5c4d3e2f1a0",
            "0f1e2d3c-4b5a-6978-8796-a5b4c3d2é1",
            long.as_str(),
        ] {
            assert!(PodUid::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn messages_carry_a_short_escaped_excerpt() {
        let err = PodUid::parse(&format!("x\0y{}", "z".repeat(10_000))).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(r"x\0y"), "{text}");
        assert!(text.contains("10003 bytes"), "{text}");
        assert!(text.len() < 200, "{text}");
        let err = PodUid::parse("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f/").unwrap_err();
        assert!(matches!(err, UidError::Form { .. }));
    }
}
