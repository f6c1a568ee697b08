//! `amdsmi-probe --set-profile <bdf>=<index>`, run inside the child: selects
//! an accelerator partition profile of one GPU with
//! `amdsmi_set_gpu_accelerator_partition_profile(handle, profile_index)`
//! (docs/amd-hardware.md §4.8), on the GPU's partition-0 processor, and reports the
//! status. The library writes the kernel's partition file itself; waiting
//! for the new partitions is the daemon's.

use std::path::PathBuf;

use tracing::{info, info_span, warn};

use super::{
    LIB_DIR_ENV, LibrarySource,
    child::{Found, detect, enumerate, retry_busy},
    dynlib::{CallFail, SET_PROFILE, Session},
    locate,
    report::{AmdSmiReport, ProfileSwitch},
    status::{self, status_name},
};

/// A `--set-profile` request: the GPU's PCI address and the profile index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileRequest {
    pub bdf: String,
    pub profile_index: u32,
}

impl std::str::FromStr for ProfileRequest {
    type Err = String;

    /// `0000:05:00.0=3`.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (bdf, index) = text
            .split_once('=')
            .ok_or_else(|| format!("{text:?}: expected <pci address>=<profile index>"))?;
        let bdf = bdf
            .parse::<crate::pci::PciAddress>()
            .map_err(|e| format!("{bdf:?}: {e}"))?
            .to_string();
        let profile_index = index
            .parse()
            .map_err(|e| format!("profile index {index:?}: {e}"))?;
        Ok(Self { bdf, profile_index })
    }
}

impl std::fmt::Display for ProfileRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}={}", self.bdf, self.profile_index)
    }
}

/// Loads the library, finds the GPU and calls the setter once (BUSY retried
/// as every call of the probe).
pub fn run(
    source: &LibrarySource,
    request: &ProfileRequest,
) -> Result<AmdSmiReport, super::report::ProbeFailure> {
    let env_dir = std::env::var_os(LIB_DIR_ENV)
        .filter(|d| !d.is_empty())
        .map(PathBuf::from);
    let (lib, library) = locate::open(source, env_dir.as_deref())?;
    let span = info_span!("amdsmi_set_profile", library = %library, gpu = %request.bdf);
    let _entered = span.enter();
    let (version, layout, session) = detect(&lib, &library)?;
    let switch = {
        let found = enumerate(&session, &library, layout.family())?;
        let status = match primary(&session, &found, &request.bdf) {
            Some(handle) => {
                match retry_busy(|| session.set_partition_profile(handle, request.profile_index)) {
                    Ok(()) => Ok(status::SUCCESS),
                    Err(CallFail::Status(code)) => Ok(code),
                    Err(CallFail::Missing(symbol)) => Err(format!("the library lacks {symbol}")),
                }
            }
            None => Err("no processor of the library has this address".to_owned()),
        };
        let (status, status_name) = match status {
            Ok(code) => (Some(code), status_name(code, Some(layout.family()))),
            Err(why) => (None, why),
        };
        ProfileSwitch {
            bdf: request.bdf.clone(),
            profile_index: request.profile_index,
            status,
            status_name,
        }
    };
    match switch.status {
        Some(status::SUCCESS) => info!(index = request.profile_index, "{SET_PROFILE} done"),
        _ => {
            warn!(index = request.profile_index, result = %switch.status_name, "{SET_PROFILE} failed")
        }
    }
    let _ = session.shut_down();
    Ok(AmdSmiReport {
        profile_switch: Some(switch),
        ..AmdSmiReport::of_library(library, version, layout.name())
    })
}

/// The processor of `bdf` with partition id 0 (the one the profile calls
/// answer on, §4.8), else the first one with that address.
fn primary<'s>(
    session: &'s Session<'_>,
    found: &[Found<'s>],
    bdf: &str,
) -> Option<super::dynlib::Handle<'s>> {
    super::usage::primaries(session, found).remove(bdf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_and_print() {
        let r: ProfileRequest = "0000:05:00.0=3".parse().unwrap();
        assert_eq!(r.bdf, "0000:05:00.0");
        assert_eq!(r.profile_index, 3);
        assert_eq!(r.to_string(), "0000:05:00.0=3");
        assert!("0000:05:00.0".parse::<ProfileRequest>().is_err());
        assert!("0000:05:00.0=x".parse::<ProfileRequest>().is_err());
        assert!("gpu=1".parse::<ProfileRequest>().is_err());
    }
}
