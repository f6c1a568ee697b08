//! Registering with kubelet, with back-off: kubelet.sock may exist a moment
//! before it serves, or not at all while kubelet restarts.

use std::{future::Future, path::Path, time::Duration};

use proto::v1beta1::{RegisterRequest, registration_client::RegistrationClient};
use tracing::{info, warn};

use super::service::options;

/// First and largest wait between attempts.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// How long one attempt may take, connecting and kubelet's answer: a
/// connection the old kubelet accepted as it went down is never answered,
/// and without a bound the plugin would wait on it for ever, never
/// registering with the new one.
const ATTEMPT_LIMIT: Duration = Duration::from_secs(10);

/// Why one attempt failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RegisterError {
    #[error("cannot reach kubelet at {path}: {source}")]
    Connect {
        path: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("kubelet at {path} did not answer the registration within {after:?}")]
    Late { path: String, after: Duration },
    #[error("kubelet refused the registration: {0}")]
    Refused(#[from] tonic::Status),
}

/// One Register call.
///
/// # Errors
/// When kubelet cannot be reached or refuses.
pub(crate) async fn register_once(
    kubelet_socket: &Path,
    endpoint: &str,
    resource_name: &str,
    pre_start: bool,
) -> Result<(), RegisterError> {
    let attempt = register_unbounded(kubelet_socket, endpoint, resource_name, pre_start);
    within(ATTEMPT_LIMIT, kubelet_socket, attempt).await
}

/// `attempt`, or [`RegisterError::Late`] once `limit` has passed.
async fn within(
    limit: Duration,
    kubelet_socket: &Path,
    attempt: impl Future<Output = Result<(), RegisterError>>,
) -> Result<(), RegisterError> {
    tokio::time::timeout(limit, attempt)
        .await
        .unwrap_or_else(|_| {
            Err(RegisterError::Late {
                path: kubelet_socket.display().to_string(),
                after: limit,
            })
        })
}

async fn register_unbounded(
    kubelet_socket: &Path,
    endpoint: &str,
    resource_name: &str,
    pre_start: bool,
) -> Result<(), RegisterError> {
    let channel = proto::unix::channel(kubelet_socket)
        .await
        .map_err(|source| RegisterError::Connect {
            path: kubelet_socket.display().to_string(),
            source,
        })?;
    let request = RegisterRequest {
        version: proto::VERSION.to_owned(),
        endpoint: endpoint.to_owned(),
        resource_name: resource_name.to_owned(),
        options: Some(options(pre_start)),
    };
    RegistrationClient::new(channel).register(request).await?;
    Ok(())
}

/// Registers until it succeeds (`true`), waiting longer after each failure;
/// gives up (`false`) as soon as `still_valid` says the attempt is moot (our
/// socket was deleted, so kubelet could not dial back anyway).
pub(crate) async fn register(
    kubelet_socket: &Path,
    endpoint: &str,
    resource_name: &str,
    pre_start: bool,
    still_valid: impl Fn() -> bool,
) -> bool {
    let mut backoff = FIRST_BACKOFF;
    let mut attempt = 1_u32;
    loop {
        if !still_valid() {
            return false;
        }
        match register_once(kubelet_socket, endpoint, resource_name, pre_start).await {
            Ok(()) => {
                info!(
                    attempt,
                    resource_name, endpoint, pre_start, "registered with kubelet"
                );
                return true;
            }
            Err(err) => {
                warn!(
                    attempt,
                    "registration failed: {err}; next attempt in {backoff:?}"
                );
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                attempt = attempt.saturating_add(1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kubelet.sock that accepts connections and never answers (the old
    /// kubelet going down): the attempt ends as Late, naming the socket.
    #[tokio::test]
    async fn a_kubelet_that_never_answers_makes_the_attempt_late() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("kubelet.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let held = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                open.push(conn);
            }
        });
        let attempt = register_unbounded(&socket, "amd.sock", "amd.com/gpu", false);
        let ended = tokio::time::timeout(
            Duration::from_secs(30),
            within(Duration::from_millis(300), &socket, attempt),
        )
        .await
        .expect("the bound ends the attempt");
        let err = ended.unwrap_err();
        assert!(matches!(err, RegisterError::Late { .. }), "{err}");
        assert!(err.to_string().contains("kubelet.sock"), "{err}");
        held.abort();
    }
}
