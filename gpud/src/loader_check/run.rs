//! What a pod's container spec says about the program it runs (issue 38,
//! F8): its `command`, `args`, `workingDir` and the `PATH` of its `env`,
//! which override the image's `Entrypoint`, `Cmd`, `WorkingDir` and `Env`.
//! A check that judged the image's own entrypoint gave the hook to a glibc
//! image whose pod runs a static binary through `command`.
//!
//! amd-gpud only bounds these (bytes, entries) and keys its cache by them;
//! what they mean is worked out in the inspector child
//! ([`RunSpec::argv`], `classify`), like everything else a tenant wrote.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Entries of `command` and `args` together. Kubelet sets no bound of its
/// own; `ARG_MAX`-sized argument lists hold about 2,000 average words, and
/// only the first few decide the program.
pub const MAX_RUN_ENTRIES: usize = 1024;
/// Bytes of the whole spec (every string of it): the child's job frame
/// carries it, and its frames are held to 64 KiB.
pub const MAX_RUN_BYTES: usize = 32 << 10;

/// The container's start, as its pod spec says it (kubelet's `$(VAR)`
/// references already expanded by the plugin). Empty fields leave the
/// image's value in place; the default is "as the image says".
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RunSpec {
    /// `command`: replaces the image's `Entrypoint` (and drops its `Cmd`).
    #[serde(default)]
    pub command: Vec<String>,
    /// `args`: replaces the image's `Cmd`.
    #[serde(default)]
    pub args: Vec<String>,
    /// `workingDir`; empty: the image's `WorkingDir`.
    #[serde(default)]
    pub working_dir: String,
    /// `PATH` from the container's `env`; empty: the image's.
    #[serde(default)]
    pub path: String,
    /// The pod sets `PATH` from a source the plugin cannot read (`envFrom`,
    /// `valueFrom`): a program looked up in `PATH` cannot be told.
    #[serde(default)]
    pub path_unknown: bool,
}

/// A spec larger than the check reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the container's {what} is {found} {unit}, above the loader check's bound of {limit}")]
pub struct RunBound {
    pub what: &'static str,
    pub unit: &'static str,
    pub found: usize,
    pub limit: usize,
}

impl RunSpec {
    /// Whether the pod says nothing the image does not: the image's own
    /// entrypoint is judged.
    #[must_use]
    pub fn is_image_default(&self) -> bool {
        *self == Self::default()
    }

    /// This spec, if within [`MAX_RUN_ENTRIES`] and [`MAX_RUN_BYTES`].
    ///
    /// # Errors
    /// [`RunBound`] naming what is too large.
    pub fn bounded(self) -> Result<Self, RunBound> {
        let entries = self.command.len() + self.args.len();
        if entries > MAX_RUN_ENTRIES {
            return Err(RunBound {
                what: "command and args",
                unit: "entries",
                found: entries,
                limit: MAX_RUN_ENTRIES,
            });
        }
        let bytes = self
            .command
            .iter()
            .chain(&self.args)
            .map(String::len)
            .sum::<usize>()
            + self.working_dir.len()
            + self.path.len();
        if bytes > MAX_RUN_BYTES {
            return Err(RunBound {
                what: "command, args, workingDir and PATH",
                unit: "bytes",
                found: bytes,
                limit: MAX_RUN_BYTES,
            });
        }
        Ok(self)
    }

    /// The cache key of image `digest` started this way: the digest alone
    /// for the image's default, else the digest and a SHA-256 of the spec
    /// (a pod author must not be able to make one spec's answer serve
    /// another's, so no weaker hash).
    #[must_use]
    pub fn cache_key(&self, digest: &str) -> String {
        if self.is_image_default() {
            return digest.to_owned();
        }
        let mut hash = Sha256::new();
        for (tag, list) in [(b'c', &self.command), (b'a', &self.args)] {
            for item in list {
                hash.update([tag]);
                hash.update((item.len() as u64).to_le_bytes());
                hash.update(item.as_bytes());
            }
        }
        for (tag, text) in [(b'w', &self.working_dir), (b'p', &self.path)] {
            hash.update([tag]);
            hash.update((text.len() as u64).to_le_bytes());
            hash.update(text.as_bytes());
        }
        hash.update([b'u', u8::from(self.path_unknown)]);
        format!("{digest} run:{:x}", hash.finalize())
    }

    /// The container's whole argv, as kubelet and the runtime build it from
    /// the image's `entrypoint` and `cmd` (Kubernetes' "Define a Command and
    /// Arguments for a Container"): `command` replaces the entrypoint and
    /// drops `cmd`; `args` replaces `cmd`.
    #[must_use]
    pub fn argv(&self, entrypoint: &[String], cmd: &[String]) -> Vec<String> {
        let (head, tail): (&[String], &[String]) =
            match (self.command.is_empty(), self.args.is_empty()) {
                (false, _) => (&self.command, &self.args),
                (true, false) => (entrypoint, &self.args),
                (true, true) => (entrypoint, cmd),
            };
        head.iter().chain(tail).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn argv_follows_kubernetes_rules() {
        let entry = strings(&["/entry"]);
        let cmd = strings(&["serve", "--port=1"]);
        let none = RunSpec::default();
        assert_eq!(
            none.argv(&entry, &cmd),
            strings(&["/entry", "serve", "--port=1"])
        );
        let args = RunSpec {
            args: strings(&["/static"]),
            ..RunSpec::default()
        };
        assert_eq!(args.argv(&entry, &cmd), strings(&["/entry", "/static"]));
        assert_eq!(args.argv(&[], &cmd), strings(&["/static"]));
        let command = RunSpec {
            command: strings(&["/static"]),
            ..RunSpec::default()
        };
        assert_eq!(command.argv(&entry, &cmd), strings(&["/static"]));
        let both = RunSpec {
            command: strings(&["/bin/sh", "-c"]),
            args: strings(&["exec /static"]),
            ..RunSpec::default()
        };
        assert_eq!(
            both.argv(&entry, &cmd),
            strings(&["/bin/sh", "-c", "exec /static"])
        );
    }

    #[test]
    fn the_cache_key_tells_specs_apart() {
        let d = "sha256:abc";
        assert_eq!(RunSpec::default().cache_key(d), d);
        let a = RunSpec {
            command: strings(&["ab", "c"]),
            ..RunSpec::default()
        };
        let b = RunSpec {
            command: strings(&["a", "bc"]),
            ..RunSpec::default()
        };
        let c = RunSpec {
            args: strings(&["ab", "c"]),
            ..RunSpec::default()
        };
        let unknown = RunSpec {
            path_unknown: true,
            ..a.clone()
        };
        let keys = [
            a.cache_key(d),
            b.cache_key(d),
            c.cache_key(d),
            unknown.cache_key(d),
        ];
        assert!(
            keys.iter().all(|k| k.starts_with("sha256:abc run:")),
            "{keys:?}"
        );
        assert_ne!(keys[0], keys[1]);
        assert_ne!(keys[0], keys[2]);
        assert_ne!(keys[0], keys[3]);
        assert_eq!(a.cache_key(d), a.clone().cache_key(d));
    }

    #[test]
    fn bounds_name_what_is_too_large() {
        let many = RunSpec {
            args: vec![String::new(); MAX_RUN_ENTRIES + 1],
            ..RunSpec::default()
        };
        let err = many.bounded().unwrap_err();
        assert_eq!(
            (err.what, err.found),
            ("command and args", MAX_RUN_ENTRIES + 1)
        );
        let long = RunSpec {
            command: vec!["x".repeat(MAX_RUN_BYTES)],
            path: "/bin".to_owned(),
            ..RunSpec::default()
        };
        let err = long.bounded().unwrap_err();
        assert_eq!(err.found, MAX_RUN_BYTES + 4);
        assert!(
            err.to_string()
                .contains("above the loader check's bound of 32768"),
            "{err}"
        );
        let fine = RunSpec {
            command: vec!["x".repeat(MAX_RUN_BYTES)],
            ..RunSpec::default()
        };
        assert!(fine.bounded().is_ok());
    }
}
