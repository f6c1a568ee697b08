use std::{
    io::ErrorKind,
    net::{TcpListener, TcpStream},
    os::unix::net::UnixListener,
};

use super::*;

/// Runs `f` in a thread of its own: landlock restricts the thread that asks
/// (and its children), so the rest of the test process stays free.
fn in_sandbox(plan: Plan, f: impl FnOnce() + Send + 'static) {
    std::thread::spawn(move || {
        let enforcement = apply(&plan, SandboxMode::BestEffort).unwrap();
        if enforcement != Enforcement::Full {
            eprintln!("skipping: landlock is {} here", enforcement.as_str());
            return;
        }
        f();
    })
    .join()
    .unwrap();
}

#[test]
fn only_the_named_files_and_ports_are_reachable() {
    let tmp = tempfile::tempdir().unwrap();
    let (allowed, rw) = (tmp.path().join("allowed"), tmp.path().join("rw"));
    std::fs::create_dir_all(&allowed).unwrap();
    std::fs::create_dir_all(&rw).unwrap();
    std::fs::write(allowed.join("config"), "ok").unwrap();
    std::fs::write(tmp.path().join("secret"), "no").unwrap();
    let api = TcpListener::bind("127.0.0.1:0").unwrap();
    let other = TcpListener::bind("127.0.0.1:0").unwrap();
    let (api_addr, other_addr) = (api.local_addr().unwrap(), other.local_addr().unwrap());
    let plan = Plan {
        read: vec![allowed.clone(), tmp.path().join("missing")],
        write: vec![rw.clone()],
        connect: vec![api_addr.port()],
        bind: vec![],
    };
    let root = tmp.path().to_path_buf();
    in_sandbox(plan, move || {
        assert_eq!(
            std::fs::read_to_string(allowed.join("config")).unwrap(),
            "ok"
        );
        let denied = std::fs::read_to_string(root.join("secret")).unwrap_err();
        assert_eq!(denied.kind(), ErrorKind::PermissionDenied, "{denied}");
        assert!(
            std::fs::write(allowed.join("new"), "x").is_err(),
            "read-only"
        );
        std::fs::write(rw.join("new"), "x").unwrap();
        let _socket = UnixListener::bind(rw.join("plugin.sock")).unwrap();
        TcpStream::connect(api_addr).unwrap();
        let refused = TcpStream::connect(other_addr).unwrap_err();
        assert_eq!(refused.kind(), ErrorKind::PermissionDenied, "{refused}");
        let bind = TcpListener::bind("127.0.0.1:0");
        assert!(bind.is_err(), "no bind outside the metrics port");
    });
}

#[test]
fn modes_parse() {
    assert_eq!(
        "required".parse::<SandboxMode>().unwrap(),
        SandboxMode::Required
    );
    assert!(
        "yes"
            .parse::<SandboxMode>()
            .unwrap_err()
            .to_string()
            .contains("\"yes\"")
    );
}
