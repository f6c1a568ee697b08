//! `io.hami.AmdGpu1.Loader` on `/io/hami/AmdGpu1`: the loader check
//! (`InspectImage`) and the per-container memory hook (`StageMemoryHook`)
//! over [`crate::loader_check`]. Conversion, access and error mapping only.

use std::{sync::Arc, time::Duration};

use ipc::ApiError;
use tracing::{Instrument, info_span};
use zbus::{Connection, interface, message::Header};

use super::auth;
use crate::loader_check::{
    Finding, Loader,
    checker::{CheckError, Checker},
    fetch::spawn::ForkedInspect,
    run::RunSpec,
    stage::HookStage,
};

/// How long staging one hook (a copy of a few MiB on local disk) may take.
const STAGE_LIMIT: Duration = Duration::from_secs(5);

/// The loader object.
pub struct LoaderObject {
    pub checker: Arc<Checker<ForkedInspect>>,
    pub stage: Arc<HookStage>,
    pub allowed_uids: Arc<[u32]>,
}

/// `InspectImage`'s answer: loader, glibc version, digest, evidence.
type Answer = (String, String, String, String);

#[interface(name = "io.hami.AmdGpu1.Loader")]
impl LoaderObject {
    /// Which dynamic loader the entrypoint of image `image` (as a pod spec
    /// names it; normalised as containerd's CRI plugin records it) runs
    /// under, read from containerd's content store. Returns `loader`
    /// ("glibc", "musl", "static" or "unknown"), `glibc` (the newest
    /// GLIBC_x.y its libc.so.6 defines, e.g. "2.36"; empty otherwise), the
    /// image's `digest`, and `evidence` (how it was decided, or why it could
    /// not be). One inspection per image at a time, cached by digest.
    /// Errors: NotFound (the image is not on the node), NotSupported (no
    /// containerd), Busy (the inspection is still running: it goes on, and a
    /// later call gets the answer; or too many run), InvalidArgument (a
    /// malformed reference), Failed (an unreadable image), AccessDenied
    /// (not root or the plugin).
    #[zbus(out_args("loader", "glibc", "digest", "evidence"))]
    async fn inspect_image(
        &self,
        image: String,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<Answer, ApiError> {
        let image_default = RunSpec::default();
        self.inspect("InspectImage", &header, conn, image, image_default)
            .await
    }

    /// As `InspectImage`, for a container that its pod starts as `command`,
    /// `args`, `working_dir` and the `PATH` of its env say (each empty:
    /// the image's `Entrypoint`, `Cmd`, `WorkingDir`, `PATH`; `path_unknown`:
    /// the pod sets `PATH` from a source the plugin cannot read), kubelet's
    /// `$(VAR)` references already expanded: the program the container will
    /// run is judged, including the one a shell's `-c` or a wrapper such as
    /// `tini` or `env` starts (docs/loader-check.md). InvalidArgument also
    /// when they exceed the check's bounds (`run::MAX_RUN_ENTRIES`,
    /// `run::MAX_RUN_BYTES`). They are only bounded here: the inspector
    /// child reads them.
    #[zbus(out_args("loader", "glibc", "digest", "evidence"))]
    #[allow(clippy::too_many_arguments)] // the method's wire arguments, and zbus's two
    async fn inspect_container(
        &self,
        image: String,
        command: Vec<String>,
        args: Vec<String>,
        working_dir: String,
        path: String,
        path_unknown: bool,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<Answer, ApiError> {
        let run = RunSpec {
            command,
            args,
            working_dir,
            path,
            path_unknown,
        };
        self.inspect("InspectContainer", &header, conn, image, run)
            .await
    }

    /// Creates the directory the plugin's Allocate mounted for a
    /// container's memory hook (`<state>/loader-hook/<pod_uid>/<key>`) and
    /// puts the node's hook in it (`hook`; a hard link to one copy) or
    /// empties it; returns the directory. `key`: 16 lowercase hex digits.
    /// Errors: InvalidArgument (UID or key), Failed (the hook, the write, or
    /// more keys per pod or pods than are staged), AccessDenied (not root or
    /// the plugin).
    #[zbus(out_args("dir"))]
    async fn stage_memory_hook(
        &self,
        pod_uid: String,
        key: String,
        hook: bool,
        #[zbus(header)] header: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<String, ApiError> {
        let uid = auth::caller_uid(conn, &header).await;
        let span = info_span!(
            "dbus",
            method = "StageMemoryHook",
            caller_uid = uid.as_ref().map_or(-1, |u| i64::from(*u)),
            pod = %crate::dmem::uid::excerpt(&pod_uid),
            hook,
        );
        async {
            let uid = uid?;
            auth::check(uid, &self.allowed_uids, "StageMemoryHook")
                .inspect_err(|e| tracing::warn!("{e}"))?;
            let stage = Arc::clone(&self.stage);
            let work = tokio::task::spawn_blocking(move || stage.stage(&pod_uid, &key, hook));
            let staged = match tokio::time::timeout(STAGE_LIMIT, work).await {
                Ok(Ok(Ok(dir))) => Ok(dir.display().to_string()),
                Ok(Ok(Err(e))) if e.is_invalid_argument() => {
                    Err(ApiError::InvalidArgument(e.to_string()))
                }
                Ok(Ok(Err(e))) => Err(ApiError::Failed(e.to_string())),
                Ok(Err(e)) => Err(ApiError::Failed(format!("staging failed: {e}"))),
                Err(_) => Err(ApiError::Failed(format!(
                    "staging the hook did not finish within {STAGE_LIMIT:?}"
                ))),
            };
            staged.map_err(|e| {
                tracing::warn!("StageMemoryHook: {e:?}");
                auth::for_caller(uid, e)
            })
        }
        .instrument(span)
        .await
    }
}

impl LoaderObject {
    /// `InspectImage` and `InspectContainer` (`method`): the caller's UID
    /// checked, `run` bounded (only bounded: the inspector child reads
    /// it), then the check's answer or its typed error.
    async fn inspect(
        &self,
        method: &'static str,
        header: &Header<'_>,
        conn: &Connection,
        image: String,
        run: RunSpec,
    ) -> Result<Answer, ApiError> {
        let uid = auth::caller_uid(conn, header).await;
        let span = info_span!(
            "dbus",
            method,
            caller_uid = uid.as_ref().map_or(-1, |u| i64::from(*u)),
            image = %crate::dmem::uid::excerpt(&image),
            from_pod = !run.is_image_default(),
        );
        async {
            let uid = uid?;
            auth::check(uid, &self.allowed_uids, method).inspect_err(|e| tracing::warn!("{e}"))?;
            let run = run.bounded().map_err(|e| {
                tracing::info!("{method}: {e}");
                auth::for_caller(uid, ApiError::InvalidArgument(e.to_string()))
            })?;
            let found = self.checker.check(&image, &run).await.map_err(|e| {
                tracing::info!("{method}: {e}");
                auth::for_caller(uid, api_error(&e))
            })?;
            Ok(answer(found))
        }
        .instrument(span)
        .await
    }
}

fn answer(found: Finding) -> Answer {
    let (loader, glibc) = match &found.loader {
        Loader::Glibc { major, minor } => ("glibc", format!("{major}.{minor}")),
        Loader::Musl => ("musl", String::new()),
        Loader::Static => ("static", String::new()),
        Loader::Unknown { .. } => ("unknown", String::new()),
    };
    let evidence = match found.loader {
        Loader::Unknown { why } if found.evidence.is_empty() => why,
        _ => found.evidence,
    };
    (loader.to_owned(), glibc, found.digest, evidence)
}

/// The typed D-Bus error of a [`CheckError`].
pub fn api_error(err: &CheckError) -> ApiError {
    let text = err.to_string();
    match err {
        CheckError::Reference(_) => ApiError::InvalidArgument(text),
        CheckError::NotPresent(_) => ApiError::NotFound(text),
        CheckError::NoRuntime(_) => ApiError::NotSupported(text),
        CheckError::StillRunning { .. } | CheckError::TooMany { .. } => ApiError::Busy(text),
        CheckError::Failed { .. } => ApiError::Failed(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_and_errors_keep_their_meaning_on_the_wire() {
        let found = |loader| Finding {
            digest: "sha256:ab".into(),
            loader,
            evidence: "because".into(),
        };
        let glibc = answer(found(Loader::Glibc {
            major: 2,
            minor: 36,
        }));
        assert_eq!((glibc.0.as_str(), glibc.1.as_str()), ("glibc", "2.36"));
        let mut unknown = found(Loader::Unknown {
            why: "no ELF".into(),
        });
        unknown.evidence.clear();
        assert_eq!(answer(unknown).3, "no ELF");
        let busy = api_error(&CheckError::StillRunning {
            image: "x".into(),
            waited: Duration::from_secs(20),
        });
        assert!(matches!(busy, ApiError::Busy(_)));
        assert!(matches!(
            api_error(&CheckError::NotPresent("x".into())),
            ApiError::NotFound(_)
        ));
        assert!(matches!(
            api_error(&CheckError::NoRuntime("x".into())),
            ApiError::NotSupported(_)
        ));
    }
}
