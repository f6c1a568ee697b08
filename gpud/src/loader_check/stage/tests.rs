use std::fs;

use super::*;

const POD: &str = "0a1b2c3d-0000-4000-8000-00000000000a";
const KEY: &str = "00112233aabbccdd";

/// A host with the hook installed and kubelet's pods directory.
fn host() -> (tempfile::TempDir, HostPaths) {
    let dir = tempfile::tempdir().unwrap();
    let paths = HostPaths::under(dir.path());
    fs::create_dir_all(&paths.hook_dir).unwrap();
    fs::write(paths.memory_hook(), b"\x7fELF the hook").unwrap();
    fs::create_dir_all(paths.kubelet.join("pods").join(POD)).unwrap();
    fs::create_dir_all(&paths.state).unwrap();
    (dir, paths)
}

#[test]
fn the_hook_is_copied_in_and_taken_out_again() {
    let (_dir, paths) = host();
    let stage = HookStage::new(&paths, None);
    let dir = stage.stage(POD, KEY, true).unwrap();
    assert_eq!(dir, paths.staged_hooks().join(POD).join(KEY));
    assert_eq!(fs::read(dir.join(HOOK_FILE)).unwrap(), b"\x7fELF the hook");
    let mode = fs::metadata(dir.join(HOOK_FILE))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o644);
    assert_eq!(stage.stage(POD, KEY, false).unwrap(), dir);
    assert!(dir.is_dir(), "the directory stays: the container mounts it");
    assert!(!dir.join(HOOK_FILE).exists());
    let left: Vec<_> = fs::read_dir(&dir).unwrap().collect();
    assert!(left.is_empty(), "no partial copy is left: {left:?}");
}

#[test]
fn uids_and_keys_that_could_spell_a_path_are_refused() {
    let (_dir, paths) = host();
    let stage = HookStage::new(&paths, None);
    for uid in ["../../../etc", "", "0a1b2c3d-0000-4000-8000-00000000000A"] {
        let err = stage.stage(uid, KEY, true).unwrap_err();
        assert!(err.is_invalid_argument(), "{uid:?}: {err}");
    }
    for key in ["..", "00112233aabbccd/", "00112233AABBCCDD", "0011"] {
        let err = stage.stage(POD, key, true).unwrap_err();
        assert!(err.is_invalid_argument(), "{key:?}: {err}");
        assert!(err.to_string().contains("staging key"), "{err}");
    }
    assert!(
        !paths.staged_hooks().join(POD).exists(),
        "nothing was created"
    );
}

#[test]
fn a_symlink_planted_where_a_directory_goes_is_refused() {
    let (dir, paths) = host();
    let elsewhere = dir.path().join("elsewhere");
    fs::create_dir_all(&elsewhere).unwrap();
    fs::create_dir_all(paths.staged_hooks()).unwrap();
    std::os::unix::fs::symlink(&elsewhere, paths.staged_hooks().join(POD)).unwrap();
    let err = HookStage::new(&paths, None)
        .stage(POD, KEY, true)
        .unwrap_err();
    assert!(matches!(err, StageError::NotADirectory { .. }), "{err}");
    assert!(fs::read_dir(&elsewhere).unwrap().next().is_none());
}

#[test]
fn a_missing_hook_is_named() {
    let (_dir, paths) = host();
    let absent = paths.hook_dir.join("absent.so");
    let err = HookStage::new(&paths, Some(absent.clone()))
        .stage(POD, KEY, true)
        .unwrap_err();
    assert!(
        err.to_string().contains(&absent.display().to_string()),
        "{err}"
    );
    // Leaving the hook out needs no hook.
    HookStage::new(&paths, Some(absent))
        .stage(POD, KEY, false)
        .unwrap();
}

#[test]
fn the_directories_of_gone_pods_are_swept() {
    let (_dir, paths) = host();
    let gone = "0a1b2c3d-0000-4000-8000-00000000000b";
    let current = "0a1b2c3d-0000-4000-8000-00000000000c";
    let root = paths.staged_hooks();
    for uid in [gone, POD] {
        fs::create_dir_all(root.join(uid).join(KEY)).unwrap();
    }
    fs::create_dir_all(root.join("not-a-uid")).unwrap();
    HookStage::new(&paths, None)
        .stage(current, KEY, false)
        .unwrap();
    assert!(!root.join(gone).exists(), "kubelet has no such pod");
    assert!(root.join(POD).exists(), "kubelet still has this pod");
    assert!(root.join(current).exists(), "the pod being staged");
    assert!(
        root.join("not-a-uid").exists(),
        "only pod directories are swept"
    );
}

#[test]
fn without_kubelet_pods_nothing_is_swept() {
    let (_dir, paths) = host();
    fs::remove_dir_all(paths.kubelet.join("pods")).unwrap();
    let other = "0a1b2c3d-0000-4000-8000-00000000000b";
    fs::create_dir_all(paths.staged_hooks().join(other)).unwrap();
    HookStage::new(&paths, None).stage(POD, KEY, false).unwrap();
    assert!(paths.staged_hooks().join(other).exists());
}
