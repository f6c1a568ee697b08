//! amd-gpud's `io.hami.AmdGpu1.Loader` as a [`LoaderSink`], over a fresh
//! connection per call (a container start is rare, and amd-gpud may have
//! restarted in between).

use std::{future::Future, pin::Pin, time::Duration};

use ipc::{ApiError, proxy::LoaderProxy};
use zbus::proxy::CacheProperties;

use super::{LoaderSink, SinkError, decide::Inspected, run::ContainerRun};
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

/// An amd-gpud older than `InspectContainer` (or its bus policy) refuses
/// the method itself: said so, since the pod's program then cannot be
/// judged and the container is refused.
fn too_old_for_the_pod(err: ApiError) -> ApiError {
    let ApiError::ZBus(zbus::Error::MethodError(name, _, _)) = &err else {
        return err;
    };
    match name.as_str() {
        "org.freedesktop.DBus.Error.UnknownMethod" | "org.freedesktop.DBus.Error.AccessDenied" => {
            ApiError::Failed(format!(
                "amd-gpud does not offer InspectContainer ({name}): it predates the check of a \
                 pod's command and args, so the program this container runs cannot be judged; \
                 upgrade amd-gpud"
            ))
        }
        _ => err,
    }
}

fn strs(items: &[String]) -> Vec<&str> {
    items.iter().map(String::as_str).collect()
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
        run: ContainerRun,
    ) -> Pin<Box<dyn Future<Output = Result<Inspected, SinkError>> + Send>> {
        let bus = self.bus.clone();
        Box::pin(async move {
            let call = async {
                let (_conn, loader) = proxy(&bus).await?;
                // The image's own start: the method every amd-gpud has.
                let answer = if run.is_image_default() {
                    loader.inspect_image(&image).await
                } else {
                    let answer = loader
                        .inspect_container(
                            &image,
                            &strs(&run.command),
                            &strs(&run.args),
                            &run.working_dir,
                            &run.path,
                            run.path_unknown,
                        )
                        .await;
                    answer.map_err(too_old_for_the_pod)
                };
                let (kind, glibc, digest, evidence) = answer.map_err(sink_error)?;
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
