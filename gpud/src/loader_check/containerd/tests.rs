use std::time::Duration;

use super::{blob::Progress, *};

#[test]
fn progress_takes_contiguous_chunks_up_to_the_size() {
    let mut progress = Progress::new(10);
    progress.accept(0, 4).expect("first chunk");
    assert!(!progress.complete());
    progress
        .accept(4, 0)
        .expect("an empty chunk changes nothing");
    progress.accept(4, 6).expect("the rest");
    assert!(progress.complete());
    let past = progress.accept(10, 1).expect_err("past the size");
    assert!(past.contains("past the blob's 10 bytes"), "{past}");
}

#[test]
fn progress_refuses_gaps_overlaps_and_negative_offsets() {
    let mut progress = Progress::new(10);
    progress.accept(0, 4).expect("first chunk");
    for offset in [5, 3, -1] {
        let why = progress.accept(offset, 1).expect_err("out of order");
        assert!(why.contains("where 4 was due"), "{why}");
    }
}

#[test]
fn namespaces_are_checked() {
    for good in ["k8s.io", "default", "a_b-c.d"] {
        assert!(namespace_header(good).is_ok(), "{good}");
    }
    let long = "n".repeat(MAX_NAMESPACE_LEN + 1);
    for bad in ["", "k8s io", "ns/other", "\u{e9}", long.as_str()] {
        let err = namespace_header(bad).expect_err(bad);
        assert!(
            matches!(
                err,
                SourceError::Rpc {
                    call: "connect",
                    ..
                }
            ),
            "{err}"
        );
    }
}

#[test]
fn long_messages_are_cut_at_a_char_boundary() {
    let text = "\u{e9}".repeat(MAX_WHY_LEN);
    let cut = bounded(&text);
    assert!(
        cut.len() <= MAX_WHY_LEN + 3 && cut.ends_with("..."),
        "{}",
        cut.len()
    );
    assert_eq!(bounded("short"), "short");
}

#[test]
fn a_missing_socket_is_no_runtime_naming_the_errno() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("containerd.sock");
    let result = ContainerdSource::connect(
        &socket,
        "k8s.io",
        runtime.handle().clone(),
        Duration::from_secs(5),
    );
    let Err(SourceError::NoRuntime { socket: got, why }) = result else {
        panic!("not NoRuntime");
    };
    assert_eq!(got, socket);
    assert!(why.contains("No such file or directory"), "{why}");
}
