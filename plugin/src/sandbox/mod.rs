//! The plugin's landlock sandbox (`SECURITY.md`): once its
//! configuration is known and before any thread starts, the plugin restricts
//! itself to the files its configuration names (read-only where it only
//! reads; read-write beneath kubelet's device-plugin directory, where it
//! binds and replaces its socket) and, where the kernel supports it
//! (landlock ABI 4+), to TCP connections to the API server's port and a bind
//! on its metrics port.
//!
//! Landlock restricts the calling thread and the threads it starts later,
//! which is why [`apply`] runs before the async runtime exists. Limits worth
//! knowing: TCP rules are by port, not address; connecting to a Unix socket
//! by path (kubelet, pod-resources, the system bus) needs no landlock right;
//! reading file metadata (`stat`) is not restricted.

use std::{
    path::{Path, PathBuf},
    str::FromStr,
    sync::OnceLock,
};

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, path_beneath_rules,
};
use tracing::{info, warn};

/// The landlock ABI whose rights are asked for (files, TCP bind/connect,
/// device ioctls).
const ABI_WANTED: ABI = ABI::V5;

/// Files of the container image every configuration reads: in-cluster
/// credentials (the token is re-read as it rotates), CA bundles (and where
/// their symlinks point), name resolution, D-Bus's machine id. Paths inside
/// the plugin's own container, not the host's.
pub(crate) const SYSTEM_READS: [&str; 11] = [
    "/var/run/secrets/kubernetes.io/serviceaccount",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/pki",
    "/usr/share/ca-certificates",
    "/usr/local/share/ca-certificates",
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/nsswitch.conf",
    "/etc/machine-id",
    "/var/lib/dbus/machine-id",
];

/// `--sandbox`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SandboxMode {
    Off,
    BestEffort,
    Required,
}

impl FromStr for SandboxMode {
    type Err = crate::choice::InvalidChoice;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "off" => Ok(Self::Off),
            "best-effort" => Ok(Self::BestEffort),
            "required" => Ok(Self::Required),
            other => Err(Self::Err::new(
                "--sandbox",
                "off, best-effort or required",
                other,
            )),
        }
    }
}

/// How fully the sandbox is enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enforcement {
    /// `--sandbox off`.
    Off,
    /// The kernel has no landlock.
    NotEnforced,
    /// Some of the rights (an older kernel).
    Partial,
    Full,
}

impl Enforcement {
    /// For logs and the metrics label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::NotEnforced => "not_enforced",
            Self::Partial => "partial",
            Self::Full => "full",
        }
    }
}

static STATUS: OnceLock<Enforcement> = OnceLock::new();

/// The sandbox status of this process (`Off` before [`apply`]).
pub(crate) fn status() -> Enforcement {
    STATUS.get().copied().unwrap_or(Enforcement::Off)
}

/// What the plugin may touch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Read-only, beneath each (missing ones are skipped).
    pub(crate) read: Vec<PathBuf>,
    /// Read-write beneath each.
    pub(crate) write: Vec<PathBuf>,
    /// TCP ports it may connect to.
    pub(crate) connect: Vec<u16>,
    /// TCP ports it may bind.
    pub(crate) bind: Vec<u16>,
}

/// Why the sandbox could not be applied as asked.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SandboxError {
    #[error("landlock refused the sandbox: {0}")]
    Landlock(#[from] landlock::RulesetError),
    #[error("--sandbox required, but the sandbox is only {0} on this kernel")]
    NotFull(&'static str),
}

fn existing(paths: &[PathBuf]) -> Vec<&Path> {
    paths
        .iter()
        .map(PathBuf::as_path)
        .filter(|p| p.exists())
        .collect()
}

/// How fully this kernel would enforce the sandbox, found by applying an
/// empty one in a throwaway thread.
pub fn probe() -> Enforcement {
    std::thread::spawn(|| restrict(&Plan::default(), SandboxMode::BestEffort))
        .join()
        .ok()
        .and_then(Result::ok)
        .unwrap_or(Enforcement::NotEnforced)
}

/// Restricts the calling thread (and every thread it starts from now on).
///
/// # Errors
/// Landlock refused a rule, or `mode` is `Required` and the kernel enforces
/// less than everything asked.
pub(crate) fn apply(plan: &Plan, mode: SandboxMode) -> Result<Enforcement, SandboxError> {
    if mode == SandboxMode::Off {
        let _ = STATUS.set(Enforcement::Off);
        warn!("--sandbox off: the plugin runs without its landlock sandbox");
        return Ok(Enforcement::Off);
    }
    let enforcement = restrict(plan, mode)?;
    let _ = STATUS.set(enforcement);
    if mode == SandboxMode::Required && enforcement != Enforcement::Full {
        return Err(SandboxError::NotFull(enforcement.as_str()));
    }
    match enforcement {
        Enforcement::Full => info!(?plan, "landlock sandbox fully enforced"),
        other => warn!(
            ?plan,
            "landlock sandbox {}: the kernel lacks some landlock rights",
            other.as_str()
        ),
    }
    Ok(enforcement)
}

fn restrict(plan: &Plan, mode: SandboxMode) -> Result<Enforcement, SandboxError> {
    let level = if mode == SandboxMode::Required {
        CompatLevel::HardRequirement
    } else {
        CompatLevel::BestEffort
    };
    let read = AccessFs::from_read(ABI_WANTED);
    let all = AccessFs::from_all(ABI_WANTED);
    let mut created = Ruleset::default()
        .set_compatibility(level)
        .handle_access(all)?
        .handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)?
        .create()?
        .add_rules(path_beneath_rules(existing(&plan.read), read))?
        .add_rules(path_beneath_rules(existing(&plan.write), all))?;
    for port in &plan.connect {
        created = created.add_rule(NetPort::new(*port, AccessNet::ConnectTcp))?;
    }
    for port in &plan.bind {
        created = created.add_rule(NetPort::new(*port, AccessNet::BindTcp))?;
    }
    let status = created.restrict_self()?;
    Ok(match status.ruleset {
        RulesetStatus::FullyEnforced => Enforcement::Full,
        RulesetStatus::PartiallyEnforced => Enforcement::Partial,
        RulesetStatus::NotEnforced => Enforcement::NotEnforced,
    })
}

#[cfg(test)]
mod tests;
