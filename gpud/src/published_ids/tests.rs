use std::os::unix::fs::symlink;

use super::*;
use crate::inventory::Gpu;
use crate::state_file::tests::{mkfifo, within_seconds};

fn gpu(bdf: &str, unique_id: u64, amdsmi: Option<&str>) -> Gpu {
    Gpu {
        bdf: bdf.parse().unwrap(),
        rocr_uuid: (unique_id != 0).then(|| format!("GPU-{unique_id:016x}")),
        unique_id,
        gfx: None,
        compute_units: 304,
        cus_per_wgp: 1,
        vram_bytes: 1 << 30,
        numa_node: None,
        market_name: None,
        amdsmi_uuid: amdsmi.map(str::to_owned),
        derived_uuid: None,
        published_id: None,
        compute_partition: None,
        memory_partition: None,
        available_compute_partitions: vec![],
        available_memory_partitions: vec![],
        supported_compute_partitions: vec![],
        vendor_id: 0x1002,
        device_id: 0x74a1,
        revision: None,
        hive_id: 0,
        partition_profile: None,
        partition_profiles: vec![],
        partitions: vec![],
        links: vec![],
    }
}

fn inventory(gpus: Vec<Gpu>) -> Inventory {
    Inventory {
        gpus,
        cpus: vec![],
        generation_id: None,
        amdsmi: crate::inventory::AmdSmiSummary::default(),
        product_names: None,
        warnings: vec![],
    }
}

fn ids(inventory: &Inventory) -> Vec<String> {
    inventory
        .gpus
        .iter()
        .map(|g| g.published_id.clone().unwrap())
        .collect()
}

const UUID: &str = "6eff74a1-0000-1000-80aa-d3b1c6a5e0ff";

#[test]
fn the_first_id_stays_when_amd_smi_fails_comes_back_or_amd_gpud_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let with_smi = || inventory(vec![gpu("0000:05:00.0", 0x8ecb, Some(UUID))]);
    let without = || inventory(vec![gpu("0000:05:00.0", 0x8ecb, None)]);
    let store = PublishedIds::load(dir.path());
    let mut first = with_smi();
    store.stamp(&mut first);
    assert_eq!(ids(&first), [UUID]);
    let mut failed = without();
    store.stamp(&mut failed);
    assert_eq!(ids(&failed), [UUID], "the probe failed: same ID");
    // A restart reads the file.
    let restarted = PublishedIds::load(dir.path());
    let mut again = without();
    restarted.stamp(&mut again);
    assert_eq!(ids(&again), [UUID]);
    // Without the file the ID would change: the file is what keeps it.
    let fresh = PublishedIds::load(tempfile::tempdir().unwrap().path());
    let mut other = without();
    fresh.stamp(&mut other);
    assert_eq!(ids(&other), ["GPU-0000000000008ecb"]);
}

#[test]
fn an_id_first_chosen_without_amd_smi_is_kept_when_it_comes() {
    let dir = tempfile::tempdir().unwrap();
    let store = PublishedIds::load(dir.path());
    let mut inv = inventory(vec![gpu("0000:05:00.0", 0x8ecb, None)]);
    store.stamp(&mut inv);
    let mut later = inventory(vec![gpu("0000:05:00.0", 0x8ecb, Some(UUID))]);
    store.stamp(&mut later);
    assert_eq!(ids(&later), ["GPU-0000000000008ecb"]);
}

#[test]
fn a_gpu_replaced_at_its_address_gets_its_own_id() {
    let dir = tempfile::tempdir().unwrap();
    let store = PublishedIds::load(dir.path());
    let mut inv = inventory(vec![gpu("0000:05:00.0", 0x8ecb, None)]);
    store.stamp(&mut inv);
    let mut replaced = inventory(vec![gpu("0000:05:00.0", 0x1234, None)]);
    store.stamp(&mut replaced);
    assert_eq!(ids(&replaced), ["GPU-0000000000001234"]);
    let text = std::fs::read_to_string(dir.path().join(FILE_NAME)).unwrap();
    assert!(
        !text.contains("8ecb"),
        "the old GPU's entry is gone: {text}"
    );
}

#[test]
fn apus_without_unique_id_and_clashing_ids_fall_back_to_the_pci_address() {
    let mut entries = Vec::new();
    let apu = gpu("0000:c1:00.0", 0, None);
    assert_eq!(assign(&mut entries, &apu).0, "amdgpu-0000-c1-00-0");
    // Two GPUs reporting the same AMD SMI UUID: the second is not given it.
    let a = gpu("0000:05:00.0", 1, Some(UUID));
    let b = gpu("0000:15:00.0", 2, Some(UUID));
    assert_eq!(assign(&mut entries, &a).0, UUID);
    assert_eq!(assign(&mut entries, &b).0, "GPU-0000000000000002");
    // An ID with HAMi's separators is never published.
    let odd = gpu("0000:25:00.0", 0, Some("a,b"));
    assert_eq!(assign(&mut entries, &odd).0, "amdgpu-0000-25-00-0");
}

#[test]
fn a_bad_file_is_moved_aside_and_the_ids_chosen_afresh() {
    for bad in [
        &b"{not json"[..],
        br#"{"version":9,"devices":[]}"#,
        br#"{"version":1,"devices":[{"bdf":"0000:05:00.0","unique_id":"1","id":"a;b"}]}"#,
    ] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE_NAME), bad).unwrap();
        let store = PublishedIds::load(dir.path());
        assert!(dir.path().join("published-ids.json.bad").exists());
        let mut inv = inventory(vec![gpu("0000:05:00.0", 1, None)]);
        store.stamp(&mut inv);
        assert_eq!(ids(&inv), ["GPU-0000000000000001"]);
        let written = read(&dir.path().join(FILE_NAME)).unwrap();
        assert_eq!(written.len(), 1, "a good file replaced it");
    }
}

#[test]
fn an_oversized_file_is_refused_unread() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(FILE_NAME);
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(MAX_FILE_BYTES + 1).unwrap();
    let err = read(&path).unwrap_err();
    assert!(
        matches!(err, IdsError::File(FileError::TooLarge { .. })),
        "{err}"
    );
    let text = err.to_string();
    assert!(text.contains(&path.display().to_string()), "{err}");
    assert!(text.contains(&MAX_FILE_BYTES.to_string()), "{err}");
}

#[test]
fn nothing_is_written_when_no_id_is_new() {
    let dir = tempfile::tempdir().unwrap();
    let store = PublishedIds::load(dir.path());
    let mut inv = inventory(vec![gpu("0000:05:00.0", 1, None)]);
    store.stamp(&mut inv);
    let path = dir.path().join(FILE_NAME);
    std::fs::remove_file(&path).unwrap();
    store.stamp(&mut inv);
    assert!(!path.exists(), "no write for known IDs");
    assert!(!dir.path().join("published-ids.json.tmp").exists());
}

/// A link to `/dev/zero` or a FIFO where the file goes: the old reader
/// followed the link (a size of 0, then a read that never ends) or blocked
/// on the FIFO. Now the load returns at once, moves it aside and starts
/// afresh.
#[test]
fn a_file_linked_to_dev_zero_or_a_fifo_is_refused_at_once() {
    for fifo in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        if fifo {
            mkfifo(&path);
        } else {
            symlink("/dev/zero", &path).unwrap();
        }
        let err = within_seconds({
            let path = path.clone();
            move || read(&path)
        })
        .unwrap_err();
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
        let at = dir.path().to_owned();
        let store = within_seconds(move || PublishedIds::load(&at));
        assert!(dir.path().join("published-ids.json.bad").exists());
        let mut inv = inventory(vec![gpu("0000:05:00.0", 1, None)]);
        store.stamp(&mut inv);
        assert_eq!(read(&path).unwrap().len(), 1, "a regular file replaced it");
    }
}

/// The old writer wrote through `published-ids.json.tmp`: a link planted
/// there made root overwrite its target.
#[test]
fn a_link_planted_at_a_temporary_name_does_not_redirect_the_write() {
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "precious").unwrap();
    for name in ["published-ids.json.tmp", ".published-ids.json.tmp"] {
        symlink(&victim, dir.path().join(name)).unwrap();
    }
    let store = PublishedIds::load(dir.path());
    let mut inv = inventory(vec![gpu("0000:05:00.0", 1, None)]);
    store.stamp(&mut inv);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    let path = dir.path().join(FILE_NAME);
    assert!(std::fs::symlink_metadata(&path).unwrap().is_file());
    assert_eq!(read(&path).unwrap().len(), 1);
    let left = std::fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(left, 4, "the file, the victim, the two links: no temporary");
}

/// The Go plugin's AMD SMI (7.0.2) UUID, computed from sysfs.
const DERIVED: &str = "afff74a1-0000-1000-8054-e92b0a5d57c8";

fn with_derived(mut g: Gpu) -> Gpu {
    g.derived_uuid = Some(DERIVED.to_owned());
    g
}

#[test]
fn the_uuid_from_sysfs_comes_first_whatever_the_library_says() {
    // A 7.13 library reports the partition-index form; a node without AMD
    // SMI has none. Both publish what the Go plugin published.
    let newer = "af0074a1-0000-1000-8054-e92b0a5d57c8";
    for amdsmi in [Some(newer), None] {
        let mut entries = Vec::new();
        let g = with_derived(gpu("0000:05:00.0", 0xaf54_e92b_0a5d_57c8, amdsmi));
        assert_eq!(assign(&mut entries, &g).0, DERIVED, "{amdsmi:?}");
    }
}

/// A node that ran an amd-gpud publishing `GPU-<hex>` (no AMD SMI, before
/// the UUID was computed from sysfs) keeps those IDs: running pods'
/// annotations name them.
#[test]
fn ids_recorded_as_rocr_uuids_stay_after_the_upgrade() {
    let dir = tempfile::tempdir().unwrap();
    let recorded = r#"{"version":1,"devices":[
        {"bdf":"0000:05:00.0","unique_id":"12345","id":"GPU-0000000000003039"}]}"#;
    std::fs::write(dir.path().join(FILE_NAME), recorded).unwrap();
    let store = PublishedIds::load(dir.path());
    let mut inv = inventory(vec![
        with_derived(gpu("0000:05:00.0", 12345, None)),
        gpu("0000:15:00.0", 7, None),
    ]);
    store.stamp(&mut inv);
    assert_eq!(ids(&inv), ["GPU-0000000000003039", "GPU-0000000000000007"]);
    // The GPU seen for the first time gets the derived UUID when it has one.
    let mut third = inventory(vec![with_derived(gpu("0000:25:00.0", 9, None))]);
    store.stamp(&mut third);
    assert_eq!(ids(&third), [DERIVED]);
    let again = PublishedIds::load(dir.path());
    let mut inv = inventory(vec![with_derived(gpu("0000:05:00.0", 12345, None))]);
    again.stamp(&mut inv);
    assert_eq!(ids(&inv), ["GPU-0000000000003039"], "across a restart too");
}
