//! Who is calling: the UID the bus reports for the sender's unique name.
//!
//! The sender is taken from the message header only, never from arguments;
//! any failure to learn the UID denies (fail closed).

use ipc::ApiError;
use zbus::{Connection, fdo::DBusProxy, message::Header, names::BusName};

/// The caller's UID from `GetConnectionCredentials` of the header's sender.
///
/// # Errors
/// [`ApiError::AccessDenied`] when the message has no sender or the bus does not
/// tell its UID.
pub async fn caller_uid(conn: &Connection, header: &Header<'_>) -> Result<u32, ApiError> {
    let sender = header
        .sender()
        .ok_or_else(|| ApiError::AccessDenied("the call carries no sender".to_owned()))?;
    let deny =
        |why: String| ApiError::AccessDenied(format!("cannot identify caller {sender}: {why}"));
    let bus = DBusProxy::new(conn)
        .await
        .map_err(|e| deny(e.to_string()))?;
    let credentials = bus
        .get_connection_credentials(BusName::from(sender.to_owned()))
        .await
        .map_err(|e| deny(e.to_string()))?;
    credentials
        .unix_user_id()
        .ok_or_else(|| deny("the bus reports no UnixUserID".to_owned()))
}

/// Checks that `uid` is one of `allowed`.
///
/// # Errors
/// [`ApiError::AccessDenied`] naming the UID and the method.
pub fn check(uid: u32, allowed: &[u32], method: &str) -> Result<(), ApiError> {
    if allowed.contains(&uid) {
        Ok(())
    } else {
        Err(ApiError::AccessDenied(format!(
            "uid {uid} may not call {method}"
        )))
    }
}

/// Checks that `uid` is root, for the methods the plugin never calls
/// (`Rescan`, `RestoreCheck`): its UID gets no more than it uses.
///
/// # Errors
/// [`ApiError::AccessDenied`] naming the UID and the method.
pub fn check_root(uid: u32, method: &str) -> Result<(), ApiError> {
    check(uid, &[0], method)
}

/// The longest error text a caller other than root gets, in bytes.
pub const MAX_ERROR_TEXT: usize = 240;

/// `err` as the caller `uid` may see it: root gets it whole; anyone else
/// (the plugin) gets it without host paths (every word holding a `/`
/// becomes `<path>`) and at most [`MAX_ERROR_TEXT`] bytes long, so that
/// neither the host's layout nor a huge argument comes back. The whole
/// error is in amd-gpud's log.
pub fn for_caller(uid: u32, err: ApiError) -> ApiError {
    if uid == 0 {
        return err;
    }
    let short = |text: String| {
        let mut out = String::with_capacity(text.len().min(MAX_ERROR_TEXT));
        for (i, word) in text.split(' ').enumerate() {
            if i > 0 {
                out.push(' ');
            }
            out.push_str(if word.contains('/') { "<path>" } else { word });
            if out.len() > MAX_ERROR_TEXT {
                break;
            }
        }
        if out.len() > MAX_ERROR_TEXT {
            let mut end = MAX_ERROR_TEXT - '…'.len_utf8();
            while !out.is_char_boundary(end) {
                end -= 1;
            }
            out.truncate(end);
            out.push('…');
        }
        out
    };
    match err {
        ApiError::AccessDenied(m) => ApiError::AccessDenied(short(m)),
        ApiError::InvalidArgument(m) => ApiError::InvalidArgument(short(m)),
        ApiError::NotFound(m) => ApiError::NotFound(short(m)),
        ApiError::Busy(m) => ApiError::Busy(short(m)),
        ApiError::NotSupported(m) => ApiError::NotSupported(short(m)),
        ApiError::Failed(m) => ApiError::Failed(short(m)),
        ApiError::ZBus(e) => ApiError::Failed(short(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_listed_uids_pass() {
        assert!(check(0, &[0, 60700], "Rescan").is_ok());
        assert!(check(60700, &[0, 60700], "Rescan").is_ok());
        let err = check(1000, &[0, 60700], "Rescan").unwrap_err();
        assert!(
            matches!(&err, ApiError::AccessDenied(m) if m.contains("uid 1000") && m.contains("Rescan"))
        );
    }

    #[test]
    fn the_plugin_gets_short_errors_without_host_paths() {
        let long = format!("GPU {:?}: not a PCI address", "x".repeat(100_000));
        let err = for_caller(60700, ApiError::InvalidArgument(long));
        assert!(
            matches!(&err, ApiError::InvalidArgument(m) if m.len() <= MAX_ERROR_TEXT && m.ends_with('…'))
        );
        let path = "no cgroup for pod p under /host/sys/fs/cgroup/kubepods (tried [\"/a\"])";
        let err = for_caller(60700, ApiError::NotFound(path.to_owned()));
        assert!(
            matches!(&err, ApiError::NotFound(m) if m == "no cgroup for pod p under <path> (tried <path>"),
            "{err:?}"
        );
        let whole = for_caller(0, ApiError::NotFound(path.to_owned()));
        assert!(matches!(&whole, ApiError::NotFound(m) if m == path));
    }

    #[test]
    fn only_root_may_rescan_or_check_a_restore() {
        assert!(check_root(0, "Rescan").is_ok());
        for method in ["Rescan", "RestoreCheck"] {
            let err = check_root(60700, method).unwrap_err();
            assert!(matches!(&err, ApiError::AccessDenied(m) if m.contains(method)));
        }
    }
}
