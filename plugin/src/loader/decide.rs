//! What a container gets once its image's loader is known: the memory hook,
//! no hook (the dmem controller caps its VRAM instead), or a refusal.
//! Pure, so that every case is a unit test (docs/loader-check.md).

use std::fmt;

/// The first glibc whose loader honours `LD_AUDIT` for the hook: 2.34
/// moved libpthread and libdl into libc.so.6, and the hook is built
/// against that layout (`GLIBC_2.34` symbols).
pub(crate) const FIRST_GLIBC: (u32, u32) = (2, 34);

/// The loader amd-gpud found (`InspectImage`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Found {
    Glibc { major: u32, minor: u32 },
    Musl,
    Static,
    Unknown,
}

/// One `InspectImage` answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Inspected {
    pub(crate) found: Found,
    pub(crate) digest: String,
    pub(crate) evidence: String,
}

impl Inspected {
    /// From the wire: `loader`, `glibc` ("2.36"), `digest`, `evidence`.
    /// A loader or version this plugin does not know reads as unknown.
    pub(crate) fn from_wire(loader: &str, glibc: &str, digest: String, evidence: String) -> Self {
        let version = glibc
            .split_once('.')
            .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)));
        let found = match (loader, version) {
            ("glibc", Some((major, minor))) => Found::Glibc { major, minor },
            ("musl", _) => Found::Musl,
            ("static", _) => Found::Static,
            _ => Found::Unknown,
        };
        Self {
            found,
            digest,
            evidence,
        }
    }
}

impl fmt::Display for Found {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Glibc { major, minor } => write!(f, "glibc {major}.{minor}"),
            Self::Musl => f.write_str("musl"),
            Self::Static => f.write_str("a static binary (no loader)"),
            Self::Unknown => f.write_str("an unknown loader"),
        }
    }
}

/// What the container gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    /// The hook goes into its staged directory.
    Hook,
    /// No hook: the loader would ignore it or fail on it, and the dmem
    /// controller caps the container's VRAM.
    NoHook,
    /// The container may not start: its memory slice would not be enforced.
    Refuse { remedy: &'static str },
}

const UNTOLD: &str = "run a program the check can tell (from an image whose libc is glibc 2.34 \
     or newer, named in command or args without a shell command line or values the plugin \
     cannot read), or turn on amd-gpud's dmem backend (GPUD_DMEM_BACKEND) so that the kernel caps \
     the slice's VRAM";
const OR_DMEM: &str = "use an image whose libc is glibc 2.34 or newer, or turn on amd-gpud's \
     dmem backend (GPUD_DMEM_BACKEND) so that the kernel caps the slice's VRAM";

/// The decision for an image whose loader is `found`, when the dmem
/// backend caps the slice (`capped`) or not.
pub(crate) fn decide(found: &Found, capped: bool) -> Decision {
    match found {
        Found::Glibc { major, minor } if (*major, *minor) >= FIRST_GLIBC => Decision::Hook,
        // With the kernel's cap the hook is not needed, whatever the loader
        // (issue 38, F8: "refused unless the dmem cap holds").
        _ if capped => Decision::NoHook,
        Found::Glibc { .. } | Found::Musl | Found::Static => Decision::Refuse { remedy: OR_DMEM },
        Found::Unknown => Decision::Refuse { remedy: UNTOLD },
    }
}

/// The staging key of a container's device ids: 64-bit FNV-1a over the
/// sorted ids, as 16 hex digits. Allocate and PreStartContainer both see the
/// same ids, in any order, so both name the same directory; the hash is
/// fixed here (not `std`'s, which may change between builds) so that a
/// plugin upgraded in between still agrees.
pub(crate) fn staging_key(ids: &[String]) -> String {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut sorted: Vec<&str> = ids.iter().map(String::as_str).collect();
    sorted.sort_unstable();
    let mut hash = OFFSET;
    for (i, id) in sorted.iter().enumerate() {
        let separator: &[u8] = if i == 0 { b"" } else { b"\n" };
        for byte in separator.iter().chain(id.as_bytes()) {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(PRIME);
        }
    }
    format!("{hash:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_loader_gets_its_documented_outcome() {
        let glibc = |minor| Found::Glibc { major: 2, minor };
        let refuse = |remedy| Decision::Refuse { remedy };
        let cases = [
            (glibc(36), false, Decision::Hook),
            (glibc(34), false, Decision::Hook),
            (Found::Glibc { major: 3, minor: 0 }, false, Decision::Hook),
            (glibc(33), true, Decision::NoHook),
            (glibc(33), false, refuse(OR_DMEM)),
            (Found::Musl, true, Decision::NoHook),
            (Found::Musl, false, refuse(OR_DMEM)),
            (Found::Static, true, Decision::NoHook),
            (Found::Static, false, refuse(OR_DMEM)),
            (Found::Unknown, true, Decision::NoHook),
            (Found::Unknown, false, refuse(UNTOLD)),
        ];
        for (found, capped, expected) in cases {
            assert_eq!(decide(&found, capped), expected, "{found} capped={capped}");
        }
    }

    #[test]
    fn wire_answers_read_back_and_strangers_are_unknown() {
        let read =
            |loader, glibc| Inspected::from_wire(loader, glibc, String::new(), String::new());
        assert_eq!(
            read("glibc", "2.36").found,
            Found::Glibc {
                major: 2,
                minor: 36
            }
        );
        assert_eq!(read("glibc", "").found, Found::Unknown);
        assert_eq!(read("glibc", "2.x").found, Found::Unknown);
        assert_eq!(read("musl", "").found, Found::Musl);
        assert_eq!(read("static", "").found, Found::Static);
        assert_eq!(read("bionic", "").found, Found::Unknown);
    }

    #[test]
    fn the_staging_key_ignores_order_and_tells_sets_apart() {
        let ids = |v: &[&str]| v.iter().map(ToString::to_string).collect::<Vec<_>>();
        let key = staging_key(&ids(&["gpu-1#0", "gpu-0#3"]));
        assert_eq!(key, staging_key(&ids(&["gpu-0#3", "gpu-1#0"])));
        assert_eq!(key.len(), 16);
        assert!(
            key.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        assert_ne!(key, staging_key(&ids(&["gpu-0#3gpu-1#0"])));
        assert_ne!(key, staging_key(&ids(&["gpu-0#3"])));
        // FNV-1a 64 of "a" (the published test vector).
        assert_eq!(staging_key(&ids(&["a"])), "af63dc4c8601ec8c");
    }
}
