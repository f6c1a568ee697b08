//! The node's CDI spec (Container Device Interface 0.6.0): one device per
//! compute partition (a whole unpartitioned GPU is its one partition), named
//! by the partition's PCI address as KFD gives it, with its DRM card and
//! render nodes; `/dev/kfd` in the spec-wide edits, since every ROCm
//! container needs it. The plugin, with `--cdi`, answers Allocate with
//! `amd.com/gpu=<name>` instead of device nodes, and the runtime injects
//! what this file says.
//!
//! Written to `<cdi>/amd.com-gpu.json` when the inventory changes and the
//! content differs, through a temporary file and a rename, so a runtime
//! never reads half a spec ([`crate::state_file`]: no link followed, a
//! bounded read).

use std::path::PathBuf;

use serde_json::{Value, json};

use crate::{
    HostPaths,
    inventory::{Gpu, Partition},
    state_file::{self, FileError},
};

/// `cdiVersion` written.
pub const CDI_VERSION: &str = "0.6.0";
/// The spec's kind; device names are `amd.com/gpu=<name>`.
pub const KIND: &str = "amd.com/gpu";
/// File name of the spec in the CDI directory.
pub const FILE_NAME: &str = "amd.com-gpu.json";

/// The largest spec read back or written. One device, pretty-printed, is
/// about 250 bytes, or about 8.5 KiB when both of its nodes carry a
/// `hostPath` as long as `PATH_MAX` (4096, a simulated node under the
/// longest root); an 8-GPU node in CPX has 64 devices, so at most about
/// 545 KiB. 4 MiB leaves seven times that, and still bounds what a planted
/// file can make amd-gpud read.
pub const MAX_SPEC_BYTES: u64 = 4 << 20;

/// Why the spec was not written.
#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    #[error("the CDI spec: {0}")]
    File(#[from] FileError),
    #[error("the CDI spec {path} would be {size} bytes, more than the {MAX_SPEC_BYTES} written")]
    TooLarge { path: PathBuf, size: usize },
    #[error("encoding the CDI spec {path}: {source}")]
    Encode {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// A device node entry: the container path, and the host path when the host
/// root is not `/` (a simulated node).
fn node(paths: &HostPaths, rel: &str) -> Value {
    let container = format!("/dev/{rel}");
    let host = paths.dev_node(rel);
    let mut entry = json!({ "path": container, "type": "c" });
    if host.to_string_lossy() != container {
        entry["hostPath"] = json!(host.display().to_string());
    }
    entry
}

/// The spec for `gpus` (the present ones: the caller leaves missing GPUs
/// out).
pub fn spec<'a>(paths: &HostPaths, gpus: impl Iterator<Item = &'a Gpu>) -> Value {
    let devices: Vec<Value> = gpus
        .flat_map(|gpu| &gpu.partitions)
        .filter_map(|part| device(paths, part))
        .collect();
    json!({
        "cdiVersion": CDI_VERSION,
        "kind": KIND,
        "containerEdits": { "deviceNodes": [node(paths, "kfd")] },
        "devices": devices,
    })
}

/// The device of one partition; `None` when it has no DRM node.
fn device(paths: &HostPaths, part: &Partition) -> Option<Value> {
    let mut nodes = Vec::new();
    if let Some(card) = part.card_minor {
        nodes.push(node(paths, &format!("dri/card{card}")));
    }
    if let Some(render) = part.render_minor {
        nodes.push(node(paths, &format!("dri/renderD{render}")));
    }
    (!nodes.is_empty()).then(|| {
        json!({
            "name": part.bdf.to_string(),
            "containerEdits": { "deviceNodes": nodes },
        })
    })
}

/// Writes `spec` into `paths.cdi` unless the file already holds it; returns
/// whether it wrote.
///
/// # Errors
/// When the spec is above [`MAX_SPEC_BYTES`], when what is there is not a
/// regular file of at most that size (a symlink, a FIFO: refused, not
/// followed), or when the directory or the file cannot be written.
pub fn write(paths: &HostPaths, spec: &Value) -> Result<bool, CdiError> {
    let path = paths.cdi.join(FILE_NAME);
    let text = serde_json::to_string_pretty(spec).map_err(|source| CdiError::Encode {
        path: path.clone(),
        source,
    })? + "\n";
    if u64::try_from(text.len()).map_or(true, |n| n > MAX_SPEC_BYTES) {
        return Err(CdiError::TooLarge {
            path,
            size: text.len(),
        });
    }
    let current = state_file::read_bounded(&path, MAX_SPEC_BYTES)?;
    if current.as_deref() == Some(text.as_bytes()) {
        return Ok(false);
    }
    state_file::replace(&path, text.as_bytes(), 0o644)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;
    use crate::state_file::tests::{mkfifo, within_seconds};

    #[test]
    fn unchanged_specs_are_not_rewritten() {
        let tmp = tempfile::tempdir().unwrap();
        let paths = HostPaths::under(tmp.path());
        let spec = spec(&paths, std::iter::empty());
        assert!(write(&paths, &spec).unwrap());
        assert!(!write(&paths, &spec).unwrap());
        let text = std::fs::read_to_string(paths.cdi.join(FILE_NAME)).unwrap();
        let back: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back["cdiVersion"], "0.6.0");
        assert_eq!(back["containerEdits"]["deviceNodes"][0]["path"], "/dev/kfd");
        let host = back["containerEdits"]["deviceNodes"][0]["hostPath"]
            .as_str()
            .unwrap();
        assert!(host.ends_with("/dev/kfd") && host.starts_with(tmp.path().to_str().unwrap()));
    }

    /// What a hostile planter can put where the spec goes: the write
    /// returns at once with an error naming the file, instead of reading
    /// `/dev/zero` until memory runs out or waiting on a FIFO for ever.
    #[test]
    fn a_spec_linked_to_dev_zero_or_a_fifo_is_refused_at_once() {
        let tmp = tempfile::tempdir().unwrap();
        let paths = HostPaths::under(tmp.path());
        std::fs::create_dir_all(&paths.cdi).unwrap();
        let path = paths.cdi.join(FILE_NAME);
        let spec = spec(&paths, std::iter::empty());
        symlink("/dev/zero", &path).unwrap();
        let (p, s) = (paths.clone(), spec.clone());
        let err = within_seconds(move || write(&p, &s)).unwrap_err();
        assert!(
            matches!(err, CdiError::File(FileError::Symlink { .. })),
            "{err}"
        );
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
        std::fs::remove_file(&path).unwrap();
        mkfifo(&path);
        let err = within_seconds(move || write(&paths, &spec)).unwrap_err();
        assert!(
            matches!(err, CdiError::File(FileError::NotRegular { .. })),
            "{err}"
        );
    }

    /// The old writer wrote through `.amd.com-gpu.json.tmp`: a link planted
    /// there made root overwrite its target. No name it uses now can be
    /// planted, and a planted one is left alone.
    #[test]
    fn a_link_planted_at_a_temporary_name_does_not_redirect_the_write() {
        let tmp = tempfile::tempdir().unwrap();
        let paths = HostPaths::under(tmp.path());
        std::fs::create_dir_all(&paths.cdi).unwrap();
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let planted = [
            format!(".{FILE_NAME}.tmp"),
            format!("{FILE_NAME}.tmp"),
            format!(".{FILE_NAME}.{}.tmp", std::process::id()),
        ];
        for name in &planted {
            symlink(&victim, paths.cdi.join(name)).unwrap();
        }
        assert!(write(&paths, &spec(&paths, std::iter::empty())).unwrap());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        let written = paths.cdi.join(FILE_NAME);
        assert!(std::fs::symlink_metadata(&written).unwrap().is_file());
        let mut names: Vec<String> = std::fs::read_dir(&paths.cdi)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        let mut expected: Vec<String> = planted.to_vec();
        expected.push(FILE_NAME.to_owned());
        expected.sort();
        assert_eq!(names, expected, "no temporary file is left");
    }

    #[test]
    fn an_oversized_spec_file_is_refused_naming_the_bound() {
        let tmp = tempfile::tempdir().unwrap();
        let paths = HostPaths::under(tmp.path());
        std::fs::create_dir_all(&paths.cdi).unwrap();
        let path = paths.cdi.join(FILE_NAME);
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(MAX_SPEC_BYTES + 1).unwrap();
        let err = write(&paths, &spec(&paths, std::iter::empty())).unwrap_err();
        assert!(
            matches!(err, CdiError::File(FileError::TooLarge { .. })),
            "{err}"
        );
        assert!(
            err.to_string().contains(&MAX_SPEC_BYTES.to_string()),
            "{err}"
        );
        assert_eq!(std::fs::metadata(&path).unwrap().len(), MAX_SPEC_BYTES + 1);
    }

    /// The bound's arithmetic: 64 partitions with a card and a render node
    /// each, under a root as long as a path can be, fit in a quarter of it.
    #[test]
    fn the_largest_real_spec_fits_well_within_the_bound() {
        let root = format!("/{}", "r".repeat(3_900));
        let paths = HostPaths::under(&root);
        let devices: Vec<Value> = (0..64u32)
            .map(|i| Partition {
                index: i % 8,
                kfd_node: i + 1,
                gpu_id: Some(u64::from(i)),
                render_minor: Some(128 + i),
                card_minor: Some(i),
                bdf: format!("0000:{:02x}:00.{}", 0x10 + i / 8, i % 8)
                    .parse()
                    .unwrap(),
                compute_units: 38,
                num_xcc: 1,
                vram_bytes: 1 << 34,
                xcp: None,
                restore: crate::inventory::RestoreProps::default(),
            })
            .filter_map(|p| device(&paths, &p))
            .collect();
        let mut whole = spec(&paths, std::iter::empty());
        whole["devices"] = Value::Array(devices);
        let size = serde_json::to_string_pretty(&whole).unwrap().len() as u64;
        assert!(size > 64 * 2 * 3_900, "the hostPaths are in: {size}");
        assert!(size < MAX_SPEC_BYTES / 4, "{size} bytes");
    }
}
