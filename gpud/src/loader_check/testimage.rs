//! Test images in memory: tar layers made with `tar::Builder`, compressed
//! with flate2 or ruzstd, and an [`ImageSource`] over a map of blobs keyed
//! by their sha256 digests, with OCI manifests, configs and indexes.

use std::{collections::HashMap, io::Read, io::Write};

use sha2::{Digest, Sha256};

use super::oci::{OCI_INDEX, OCI_MANIFEST};
use super::source::{Descriptor, ImageSource, SourceError};

pub(crate) const TAR: &str = "application/vnd.oci.image.layer.v1.tar";
pub(crate) const TAR_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub(crate) const TAR_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
pub(crate) const CONFIG: &str = "application/vnd.oci.image.config.v1+json";

/// One tar layer being written.
pub(crate) struct TarLayer(tar::Builder<Vec<u8>>);

fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_mtime(0);
    h
}

impl TarLayer {
    pub(crate) fn new() -> Self {
        Self(tar::Builder::new(Vec::new()))
    }

    pub(crate) fn dir(mut self, path: &str) -> Self {
        let mut h = header(tar::EntryType::Directory, 0o755, 0);
        self.0.append_data(&mut h, path, &[][..]).expect("dir");
        self
    }

    pub(crate) fn file(mut self, path: &str, mode: u32, data: &[u8]) -> Self {
        let mut h = header(tar::EntryType::Regular, mode, data.len() as u64);
        self.0.append_data(&mut h, path, data).expect("file");
        self
    }

    pub(crate) fn host_file(self, path: &str, mode: u32, host: &str) -> Self {
        let data = std::fs::read(host).unwrap_or_else(|e| panic!("fixture {host}: {e}"));
        self.file(path, mode, &data)
    }

    pub(crate) fn symlink(mut self, path: &str, target: &str) -> Self {
        let mut h = header(tar::EntryType::Symlink, 0o777, 0);
        self.0.append_link(&mut h, path, target).expect("symlink");
        self
    }

    pub(crate) fn hardlink(mut self, path: &str, target: &str) -> Self {
        let mut h = header(tar::EntryType::Link, 0o755, 0);
        self.0.append_link(&mut h, path, target).expect("hardlink");
        self
    }

    pub(crate) fn finish(self) -> Vec<u8> {
        self.0.into_inner().expect("tar")
    }
}

pub(crate) fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).expect("gzip");
    e.finish().expect("gzip")
}

pub(crate) fn zstd(bytes: &[u8]) -> Vec<u8> {
    ruzstd::encoding::compress_to_vec(bytes, ruzstd::encoding::CompressionLevel::Fastest)
}

pub(crate) fn digest_of(bytes: &[u8]) -> String {
    let hash = Sha256::digest(bytes);
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// Blobs by digest, and image names.
#[derive(Default)]
pub(crate) struct MemSource {
    pub(crate) blobs: HashMap<String, Vec<u8>>,
    pub(crate) names: HashMap<String, Descriptor>,
}

impl MemSource {
    /// Stores `bytes`, and returns their descriptor.
    pub(crate) fn put(&mut self, media_type: &str, bytes: Vec<u8>) -> Descriptor {
        let desc = Descriptor {
            media_type: media_type.to_owned(),
            digest: digest_of(&bytes),
            size: bytes.len() as u64,
        };
        self.blobs.insert(desc.digest.clone(), bytes);
        desc
    }

    /// Stores a config and a manifest over `layers` (media type, bytes).
    pub(crate) fn image(
        &mut self,
        config: &serde_json::Value,
        layers: Vec<(&str, Vec<u8>)>,
    ) -> Descriptor {
        let config = serde_json::json!({
            "architecture": "amd64",
            "os": "linux",
            "config": config,
            "rootfs": {"type": "layers", "diff_ids": []},
        });
        let config = self.put(CONFIG, serde_json::to_vec(&config).expect("json"));
        let layers: Vec<serde_json::Value> = layers
            .into_iter()
            .map(|(mt, bytes)| json_desc(&self.put(mt, bytes)))
            .collect();
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": json_desc(&config),
            "layers": layers,
        });
        self.put(OCI_MANIFEST, serde_json::to_vec(&manifest).expect("json"))
    }

    /// Stores an index over (manifest, platform `os/arch[/variant]`).
    pub(crate) fn index(&mut self, entries: &[(&Descriptor, &str)]) -> Descriptor {
        let manifests: Vec<serde_json::Value> = entries
            .iter()
            .map(|(d, platform)| {
                let mut v = json_desc(d);
                let mut parts = platform.split('/');
                let mut p = serde_json::json!({
                    "os": parts.next().unwrap_or_default(),
                    "architecture": parts.next().unwrap_or_default(),
                });
                if let Some(variant) = parts.next() {
                    p["variant"] = variant.into();
                }
                if !platform.is_empty() {
                    v["platform"] = p;
                }
                v
            })
            .collect();
        let index = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_INDEX,
            "manifests": manifests,
        });
        self.put(OCI_INDEX, serde_json::to_vec(&index).expect("json"))
    }
}

fn json_desc(d: &Descriptor) -> serde_json::Value {
    serde_json::json!({"mediaType": d.media_type, "digest": d.digest, "size": d.size})
}

impl ImageSource for MemSource {
    fn target(&mut self, name: &str) -> Result<Descriptor, SourceError> {
        self.names
            .get(name)
            .cloned()
            .ok_or_else(|| SourceError::NotPresent {
                image: name.to_owned(),
            })
    }

    fn read_blob(&mut self, desc: &Descriptor, max: u64) -> Result<Vec<u8>, SourceError> {
        let blob = self.blob(desc)?;
        if blob.len() as u64 > max {
            return Err(SourceError::TooLarge {
                digest: desc.digest.clone(),
                size: blob.len() as u64,
                max,
            });
        }
        Ok(blob.to_vec())
    }

    fn open_blob(&mut self, desc: &Descriptor) -> Result<Box<dyn Read + Send + '_>, SourceError> {
        Ok(Box::new(self.blob(desc)?))
    }
}

impl MemSource {
    fn blob(&self, desc: &Descriptor) -> Result<&[u8], SourceError> {
        self.blobs
            .get(&desc.digest)
            .map(Vec::as_slice)
            .ok_or_else(|| SourceError::MissingBlob {
                digest: desc.digest.clone(),
            })
    }
}
