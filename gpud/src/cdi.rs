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
//! never reads half a spec.

use std::{io, path::PathBuf};

use serde_json::{Value, json};

use crate::{HostPaths, inventory::Gpu};

/// `cdiVersion` written.
pub const CDI_VERSION: &str = "0.6.0";
/// The spec's kind; device names are `amd.com/gpu=<name>`.
pub const KIND: &str = "amd.com/gpu";
/// File name of the spec in the CDI directory.
pub const FILE_NAME: &str = "amd.com-gpu.json";

/// Why the spec was not written.
#[derive(Debug, thiserror::Error)]
#[error("writing the CDI spec {path}: {source}")]
pub struct CdiError {
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
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
    let mut devices = Vec::new();
    for gpu in gpus {
        for part in &gpu.partitions {
            let mut nodes = Vec::new();
            if let Some(card) = part.card_minor {
                nodes.push(node(paths, &format!("dri/card{card}")));
            }
            if let Some(render) = part.render_minor {
                nodes.push(node(paths, &format!("dri/renderD{render}")));
            }
            if nodes.is_empty() {
                continue;
            }
            devices.push(json!({
                "name": part.bdf.to_string(),
                "containerEdits": { "deviceNodes": nodes },
            }));
        }
    }
    json!({
        "cdiVersion": CDI_VERSION,
        "kind": KIND,
        "containerEdits": { "deviceNodes": [node(paths, "kfd")] },
        "devices": devices,
    })
}

/// Writes `spec` into `paths.cdi` unless the file already holds it; returns
/// whether it wrote.
///
/// # Errors
/// When the directory or the file cannot be written.
pub fn write(paths: &HostPaths, spec: &Value) -> Result<bool, CdiError> {
    let path = paths.cdi.join(FILE_NAME);
    let wrap = |source| CdiError {
        path: path.clone(),
        source,
    };
    let text = serde_json::to_string_pretty(spec).map_err(|e| wrap(io::Error::other(e)))? + "\n";
    if std::fs::read_to_string(&path).ok().as_deref() == Some(text.as_str()) {
        return Ok(false);
    }
    std::fs::create_dir_all(&paths.cdi).map_err(wrap)?;
    let temp = paths.cdi.join(format!(".{FILE_NAME}.tmp"));
    std::fs::write(&temp, &text).map_err(wrap)?;
    std::fs::rename(&temp, &path).map_err(wrap)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
