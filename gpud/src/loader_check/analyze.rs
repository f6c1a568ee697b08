//! The image analysis: from an image's target descriptor (index or
//! manifest) to the loader its command runs under.
//!
//! [`inspect_target`] reads the manifest for the platform
//! (`opencontainers/image-spec:image-index.md`), the config's command
//! (`config.md`), merges the layers into a file tree of summaries
//! (`layer.md`, [`super::layers`]) and classifies the command over that tree
//! ([`super::classify`]). Everything read is bounded by [`Limits`].

use std::time::Instant;

use tracing::{debug, debug_span};

use super::Finding;
use super::classify::{self, Command};
use super::layers::{self, Budget, Compression, Tree};
use super::oci::{self, Parsed};
use super::run::RunSpec;
use super::source::{Descriptor, ImageSource, SourceError};

use super::inspection::MAX_NESTING;
pub use super::inspection::{InspectError, Limits, Platform};

fn check_time(limits: &Limits, stage: &'static str) -> Result<(), InspectError> {
    if Instant::now() >= limits.deadline {
        return Err(InspectError::OutOfTime { stage });
    }
    Ok(())
}

/// A JSON blob, bounded by `max_json` (a store's `TooLarge` is reported as
/// that limit).
fn read_json(
    source: &mut dyn ImageSource,
    desc: &Descriptor,
    limits: &Limits,
) -> Result<Vec<u8>, InspectError> {
    check_time(limits, "reading the manifest and config")?;
    match source.read_blob(desc, limits.max_json) {
        Err(SourceError::TooLarge { .. }) => Err(InspectError::Limit {
            limit: "max_json",
            value: limits.max_json,
        }),
        Ok(b) if b.len() as u64 > limits.max_json => Err(InspectError::Limit {
            limit: "max_json",
            value: limits.max_json,
        }),
        other => Ok(other?),
    }
}

/// The manifest for `platform` under `target`: its config and layers.
fn manifest(
    source: &mut dyn ImageSource,
    target: &Descriptor,
    platform: &Platform,
    limits: &Limits,
) -> Result<(Descriptor, Vec<Descriptor>), InspectError> {
    let mut desc = target.clone();
    for _ in 0..=MAX_NESTING {
        let bytes = read_json(source, &desc, limits)?;
        match oci::parse_target(&desc, &bytes)? {
            Parsed::Manifest { config, layers } => {
                let layers = layers.iter().map(oci::JsonDescriptor::to_descriptor);
                return Ok((config.to_descriptor(), layers.collect()));
            }
            Parsed::Index(entries) => {
                let chosen = oci::select(&desc.digest, &entries, platform)?;
                debug!(index = %desc.digest, manifest = %chosen.digest, "chose a manifest");
                desc = chosen.to_descriptor();
            }
        }
    }
    Err(InspectError::TooDeep {
        digest: desc.digest,
    })
}

/// The command of the config blob `desc`, as the pod's `run` overrides it.
fn command(
    source: &mut dyn ImageSource,
    desc: &Descriptor,
    run: &RunSpec,
    limits: &Limits,
) -> Result<Command, InspectError> {
    let bytes = read_json(source, desc, limits)?;
    let config = oci::parse_config(&desc.digest, &bytes)?;
    let defaults = Command::default();
    let working_dir = Some(run.working_dir.as_str())
        .filter(|d| !d.is_empty())
        .or(config.working_dir.as_deref());
    let working_dir = match working_dir {
        Some(d) if d.starts_with('/') => d.to_owned(),
        Some(d) if !d.is_empty() => format!("/{d}"),
        _ => defaults.working_dir,
    };
    let path = match run.path.as_str() {
        "" => config.path().map_or(defaults.path, str::to_owned),
        set => set.to_owned(),
    };
    let entrypoint = config.entrypoint.as_deref().unwrap_or_default();
    let origin = match (
        run.command.is_empty(),
        entrypoint.is_empty(),
        run.args.is_empty(),
    ) {
        (false, _, _) => "the pod's command",
        (true, true, false) => "the pod's args",
        _ => defaults.origin,
    };
    let mut argv = run
        .argv(entrypoint, config.cmd.as_deref().unwrap_or_default())
        .into_iter();
    let command = Command {
        argv0: argv.next(),
        args: argv.take(classify::MAX_ARGS_KEPT).collect(),
        origin,
        path,
        working_dir,
        path_unknown: run.path_unknown,
    };
    Ok(command.bounded()?)
}

/// The merged file tree of `layers`, bottom first.
fn merge(
    source: &mut dyn ImageSource,
    layers: &[Descriptor],
    limits: &Limits,
) -> Result<Tree, InspectError> {
    let mut tree = Tree::default();
    let budget = Budget::new(limits);
    for layer in layers {
        check_time(limits, "reading layers")?;
        let compression =
            Compression::of(&layer.media_type).ok_or_else(|| InspectError::UnsupportedLayer {
                digest: layer.digest.clone(),
                media_type: layer.media_type.clone(),
            })?;
        let blob = source.open_blob(layer)?;
        layers::apply_layer(&mut tree, blob, compression, &layer.digest, &budget, limits)?;
        debug!(layer = %layer.digest, entries = tree.len(), "applied a layer");
    }
    Ok(tree)
}

/// Which loader the image `target` (an index or a manifest) runs its
/// command under on `platform`, started as `run` says (the image's own
/// entrypoint for [`RunSpec::default`]).
///
/// # Errors
/// [`InspectError`]: the store failed, a document is malformed, no manifest
/// fits the platform, a layer cannot be read, a limit or the deadline was
/// reached.
pub fn inspect_target(
    source: &mut dyn ImageSource,
    target: &Descriptor,
    platform: &Platform,
    run: &RunSpec,
    limits: &Limits,
) -> Result<Finding, InspectError> {
    let span = debug_span!("loader_check", digest = %target.digest, %platform);
    let _entered = span.enter();
    let result = inspect(source, target, platform, run, limits);
    match &result {
        Ok(f) => debug!(loader = ?f.loader, evidence = %f.evidence, "inspected"),
        Err(e) => debug!(error = %e, reason = e.reason(), "inspection failed"),
    }
    result
}

fn inspect(
    source: &mut dyn ImageSource,
    target: &Descriptor,
    platform: &Platform,
    run: &RunSpec,
    limits: &Limits,
) -> Result<Finding, InspectError> {
    check_time(limits, "before starting")?;
    let (config, layers) = manifest(source, target, platform, limits)?;
    let command = command(source, &config, run, limits)?;
    let tree = merge(source, &layers, limits)?;
    check_time(limits, "resolving the command")?;
    let (loader, evidence) = classify::classify(&tree, &command, limits.deadline)?;
    Ok(Finding {
        digest: target.digest.clone(),
        loader,
        evidence,
    })
}

/// Runs the layer reader over `bytes` (a tar archive, gzip- or
/// zstd-compressed if it starts with their magic) with the default limits,
/// then classifies `/bin/sh` over the result: for the fuzzer. Returns the
/// number of paths in the merged tree and the loader found.
///
/// # Errors
/// What reading the layer would return.
pub fn read_layer_for_fuzz(bytes: &[u8]) -> Result<(usize, super::Loader), InspectError> {
    let compression = match bytes {
        [0x1f, 0x8b, ..] => Compression::Gzip,
        [0x28, 0xb5, 0x2f, 0xfd, ..] => Compression::Zstd,
        _ => Compression::None,
    };
    let limits = Limits {
        max_layer_bytes: 64 << 20,
        max_entries: 100_000,
        max_libc: 4 << 20,
        ..Limits::default()
    };
    let budget = Budget::new(&limits);
    let mut tree = Tree::default();
    layers::apply_layer(&mut tree, bytes, compression, "fuzz", &budget, &limits)?;
    let command = Command {
        argv0: Some("sh".to_owned()),
        ..Command::default()
    };
    let (loader, _) = classify::classify(&tree, &command, limits.deadline)?;
    Ok((tree.len(), loader))
}

#[cfg(test)]
mod pod_tests;
#[cfg(test)]
mod tests;
