use std::os::unix::fs::PermissionsExt;

use super::*;

fn acl_supported(dir: &Path) -> bool {
    let probe = dir.join("probe");
    std::fs::create_dir(&probe).unwrap();
    let ok = grant(&probe, true, 60700, 7).is_ok();
    std::fs::remove_dir(&probe).unwrap();
    ok
}

#[test]
fn the_plugin_user_gets_its_entries_and_nothing_else_changes() {
    let tmp = tempfile::tempdir().unwrap();
    if !acl_supported(tmp.path()) {
        eprintln!("skipping: no POSIX ACLs on {}", tmp.path().display());
        return;
    }
    let dir = tmp.path().join("device-plugins");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o750)).unwrap();
    let sock = dir.join("kubelet.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o755)).unwrap();
    let targets = vec![Target {
        dir: dir.clone(),
        dir_perm: 7,
        sockets: vec!["kubelet.sock".into()],
    }];
    assert_eq!(ensure(&targets, 60700), [dir.clone(), sock.clone()]);
    assert!(ensure(&targets, 60700).is_empty(), "idempotent");
    let meta = std::fs::metadata(&dir).unwrap();
    assert_eq!(meta.mode() & 0o707, 0o700, "owner and other bits untouched");
    let dir_acl = acl::read(&dir, meta.mode()).unwrap();
    assert_eq!(dir_acl.user_perm(60700), 7);
    assert_eq!(dir_acl.user_perm(60701), 0);
    let sock_acl = acl::read(&sock, std::fs::metadata(&sock).unwrap().mode()).unwrap();
    assert_eq!(sock_acl.user_perm(60700), 6);
}

#[test]
fn symlinks_and_wrong_types_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let real = tmp.path().join("real");
    std::fs::create_dir(&real).unwrap();
    let link = tmp.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    assert!(matches!(
        grant(&link, true, 60700, 7),
        Err(AccessError::NotA { .. })
    ));
    let file = real.join("kubelet.sock");
    std::fs::write(&file, "").unwrap();
    assert!(matches!(
        grant(&file, false, 60700, 6),
        Err(AccessError::NotA { .. })
    ));
    assert!(!grant(&tmp.path().join("absent"), true, 60700, 7).unwrap());
}
