//! The users the bus tests need, created with `systemd-sysusers` when missing.

use std::{
    fs, io,
    sync::{Mutex, PoisonError},
};

use super::{
    CALL_TIMEOUT, OTHER_UID, OTHER_USER, PLUGIN_UID, PLUGIN_USER, run_as, shipped_sysusers,
};

const SYSUSERS: &str = "systemd-sysusers";
const GETENT: &str = "getent";
const PROC_SELF_STATUS: &str = "/proc/self/status";

/// Makes sure [`PLUGIN_USER`] exists with [`PLUGIN_UID`], running `systemd-sysusers` on
/// the shipped `systemd/amd-gpud.sysusers.conf` when it does not.
///
/// # Errors
/// When the user is missing and this process is not root, when `systemd-sysusers` fails,
/// or when the user exists with another UID.
pub fn ensure_plugin_user() -> io::Result<()> {
    let conf = shipped_sysusers();
    // systemd-sysusers takes a relative path for a name in sysusers.d: keep it absolute.
    ensure_user(PLUGIN_USER, PLUGIN_UID, &[&conf.to_string_lossy()])
}

/// Makes sure [`OTHER_USER`] exists with [`OTHER_UID`] (`systemd-sysusers --inline`).
///
/// # Errors
/// As [`ensure_plugin_user`].
pub fn ensure_other_user() -> io::Result<()> {
    let line = format!("u {OTHER_USER} {OTHER_UID} \"amd-gpud tests, unknown to the policy\" - -");
    ensure_user(OTHER_USER, OTHER_UID, &["--inline", &line])
}

fn ensure_user(name: &str, uid: u32, sysusers_args: &[&str]) -> io::Result<()> {
    // One creator at a time: tests run on parallel threads.
    static LOCK: Mutex<()> = Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(PoisonError::into_inner);
    match lookup_uid(name)? {
        Some(found) if found == uid => return Ok(()),
        Some(found) => {
            return Err(io::Error::other(format!(
                "user {name} exists with UID {found}, the tests need {uid}"
            )));
        }
        None => {}
    }
    let command = format!("{SYSUSERS} {}", sysusers_args.join(" "));
    if effective_uid()? != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("user {name} (UID {uid}) does not exist; create it as root: {command}"),
        ));
    }
    let out = run_as(0, 0, SYSUSERS, sysusers_args, CALL_TIMEOUT)?;
    match lookup_uid(name)? {
        Some(found) if found == uid => Ok(()),
        found => Err(io::Error::other(format!(
            "`{command}` did not create {name} with UID {uid} (now {found:?}, exit {:?}): {}",
            out.code,
            out.stderr.trim()
        ))),
    }
}

/// The UID NSS gives for `name` (`getent passwd`), `None` when it does not resolve.
fn lookup_uid(name: &str) -> io::Result<Option<u32>> {
    let out = run_as(0, 0, GETENT, &["passwd", name], CALL_TIMEOUT)?;
    if !out.success() {
        return Ok(None);
    }
    let uid = out
        .stdout
        .split(':')
        .nth(2)
        .and_then(|f| f.trim().parse().ok());
    uid.map(Some)
        .ok_or_else(|| io::Error::other(format!("unreadable getent line: {}", out.stdout)))
}

/// This process's effective UID, from `/proc/self/status`.
///
/// # Errors
/// When the file cannot be read or has no `Uid:` line.
pub fn effective_uid() -> io::Result<u32> {
    let status = fs::read_to_string(PROC_SELF_STATUS)?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .and_then(|euid| euid.parse().ok())
        .ok_or_else(|| io::Error::other(format!("no effective UID in {PROC_SELF_STATUS}")))
}
