//! The JSON documents of an image: index (or Docker manifest list),
//! manifest and config, as `opencontainers/image-spec:image-index.md`,
//! `manifest.md` and `config.md` describe them (the Docker v2 schema 2
//! forms, `distribution/distribution:docs/spec/manifest-v2-2.md`, have the
//! same fields). Only the fields the loader check needs are read.

use serde::Deserialize;

use super::inspection::{InspectError, Platform};
use super::source::Descriptor;

pub(crate) const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub(crate) const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub(crate) const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub(crate) const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";

/// What a target blob is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Index,
    Manifest,
}

/// A descriptor as it appears in JSON.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct JsonDescriptor {
    #[serde(default)]
    pub(crate) media_type: String,
    pub(crate) digest: String,
    #[serde(default)]
    pub(crate) size: u64,
    #[serde(default)]
    pub(crate) platform: Option<JsonPlatform>,
}

impl JsonDescriptor {
    pub(crate) fn to_descriptor(&self) -> Descriptor {
        Descriptor {
            media_type: self.media_type.clone(),
            digest: self.digest.clone(),
            size: self.size,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct JsonPlatform {
    #[serde(default)]
    pub(crate) os: String,
    #[serde(default)]
    pub(crate) architecture: String,
    #[serde(default)]
    pub(crate) variant: Option<String>,
}

/// An index or a manifest: which fields are present tells them apart when
/// neither the descriptor nor the `mediaType` field does.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Document {
    #[serde(default)]
    media_type: Option<String>,
    #[serde(default)]
    manifests: Option<Vec<JsonDescriptor>>,
    #[serde(default)]
    config: Option<JsonDescriptor>,
    #[serde(default)]
    layers: Option<Vec<JsonDescriptor>>,
}

/// A parsed index or manifest.
#[derive(Debug)]
pub(crate) enum Parsed {
    Index(Vec<JsonDescriptor>),
    Manifest {
        config: JsonDescriptor,
        layers: Vec<JsonDescriptor>,
    },
}

fn kind_of(media_type: &str) -> Option<Kind> {
    match media_type {
        OCI_INDEX | DOCKER_LIST => Some(Kind::Index),
        OCI_MANIFEST | DOCKER_MANIFEST => Some(Kind::Manifest),
        _ => None,
    }
}

/// Parses the blob `desc` as an index or a manifest: its kind comes from
/// the descriptor's media type, else from the blob's `mediaType` field,
/// else from its fields (`manifests`: an index; `config`: a manifest).
///
/// # Errors
/// [`InspectError::Malformed`] naming the digest.
pub(crate) fn parse_target(desc: &Descriptor, bytes: &[u8]) -> Result<Parsed, InspectError> {
    let bad = |why: String| InspectError::Malformed {
        digest: desc.digest.clone(),
        why,
    };
    let doc: Document = serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))?;
    let declared = doc.media_type.as_deref().unwrap_or_default();
    let kind = match (desc.media_type.as_str(), declared) {
        ("", "") if doc.manifests.is_some() => Some(Kind::Index),
        ("", "") if doc.config.is_some() => Some(Kind::Manifest),
        ("", declared) => kind_of(declared),
        (given, _) => kind_of(given),
    };
    let kind = kind.ok_or_else(|| {
        bad(format!(
            "media type {:?} (blob says {declared:?}) is neither an index nor a manifest",
            desc.media_type
        ))
    })?;
    match (kind, doc) {
        (
            Kind::Index,
            Document {
                manifests: Some(m), ..
            },
        ) => Ok(Parsed::Index(m)),
        (
            Kind::Manifest,
            Document {
                config: Some(config),
                layers,
                ..
            },
        ) => Ok(Parsed::Manifest {
            config,
            layers: layers.unwrap_or_default(),
        }),
        (Kind::Index, _) => Err(bad("index without \"manifests\"".to_owned())),
        (Kind::Manifest, _) => Err(bad("manifest without \"config\"".to_owned())),
    }
}

fn matches(p: &JsonPlatform, want: &Platform) -> bool {
    p.os == want.os
        && p.architecture == want.architecture
        && want
            .variant
            .as_ref()
            .is_none_or(|v| p.variant.as_ref() == Some(v))
}

/// The manifest of `index` (the blob `digest`) for `platform`: the first
/// whose platform matches, or the only entry when it names no platform.
///
/// # Errors
/// [`InspectError::NoPlatform`] listing what the index offers.
pub(crate) fn select<'a>(
    digest: &str,
    index: &'a [JsonDescriptor],
    platform: &Platform,
) -> Result<&'a JsonDescriptor, InspectError> {
    if let [only] = index
        && only.platform.is_none()
    {
        return Ok(only);
    }
    if let Some(m) = index
        .iter()
        .find(|m| m.platform.as_ref().is_some_and(|p| matches(p, platform)))
    {
        return Ok(m);
    }
    let offered = index
        .iter()
        .map(|m| match &m.platform {
            Some(p) => match &p.variant {
                Some(v) => format!("{}/{}/{v}", p.os, p.architecture),
                None => format!("{}/{}", p.os, p.architecture),
            },
            None => "(no platform)".to_owned(),
        })
        .collect();
    Err(InspectError::NoPlatform {
        digest: digest.to_owned(),
        wanted: platform.to_string(),
        offered,
    })
}

/// The part of an image config (`config.md`, "Properties") that says how
/// the container starts.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct RunConfig {
    #[serde(default)]
    pub(crate) entrypoint: Option<Vec<String>>,
    #[serde(default)]
    pub(crate) cmd: Option<Vec<String>>,
    #[serde(default)]
    pub(crate) env: Option<Vec<String>>,
    #[serde(default)]
    pub(crate) working_dir: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ConfigDocument {
    #[serde(default)]
    config: Option<RunConfig>,
}

/// Parses the config blob `digest`.
///
/// # Errors
/// [`InspectError::Malformed`] naming the digest.
pub(crate) fn parse_config(digest: &str, bytes: &[u8]) -> Result<RunConfig, InspectError> {
    let doc: ConfigDocument =
        serde_json::from_slice(bytes).map_err(|e| InspectError::Malformed {
            digest: digest.to_owned(),
            why: e.to_string(),
        })?;
    Ok(doc.config.unwrap_or_default())
}

impl RunConfig {
    /// `PATH` from `Env`, if set there.
    pub(crate) fn path(&self) -> Option<&str> {
        self.env
            .as_ref()?
            .iter()
            .rev()
            .find_map(|e| e.strip_prefix("PATH="))
    }
}
