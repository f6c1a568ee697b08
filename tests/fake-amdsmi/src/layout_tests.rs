use super::*;
use crate::fixture::{Loaded, tests::README_EXAMPLE};

fn u32_at(bytes: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(bytes[off..off + 4].try_into().unwrap())
}

fn u64_at(bytes: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(bytes[off..off + 8].try_into().unwrap())
}

fn str_at(bytes: &[u8], off: usize) -> &str {
    let field = &bytes[off..];
    let end = field.iter().position(|&b| b == 0).unwrap();
    std::str::from_utf8(&field[..end]).unwrap()
}

fn example_processor() -> Processor {
    let loaded = Loaded::parse(README_EXAMPLE.as_bytes()).unwrap();
    loaded.fixture.sockets[0].processors[0].clone()
}

#[test]
fn image_string_truncates_and_terminates() {
    let mut img = Image::new(8);
    img.str(2, 4, "abcdef");
    assert_eq!(img.bytes(), b"\0\0abc\0\0\0");
    // Writes that would run past the end are dropped whole.
    img.str(6, 4, "xyz");
    img.u64(4, u64::MAX);
    assert_eq!(img.bytes(), b"\0\0abc\0\0\0");
    img.u32(4, 0x0101_0101);
    assert_eq!(img.bytes(), b"\0\0ab\x01\x01\x01\x01");
}

#[test]
fn asic_info_6_2_vs_6_4() {
    let p = example_processor();
    let old = asic_info(Abi::V6_2, &p);
    let new = asic_info(Abi::V6_4, &p);
    assert_eq!(old.bytes().len(), 448);
    assert_eq!(new.bytes().len(), 896);
    assert_eq!(u64_at(old.bytes(), 328), 29857);
    assert_eq!(u64_at(new.bytes(), 520), 29857);
    assert_eq!(u64_at(new.bytes(), 328), 0);
    for img in [&old, &new] {
        assert_eq!(str_at(img.bytes(), 0), "AMD Instinct MI300X");
        assert_eq!(u32_at(img.bytes(), 256), 4098);
        assert_eq!(str_at(img.bytes(), 260), AMD_VENDOR_NAME);
    }
    assert_eq!(
        u32_at(old.bytes(), 324),
        4098,
        "subvendor defaults to vendor"
    );
    assert_eq!(str_at(old.bytes(), 340), "0xE3A7C0FFEE01F431");
    assert_eq!(str_at(new.bytes(), 532), "0xE3A7C0FFEE01F431");
    assert_eq!(u32_at(new.bytes(), 792), 38);
    // 6.2 has no num_of_compute_units: 376 is reserved and stays zero.
    assert_eq!(u32_at(old.bytes(), 376), 0);
}

#[test]
fn asic_info_6_3_has_compute_units() {
    let mut p = example_processor();
    p.target_graphics_version = Some(0x942);
    p.oam_id = Some(5);
    let img = asic_info(Abi::V6_3, &p);
    assert_eq!(img.bytes().len(), 456);
    assert_eq!(u32_at(img.bytes(), 372), 5);
    assert_eq!(u32_at(img.bytes(), 376), 38);
    assert_eq!(u64_at(img.bytes(), 384), 0x942);
    let img = asic_info(Abi::V7_13, &p);
    assert_eq!(u32_at(img.bytes(), 788), 5);
    assert_eq!(u64_at(img.bytes(), 800), 0x942);
}

#[test]
fn asic_serial_is_truncated_to_32_bytes_on_6_2() {
    let mut p = example_processor();
    p.asic_serial = Some("S".repeat(40));
    let img = asic_info(Abi::V6_2, &p);
    assert_eq!(str_at(img.bytes(), 340), "S".repeat(31));
    assert_eq!(u32_at(img.bytes(), 372), 0, "oam_id not overwritten");
}

#[test]
fn version_layouts() {
    let v = Version {
        year: 24,
        major: 6,
        minor: 2,
        release: 1,
    };
    let six = version(Abi::V6_2, v, 0x1234_5678);
    assert_eq!([0, 4, 8, 12].map(|o| u32_at(six.bytes(), o)), [24, 6, 2, 1]);
    assert_eq!(u64_at(six.bytes(), 16), 0x1234_5678);
    let v = Version {
        year: 0,
        major: 26,
        minor: 1,
        release: 3,
    };
    let seven = version(Abi::V7_0, v, 8);
    assert_eq!(
        [0, 4, 8, 12].map(|o| u32_at(seven.bytes(), o)),
        [26, 1, 3, 0]
    );
    assert_eq!(u64_at(seven.bytes(), 16), 8);
}

#[test]
fn kfd_and_enumeration_info() {
    let mut p = example_processor();
    p.partition_id = 3;
    p.oam_id = Some(7);
    let kfd = kfd_info(&p);
    assert_eq!(kfd.bytes().len(), 64);
    assert_eq!(u64_at(kfd.bytes(), 0), 53862);
    assert_eq!(u32_at(kfd.bytes(), 8), 2);
    assert_eq!(u32_at(kfd.bytes(), 12), 3);
    let e = enumeration_info(Abi::V7_0, &p);
    assert_eq!(e.bytes().len(), 272);
    assert_eq!([0, 4, 8, 12].map(|o| u32_at(e.bytes(), o)), [128, 0, 2, 0]);
    assert_eq!(str_at(e.bytes(), 16), "GPU-e3a7c0ffee01f431");
    let e = enumeration_info(Abi::V7_13, &p);
    assert_eq!(e.bytes().len(), 276);
    assert_eq!(u32_at(e.bytes(), 272), 7);
}

#[test]
fn profile_layout() {
    let p = example_processor();
    let img = profile(p.profile.as_ref().unwrap(), p.profile_config.as_ref());
    let b = img.bytes();
    assert_eq!(b.len(), 1152);
    assert_eq!(u32_at(b, 0), 5, "CPX");
    assert_eq!(u32_at(b, 4), 8);
    assert_eq!(u32_at(b, 8), 0b101, "NPS1 | NPS4");
    assert_eq!(u32_at(b, 12), 3);
    assert_eq!(u32_at(b, 16), 1);
    // The config has no CPX entry, so the resource index falls back to 3.
    for partition in 0..8 {
        assert_eq!(u32_at(b, 20 + partition * 128), 3);
        assert_eq!(u32_at(b, 24 + partition * 128), 0);
    }
}

#[test]
fn profile_config_layout() {
    let p = example_processor();
    let img = profile_config(p.profile_config.as_ref().unwrap());
    let b = img.bytes();
    assert_eq!(b.len(), 39168);
    assert_eq!(u32_at(b, 0), 1, "num_profiles");
    assert_eq!(u32_at(b, 4), 1, "num_resource_profiles");
    assert_eq!([8, 12, 16, 20].map(|o| u32_at(b, o)), [0, 0, 8, 1]);
    assert_eq!(u32_at(b, 2056), 0);
    assert_eq!(
        [2064, 2068, 2072, 2076, 2080].map(|o| u32_at(b, o)),
        [1, 1, 1, 0, 1]
    );
    assert_eq!(u32_at(b, 2084), 0, "resources[0][0] = resource profile 0");
    assert_eq!(u32_at(b, 2084 + 128), 0, "only one partition");
}

#[test]
fn resource_index_is_the_position_in_the_config() {
    let json = r#"{"profile_type": "CPX", "num_partitions": 2, "profile_index": 3, "xcc_per_partition": 1}"#;
    let cpx: Profile = serde_json::from_str(json).unwrap();
    let spx: Profile = serde_json::from_str(
        r#"{"profile_type": "SPX", "num_partitions": 1, "profile_index": 0, "xcc_per_partition": 8}"#,
    )
    .unwrap();
    let config = ProfileConfig {
        default_profile_index: 0,
        profiles: vec![spx, cpx.clone()],
    };
    let img = profile(&cpx, Some(&config));
    assert_eq!(u32_at(img.bytes(), 20), 1);
    assert_eq!(u32_at(img.bytes(), 20 + 128), 1);
    assert_eq!(
        u32_at(img.bytes(), 20 + 2 * 128),
        0,
        "partition 2 does not exist"
    );
}

#[test]
fn proc_info_stride_224_vs_704() {
    let procs = vec![
        Process {
            pid: 1,
            name: "a".into(),
            mem_bytes: 10,
            vram_bytes: 11,
            container_name: "c".into(),
        },
        Process {
            pid: 2,
            name: "b".into(),
            mem_bytes: 20,
            vram_bytes: 21,
            container_name: String::new(),
        },
    ];
    let old = process_list(Abi::V6_3, &procs);
    let new = process_list(Abi::V6_4, &procs);
    assert_eq!(proc_stride(Abi::V6_2), 224);
    assert_eq!(proc_stride(Abi::V7_13), 704);
    assert_eq!(old.bytes().len(), 448);
    assert_eq!(new.bytes().len(), 1408);
    assert_eq!(u32_at(old.bytes(), 224 + 32), 2);
    assert_eq!(u64_at(old.bytes(), 224 + 40), 20);
    assert_eq!(u64_at(old.bytes(), 224 + 128), 21);
    assert_eq!(str_at(old.bytes(), 176), "c");
    assert_eq!(str_at(new.bytes(), 704), "b");
    assert_eq!(u32_at(new.bytes(), 704 + 256), 2);
    assert_eq!(u64_at(new.bytes(), 704 + 264), 20);
    assert_eq!(u64_at(new.bytes(), 704 + 352), 21);
    assert_eq!(str_at(new.bytes(), 400), "c");
}
