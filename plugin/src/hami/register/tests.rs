use super::*;

const SPEC_EXAMPLE: &str = r#"[{"id":"8eff74b5-0000-1000-801b-b56457addd1b","count":10,"devmem":196288,"devcore":304,"type":"AMD Instinct MI300X VF","numa":0,"health":true,"devicevendor":"amd","custominfo":{"pciBDF":"0000:83:00.0"}}]"#;

fn mi300x() -> DeviceInfo {
    DeviceInfo {
        id: "8eff74b5-0000-1000-801b-b56457addd1b".to_owned(),
        count: 10,
        devmem: 196_288,
        devcore: 304,
        device_type: "AMD Instinct MI300X VF".to_owned(),
        health: true,
        devicevendor: DEVICE_VENDOR.to_owned(),
        custominfo: CustomInfo {
            pci_bdf: "0000:83:00.0".to_owned(),
            ..CustomInfo::default()
        },
        ..DeviceInfo::default()
    }
}

fn device_err(devices: &[DeviceInfo]) -> String {
    register_annotation(devices).unwrap_err().to_string()
}

#[test]
fn encodes_the_spec_example_byte_for_byte() {
    assert_eq!(register_annotation(&[mi300x()]).unwrap(), SPEC_EXAMPLE);
}

#[test]
fn parses_the_spec_example() {
    assert_eq!(parse_register(SPEC_EXAMPLE).unwrap(), vec![mi300x()]);
}

#[test]
fn round_trips_every_field() {
    let mut d = mi300x();
    d.index = 3;
    d.numa = -1;
    d.mode = "spx".to_owned();
    d.custominfo
        .extra
        .insert("computeQueues".to_owned(), serde_json::json!(4));
    d.custominfo
        .extra
        .insert("partitionProfile".to_owned(), serde_json::json!("spx_nps1"));
    let mut other = mi300x();
    other.id = "GPU-0123456789abcdef#spx".to_owned();
    other.health = false;
    other.custominfo = CustomInfo::default();
    let devices = vec![d, other];
    let s = register_annotation(&devices).unwrap();
    assert!(
        s.contains(r#""index":3"#) && s.contains(r#""numa":-1"#),
        "{s}"
    );
    assert!(s.contains(r#""mode":"spx""#), "{s}");
    assert_eq!(parse_register(&s).unwrap(), devices);
}

#[test]
fn zero_values_are_omitted_so_false_health_is_absent() {
    let mut d = mi300x();
    d.health = false;
    d.custominfo = CustomInfo::default();
    let s = register_annotation(&[d]).unwrap();
    assert!(s.contains(r#""numa":0"#), "{s}");
    for key in ["health", "index", "mode", "custominfo", "migProfiles"] {
        assert!(!s.contains(key), "{key} in {s}");
    }
}

#[test]
fn parse_reads_absent_health_as_unhealthy_and_ignores_unknown_keys() {
    let s = r#"[{"id":"a","type":"AMD X","migProfiles":[],"migtemplate":null,"new":{"x":1}}]"#;
    let d = &parse_register(s).unwrap()[0];
    assert!(!d.health);
    assert_eq!(d.count, 0);
}

#[test]
fn parse_reads_null_as_zero_like_go() {
    let s = r#"[{"id":"a","type":"AMD X","count":null,"custominfo":null,"health":null}]"#;
    let d = &parse_register(s).unwrap()[0];
    assert_eq!((d.count, d.health), (0, false));
    assert!(d.custominfo.is_empty());
}

#[test]
fn parse_rejects_what_go_rejects() {
    for bad in [
        r#"[{"id":"a","type":"AMD","count":1.5}]"#,
        r#"[{"id":"a","type":"AMD","count":"10"}]"#,
        r#"[{"id":"a","type":"AMD","index":-1}]"#,
        r#"[{"id":"a","type":"AMD","devmem":2147483648}]"#,
        r#"{"id":"a","type":"AMD"}"#,
        "",
        "null",
        "[",
    ] {
        let err = parse_register(bad).unwrap_err();
        assert!(matches!(err, HamiError::Json { .. }), "{bad}: {err}");
        assert!(err.to_string().contains(REGISTER_KEY), "{err}");
    }
}

#[test]
fn empty_array_is_refused_both_ways() {
    assert_eq!(parse_register("[]"), Err(HamiError::NoDevices));
    assert_eq!(register_annotation(&[]), Err(HamiError::NoDevices));
}

#[test]
fn ids_with_separators_are_refused_naming_the_id() {
    for id in ["a,b", "a:b", "a;b"] {
        let mut d = mi300x();
        d.id = id.to_owned();
        let err = device_err(&[d.clone()]);
        assert!(
            err.contains(&format!("{id:?}")) && err.contains("separator"),
            "{err}"
        );
        let json = SPEC_EXAMPLE.replace("8eff74b5-0000-1000-801b-b56457addd1b", id);
        assert!(parse_register(&json).is_err());
    }
    let mut d = mi300x();
    d.id = String::new();
    assert!(device_err(&[d]).contains("id is empty"));
}

#[test]
fn duplicate_ids_are_refused() {
    let err = device_err(&[mi300x(), mi300x()]);
    assert!(
        err.contains("registered twice") && err.contains("8eff74b5"),
        "{err}"
    );
}

#[test]
fn type_must_start_with_amd_and_be_free_of_separators() {
    for (ty, ok) in [
        ("AMD Instinct MI300X VF", true),
        ("amd-gpu", true),
        ("Amd Radeon", true),
        ("Instinct MI300X", false),
        ("Radeon (AMD)", false),
        ("AMD X,Y", false),
        ("", false),
        ("ÄMD", false),
    ] {
        let mut d = mi300x();
        d.device_type = ty.to_owned();
        assert_eq!(register_annotation(&[d]).is_ok(), ok, "{ty:?}");
    }
}

#[test]
fn product_type_fixes_up_market_names() {
    for (raw, want) in [
        ("AMD Instinct MI300X VF", "AMD Instinct MI300X VF"),
        ("Instinct MI210", "AMD Instinct MI210"),
        ("", UNKNOWN_TYPE),
        ("  ", UNKNOWN_TYPE),
        ("Radeon: Pro, W7900;", "AMD Radeon Pro W7900"),
        ("amd-gpu", "amd-gpu"),
        ("Ünïcode", "AMD Ünïcode"),
    ] {
        let got = DeviceInfo::product_type(raw);
        assert_eq!(got, want, "{raw:?}");
        let mut d = mi300x();
        d.device_type = got;
        d.validate().unwrap();
    }
}

#[test]
fn mig_mode_and_negative_numbers_are_refused() {
    let mut d = mi300x();
    d.mode = "MIG".to_owned();
    assert!(device_err(&[d]).contains("mig"));
    for field in ["count", "devmem", "devcore"] {
        let mut d = mi300x();
        match field {
            "count" => d.count = -1,
            "devmem" => d.devmem = -1,
            _ => d.devcore = -1,
        }
        let err = device_err(&[d]);
        assert!(err.contains(field) && err.contains("negative"), "{err}");
    }
}

#[test]
fn custominfo_extra_keys_are_sorted_and_stable() {
    let mut d = mi300x();
    d.custominfo
        .extra
        .insert("z".to_owned(), serde_json::json!(1));
    d.custominfo
        .extra
        .insert("a".to_owned(), serde_json::json!("x"));
    let s = register_annotation(&[d]).unwrap();
    assert!(
        s.ends_with(r#""custominfo":{"pciBDF":"0000:83:00.0","a":"x","z":1}}]"#),
        "{s}"
    );
}
