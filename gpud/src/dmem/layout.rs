//! Where kubelet puts pod cgroups, for both cgroup drivers, every QoS class
//! and any `cgroupRoot` (kubernetes/kubernetes:pkg/kubelet/cm/cgroup_manager_linux.go).
//!
//! kubelet names cgroups abstractly: `[<cgroupRoot components>..., "kubepods",
//! ("burstable" | "besteffort")?, "pod<UID>"]`. The cgroupfs driver joins the
//! components with `/`. The systemd driver replaces `-` by `_` in each
//! component, joins them with `-`, appends `.slice` and expands the name the
//! way systemd nests slices (`a-b-c.slice` is `a.slice/a-b.slice/a-b-c.slice`).
//! Every path here is relative: to the cgroup mount, or to the kubepods cgroup.

use std::{fmt, path::PathBuf, str::FromStr};

use super::uid::PodUid;

/// The kubelet's cgroup driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    Systemd,
    Cgroupfs,
}

impl fmt::Display for Driver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Systemd => "systemd",
            Self::Cgroupfs => "cgroupfs",
        })
    }
}

impl FromStr for Driver {
    type Err = LayoutError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "systemd" => Ok(Self::Systemd),
            "cgroupfs" => Ok(Self::Cgroupfs),
            other => Err(LayoutError::Driver {
                value: super::uid::excerpt(other),
            }),
        }
    }
}

/// A pod's QoS class: where under kubepods its cgroup is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Qos {
    /// Directly under kubepods.
    Guaranteed,
    Burstable,
    BestEffort,
}

impl Qos {
    pub const ALL: [Self; 3] = [Self::Guaranteed, Self::Burstable, Self::BestEffort];

    /// kubelet's name of the QoS cgroup; none for Guaranteed.
    fn component(self) -> Option<&'static str> {
        match self {
            Self::Guaranteed => None,
            Self::Burstable => Some("burstable"),
            Self::BestEffort => Some("besteffort"),
        }
    }
}

impl fmt::Display for Qos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Guaranteed => "Guaranteed",
            Self::Burstable => "Burstable",
            Self::BestEffort => "BestEffort",
        })
    }
}

/// A kubelet cgroup root or driver that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error(
        "kubelet cgroup root {value} is not an absolute path of plain components ([A-Za-z0-9_.-], no . or ..)"
    )]
    Root { value: String },
    #[error("kubelet cgroup driver {value} is neither systemd nor cgroupfs")]
    Driver { value: String },
}

/// The kubelet's pod cgroup naming on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    driver: Driver,
    /// Components of kubelet's `cgroupRoot` (empty for `/`).
    root: Vec<String>,
}

impl Layout {
    /// `cgroup_root` is kubelet's `cgroupRoot`/`--cgroup-root` in its own
    /// (cgroupfs-style) spelling, e.g. `/` or `/kubelet`.
    ///
    /// # Errors
    /// [`LayoutError::Root`] for a relative path, `.`/`..` or odd characters.
    pub fn new(driver: Driver, cgroup_root: &str) -> Result<Self, LayoutError> {
        let bad = || LayoutError::Root {
            value: super::uid::excerpt(cgroup_root),
        };
        if !cgroup_root.starts_with('/') || cgroup_root.len() > 256 {
            return Err(bad());
        }
        let root: Vec<String> = cgroup_root
            .split('/')
            .filter(|c| !c.is_empty())
            .map(str::to_owned)
            .collect();
        let plain = |c: &String| {
            c != "."
                && c != ".."
                && c.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
        };
        if root.iter().all(plain) {
            Ok(Self { driver, root })
        } else {
            Err(bad())
        }
    }

    pub fn driver(&self) -> Driver {
        self.driver
    }

    /// The components above kubepods, as kubelet's `cgroupRoot` names them.
    pub fn root_components(&self) -> &[String] {
        &self.root
    }

    /// The kubepods cgroup, relative to the cgroup mount:
    /// `kubepods.slice`, `kubepods`, `kubelet.slice/kubelet-kubepods.slice`...
    pub fn kubepods(&self) -> PathBuf {
        self.dirs(&self.abstract_name(&[])).into_iter().collect()
    }

    /// Every cgroup strictly above kubepods, relative to the cgroup mount,
    /// top down, the mount itself (`""`) first.
    pub fn above_kubepods(&self) -> Vec<PathBuf> {
        let dirs = self.dirs(&self.abstract_name(&[]));
        (0..dirs.len())
            .map(|n| dirs[..n].iter().collect())
            .collect()
    }

    /// The QoS cgroup of `qos` relative to kubepods; `None` for Guaranteed.
    pub fn qos_dir(&self, qos: Qos) -> Option<PathBuf> {
        let component = qos.component()?;
        let dirs = self.dirs(&self.abstract_name(&[component]));
        dirs.last().map(PathBuf::from)
    }

    /// The pod cgroup of `uid` in class `qos`, relative to kubepods.
    pub fn pod_dir(&self, qos: Qos, uid: &PodUid) -> PathBuf {
        let pod = format!("pod{}", uid.as_str());
        let mut extra: Vec<&str> = qos.component().into_iter().collect();
        extra.push(&pod);
        let dirs = self.dirs(&self.abstract_name(&extra));
        // Everything past kubepods itself.
        let skip = self.root.len() + 1;
        dirs.into_iter().skip(skip).collect()
    }

    /// `[root..., "kubepods", extra...]`.
    fn abstract_name(&self, extra: &[&str]) -> Vec<String> {
        self.root
            .iter()
            .cloned()
            .chain(std::iter::once("kubepods".to_owned()))
            .chain(extra.iter().map(|s| (*s).to_owned()))
            .collect()
    }

    /// One directory name per component: plain for cgroupfs, nested slice
    /// names for systemd (kubelet's `ToSystemd` and runc's `ExpandSlice`).
    fn dirs(&self, name: &[String]) -> Vec<String> {
        match self.driver {
            Driver::Cgroupfs => name.to_vec(),
            Driver::Systemd => {
                let mut prefix = String::new();
                name.iter()
                    .map(|component| {
                        if !prefix.is_empty() {
                            prefix.push('-');
                        }
                        prefix.push_str(&component.replace('-', "_"));
                        format!("{prefix}.slice")
                    })
                    .collect()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    const UID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
    const UID_: &str = "0f1e2d3c_4b5a_6978_8796_a5b4c3d2e1f0";

    fn full(layout: &Layout, qos: Qos) -> PathBuf {
        layout
            .kubepods()
            .join(layout.pod_dir(qos, &PodUid::parse(UID).unwrap()))
    }

    #[test]
    fn systemd_default_root_matches_the_spec_table() {
        let l = Layout::new(Driver::Systemd, "/").unwrap();
        assert_eq!(l.kubepods(), Path::new("kubepods.slice"));
        assert_eq!(l.above_kubepods(), [PathBuf::new()]);
        assert_eq!(
            full(&l, Qos::Guaranteed),
            Path::new(&format!("kubepods.slice/kubepods-pod{UID_}.slice"))
        );
        assert_eq!(
            full(&l, Qos::Burstable),
            Path::new(&format!(
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice"
            ))
        );
        assert_eq!(
            full(&l, Qos::BestEffort),
            Path::new(&format!(
                "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice"
            ))
        );
        assert_eq!(
            l.qos_dir(Qos::Burstable),
            Some(PathBuf::from("kubepods-burstable.slice"))
        );
        assert_eq!(l.qos_dir(Qos::Guaranteed), None);
    }

    #[test]
    fn cgroupfs_default_root_matches_the_spec_table() {
        let l = Layout::new(Driver::Cgroupfs, "/").unwrap();
        assert_eq!(l.kubepods(), Path::new("kubepods"));
        assert_eq!(
            full(&l, Qos::Guaranteed),
            Path::new(&format!("kubepods/pod{UID}"))
        );
        assert_eq!(
            full(&l, Qos::Burstable),
            Path::new(&format!("kubepods/burstable/pod{UID}"))
        );
        assert_eq!(
            full(&l, Qos::BestEffort),
            Path::new(&format!("kubepods/besteffort/pod{UID}"))
        );
    }

    #[test]
    fn custom_roots_come_first() {
        let s = Layout::new(Driver::Systemd, "/kubelet").unwrap();
        assert_eq!(
            s.kubepods(),
            Path::new("kubelet.slice/kubelet-kubepods.slice")
        );
        assert_eq!(
            s.above_kubepods(),
            [PathBuf::new(), PathBuf::from("kubelet.slice")]
        );
        assert_eq!(
            full(&s, Qos::Burstable),
            Path::new(&format!(
                "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/\
                 kubelet-kubepods-burstable-pod{UID_}.slice"
            ))
        );
        let c = Layout::new(Driver::Cgroupfs, "/kubelet/nested/").unwrap();
        assert_eq!(c.kubepods(), Path::new("kubelet/nested/kubepods"));
        assert_eq!(
            full(&c, Qos::BestEffort),
            Path::new(&format!("kubelet/nested/kubepods/besteffort/pod{UID}"))
        );
        // A dash in a root component is escaped like kubelet does.
        let d = Layout::new(Driver::Systemd, "/my-root").unwrap();
        assert_eq!(
            d.kubepods(),
            Path::new("my_root.slice/my_root-kubepods.slice")
        );
    }

    #[test]
    fn odd_roots_and_drivers_are_refused() {
        for bad in ["", "kubelet", "/a/../b", "/a/./b", "/a b", "/a\0b", "/ä"] {
            assert!(Layout::new(Driver::Cgroupfs, bad).is_err(), "{bad:?}");
        }
        assert!("SystemD".parse::<Driver>().is_err());
        assert_eq!("cgroupfs".parse::<Driver>(), Ok(Driver::Cgroupfs));
    }
}
