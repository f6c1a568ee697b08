//! What the kubelet's config file says about cgroups: `cgroupDriver`,
//! `cgroupRoot` and `cgroupsPerQOS` (kubernetes/kubernetes:
//! pkg/kubelet/apis/config/types.go; the most authoritative source of the
//! driver).
//!
//! The file is YAML (a `KubeletConfiguration`, usually
//! `/var/lib/kubelet/config.yaml`). Only top-level `key: value` lines are
//! read; anything else (nested keys, JSON, flow style) leaves the value
//! unknown, and detection falls back to looking at the cgroup tree.

use std::{io, path::Path};

/// Longest kubelet config read.
const MAX_CONFIG: u64 = 1024 * 1024;

/// The cgroup settings of a kubelet config; `None` where it says nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KubeletCgroups {
    pub driver: Option<String>,
    pub root: Option<String>,
    pub per_qos: Option<bool>,
}

impl KubeletCgroups {
    /// Reads `path`; a missing file says nothing.
    ///
    /// # Errors
    /// When the file exists but cannot be read.
    pub fn read(path: &Path) -> io::Result<Self> {
        use std::io::Read;
        crate::deadline::reading(path);
        match std::fs::File::open(path) {
            Ok(file) => {
                let mut text = String::new();
                file.take(MAX_CONFIG).read_to_string(&mut text)?;
                Ok(Self::parse(&text))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(e),
        }
    }

    /// The settings in a config's text.
    pub fn parse(text: &str) -> Self {
        let mut out = Self::default();
        for line in text.lines() {
            // Top level only: nested keys are indented.
            if line.starts_with([' ', '\t', '#']) {
                continue;
            }
            let Some((key, value)) = line.split_once(':') else {
                continue;
            };
            let value = scalar(value);
            match key.trim() {
                "cgroupDriver" => out.driver = value,
                "cgroupRoot" => out.root = value,
                "cgroupsPerQOS" => out.per_qos = value.and_then(|v| v.parse().ok()),
                _ => {}
            }
        }
        out
    }
}

/// A plain or quoted YAML scalar without a trailing comment; `None` if empty.
fn scalar(raw: &str) -> Option<String> {
    let raw = raw.trim();
    let unquoted = ['"', '\'']
        .iter()
        .find_map(|q| raw.strip_prefix(*q).and_then(|r| r.split_once(*q)))
        .map(|(inside, _)| inside);
    let value = match unquoted {
        Some(inside) => inside,
        None => raw.split(" #").next().unwrap_or("").trim(),
    };
    (!value.is_empty()).then(|| value.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_top_level_cgroup_keys() {
        let text = "apiVersion: kubelet.config.k8s.io/v1beta1\n\
                    kind: KubeletConfiguration\n\
                    cgroupDriver: systemd # set by kubeadm\n\
                    cgroupRoot: \"/kubelet\"\n\
                    cgroupsPerQOS: false\n\
                    evictionHard:\n  cgroupDriver: cgroupfs\n";
        let got = KubeletCgroups::parse(text);
        assert_eq!(got.driver.as_deref(), Some("systemd"));
        assert_eq!(got.root.as_deref(), Some("/kubelet"));
        assert_eq!(got.per_qos, Some(false));
    }

    #[test]
    fn says_nothing_when_absent() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(
            KubeletCgroups::read(&tmp.path().join("config.yaml")).unwrap(),
            KubeletCgroups::default()
        );
        assert_eq!(
            KubeletCgroups::parse("{\"cgroupDriver\":\"systemd\"}"),
            KubeletCgroups::default()
        );
        assert_eq!(KubeletCgroups::parse("cgroupDriver:\n").driver, None);
    }
}
