//! The ID each GPU is published under, chosen once and kept.
//!
//! The plugin names a whole GPU to kubelet and HAMi by one ID, and HAMi's
//! pod annotations (grants, CU records) are keyed by it. The best ID is AMD
//! SMI's UUID as HAMi's Go AMD plugin published it (AMD SMI 7.0.2), which
//! amd-gpud computes from sysfs with or without the library
//! (`inventory::smi_uuid`); then the UUID the loaded library reports, then
//! ROCr's `GPU-<unique_id>`, and last `amdgpu-<pci address>`. Choosing afresh on every read would re-key every
//! GPU whenever a probe fails or comes back, and the same CUs could be
//! handed out twice under two names. So the first ID a GPU gets is written
//! to `<state>/published-ids.json`, keyed by its PCI address and
//! `unique_id` (a GPU replaced at the same address gets a new one), and
//! reused from then on, across probes and restarts.

use std::{
    fs,
    path::{Path, PathBuf},
    sync::Mutex,
};

use serde::{Deserialize, Serialize};
use tracing::{error, info};

use crate::{
    inventory::{Gpu, Inventory},
    state_file::{self, FileError},
};

/// The file under the state directory.
pub const FILE_NAME: &str = "published-ids.json";
/// Larger files are refused unread. A full file ([`MAX_ENTRIES`] entries
/// of a 12-byte address, a 20-digit `unique_id` and an ID of
/// [`MAX_ID_LEN`], pretty-printed: about 240 bytes each) is about 240 KiB.
const MAX_FILE_BYTES: u64 = 1 << 20;
/// More entries than this are not kept (a node has a few dozen GPUs).
const MAX_ENTRIES: usize = 1024;
/// Longest ID accepted from the file.
const MAX_ID_LEN: usize = 128;
const VERSION: u32 = 1;

/// Why the file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum IdsError {
    #[error("the published IDs: {0}")]
    File(#[from] FileError),
    #[error("{path} is not a published-ID file: {source}")]
    Parse {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: {why}")]
    Invalid { path: String, why: String },
    #[error("cannot encode the published IDs for {path}: {source}")]
    Encode {
        path: String,
        #[source]
        source: serde_json::Error,
    },
}

/// One GPU's published ID.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub bdf: String,
    /// Decimal, as KFD prints it; `0` when the GPU has none.
    pub unique_id: String,
    pub id: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct Stored {
    version: u32,
    devices: Vec<Entry>,
}

/// The IDs chosen so far, and where they are kept.
#[derive(Debug)]
pub struct PublishedIds {
    path: PathBuf,
    entries: Mutex<Vec<Entry>>,
}

impl PublishedIds {
    /// Loads `<dir>/published-ids.json`. A missing file is an empty store;
    /// a file that cannot be used is logged, moved aside (`.bad`) so that it
    /// can be looked at, and replaced at the next write.
    pub fn load(dir: &Path) -> Self {
        let path = dir.join(FILE_NAME);
        let entries = match read(&path) {
            Ok(entries) => entries,
            Err(err) => {
                error!("{err}; choosing the published IDs afresh");
                let aside = path.with_extension("json.bad");
                if let Err(e) = fs::rename(&path, &aside) {
                    error!(path = %path.display(), "cannot move it aside: {e}");
                }
                Vec::new()
            }
        };
        Self {
            path,
            entries: Mutex::new(entries),
        }
    }

    /// Sets every GPU's `published_id`, choosing and writing down the IDs
    /// of GPUs seen for the first time. A failed write is logged: the IDs
    /// then hold until amd-gpud restarts.
    pub fn stamp(&self, inventory: &mut Inventory) {
        let mut entries = self
            .entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut changed = false;
        for gpu in &mut inventory.gpus {
            let (id, new) = assign(&mut entries, gpu);
            changed |= new;
            gpu.published_id = Some(id);
        }
        if changed {
            match write(&self.path, &entries) {
                Ok(()) => info!(path = %self.path.display(), "published IDs written"),
                Err(err) => error!("{err}; the IDs hold until amd-gpud restarts"),
            }
        }
    }
}

/// The published ID of `gpu`, and whether it was chosen now.
pub fn assign(entries: &mut Vec<Entry>, gpu: &Gpu) -> (String, bool) {
    let bdf = gpu.bdf.to_string();
    let unique_id = gpu.unique_id.to_string();
    if let Some(known) = entries
        .iter()
        .find(|e| e.bdf == bdf && e.unique_id == unique_id)
    {
        return (known.id.clone(), false);
    }
    // Another GPU at this address: it was replaced.
    entries.retain(|e| e.bdf != bdf);
    let fallback = format!("amdgpu-{}", bdf.replace([':', '.'], "-"));
    let taken = |id: &str| entries.iter().any(|e| e.id == id);
    let candidates = [&gpu.derived_uuid, &gpu.amdsmi_uuid, &gpu.rocr_uuid];
    let id = candidates
        .into_iter()
        .filter_map(Option::as_deref)
        .find(|id| clean(id) && !taken(id))
        .map_or(fallback, str::to_owned);
    if entries.len() < MAX_ENTRIES {
        entries.push(Entry {
            bdf,
            unique_id,
            id: id.clone(),
        });
    }
    (id, true)
}

/// Usable as a HAMi and kubelet device ID: non-empty, bounded, none of
/// HAMi's separators.
fn clean(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_graphic() && !b",:;#".contains(&b))
}

fn read(path: &Path) -> Result<Vec<Entry>, IdsError> {
    let shown = || path.display().to_string();
    let Some(bytes) = state_file::read_bounded(path, MAX_FILE_BYTES)? else {
        return Ok(Vec::new());
    };
    let stored: Stored = serde_json::from_slice(&bytes).map_err(|source| IdsError::Parse {
        path: shown(),
        source,
    })?;
    let invalid = |why: String| IdsError::Invalid { path: shown(), why };
    if stored.version != VERSION {
        return Err(invalid(format!(
            "version {} (expected {VERSION})",
            stored.version
        )));
    }
    if stored.devices.len() > MAX_ENTRIES {
        return Err(invalid(format!(
            "{} entries, more than {MAX_ENTRIES}",
            stored.devices.len()
        )));
    }
    if let Some(bad) = stored.devices.iter().find(|e| !clean(&e.id)) {
        return Err(invalid(format!("unusable ID {:?} for {}", bad.id, bad.bdf)));
    }
    Ok(stored.devices)
}

/// Writes `entries` whole or not at all ([`state_file::replace`]).
fn write(path: &Path, entries: &[Entry]) -> Result<(), IdsError> {
    let stored = Stored {
        version: VERSION,
        devices: entries.to_vec(),
    };
    let mut text = serde_json::to_vec_pretty(&stored).map_err(|source| IdsError::Encode {
        path: path.display().to_string(),
        source,
    })?;
    text.push(b'\n');
    Ok(state_file::replace(path, &text, 0o644)?)
}

#[cfg(test)]
mod tests;
