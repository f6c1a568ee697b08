//! Registering with kubelet, with back-off: kubelet.sock may exist a moment
//! before it serves, or not at all while kubelet restarts.

use std::{path::Path, time::Duration};

use proto::v1beta1::{RegisterRequest, registration_client::RegistrationClient};
use tracing::{info, warn};

use super::service::options;

/// First and largest wait between attempts.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Why one attempt failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RegisterError {
    #[error("cannot reach kubelet at {path}: {source}")]
    Connect {
        path: String,
        #[source]
        source: tonic::transport::Error,
    },
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
