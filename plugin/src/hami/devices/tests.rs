use super::*;

const T: &str = "AMD Instinct MI300X VF";

fn dev(uuid: &str, ty: &str, mem: u32, cores: u32) -> ContainerDevice {
    ContainerDevice {
        uuid: uuid.to_owned(),
        device_type: ty.to_owned(),
        usedmem: mem,
        usedcores: cores,
    }
}

fn parse(s: &str) -> Result<Vec<ContainerDevices>, HamiError> {
    parse_pod_devices(DevicesAnnotation::ToAllocate, s)
}

fn encode(c: &[ContainerDevices]) -> Result<String, HamiError> {
    encode_pod_devices(DevicesAnnotation::ToAllocate, c)
}

#[test]
fn spec_examples_verbatim() {
    let one = "8eff…1b,AMD Instinct MI300X VF,16384,76:;";
    assert_eq!(
        parse(one).unwrap(),
        vec![vec![dev("8eff…1b", T, 16384, 76)]]
    );
    let two_gpus = "A,T,16384,76:B,T,16384,76:;";
    assert_eq!(
        parse(two_gpus).unwrap(),
        vec![vec![dev("A", "T", 16384, 76), dev("B", "T", 16384, 76)]]
    );
    let two_containers = "A,T,8192,38:;A,T,8192,38:;";
    let c = vec![dev("A", "T", 8192, 38)];
    assert_eq!(parse(two_containers).unwrap(), vec![c.clone(), c]);
    for s in [one, two_gpus, two_containers] {
        assert_eq!(encode(&parse(s).unwrap()).unwrap(), s);
    }
}

#[test]
fn empty_slots_are_kept_and_encode_as_bare_terminators() {
    let c = parse(";A,T,1,2:;;").unwrap();
    assert_eq!(c, vec![vec![], vec![dev("A", "T", 1, 2)], vec![]]);
    assert_eq!(encode(&c).unwrap(), ";A,T,1,2:;;");
    assert_eq!(parse(";").unwrap(), vec![Vec::new()]);
    assert_eq!(encode(&[vec![], vec![]]).unwrap(), ";;");
    assert_eq!(EMPTY_ENTRY, ";");
}

#[test]
fn empty_value_is_zero_entries() {
    assert_eq!(parse("").unwrap(), Vec::<ContainerDevices>::new());
    assert_eq!(encode(&[]).unwrap(), "");
    assert_eq!(pop_next("").unwrap(), None);
}

#[test]
fn erase_matches_both_spec_styles() {
    // §3.6: `A:;B:;` becomes `;B:;` (Go style) or `;B:;;` (HAMi style).
    let (taken, rest) = pop_next("A,T,1,2:;B,T,3,4:;").unwrap().unwrap();
    assert_eq!(taken, vec![dev("A", "T", 1, 2)]);
    assert_eq!(rest, ";B,T,3,4:;");
    let (taken, rest) = pop_next(&rest).unwrap().unwrap();
    assert_eq!(taken, vec![dev("B", "T", 3, 4)]);
    assert_eq!(rest, ";;");
    assert_eq!(pop_next(&rest).unwrap(), None);
    let hami_style = parse(";B,T,3,4:;;").unwrap();
    assert_eq!(first_non_empty(&hami_style).unwrap().0, 1);
}

#[test]
fn first_non_empty_and_take() {
    let mut c = vec![vec![], vec![dev("A", "T", 1, 2)], vec![dev("B", "T", 3, 4)]];
    assert!(has_pending(&c));
    assert_eq!(first_non_empty(&c).unwrap().0, 1);
    assert_eq!(
        take_first_non_empty(&mut c).unwrap(),
        (1, vec![dev("A", "T", 1, 2)])
    );
    assert_eq!(take_first_non_empty(&mut c).unwrap().0, 2);
    assert_eq!(c, vec![Vec::new(), Vec::new(), Vec::new()]);
    assert!(!has_pending(&c));
    assert_eq!(take_first_non_empty(&mut c), None);
}

#[test]
fn allocated_errors_name_their_own_key() {
    let err = parse_pod_devices(DevicesAnnotation::Allocated, "x;").unwrap_err();
    assert!(err.to_string().starts_with(ALLOCATED_KEY), "{err}");
    let err = parse("x;").unwrap_err();
    assert!(err.to_string().starts_with(TO_ALLOCATE_KEY), "{err}");
}

#[test]
fn values_longer_than_the_limit_are_refused_unparsed() {
    let long = "A,T,1,2:;".repeat(MAX_VALUE_LEN / 9 + 1);
    let err = parse_pod_devices(DevicesAnnotation::Allocated, &long).unwrap_err();
    assert!(
        matches!(
            err,
            HamiError::TooLong {
                annotation: ALLOCATED_KEY,
                ..
            }
        ),
        "{err}"
    );
    assert!(parse(&long[..MAX_VALUE_LEN / 9 * 9]).is_ok());
}

/// HAMi reads the first four fields and ignores more (a planned fifth), so
/// a device with five or six fields decodes to its first four.
#[test]
fn fields_after_the_fourth_are_ignored() {
    let four = parse("A,T,1,2:;").unwrap();
    assert_eq!(parse("A,T,1,2,3:;").unwrap(), four);
    assert_eq!(parse("A,T,1,2,x,y:;").unwrap(), four);
    assert_eq!(parse("A,T,1,2,:;").unwrap(), four);
    let err = parse("A,T,1,x,3:;").unwrap_err().to_string();
    assert!(
        err.contains("cuCount \"x\""),
        "the four are still checked: {err}"
    );
}

/// Each malformed value, the container index, the fragment and a reason word.
#[test]
fn malformed_values_name_the_fragment() {
    let cases: &[(&str, usize, &str, &str)] = &[
        ("A,T,1,2:", 0, "A,T,1,2:", "';'"),
        ("A,T,1,2:;B,T,1,2:", 1, "B,T,1,2:", "';'"),
        ("A,T,1,2;", 0, "A,T,1,2", "':'"),
        (";A,T,1,2:B,T,1,2;", 1, "B,T,1,2", "':'"),
        ("A,T,1:;", 0, "A,T,1", "found 3"),
        ("garbage:;", 0, "garbage", "found 1"),
        ("::;", 0, "", "found 1"),
        ("A,T,1,2::;", 0, "", "found 1"),
        (",T,1,2:;", 0, ",T,1,2", "uuid is empty"),
        ("A,,1,2:;", 0, "A,,1,2", "type is empty"),
        ("A,T,x,2:;", 0, "A,T,x,2", "memMiB \"x\""),
        ("A,T,1,:;", 0, "A,T,1,", "cuCount \"\""),
        ("A,T,-1,2:;", 0, "A,T,-1,2", "memMiB \"-1\""),
        ("A,T,+1,2:;", 0, "A,T,+1,2", "memMiB \"+1\""),
        ("A,T, 1,2:;", 0, "A,T, 1,2", "memMiB \" 1\""),
        ("A,T,1.5,2:;", 0, "A,T,1.5,2", "memMiB"),
        ("A,T,1,2147483648:;", 0, "A,T,1,2147483648", "exceeds"),
        (
            "A,T,1,99999999999999999999:;",
            0,
            "A,T,1,99999999999999999999",
            "exceeds",
        ),
        ("A,T,١٢,2:;", 0, "A,T,١٢,2", "memMiB"),
    ];
    for &(value, container, fragment, why) in cases {
        let err = parse(value).unwrap_err();
        let HamiError::DeviceList {
            annotation,
            container: c,
            fragment: f,
            reason,
        } = &err
        else {
            panic!("{value:?}: {err:?}");
        };
        assert_eq!(*annotation, TO_ALLOCATE_KEY);
        assert_eq!((*c, f.as_str()), (container, fragment), "{value:?}: {err}");
        assert!(err.to_string().contains(why), "{value:?}: {err}");
        assert!(!reason.is_empty());
    }
}

#[test]
fn unicode_and_limits_round_trip() {
    let c = vec![vec![
        dev("ü-uuid", "AMD Ünï", 0, 0),
        dev("b", "T", 2_147_483_647, 304),
    ]];
    let s = encode(&c).unwrap();
    assert_eq!(s, "ü-uuid,AMD Ünï,0,0:b,T,2147483647,304:;");
    assert_eq!(parse(&s).unwrap(), c);
}

#[test]
fn encoder_refuses_what_could_not_be_decoded() {
    for (d, why) in [
        (dev("a,b", "T", 1, 1), "uuid contains"),
        (dev("a", "T;", 1, 1), "type contains"),
        (dev("", "T", 1, 1), "uuid is empty"),
        (dev("a", "", 1, 1), "type is empty"),
        (dev("a", "T", 2_147_483_648, 1), "memMiB 2147483648 exceeds"),
        (dev("a", "T", 1, u32::MAX), "cuCount"),
    ] {
        let err = encode(&[vec![], vec![d]]).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(why) && text.contains("entry 1"), "{text}");
    }
}
