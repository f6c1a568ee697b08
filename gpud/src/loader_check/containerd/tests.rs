use std::{io, time::Duration};

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
    // The errno comes twice down tonic's source chain under "transport
    // error"; the line says it once.
    assert_eq!(why.matches("No such file or directory").count(), 1, "{why}");
    assert!(why.starts_with("transport error: "), "{why}");
}

#[test]
fn a_broken_call_is_no_runtime_only_when_the_socket_refuses() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("containerd.sock");
    // A socket file left behind by a dead containerd: connection refused.
    drop(std::os::unix::net::UnixListener::bind(&socket).expect("bind"));
    for code in [Code::Cancelled, Code::Unavailable, Code::Unknown] {
        let status = Status::new(code, "operation was canceled");
        let SourceError::NoRuntime { socket: got, why } =
            status_error(&socket, "Images.Get", &status)
        else {
            panic!("{code:?} on a refusing socket is not NoRuntime");
        };
        assert_eq!(got, socket);
        assert!(why.contains("Connection refused"), "{why}");
    }
    // The same statuses while something still listens: a failed call.
    let _listening =
        std::os::unix::net::UnixListener::bind(dir.path().join("live.sock")).expect("bind");
    let live = dir.path().join("live.sock");
    for code in [
        Code::Cancelled,
        Code::Unavailable,
        Code::Unknown,
        Code::Internal,
    ] {
        let status = Status::new(code, "operation was canceled");
        let err = status_error(&live, "Images.Get", &status);
        assert!(
            matches!(
                err,
                SourceError::Rpc {
                    call: "Images.Get",
                    ..
                }
            ),
            "{err:?}"
        );
    }
    // A refused socket does not turn other failures into NoRuntime.
    let internal = Status::new(Code::Internal, "boom");
    let err = status_error(&socket, "Images.Get", &internal);
    assert!(matches!(err, SourceError::Rpc { .. }), "{err:?}");
}

mod fake;

use std::io::{ErrorKind, Read as _};

use fake::{Script, Served, blob};

const TIMEOUT: Duration = Duration::from_secs(5);

fn chunks(parts: &[(i64, &str)]) -> Vec<(i64, Vec<u8>)> {
    parts
        .iter()
        .map(|&(o, d)| (o, d.as_bytes().to_vec()))
        .collect()
}

/// `open_blob` of a blob of `size`, read to the end.
fn stream(script: Script, size: u64, timeout: Duration) -> io::Result<Vec<u8>> {
    let served = Served::start(script);
    let mut source = served.source(timeout);
    let mut reader = source.open_blob(&blob(size)).expect("open");
    let mut out = Vec::new();
    reader.read_to_end(&mut out).map(|_| out)
}

#[test]
fn chunks_are_joined_in_both_reads() {
    let script = Script {
        info_size: Some(11),
        chunks: chunks(&[(0, "hello "), (6, ""), (6, "world")]),
        ..Script::default()
    };
    let served = Served::start(script.clone());
    let mut source = served.source(TIMEOUT);
    let whole = source.read_blob(&blob(11), 11).expect("read_blob");
    assert_eq!(whole, b"hello world");
    assert_eq!(stream(script, 11, TIMEOUT).expect("stream"), b"hello world");
}

#[test]
fn a_gap_or_an_overlap_fails_the_stream_naming_the_digest() {
    for parts in [[(0, "abc"), (4, "de")], [(0, "abc"), (2, "de")]] {
        let script = Script {
            info_size: Some(5),
            chunks: chunks(&parts),
            ..Script::default()
        };
        let err = stream(script, 5, TIMEOUT).expect_err("out of order");
        assert_eq!(err.kind(), ErrorKind::InvalidData, "{err}");
        let text = err.to_string();
        assert!(
            text.contains(&blob(5).digest) && text.contains("where 3 was due"),
            "{text}"
        );
    }
}

#[test]
fn bytes_past_the_size_are_refused() {
    let script = Script {
        info_size: Some(3),
        chunks: chunks(&[(0, "abcdef")]),
        ..Script::default()
    };
    let err = stream(script.clone(), 3, TIMEOUT).expect_err("past the size");
    assert_eq!(err.kind(), ErrorKind::InvalidData, "{err}");
    let served = Served::start(script);
    let got = served.source(TIMEOUT).read_blob(&blob(3), 4);
    let digest = blob(3).digest;
    assert_eq!(
        got,
        Err(SourceError::TooLarge {
            digest,
            size: 6,
            max: 4
        })
    );
}

#[test]
fn a_short_stream_is_unexpected_eof() {
    let script = Script {
        info_size: Some(3),
        chunks: chunks(&[(0, "ab")]),
        ..Script::default()
    };
    let err = stream(script, 3, TIMEOUT).expect_err("short");
    assert_eq!(err.kind(), ErrorKind::UnexpectedEof, "{err}");
    assert!(err.to_string().contains("after 2 of 3 bytes"), "{err}");
}

#[test]
fn a_silent_stream_times_out() {
    let script = Script {
        info_size: Some(4),
        chunks: chunks(&[(0, "ab")]),
        hang: true,
        ..Script::default()
    };
    let err = stream(script, 4, Duration::from_millis(300)).expect_err("idle");
    assert_eq!(err.kind(), ErrorKind::TimedOut, "{err}");
}

#[test]
fn sizes_are_checked_before_reading() {
    // No Info answer at all: a refusal by size must come first.
    let served = Served::start(Script::default());
    let mut source = served.source(TIMEOUT);
    let digest = blob(10).digest;
    let got = source.read_blob(&blob(10), 9);
    let want = SourceError::TooLarge {
        digest: digest.clone(),
        size: 10,
        max: 9,
    };
    assert_eq!(got, Err(want));
    assert_eq!(
        source.read_blob(&blob(10), 10),
        Err(SourceError::MissingBlob {
            digest: digest.clone()
        })
    );
    assert_eq!(
        source.open_blob(&blob(10)).err(),
        Some(SourceError::MissingBlob { digest })
    );
    // The store's size disagreeing with the descriptor's.
    let served = Served::start(Script {
        info_size: Some(7),
        ..Script::default()
    });
    let got = served.source(TIMEOUT).read_blob(&blob(10), 100);
    assert!(
        matches!(
            got,
            Err(SourceError::Rpc {
                call: "Content.Info",
                ..
            })
        ),
        "{got:?}"
    );
}

#[test]
fn a_slow_stream_may_outlast_one_call_timeout() {
    // Three chunks 150 ms apart: 450 ms in all, each within 300 ms.
    let script = Script {
        info_size: Some(3),
        chunks: chunks(&[(0, "a"), (1, "b"), (2, "c")]),
        delay: Duration::from_millis(150),
        ..Script::default()
    };
    let got = stream(script, 3, Duration::from_millis(300)).expect("slow but steady");
    assert_eq!(got, b"abc");
}
