//! The pods to schedule: Kubernetes Pod manifests in YAML, as a user writes
//! them.

use std::{
    fs,
    path::{Path, PathBuf},
};

use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;
use serde_json::Value;

use super::{
    error::SimError,
    options::{MODE_ANNOTATION, Mode},
};

/// Shown in the report under the pod's name, when set.
pub const DESCRIPTION_ANNOTATION: &str = "node-sim/description";

/// `absent`: the simulated kubelet makes no cgroup for the pod, so the VRAM
/// cap at PreStartContainer has nowhere to go (a fault to see reported).
pub const POD_CGROUP_ANNOTATION: &str = "node-sim/pod-cgroup";

/// One pod manifest.
#[derive(Debug, Clone)]
pub struct ExamplePod {
    pub file: PathBuf,
    pub name: String,
    pub namespace: String,
    /// The manifest as JSON (what would be POSTed).
    pub manifest: Value,
    /// The mode its [`MODE_ANNOTATION`] asks for.
    pub mode: Option<Mode>,
    pub description: Option<String>,
}

/// Every pod of `paths` (files, or directories of `*.yaml` / `*.yml` read in
/// name order), in order.
///
/// # Errors
/// Unreadable files, YAML errors, documents that are not Pods, a pod named
/// twice, a bad [`MODE_ANNOTATION`].
pub fn load(paths: &[PathBuf]) -> Result<Vec<ExamplePod>, SimError> {
    let mut pods: Vec<ExamplePod> = Vec::new();
    for path in paths {
        for file in files(path)? {
            let text = fs::read_to_string(&file).map_err(|source| SimError::Read {
                path: file.clone(),
                source,
            })?;
            for pod in parse(&file, &text)? {
                if let Some(first) = pods
                    .iter()
                    .find(|p| p.name == pod.name && p.namespace == pod.namespace)
                {
                    return Err(SimError::Duplicate {
                        name: format!("{}/{}", pod.namespace, pod.name),
                        first: first.file.clone(),
                        second: file.clone(),
                    });
                }
                pods.push(pod);
            }
        }
    }
    Ok(pods)
}

fn files(path: &Path) -> Result<Vec<PathBuf>, SimError> {
    let read = |source| SimError::Read {
        path: path.to_path_buf(),
        source,
    };
    if !fs::metadata(path).map_err(read)?.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files: Vec<PathBuf> = fs::read_dir(path)
        .map_err(read)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(SimError::NoPods {
            path: path.to_path_buf(),
        });
    }
    Ok(files)
}

/// The pods of one file (`---` separates documents; empty ones are skipped).
///
/// # Errors
/// As [`load`].
pub fn parse(file: &Path, text: &str) -> Result<Vec<ExamplePod>, SimError> {
    let mut pods = Vec::new();
    for (i, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let doc = i + 1;
        let manifest = Value::deserialize(document).map_err(|source| SimError::Yaml {
            path: file.to_path_buf(),
            doc,
            source,
        })?;
        if manifest.is_null() {
            continue;
        }
        let not_pod = |message: String| SimError::NotPod {
            path: file.to_path_buf(),
            doc,
            message,
        };
        if manifest["kind"] != "Pod" {
            return Err(not_pod(format!("kind is {}", manifest["kind"])));
        }
        let pod: Pod =
            serde_json::from_value(manifest.clone()).map_err(|e| not_pod(e.to_string()))?;
        let name = pod
            .metadata
            .name
            .clone()
            .ok_or_else(|| not_pod("metadata.name is missing".to_owned()))?;
        let annotations = pod.metadata.annotations.clone().unwrap_or_default();
        let mode = match annotations.get(MODE_ANNOTATION).map(String::as_str) {
            None => None,
            Some("cu") => Some(Mode::Cu),
            Some("partition") => Some(Mode::Partition),
            Some(other) => {
                return Err(SimError::BadMode {
                    path: file.to_path_buf(),
                    value: other.to_owned(),
                });
            }
        };
        pods.push(ExamplePod {
            file: file.to_path_buf(),
            name,
            namespace: pod
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".to_owned()),
            manifest,
            mode,
            description: annotations.get(DESCRIPTION_ANNOTATION).cloned(),
        });
    }
    Ok(pods)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: a\n  annotations:\n    \
                       node-sim/mode: partition\nspec:\n  containers:\n  - name: c\n    image: x\n    \
                       resources:\n      limits:\n        amd.com/gpu: 1\n---\n---\n\
                       apiVersion: v1\nkind: Pod\nmetadata:\n  name: b\nspec:\n  containers: []\n";

    #[test]
    fn documents_modes_and_refusals() {
        let pods = parse(Path::new("x.yaml"), TWO).unwrap();
        let got: Vec<(&str, Option<Mode>)> =
            pods.iter().map(|p| (p.name.as_str(), p.mode)).collect();
        assert_eq!(got, [("a", Some(Mode::Partition)), ("b", None)]);
        assert_eq!(
            pods[0].manifest["spec"]["containers"][0]["resources"]["limits"]["amd.com/gpu"],
            1
        );
        let err = parse(Path::new("x.yaml"), "kind: Deployment\n").unwrap_err();
        assert!(err.to_string().contains("not a Pod"), "{err}");
        let err = parse(Path::new("x.yaml"), "kind: Pod\nmetadata: {annotations: {node-sim/mode: x}, name: a}\nspec: {containers: []}\napiVersion: v1\n")
            .unwrap_err();
        assert!(matches!(err, SimError::BadMode { .. }), "{err}");
    }

    #[test]
    fn the_shipped_examples_load() {
        let pods = load(&[PathBuf::from(super::super::options::EXAMPLES)]).unwrap();
        assert!(pods.len() >= 6, "{pods:?}");
        assert!(pods.iter().any(|p| p.mode == Some(Mode::Partition)));
    }
}
