//! CRIU's hive bookkeeping (pairs of an abandoned hive try stay in its
//! maps): `criu` mode reproduces it, `explain` mode does not, and says so.

use super::{TopoBuilder, both, run};
use crate::restore_check::{
    Mode, Request, check,
    model::Topo,
    options::{Check, Options},
};

/// Six GPUs on one CPU in hives of `first` and `second` GPUs, listed in
/// that order (the hive of the lowest node is found first).
fn hives(first: &[u32], second: &[u32]) -> Topo {
    let mut b = TopoBuilder::new().cpu(0);
    for id in 1..=6 {
        b = b.gpu(id, 0);
    }
    b.hive(first).hive(second).build()
}

#[test]
fn hives_of_2_and_4_restore_onto_2_and_4_but_criu_refuses_4_and_2() {
    let src = hives(&[1, 2], &[3, 4, 5, 6]);
    let same_order = hives(&[1, 2], &[3, 4, 5, 6]);
    let (criu, _) = both(&src, &same_order, &Options::default());
    assert!(criu.restorable);

    let swapped = hives(&[1, 2, 3, 4], &[5, 6]);
    let criu = run(&src, &swapped, Mode::Criu, Options::default());
    assert!(!criu.restorable);
    assert_eq!(
        criu.reason.as_deref(),
        Some("Failed to match all GPU groups")
    );
    assert_eq!(criu.refusals.len(), 1);
    assert_eq!(criu.refusals[0].property, "criu_matching_order");
    assert_eq!(criu.refusals[0].option, None);
    assert!(
        criu.notes.iter().any(|n| n.contains("known quirk")),
        "{:?}",
        criu.notes
    );

    let explain = run(&src, &swapped, Mode::Explain, Options::default());
    assert!(explain.restorable, "{explain:#?}");
    assert_eq!(explain.criu_restorable, Some(false));
    assert!(explain.notes.iter().any(|n| n.contains("known quirk")));
    // The hive of 2 lands on the local hive of 2, the hive of 4 on the 4.
    let local_of = |gpu: u32| {
        explain
            .mapping
            .iter()
            .find(|m| m.checkpoint_gpu == gpu)
            .map(|m| m.local_gpu)
            .unwrap()
    };
    assert!([0x1005, 0x1006].contains(&local_of(0x1001)));
    assert!([0x1005, 0x1006].contains(&local_of(0x1002)));
    assert!((0x1001..=0x1004).contains(&local_of(0x1003)));
    let mut text = Vec::new();
    explain.write_text(&mut text).unwrap();
    let text = String::from_utf8(text).unwrap();
    assert!(
        text.contains("CRIU 3.17.1 itself would refuse this restore"),
        "{text}"
    );
    // No option changes CRIU's answer.
    let all_off = Check::ALL
        .iter()
        .fold(Options::default(), |o, c| o.with(*c, false));
    assert!(!run(&src, &swapped, Mode::Criu, all_off).restorable);
}

#[test]
fn the_quirk_on_a_container_that_sees_parts_of_two_hives() {
    // Host: two hives of 4 on one CPU; every GPU reports io_links_count 4
    // whatever the container sees. The checkpoint saw 2 GPUs of one hive and
    // 4 of the other (links to hidden GPUs omitted, as CRIU dumps them).
    let host = {
        let mut b = TopoBuilder::new().cpu(0);
        for id in 1..=8 {
            b = b.gpu(id, 0);
        }
        b.hive(&[1, 2, 3, 4]).hive(&[5, 6, 7, 8]).build()
    };
    let src = hives(&[1, 2], &[3, 4, 5, 6]);
    let local = super::local(host);
    let ask = |mode: Mode, gpus: &[&str]| {
        let request = Request {
            mode,
            gpus: gpus.iter().map(|g| (*g).to_owned()).collect(),
            options: Options::default(),
        };
        check(&super::image(src.clone()), &local, &request).unwrap()
    };
    // 2 of the first hive, 4 of the second: listed (2, 4).
    let fits = ["0x1001", "0x1002", "0x1005", "0x1006", "0x1007", "0x1008"];
    assert!(ask(Mode::Criu, &fits).restorable);
    // All of the first hive, 2 of the second: listed (4, 2).
    let swapped = ["0x1001", "0x1002", "0x1003", "0x1004", "0x1005", "0x1006"];
    assert!(!ask(Mode::Criu, &swapped).restorable);
    let explain = ask(Mode::Explain, &swapped);
    assert!(explain.restorable);
    assert_eq!(explain.criu_restorable, Some(false));
}
