//! Images in the old and new formats, and every way one can be broken.

use std::fs;

use prost::Message;

use super::{TopoBuilder, gpu_props};
use crate::restore_check::{
    Mode, Outcome, Request, Verdict, check,
    image::{self, ImageError, ImageFormat, MAX_IMAGE_BYTES},
    model::{GpuProps, LinkKind, Node, Topo},
    proto::{current, v3_17},
};

fn entry(n: &Node) -> current::KfdDeviceEntry {
    let p: &GpuProps = &n.props;
    current::KfdDeviceEntry {
        node_id: Some(n.id),
        gpu_id: Some(n.gpu_id),
        cpu_cores_count: Some(if n.is_gpu() { 0 } else { 96 }),
        simd_count: Some(p.simd_count),
        mem_banks_count: Some(p.mem_banks_count),
        caches_count: Some(p.caches_count),
        io_links_count: Some(p.io_links_count),
        max_waves_per_simd: Some(p.max_waves_per_simd),
        lds_size_in_kb: Some(p.lds_size_in_kb),
        gds_size_in_kb: Some(0),
        num_gws: Some(p.num_gws),
        wave_front_size: Some(p.wave_front_size),
        array_count: Some(p.array_count),
        simd_arrays_per_engine: Some(p.simd_arrays_per_engine),
        cu_per_simd_array: Some(p.cu_per_simd_array),
        simd_per_cu: Some(p.simd_per_cu),
        max_slots_scratch_cu: Some(p.max_slots_scratch_cu),
        vendor_id: Some(p.vendor_id),
        device_id: Some(p.device_id),
        domain: Some(p.domain),
        drm_render_minor: Some(p.drm_render_minor),
        hive_id: Some(p.hive_id),
        num_sdma_engines: Some(p.num_sdma_engines),
        num_sdma_xgmi_engines: Some(p.num_sdma_xgmi_engines),
        num_sdma_queues_per_engine: Some(p.num_sdma_queues_per_engine),
        num_cp_queues: Some(p.num_cp_queues),
        fw_version: Some(p.fw_version),
        capability: Some(p.capability),
        sdma_fw_version: Some(p.sdma_fw_version),
        vram_public: Some(p.vram_public),
        vram_size: Some(p.vram_size),
        iolinks: n
            .links
            .iter()
            .map(|l| current::DevIolink {
                r#type: Some(l.kind.crat()),
                node_to_id: Some(l.to),
            })
            .collect(),
    }
}

/// A newest-format message for `topo`, with `bos` buffer objects that carry
/// a handle.
fn message(topo: &Topo, bos: u32) -> current::CriuKfd {
    current::CriuKfd {
        pid: Some(4242),
        num_of_gpus: u32::try_from(topo.gpu_count()).ok(),
        num_of_cpus: u32::try_from(topo.nodes.len() - topo.gpu_count()).ok(),
        device_entries: topo.nodes.iter().map(entry).collect(),
        num_of_bos: Some(u64::from(bos)),
        bo_entries: (0..bos)
            .map(|i| current::KfdBoEntry {
                addr: Some(0x7f00_0000_0000 + u64::from(i) * 4096),
                size: Some(4096),
                offset: Some(0),
                alloc_flags: Some(1),
                gpu_id: Some(0x1002),
                handle: Some(i + 1),
            })
            .collect(),
        num_of_objects: Some(0),
        shared_mem_size: Some(0),
        shared_mem_magic: Some(0),
        priv_data: Some(vec![0xab; 64]),
    }
}

/// The same checkpoint as CRIU 3.17 writes it (old message, no handles).
fn old_message(topo: &Topo, bos: u32) -> v3_17::CriuKfd {
    let new = message(topo, bos);
    let bytes = new.encode_to_vec();
    // Same wire format for device entries: decode them with the old schema.
    v3_17::CriuKfd::decode(bytes.as_slice()).unwrap()
}

fn topo() -> Topo {
    TopoBuilder::new()
        .cpu(0)
        .cpu(1)
        .gpu(2, 0)
        .gpu(3, 1)
        .hive(&[2, 3])
        .tweak(3, |p| p.hive_id = 77)
        .build()
}

#[test]
fn both_formats_read_back_the_same_topology() {
    let t = topo();
    let cases = [
        (image::frame(&message(&t, 0)), ImageFormat::Any),
        (image::frame(&message(&t, 3)), ImageFormat::AfterV4_2),
        (image::frame(&old_message(&t, 3)), ImageFormat::V3_17ToV4_2),
        (image::frame(&old_message(&t, 0)), ImageFormat::Any),
    ];
    for (bytes, format) in cases {
        let img = image::parse(&bytes, "amdgpu-kfd-7.img").unwrap();
        assert_eq!(img.format, format);
        assert_eq!(img.pid, 4242);
        // Locations are local-only.
        let mut want = t.clone();
        want.nodes
            .iter_mut()
            .for_each(|n| n.location = Default::default());
        assert_eq!(img.topo, want);
    }
    let old = v3_17::CriuKfd::decode(&image::frame(&old_message(&t, 2))[8..]).unwrap();
    assert_eq!(old.device_entries[2].fw_version, 177);
    assert_eq!(old.bo_entries.len(), 2);
}

#[test]
fn the_header_is_the_little_endian_payload_length() {
    let bytes = image::frame(&message(&topo(), 0));
    let len = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    assert_eq!(len, u64::try_from(bytes.len() - 8).unwrap());
}

#[test]
fn every_truncation_is_a_clear_error() {
    let bytes = image::frame(&message(&topo(), 2));
    for cut in 0..bytes.len() {
        let err = image::parse(&bytes[..cut], "img").unwrap_err();
        match cut {
            0..8 => assert!(matches!(err, ImageError::TooShort { .. }), "{cut}: {err}"),
            _ => assert!(matches!(err, ImageError::Truncated { .. }), "{cut}: {err}"),
        }
        assert!(err.to_string().starts_with("img: "), "{err}");
    }
}

/// CRIU reads the length the header announces and unpacks that many bytes
/// (checkpoint-restore/criu:plugins/amdgpu/amdgpu_plugin.c, restore path:
/// `read_fp(img_fp, buf, img_size)`, `criu_kfd__unpack(NULL, img_size,
/// buf)`): bytes after them are never read, and the image restores.
#[test]
fn bytes_after_the_announced_message_are_ignored_as_criu_ignores_them() {
    let t = topo();
    let mut bytes = image::frame(&message(&t, 0));
    bytes.extend_from_slice(b"junk");
    let img = image::parse(&bytes, "img").unwrap();
    assert_eq!(img.trailing_bytes, 4);
    assert_eq!(
        img.topo,
        image::parse(&image::frame(&message(&t, 0)), "img")
            .unwrap()
            .topo
    );
    for mode in [Mode::Criu, Mode::Explain] {
        let request = Request {
            mode,
            ..Request::default()
        };
        let v = check(&img, &super::local(t.clone()), &request).unwrap();
        assert_eq!(v.outcome, Outcome::Restorable, "{mode}");
        assert_eq!(v.mapping.len(), t.gpu_count());
        assert!(
            v.notes.iter().any(|n| n.contains("4 bytes follow")),
            "{:?}",
            v.notes
        );
    }
}

#[test]
fn oversized_images_are_refused() {
    let mut huge = (MAX_IMAGE_BYTES + 1).to_le_bytes().to_vec();
    huge.extend_from_slice(&[0; 16]);
    let err = image::parse(&huge, "img").unwrap_err();
    assert!(matches!(err, ImageError::TooLarge { .. }), "{err}");
    let mut max = u64::MAX.to_le_bytes().to_vec();
    max.push(0);
    assert!(matches!(
        image::parse(&max, "img"),
        Err(ImageError::TooLarge { .. })
    ));
    // A file past the limit is not read whole.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("amdgpu-kfd-1.img");
    let file = fs::File::create(&path).unwrap();
    file.set_len(MAX_IMAGE_BYTES * 4).unwrap();
    let err = image::read_file(&path).unwrap_err();
    assert!(matches!(err, ImageError::TooLarge { .. }), "{err}");
}

#[test]
fn other_files_are_named_for_what_they_are() {
    // A CRIU core image: common magic, then a type magic.
    let mut core = 0x5476_4319_u32.to_le_bytes().to_vec();
    core.extend_from_slice(&0x5832_1234_u32.to_le_bytes());
    core.extend_from_slice(&[1, 2, 3, 4]);
    let err = image::parse(&core, "core-1.img").unwrap_err();
    assert!(matches!(err, ImageError::CoreImage { .. }), "{err}");
    // Framed garbage.
    let mut junk = 5_u64.to_le_bytes().to_vec();
    junk.extend_from_slice(&[0xff; 5]);
    let err = image::parse(&junk, "img").unwrap_err();
    assert!(matches!(err, ImageError::Decode { .. }), "{err}");
    // A render-node image decodes (field 1 is a uint32 in both) but has no
    // device entries, which every kfd image has.
    let render = current::CriuRenderNode {
        gpu_id: Some(0x1002),
        ..Default::default()
    };
    let err = image::parse(&image::frame(&render), "renderD").unwrap_err();
    assert!(matches!(err, ImageError::NoDevices { .. }), "{err}");
}

#[test]
fn a_missing_required_field_is_named() {
    let mut m = message(&topo(), 0);
    m.device_entries[2].fw_version = None;
    let err = image::parse(&image::frame(&m), "img").unwrap_err();
    assert!(
        matches!(
            err,
            ImageError::MissingField {
                index: 2,
                field: "fw_version",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("CRIU 3.17 or later"), "{err}");
    let mut m = message(&topo(), 0);
    m.device_entries[0].iolinks[0].node_to_id = None;
    let err = image::parse(&image::frame(&m), "img").unwrap_err();
    assert!(err.to_string().contains("iolinks.node_to_id"), "{err}");
}

#[test]
fn inconsistent_images_are_refused() {
    let mut m = message(&topo(), 2);
    m.bo_entries[0].handle = None;
    let err = image::parse(&image::frame(&m), "img").unwrap_err();
    assert!(
        matches!(
            err,
            ImageError::MixedFormats {
                with: 1,
                without: 1,
                ..
            }
        ),
        "{err}"
    );
    let mut m = message(&topo(), 0);
    m.device_entries[3].node_id = Some(2);
    let err = image::parse(&image::frame(&m), "img").unwrap_err();
    assert!(
        matches!(err, ImageError::DuplicateNode { node: 2, .. }),
        "{err}"
    );
    let mut m = message(&topo(), 0);
    m.device_entries[3].gpu_id = Some(0x1002);
    let err = image::parse(&image::frame(&m), "img").unwrap_err();
    assert!(matches!(err, ImageError::DuplicateGpu { .. }), "{err}");
}

#[test]
fn unknown_link_types_are_kept() {
    let mut m = message(&topo(), 0);
    m.device_entries[2].iolinks[0].r#type = Some(1);
    let img = image::parse(&image::frame(&m), "img").unwrap();
    assert_eq!(img.topo.nodes[2].links[0].kind, LinkKind::Other(1));
    assert_eq!(gpu_props().fw_version, img.topo.nodes[2].props.fw_version);
}

#[test]
fn images_are_found_in_a_checkpoint_directory() {
    let dir = tempfile::tempdir().unwrap();
    let err = image::find(dir.path()).unwrap_err();
    assert!(matches!(err, ImageError::NoImage { .. }), "{err}");
    let inner = dir.path().join("checkpoint");
    fs::create_dir(&inner).unwrap();
    for name in ["amdgpu-renderD-5.img", "amdgpu-kfd-x.img", "pages-1.img"] {
        fs::write(inner.join(name), b"").unwrap();
    }
    assert!(image::find(dir.path()).is_err());
    fs::write(
        inner.join("amdgpu-kfd-12.img"),
        image::frame(&message(&topo(), 0)),
    )
    .unwrap();
    let found = image::find(dir.path()).unwrap();
    assert_eq!(found, inner.join("amdgpu-kfd-12.img"));
    assert_eq!(image::read_file(&found).unwrap().topo.gpu_count(), 2);
    fs::write(inner.join("amdgpu-kfd-13.img"), b"").unwrap();
    let err = image::find(&inner).unwrap_err();
    assert!(
        err.to_string()
            .contains("amdgpu-kfd-12.img, amdgpu-kfd-13.img"),
        "{err}"
    );
    assert_eq!(image::find(&found).unwrap(), found, "a file is itself");
    let err = image::read_file(&dir.path().join("missing.img")).unwrap_err();
    assert!(matches!(err, ImageError::Read { .. }));
}

/// Checks the image of `m` against `local` in `mode`.
fn verdict(m: &current::CriuKfd, local: &Topo, mode: Mode) -> Verdict {
    let img = image::parse(&image::frame(m), "amdgpu-kfd-1.img").unwrap();
    let request = Request {
        mode,
        ..Request::default()
    };
    check(&img, &super::local(local.clone()), &request).unwrap()
}

/// Point 6 of CRIU's reading (checkpoint-restore/criu:plugins/amdgpu/
/// amdgpu_plugin.c, restore path): it converts `num_of_gpus + num_of_cpus`
/// entries, whatever the entry list holds, and an entry with
/// `cpu_cores_count` set keeps only that count (`devinfo_to_topology`).
#[test]
fn criu_reads_as_many_entries_as_the_header_counts() {
    let t = TopoBuilder::new().cpu(0).gpu(1, 0).gpu(2, 0).build();
    let mut m = message(&t, 0);
    // 1 GPU + 1 CPU: the entries of node 0 and node 1 only.
    m.num_of_gpus = Some(1);
    let v = verdict(&m, &t, Mode::Criu);
    assert_eq!(
        v.reason.as_deref(),
        Some("Number of devices mismatch (checkpointed:1 local:2)")
    );
    assert!(
        v.notes.iter().any(|n| n.contains("reads the first 2")),
        "{v:#?}"
    );
    // 3 + 1 entries announced, 3 there: CRIU reads past the array.
    m.num_of_gpus = Some(3);
    let v = verdict(&m, &t, Mode::Criu);
    assert_eq!(v.outcome, Outcome::CriuWouldCrash);
    let v = verdict(&m, &t, Mode::Explain);
    assert_eq!(v.outcome, Outcome::Restorable);
    assert_eq!(v.criu_outcome, Some(Outcome::CriuWouldCrash));
    // CRIU's schema requires both counts.
    m.num_of_gpus = None;
    let v = verdict(&m, &t, Mode::Criu);
    assert_eq!(v.reason.as_deref(), Some("Unable to parse the KFD message"));
}

#[test]
fn an_entry_with_cpu_cores_is_read_as_a_cpu() {
    let t = TopoBuilder::new().cpu(0).gpu(1, 0).build();
    let mut m = message(&t, 0);
    m.device_entries[1].cpu_cores_count = Some(24);
    let img = image::parse(&image::frame(&m), "amdgpu-kfd-1.img").unwrap();
    assert_eq!(img.gpus_read_as_cpus, [1]);
    assert_eq!(img.topo.nodes[1].props, GpuProps::default());
    // Still a GPU by its gpu_id, with every compared value zero.
    let v = verdict(&m, &t, Mode::Explain);
    assert_eq!(v.outcome, Outcome::Refused);
    assert!(
        v.refusals.iter().any(|r| r.property == "simd_count"),
        "{v:#?}"
    );
    assert!(v.notes.iter().any(|n| n.contains("reads it as a CPU")));
}

#[test]
fn verdicts_name_their_criu_and_what_newer_criu_cannot_read() {
    let t = topo();
    let old = old_message(&t, 2);
    let bytes = image::frame(&old);
    let img = image::parse(&bytes, "amdgpu-kfd-1.img").unwrap();
    assert_eq!(img.format, ImageFormat::V3_17ToV4_2);
    let v = check(&img, &super::local(t.clone()), &Request::default()).unwrap();
    assert_eq!(v.criu_version, "3.17.1");
    assert!(
        v.notes
            .iter()
            .any(|n| n.contains("CRIU after 4.2 cannot read this image")),
        "{:?}",
        v.notes
    );
    let v = verdict(&message(&t, 0), &t, Mode::Criu);
    assert!(!v.notes.iter().any(|n| n.contains("after 4.2")));
}

/// CRIU copies an entry's `vram_public` (a uint32 in the image) into the
/// bool `tp_node.vram_public` (checkpoint-restore/criu:plugins/amdgpu/
/// amdgpu_plugin.c, `devinfo_to_topology`) and compares the bools
/// (amdgpu_plugin_topology.c:1002): an image whose GPUs carry 1 and 2 has
/// two public-VRAM GPUs, and restores onto two of them with the same
/// mapping. Compared raw, 2 against 1 failed ("Failed to match remaining
/// nodes").
#[test]
fn vram_public_is_read_as_the_bool_criu_keeps() {
    let t = TopoBuilder::new().cpu(0).gpu(1, 0).gpu(2, 0).build();
    let mut m = message(&t, 0);
    m.device_entries[2].vram_public = Some(2);
    let criu = verdict(&m, &t, Mode::Criu);
    assert_eq!(criu.outcome, Outcome::Restorable, "{criu:#?}");
    let pairs: Vec<(u32, u32)> = criu
        .mapping
        .iter()
        .map(|p| (p.checkpoint_gpu, p.local_gpu))
        .collect();
    assert_eq!(pairs, [(0x1001, 0x1001), (0x1002, 0x1002)]);
    assert!(verdict(&m, &t, Mode::Explain).restorable);
    // Zero stays private: a real difference, refused by both.
    m.device_entries[2].vram_public = Some(0);
    let criu = verdict(&m, &t, Mode::Criu);
    assert_eq!(
        criu.reason.as_deref(),
        Some("Failed to match remaining nodes")
    );
    let explain = verdict(&m, &t, Mode::Explain);
    assert_eq!(explain.refusals[0].property, "vram_public");
}
