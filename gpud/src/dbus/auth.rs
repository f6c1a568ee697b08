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
}
