//! Kubelet's `Register` handler (`pkg/kubelet/cm/devicemanager/plugin/v1beta1/server.go`
//! and `manager.go` PluginConnected) and the `ListAndWatch` reader it starts.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use proto::v1beta1::{
    DevicePluginOptions, Empty, RegisterRequest, device_plugin_client::DevicePluginClient,
    registration_server::Registration,
};
use tonic::{Request, Response, Status, transport::Channel};

use super::{SUPPORTED_VERSION, dial, state::Shared};

/// The `Registration` service of one kubelet "process" (epoch).
pub(super) struct RegistrationService {
    shared: Arc<Shared>,
    epoch: u64,
}

impl RegistrationService {
    pub(super) fn new(shared: Arc<Shared>) -> Self {
        let epoch = shared.with(|s| s.epoch);
        Self { shared, epoch }
    }

    /// Records a refusal and turns it into the status a gRPC client sees.
    fn refuse(&self, status: Status) -> Status {
        let message = format!("{:?}: {}", status.code(), status.message());
        self.shared.with(|s| s.rejections.push(message));
        status
    }

    /// Kubelet's checks, dial-back and options call; `Ok` carries the connection.
    async fn accept(
        &self,
        request: &RegisterRequest,
    ) -> Result<(DevicePluginOptions, DevicePluginClient<Channel>), Status> {
        let (fail, stale, dial_timeout) = self.shared.with(|s| {
            s.attempts.push(request.clone());
            let fail = s.fail_next > 0;
            s.fail_next = s.fail_next.saturating_sub(1);
            (fail, s.epoch != self.epoch, s.dial_timeout)
        });
        if stale {
            return Err(Status::unavailable(
                "this kubelet has restarted; its registration socket is gone",
            ));
        }
        if fail {
            return Err(Status::unavailable("injected registration failure"));
        }
        // Kubelet's errors are plain Go errors: a gRPC client sees them as Unknown.
        if request.version != SUPPORTED_VERSION {
            return Err(Status::unknown(format!(
                "requested API version {:?} is not supported by kubelet. \
                 Supported versions are [{SUPPORTED_VERSION:?}]",
                request.version
            )));
        }
        if !is_extended_resource_name(&request.resource_name) {
            return Err(Status::unknown(format!(
                "the ResourceName {:?} is invalid",
                request.resource_name
            )));
        }
        let path = join_endpoint(&self.shared.dir, &request.endpoint);
        let mut client = dial::dial(&path, dial_timeout)
            .await
            .map_err(|e| Status::unknown(format!("failed to dial device plugin: {e}")))?;
        let options = client
            .get_device_plugin_options(Empty {})
            .await
            .map_err(|e| Status::unknown(format!("failed to get device plugin options: {e}")))?
            .into_inner();
        Ok((options, client))
    }
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let request = request.into_inner();
        let (options, client) = self.accept(&request).await.map_err(|e| self.refuse(e))?;
        let shared = Arc::clone(&self.shared);
        let accepted = self.shared.with(|s| {
            if s.epoch != self.epoch {
                return false;
            }
            let id = s.connect(request, options, client.clone());
            // Kubelet starts its ListAndWatch reader in a goroutine and returns.
            s.add_reader(tokio::spawn(read_list_and_watch(shared, id, client)));
            true
        });
        if accepted {
            Ok(Response::new(Empty {}))
        } else {
            Err(self.refuse(Status::unavailable(
                "this kubelet restarted during the registration",
            )))
        }
    }
}

/// Kubelet's client `Run`: one `ListAndWatch` per connection, read until it ends, never
/// reopened.
async fn read_list_and_watch(
    shared: Arc<Shared>,
    id: u64,
    mut client: DevicePluginClient<Channel>,
) {
    let why = match client.list_and_watch(Empty {}).await {
        Err(status) => format!("ListAndWatch failed: {status}"),
        Ok(response) => {
            shared.with(|s| s.stream_opened(id));
            let mut stream = response.into_inner();
            loop {
                match stream.message().await {
                    Ok(Some(message)) => shared.with(|s| s.received(id, message.devices)),
                    Ok(None) => break "ListAndWatch stream ended".to_owned(),
                    Err(status) => break format!("ListAndWatch stream failed: {status}"),
                }
            }
        }
    };
    shared.with(|s| s.stream_ended(id, why));
}

/// Go's `filepath.Join(dir, endpoint)`: an absolute endpoint is appended, not substituted,
/// so a plugin that sends a full path is caught as it is by kubelet.
fn join_endpoint(dir: &Path, endpoint: &str) -> PathBuf {
    dir.join(endpoint.trim_start_matches('/'))
}

/// Kubelet's `IsExtendedResourceName`: not native (has a `/`, not under `kubernetes.io/`),
/// not starting with `requests.`, and a qualified name once prefixed with `requests.`.
pub(super) fn is_extended_resource_name(name: &str) -> bool {
    const REQUESTS: &str = "requests.";
    name.contains('/')
        && !name.contains("kubernetes.io/")
        && !name.starts_with(REQUESTS)
        && is_qualified_name(&format!("{REQUESTS}{name}"))
}

/// apimachinery's `IsQualifiedName`: `[prefix/]name`, the prefix a DNS-1123 subdomain,
/// the name at most 63 alphanumerics, `-`, `_`, `.`, starting and ending alphanumeric.
fn is_qualified_name(value: &str) -> bool {
    let mut parts = value.split('/');
    let (prefix, name) = match (parts.next(), parts.next(), parts.next()) {
        (Some(name), None, None) => (None, name),
        (Some(prefix), Some(name), None) => (Some(prefix), name),
        _ => return false,
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric())
        && name
            .bytes()
            .last()
            .is_some_and(|b| b.is_ascii_alphanumeric());
    name_ok && prefix.is_none_or(is_dns1123_subdomain)
}

fn is_dns1123_subdomain(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= 253
        && value.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}
