use std::{os::unix::fs::symlink, sync::mpsc, thread, time::Duration};

use super::*;

/// Runs `f` on a thread and fails the test when it has not returned
/// within a few seconds (the attacks here are reads that never end).
pub(crate) fn within_seconds<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || drop(tx.send(f())));
    rx.recv_timeout(Duration::from_secs(5))
        .expect("the read did not return: it follows the link or blocks on the FIFO")
}

pub(crate) fn mkfifo(path: &Path) {
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        path,
        rustix::fs::Mode::from_raw_mode(0o600),
    )
    .unwrap();
}

#[test]
fn a_link_to_an_endless_device_is_refused_unread() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.json");
    symlink("/dev/zero", &path).unwrap();
    let err = within_seconds(move || read_bounded(&path, 1 << 20)).unwrap_err();
    assert!(matches!(err, FileError::Symlink { .. }), "{err}");
    assert!(err.to_string().contains("state.json"), "{err}");
}

#[test]
fn a_fifo_or_a_device_is_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("state.json");
    mkfifo(&fifo);
    let err = within_seconds(move || read_bounded(&fifo, 1 << 20)).unwrap_err();
    assert!(matches!(err, FileError::NotRegular { .. }), "{err}");
    let err = within_seconds(|| read_bounded(Path::new("/dev/zero"), 1 << 20)).unwrap_err();
    assert!(matches!(err, FileError::NotRegular { .. }), "{err}");
}

#[test]
fn a_file_above_the_bound_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.json");
    fs::write(&path, vec![b'x'; 4097]).unwrap();
    let err = read_bounded(&path, 4096).unwrap_err();
    assert!(
        matches!(err, FileError::TooLarge { limit: 4096, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("4096 bytes"), "{err}");
    assert_eq!(read_bounded(&path, 4097).unwrap().unwrap().len(), 4097);
    assert!(
        read_bounded(&dir.path().join("absent"), 1)
            .unwrap()
            .is_none()
    );
}

#[test]
fn a_link_at_the_target_is_replaced_and_its_victim_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    fs::write(&victim, "precious").unwrap();
    let path = dir.path().join("state.json");
    symlink(&victim, &path).unwrap();
    replace(&path, b"new", 0o644).unwrap();
    assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
    assert!(fs::symlink_metadata(&path).unwrap().file_type().is_file());
    assert_eq!(fs::read_to_string(&path).unwrap(), "new");
    let names = listing(dir.path());
    assert_eq!(names, ["state.json", "victim"], "no temporary file is left");
}

#[test]
fn a_failed_replacement_leaves_no_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.json");
    // A non-empty directory cannot be renamed over.
    fs::create_dir_all(path.join("inside")).unwrap();
    let err = replace(&path, b"new", 0o644).unwrap_err();
    assert!(matches!(err, FileError::Write { .. }), "{err}");
    assert!(err.to_string().contains("state.json"), "{err}");
    assert_eq!(listing(dir.path()), ["state.json"]);
}

fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}
