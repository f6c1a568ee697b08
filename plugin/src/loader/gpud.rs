//! amd-gpud's `io.hami.AmdGpu1.Loader` as a [`LoaderSink`], over a fresh
//! connection per call (a container start is rare, and amd-gpud may have
//! restarted in between).

use std::{future::Future, pin::Pin, time::Duration};

use ipc::{ApiError, proxy::LoaderProxy};
use zbus::proxy::CacheProperties;

use super::{LoaderSink, SinkError, decide::Inspected};
use crate::gpud::{Bus, connect};

/// amd-gpud answers `InspectImage` within 20 s (a longer inspection goes on
/// and answers Busy); kubelet gives PreStartContainer 30 s in all.
const INSPECT_TIMEOUT: Duration = Duration::from_secs(25);
const STAGE_TIMEOUT: Duration = Duration::from_secs(10);

/// The loader check through amd-gpud.
#[derive(Debug, Clone)]
pub(crate) struct GpudLoader {
    pub(crate) bus: Bus,
}

fn sink_error(err: ApiError) -> SinkError {
    match err {
        ApiError::NotFound(m) => SinkError::NotPresent(m),
        ApiError::NotSupported(m) => SinkError::NoRuntime(m),
        ApiError::Busy(m) => SinkError::Pending(m),
        other => SinkError::Other(other.to_string()),
    }
}

async fn proxy(bus: &Bus) -> Result<(zbus::Connection, LoaderProxy<'static>), SinkError> {
    let other = |e: &dyn std::fmt::Display| SinkError::Other(format!("amd-gpud: {e}"));
    let conn = connect(bus).await.map_err(|e| other(&e))?;
    let loader = LoaderProxy::builder(&conn)
        .cache_properties(CacheProperties::No)
        .build()
        .await
        .map_err(|e| other(&e))?;
    Ok((conn, loader))
}

impl LoaderSink for GpudLoader {
    fn inspect(
        &self,
        image: String,
    ) -> Pin<Box<dyn Future<Output = Result<Inspected, SinkError>> + Send>> {
        let bus = self.bus.clone();
        Box::pin(async move {
            let call = async {
                let (_conn, loader) = proxy(&bus).await?;
                let (kind, glibc, digest, evidence) =
                    loader.inspect_image(&image).await.map_err(sink_error)?;
                Ok(Inspected::from_wire(&kind, &glibc, digest, evidence))
            };
            tokio::time::timeout(INSPECT_TIMEOUT, call)
                .await
                .unwrap_or_else(|_| {
                    Err(SinkError::Pending(format!(
                        "amd-gpud did not answer InspectImage within {INSPECT_TIMEOUT:?}"
                    )))
                })
        })
    }

    fn stage(
        &self,
        pod_uid: String,
        key: String,
        hook: bool,
    ) -> Pin<Box<dyn Future<Output = Result<String, SinkError>> + Send>> {
        let bus = self.bus.clone();
        Box::pin(async move {
            let call = async {
                let (_conn, loader) = proxy(&bus).await?;
                loader
                    .stage_memory_hook(&pod_uid, &key, hook)
                    .await
                    .map_err(sink_error)
            };
            tokio::time::timeout(STAGE_TIMEOUT, call)
                .await
                .unwrap_or_else(|_| {
                    Err(SinkError::Other(format!(
                        "amd-gpud did not answer StageMemoryHook within {STAGE_TIMEOUT:?}"
                    )))
                })
        })
    }
}
