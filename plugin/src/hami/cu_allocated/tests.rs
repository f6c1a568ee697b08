use super::*;

fn list(s: &str) -> CuList {
    CuList::parse(s).unwrap()
}

fn ranges(l: &CuList) -> Vec<(u32, u32)> {
    l.ranges().iter().map(|r| (r.start, r.end)).collect()
}

#[test]
fn spec_examples() {
    let l = list("0-3,8,10-12");
    assert_eq!(ranges(&l), vec![(0, 3), (8, 8), (10, 12)]);
    assert_eq!(l.len(), 8);
    assert_eq!(l.to_string(), "0-3,8,10-12");
    let id = "8eff74b5-0000-1000-801b-b56457addd1b";
    let value = format!(r#"{{"{id}":"0-75"}}"#);
    let parsed = parse_cu_allocated(&value).unwrap();
    assert_eq!(parsed.0[id].len(), 76);
    assert_eq!(parsed.encode().unwrap(), value);
}

#[test]
fn from_indices_writes_runs_of_two_or_more_as_ranges() {
    let l = CuList::from_indices([12, 0, 1, 2, 3, 8, 10, 11, 3, 20, 21]);
    assert_eq!(l.to_string(), "0-3,8,10-12,20-21");
    assert_eq!(
        l.iter().collect::<Vec<_>>(),
        vec![0, 1, 2, 3, 8, 10, 11, 12, 20, 21]
    );
    assert_eq!(CuList::from_indices([]).to_string(), "");
    assert_eq!(
        CuList::from_indices([u32::MAX, 0]).to_string(),
        "0,4294967295"
    );
    assert_eq!(CuList::from_indices([u32::MAX - 1, u32::MAX]).len(), 2);
}

#[test]
fn adjacent_items_are_merged_into_canonical_form() {
    assert_eq!(list("0-3,4,5-6").to_string(), "0-6");
    assert_eq!(list("7,8").to_string(), "7-8");
    assert_eq!(list("5-5").to_string(), "5");
}

#[test]
fn queries() {
    let l = list("0-3,8,10-12");
    assert_eq!(l.max(), Some(12));
    assert!(l.contains(8) && l.contains(11) && !l.contains(9) && !l.contains(13));
    assert!(l.overlaps(&list("12-20")));
    assert!(l.overlaps(&list("9,11")));
    assert!(!l.overlaps(&list("4-7,9,13-100")));
    assert!(!CuList::default().overlaps(&l));
    assert!(CuList::default().is_empty() && CuList::default().max().is_none());
}

#[test]
fn malformed_lists_name_the_item() {
    for (s, why) in [
        ("", "empty CU list"),
        ("3-1", "\"3-1\": range start is above its end"),
        ("0-3,2", "\"2\" is not above 0-3"),
        ("5,5", "\"5\" is not above 5-5"),
        ("4,1", "\"1\" is not above"),
        ("0-3,3-5", "\"3-5\" is not above"),
        ("1,", "item \"\""),
        (",1", "item \"\""),
        ("1,,2", "item \"\""),
        ("-1", "\"\" is not a CU index"),
        ("1-", "\"\" is not a CU index"),
        ("1-2-3", "\"2-3\" is not a CU index"),
        ("a", "\"a\" is not a CU index"),
        (" 1", "\" 1\" is not a CU index"),
        ("+1", "\"+1\" is not a CU index"),
        ("4294967296", "too large"),
        ("0-99999999999999999999", "too large"),
        ("١", "is not a CU index"),
    ] {
        let err = CuList::parse(s).unwrap_err().to_string();
        assert!(err.contains(why), "{s:?}: {err}");
    }
}

#[test]
fn annotation_errors_name_id_and_list() {
    let err = parse_cu_allocated(r#"{"gpu-a":"0-3","gpu-b":"4,2"}"#).unwrap_err();
    assert_eq!(
        err,
        HamiError::CuList {
            id: "gpu-b".to_owned(),
            list: "4,2".to_owned(),
            reason: "item \"2\" is not above 4-4: the list must be ascending and non-overlapping"
                .to_owned(),
        }
    );
    let text = err.to_string();
    assert!(
        text.starts_with(CU_ALLOCATED_KEY) && text.contains("\"4,2\""),
        "{text}"
    );
    let err = parse_cu_allocated(r#"{"a:b":"1"}"#)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("\"a:b\"") && err.contains("separator"),
        "{err}"
    );
    let err = parse_cu_allocated(r#"{"":"1"}"#).unwrap_err().to_string();
    assert!(err.contains("id is empty"), "{err}");
}

#[test]
fn non_object_json_is_refused() {
    for bad in [
        "",
        "[]",
        "null",
        r#"{"a":1}"#,
        r#"{"a":["0-3"]}"#,
        "{",
        r#""0-3""#,
    ] {
        let err = parse_cu_allocated(bad).unwrap_err();
        assert!(
            matches!(
                err,
                HamiError::Json {
                    annotation: CU_ALLOCATED_KEY,
                    ..
                }
            ),
            "{bad}"
        );
    }
}

#[test]
fn empty_object_round_trips() {
    let empty = parse_cu_allocated("{}").unwrap();
    assert!(empty.0.is_empty());
    assert_eq!(empty.encode().unwrap(), "{}");
}

#[test]
fn encode_is_sorted_canonical_and_round_trips() {
    let mut map = BTreeMap::new();
    map.insert("z-gpu".to_owned(), CuList::from_indices([5, 6, 7, 1]));
    map.insert("a-gpu".to_owned(), CuList::from_indices(0..76));
    map.insert("GPU-0123#spx".to_owned(), CuList::from_indices([3]));
    let cu = CuAllocated(map);
    let s = cu.encode().unwrap();
    assert_eq!(s, r#"{"GPU-0123#spx":"3","a-gpu":"0-75","z-gpu":"1,5-7"}"#);
    assert_eq!(parse_cu_allocated(&s).unwrap(), cu);
}

#[test]
fn encode_refuses_bad_ids_and_empty_lists() {
    let mut map = BTreeMap::new();
    map.insert("a;b".to_owned(), CuList::from_indices([1]));
    let err = CuAllocated(map).encode().unwrap_err().to_string();
    assert!(err.contains("\"a;b\""), "{err}");
    let mut map = BTreeMap::new();
    map.insert("a".to_owned(), CuList::default());
    let err = CuAllocated(map).encode().unwrap_err().to_string();
    assert!(err.contains("empty CU list"), "{err}");
}

#[test]
fn set_operations_work_on_ranges_and_never_expand() {
    let huge = list("0-4294967295");
    let hole = list("1-2,10-4294967294");
    assert_eq!(
        ranges(&huge.difference(&hole)),
        [(0, 0), (3, 9), (4294967295, 4294967295)]
    );
    assert!(hole.is_subset(&huge) && !huge.is_subset(&hole));
    assert!(huge.difference(&huge).is_empty());
    assert_eq!(
        ranges(&list("0-3,8").difference(&list("2,4-9"))),
        [(0, 1), (3, 3)]
    );
    assert_eq!(ranges(&list("5-9").difference(&list("0-1,3"))), [(5, 9)]);
    // One cut across two ranges.
    assert_eq!(
        ranges(&list("0-3,6-9").difference(&list("2-7"))),
        [(0, 1), (8, 9)]
    );
    assert_eq!(
        ranges(&list("0-3,10").union(&list("4-6,9"))),
        [(0, 6), (9, 10)]
    );
    assert_eq!(
        ranges(&huge.union(&list("7,4294967295"))),
        [(0, 4294967295)]
    );
    assert_eq!(huge.len(), 1 << 32);
}

#[test]
fn oversized_values_are_refused_before_parsing() {
    let long = format!("{{\"A\":\"{}\"}}", "1".repeat(MAX_VALUE_LEN));
    let err = parse_cu_allocated(&long).unwrap_err().to_string();
    assert!(
        err.contains(CU_ALLOCATED_KEY) && err.contains("accepted"),
        "{err}"
    );
    let many: Vec<String> = (0..=MAX_GPUS).map(|i| format!("\"g{i}\":\"0\"")).collect();
    let err = parse_cu_allocated(&format!("{{{}}}", many.join(","))).unwrap_err();
    assert!(err.to_string().contains("GPU ids"), "{err}");
    let ranges: Vec<String> = (0..=MAX_RANGES).map(|i| (2 * i).to_string()).collect();
    let value = format!("{{\"A\":\"{}\"}}", ranges.join(","));
    let err = parse_cu_allocated(&value).unwrap_err().to_string();
    assert!(err.contains("more than 4096 ranges"), "{err}");
    assert!(err.len() < 300, "the list is quoted short: {err}");
}
