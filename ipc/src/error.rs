//! The one typed error of the API, `io.hami.AmdGpu1.Error.*` on the wire.

/// Errors every `amd-gpud` method may return. Each carries a message naming
/// the value, device or caller concerned.
#[derive(Debug, zbus::DBusError)]
#[zbus(prefix = "io.hami.AmdGpu1.Error")]
pub enum ApiError {
    /// Transport-level failure (not sent by the daemon).
    #[zbus(error)]
    ZBus(zbus::Error),
    /// The caller's UID may not call this method.
    AccessDenied(String),
    /// An argument failed validation.
    InvalidArgument(String),
    /// The named GPU, partition or pod does not exist.
    NotFound(String),
    /// The device is in use or another operation holds it; retry later.
    Busy(String),
    /// The device or host cannot do this (no such mode, no controller).
    NotSupported(String),
    /// Anything else; the message says what.
    Failed(String),
}

#[cfg(test)]
mod tests {
    use zbus::DBusError;

    use super::*;

    #[test]
    fn names_are_under_the_error_prefix() {
        let cases = [
            (ApiError::AccessDenied("uid 1000".into()), "AccessDenied"),
            (ApiError::InvalidArgument("x".into()), "InvalidArgument"),
            (ApiError::NotFound("x".into()), "NotFound"),
            (ApiError::Busy("x".into()), "Busy"),
            (ApiError::NotSupported("x".into()), "NotSupported"),
            (ApiError::Failed("x".into()), "Failed"),
        ];
        for (err, name) in cases {
            assert_eq!(err.name().as_str(), format!("io.hami.AmdGpu1.Error.{name}"));
        }
        assert_eq!(
            ApiError::AccessDenied("uid 1000".into()).description(),
            Some("uid 1000")
        );
    }
}
