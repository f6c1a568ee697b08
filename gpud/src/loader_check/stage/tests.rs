use std::{fs, os::unix::fs::MetadataExt, path::Path};

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

/// The bytes on disk under `root`: each inode once (hard links share one),
/// directories included.
fn disk_usage(root: &Path) -> u64 {
    fn walk(dir: &Path, seen: &mut std::collections::HashSet<(u64, u64)>, total: &mut u64) {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = fs::symlink_metadata(&path).unwrap();
            if seen.insert((meta.dev(), meta.ino())) {
                *total += meta.blocks() * 512;
            }
            if meta.is_dir() {
                walk(&path, seen, total);
            }
        }
    }
    let mut total = 0;
    walk(root, &mut std::collections::HashSet::new(), &mut total);
    total
}

fn key(i: usize) -> String {
    format!("{i:016x}")
}

/// Issue 38, F6: one pod staging key after key made a copy of the hook
/// for each (300 calls, 1.5 GB). Now every key's file is a link to one
/// copy, and the key past the bound is refused, naming it and the pod.
#[test]
fn the_keys_of_a_pod_share_one_copy_and_are_bounded() {
    let (_dir, paths) = host();
    let hook = vec![0x5a_u8; 5 << 20];
    fs::write(paths.memory_hook(), &hook).unwrap();
    let stage = HookStage::new(&paths, None);
    let root = paths.staged_hooks();
    let mut refused = 0;
    for i in 0..300 {
        match stage.stage(POD, &key(i), true) {
            Ok(dir) => assert!(i < MAX_KEYS_PER_POD, "key {i} staged in {dir:?}"),
            Err(err) => {
                assert!(i >= MAX_KEYS_PER_POD, "key {i}: {err}");
                let StageError::TooManyKeys { pod, limit } = &err else {
                    panic!("key {i}: {err}");
                };
                assert_eq!((pod.as_str(), *limit), (POD, MAX_KEYS_PER_POD));
                let text = err.to_string();
                assert!(text.contains(POD) && text.contains("256"), "{text}");
                refused += 1;
            }
        }
    }
    assert_eq!(refused, 300 - MAX_KEYS_PER_POD);
    let copy = fs::metadata(root.join(HOOK_FILE)).unwrap();
    for i in 0..MAX_KEYS_PER_POD {
        let staged = fs::metadata(root.join(POD).join(key(i)).join(HOOK_FILE)).unwrap();
        assert_eq!(
            (staged.dev(), staged.ino()),
            (copy.dev(), copy.ino()),
            "key {i}"
        );
    }
    assert_eq!(copy.nlink(), 1 + MAX_KEYS_PER_POD as u64);
    let used = disk_usage(&root);
    eprintln!("{MAX_KEYS_PER_POD} keys of a 5 MiB hook: {used} bytes on disk under the root");
    // One copy, and the directories (a block each at most).
    assert!(used < (5 << 20) + 300 * 4096 + 8192, "{used} bytes");
    // An existing key may still be staged again, or emptied.
    stage.stage(POD, &key(0), true).unwrap();
    stage.stage(POD, &key(1), false).unwrap();
    assert_eq!(
        fs::read(root.join(POD).join(key(0)).join(HOOK_FILE)).unwrap(),
        hook
    );
}

/// A new pod beyond [`MAX_PODS`] is refused while every staged pod is
/// live; once kubelet has none of them, they are swept and it is staged.
#[test]
fn pods_beyond_the_bound_are_refused_until_gone_ones_are_swept() {
    let (_dir, paths) = host();
    // No kubelet pods directory: nothing counts as gone.
    fs::remove_dir_all(paths.kubelet.join("pods")).unwrap();
    let stage = HookStage::new(&paths, None);
    let pod = |i: usize| format!("0a1b2c3d-0000-4000-8000-{i:012x}");
    for i in 0..MAX_PODS {
        stage.stage(&pod(i), KEY, false).unwrap();
    }
    let next = pod(MAX_PODS);
    let err = stage.stage(&next, KEY, false).unwrap_err();
    let StageError::TooManyPods { pod: named, limit } = &err else {
        panic!("{err}");
    };
    assert_eq!((named.as_str(), *limit), (next.as_str(), MAX_PODS));
    assert!(err.to_string().contains("512"), "{err}");
    assert!(!paths.staged_hooks().join(&next).exists());
    // A pod already staged is not a new one.
    stage.stage(&pod(7), &key(9), false).unwrap();
    // kubelet has none of them any more: they are swept to make room.
    fs::create_dir_all(paths.kubelet.join("pods")).unwrap();
    stage.stage(&next, KEY, false).unwrap();
    assert!(!paths.staged_hooks().join(pod(0)).exists());
}

/// A new hook (an upgrade) is copied again for what is staged next; what
/// was staged before keeps the hook it had.
#[test]
fn a_changed_hook_is_copied_again_and_earlier_links_keep_theirs() {
    let (_dir, paths) = host();
    let stage = HookStage::new(&paths, None);
    let first = stage.stage(POD, &key(1), true).unwrap();
    fs::write(paths.memory_hook(), b"\x7fELF the new hook").unwrap();
    let second = stage.stage(POD, &key(2), true).unwrap();
    assert_eq!(
        fs::read(first.join(HOOK_FILE)).unwrap(),
        b"\x7fELF the hook"
    );
    assert_eq!(
        fs::read(second.join(HOOK_FILE)).unwrap(),
        b"\x7fELF the new hook"
    );
    let again = stage.stage(POD, &key(1), true).unwrap();
    assert_eq!(
        fs::read(again.join(HOOK_FILE)).unwrap(),
        b"\x7fELF the new hook"
    );
}
