//! The node's compute partition mode: the node annotation
//! `hami.io/amd-compute-partition` when set, else `--compute-partition`
//! (`COMPUTE_PARTITION`), as in the Go plugin, whose vLLM example sets it
//! per node beside `hami.io/amd-operating-mode`
//! (Project-HAMi/amd-device-plugin:example/vllm-serve/README.md, values
//! `qpx`...; its tests read it with `COMPUTE_PARTITION=qpx`).
//!
//! Mode names are taken in any case (`qpx`, `QPX`, `Cpx`). The annotation
//! is followed while the plugin runs, like the operating mode
//! ([`super::follow`]): each time the wanted mode changes, every idle GPU
//! that offers it is switched through amd-gpud ([`switch::switch_idle_gpus`],
//! which waits for a trustworthy view of allocations and leaves a held GPU
//! in its mode). The Go plugin reads the annotation at start only. A value
//! that names no mode is a warning and a Warning Event on the Node naming
//! the value and the annotation; the GPUs then keep their modes (the flag
//! is not used in its place: the annotation was meant to override it).

use std::{future::Future, time::Duration};

use ipc::ComputeMode;
use kube::ResourceExt;
use tracing::{info, warn};

use crate::{
    choice::{COMPUTE_MODES, InvalidChoice, compute_mode},
    gpud::Bus,
    inventory::Snapshot,
    mode::switch::{self, Sources},
};

/// The node annotation.
pub(crate) const PARTITION_ANNOTATION: &str = "hami.io/amd-compute-partition";

/// The Event reason of an annotation value that names no mode.
pub(crate) const INVALID: &str = "ComputePartitionInvalid";

/// How often the annotation is looked at.
const CHECK: Duration = Duration::from_secs(2);

/// The mode wanted: the annotation's when set, else the flag's.
///
/// # Errors
/// When the annotation names no mode.
pub(crate) fn wanted(
    annotation: Option<&str>,
    flag: Option<&ComputeMode>,
) -> Result<Option<ComputeMode>, InvalidChoice> {
    match annotation {
        None => Ok(flag.cloned()),
        Some(text) => compute_mode(PARTITION_ANNOTATION, text).map(Some),
    }
}

/// Switches idle GPUs to the wanted mode at start and whenever the
/// annotation changes it, until `shutdown`. Without the Kubernetes API,
/// the flag alone, once.
pub(crate) async fn follow(
    bus: Bus,
    raw: tokio::sync::watch::Receiver<Snapshot>,
    sources: Sources,
    flag: Option<ComputeMode>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let Some(caches) = sources.caches.clone() else {
        if let Some(target) = flag {
            let switch = switch::switch_idle_gpus(bus, raw, sources, target.as_str().to_owned());
            tokio::select! {
                () = &mut shutdown => {}
                () = switch => {}
            }
        }
        return;
    };
    // With the API server down at start neither the node nor its pods are
    // known: the flag's switch waits, and says why and when it resumes, as
    // the switch itself does once the node is known.
    if let (Some(target), None) = (&flag, caches.node()) {
        tokio::select! {
            () = &mut shutdown => return,
            _ = switch::trusted(&sources, target.as_str()) => {}
        }
    }
    let mut seen: Option<Option<String>> = None;
    let mut applied: Option<ComputeMode> = None;
    loop {
        // Nothing is decided before the node is known: an annotation not
        // yet seen must not let the flag switch GPUs first.
        if let Some(node) = caches.node() {
            let annotation = node.annotations().get(PARTITION_ANNOTATION).cloned();
            if seen.as_ref() != Some(&annotation) {
                seen = Some(annotation.clone());
                match wanted(annotation.as_deref(), flag.as_ref()) {
                    Ok(Some(target)) if applied.as_ref() != Some(&target) => {
                        info!(mode = %target, "compute partition wanted; switching idle GPUs");
                        applied = Some(target.clone());
                        let target = target.as_str().to_owned();
                        let switch = switch::switch_idle_gpus(
                            bus.clone(),
                            raw.clone(),
                            sources.clone(),
                            target,
                        );
                        tokio::select! {
                            () = &mut shutdown => return,
                            () = switch => {}
                        }
                    }
                    Ok(_) => {}
                    Err(bad) => invalid(&sources, &bad),
                }
            }
        }
        tokio::select! {
            () = &mut shutdown => return,
            () = tokio::time::sleep(CHECK) => {}
        }
    }
}

/// Says that the annotation names no mode: a warning and a Warning Event.
fn invalid(sources: &Sources, bad: &InvalidChoice) {
    let note = format!(
        "{PARTITION_ANNOTATION} on the node is {:?}, not {COMPUTE_MODES}; the GPUs keep their \
         compute partition modes",
        bad.value
    );
    warn!("{note}");
    switch::node_event(sources, true, (INVALID, "ComputePartition"), note);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::choice::compute_partition_flag;

    #[test]
    fn mode_names_in_any_case() {
        // The Go plugin's vLLM example annotates `qpx`; its chart and env
        // take `qpx` too.
        for text in ["qpx", "QPX", "Qpx", " qpx "] {
            assert_eq!(
                wanted(Some(text), None),
                Ok(Some(ComputeMode::Qpx)),
                "{text}"
            );
        }
        assert_eq!(compute_partition_flag("Cpx"), Ok(ComputeMode::Cpx));
        assert_eq!(compute_partition_flag("spx"), Ok(ComputeMode::Spx));
    }

    #[test]
    fn the_annotation_wins_over_the_flag() {
        let cpx = Some(&ComputeMode::Cpx);
        assert_eq!(wanted(None, cpx), Ok(Some(ComputeMode::Cpx)));
        assert_eq!(wanted(Some("dpx"), cpx), Ok(Some(ComputeMode::Dpx)));
        assert_eq!(wanted(None, None), Ok(None));
    }

    #[test]
    fn a_bad_value_names_itself_and_its_source() {
        let err = wanted(Some("cpx4"), Some(&ComputeMode::Spx)).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("\"cpx4\"") && text.contains(PARTITION_ANNOTATION),
            "{text}"
        );
        let err = compute_partition_flag("nps1").unwrap_err().to_string();
        assert!(
            err.contains("\"nps1\"") && err.contains("COMPUTE_PARTITION"),
            "{err}"
        );
    }

    #[test]
    fn the_flag_takes_any_case_and_refuses_unknown_modes() {
        use clap::Parser;
        let cli = crate::config::Cli::try_parse_from(["x", "--compute-partition", "qpx"]).unwrap();
        assert_eq!(cli.compute_partition, Some(ComputeMode::Qpx));
        let err = crate::config::Cli::try_parse_from(["x", "--compute-partition", "cpx4"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("cpx4"), "{err}");
    }
}
