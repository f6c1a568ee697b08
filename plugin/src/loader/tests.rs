//! The loader check at PreStartContainer over fakes of amd-gpud and the pod
//! lookup (the real amd-gpud and containerd: tests/tests/loader_check.rs).

use std::{sync::Mutex, time::Duration};

use serde_json::json;

use super::{decide::Found, *};
use crate::testutil::KnownPods;

const UID: &str = "0b4c6c1e-5d0e-4d3c-9a43-4b0c2f4e0a01";

/// amd-gpud as a table: image -> answer; stage calls recorded.
#[derive(Debug, Default)]
struct FakeGpud {
    answers: Vec<(String, Result<Inspected, SinkError>)>,
    inspected: Mutex<Vec<String>>,
    runs: Mutex<Vec<ContainerRun>>,
    staged: Mutex<Vec<(String, String, bool)>>,
}

impl LoaderSink for FakeGpud {
    fn inspect(
        &self,
        image: String,
        run: ContainerRun,
    ) -> Pin<Box<dyn Future<Output = Result<Inspected, SinkError>> + Send>> {
        self.inspected.lock().unwrap().push(image.clone());
        self.runs.lock().unwrap().push(run);
        let answer = self.answers.iter().find(|(i, _)| *i == image).map_or_else(
            || Err(SinkError::NotPresent(format!("no {image}"))),
            |(_, a)| a.clone(),
        );
        Box::pin(async move { answer })
    }

    fn stage(
        &self,
        pod_uid: String,
        key: String,
        hook: bool,
    ) -> Pin<Box<dyn Future<Output = Result<String, SinkError>> + Send>> {
        self.staged.lock().unwrap().push((pod_uid, key, hook));
        Box::pin(async { Ok("/var/lib/amd-gpud/loader-hook/x".to_owned()) })
    }
}

fn found(found: Found) -> Result<Inspected, SinkError> {
    Ok(Inspected {
        found,
        digest: "sha256:aa".into(),
        evidence: "entrypoint /app -> interpreter /lib/ld-musl-x86_64.so.1".into(),
    })
}

/// Pod `ns/p` whose containers (name, image, GPUs asked) are `containers`.
fn pod(containers: &[(&str, &str, u32)]) -> Pod {
    let containers: Vec<_> = containers
        .iter()
        .map(|(name, image, gpus)| {
            let mut c = json!({ "name": name, "image": image });
            if *gpus > 0 {
                c["resources"] = json!({ "limits": { "amd.com/gpu": gpus.to_string() } });
            }
            c
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": { "namespace": "ns", "name": "p", "uid": UID },
        "spec": { "containers": containers },
    }))
    .unwrap()
}

fn checker(gpud: FakeGpud, pod: Pod) -> (LoaderCheck, Arc<FakeGpud>) {
    let gpud = Arc::new(gpud);
    let check = LoaderCheck {
        sink: gpud.clone(),
        owners: Arc::new(Owners::new(None, "amd.com/gpu")),
        pods: Arc::new(KnownPods {
            pods: vec![Arc::new(pod)],
        }),
        pod_resources: None,
        resource_name: "amd.com/gpu".into(),
        events: None,
    };
    (check, gpud)
}

fn allocated(check: &LoaderCheck, ids: &[String], staged: bool) {
    let owner = PodRef {
        namespace: "ns".into(),
        name: "p".into(),
        uid: UID.into(),
    };
    check.owners.remember(ids, owner, |_| true);
    check.owners.remember_hook(ids, staged);
}

async fn pre_start(check: &LoaderCheck, ids: &[String], capped: bool) -> Result<bool, LoaderError> {
    tokio::time::timeout(Duration::from_secs(5), check.pre_start(ids, capped))
        .await
        .expect("timed out")
}

fn ids() -> Vec<String> {
    vec!["GPU-A#0".to_owned()]
}

#[tokio::test(flavor = "current_thread")]
async fn glibc_gets_the_hook_in_its_staged_directory() {
    let gpud = FakeGpud {
        answers: vec![(
            "rocm/pytorch".into(),
            found(Found::Glibc {
                major: 2,
                minor: 35,
            }),
        )],
        ..FakeGpud::default()
    };
    let (check, gpud) = checker(gpud, pod(&[("main", "rocm/pytorch", 1)]));
    allocated(&check, &ids(), true);
    assert!(
        !pre_start(&check, &ids(), false).await.unwrap(),
        "the hook is there"
    );
    let staged = gpud.staged.lock().unwrap().clone();
    assert_eq!(staged, [(UID.to_owned(), staging_key(&ids()), true)]);
}

#[tokio::test(flavor = "current_thread")]
async fn musl_goes_without_the_hook_only_when_dmem_caps_it() {
    let gpud = FakeGpud {
        answers: vec![("alpine".into(), found(Found::Musl))],
        ..FakeGpud::default()
    };
    let (check, gpud) = checker(gpud, pod(&[("main", "alpine", 1)]));
    allocated(&check, &ids(), true);
    assert!(
        pre_start(&check, &ids(), true).await.unwrap(),
        "the cap becomes mandatory"
    );
    assert_eq!(gpud.staged.lock().unwrap().last().map(|s| s.2), Some(false));

    let err = pre_start(&check, &ids(), false).await.unwrap_err();
    let text = err.to_string();
    for part in [
        "ns/p",
        "alpine",
        "musl",
        "ld-musl",
        "glibc 2.34 or newer",
        "dmem backend",
    ] {
        assert!(text.contains(part), "{part:?} missing from: {text}");
    }
    assert_eq!(err.reason(), "MemoryHookRefused");
    assert_eq!(
        gpud.staged.lock().unwrap().len(),
        1,
        "a refusal stages nothing"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn unknown_loaders_are_refused_unless_capped_and_missing_images_always() {
    let gpud = FakeGpud {
        answers: vec![("odd".into(), found(Found::Unknown))],
        ..FakeGpud::default()
    };
    let (check, gpud) = checker(gpud, pod(&[("main", "odd", 1)]));
    allocated(&check, &ids(), true);
    let err = pre_start(&check, &ids(), false).await.unwrap_err();
    assert!(matches!(err, LoaderError::Refused { .. }), "{err}");
    assert!(
        pre_start(&check, &ids(), true).await.unwrap(),
        "with the kernel's cap it goes without the hook"
    );

    let (check, _) = checker(FakeGpud::default(), pod(&[("main", "never-pulled", 1)]));
    allocated(&check, &ids(), true);
    let err = pre_start(&check, &ids(), true).await.unwrap_err();
    assert!(
        matches!(
            &err,
            LoaderError::Inspect {
                why: SinkError::NotPresent(_),
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("never-pulled"), "{err}");
    assert_eq!(
        *gpud.staged.lock().unwrap(),
        [(UID.to_owned(), staging_key(&ids()), false)],
        "only the capped start staged (an empty directory)"
    );
}

/// Issue 38, F8: the pod's command goes to amd-gpud with the image, so that
/// the program that will run is judged; one the plugin cannot read is
/// unknown without asking.
#[tokio::test(flavor = "current_thread")]
async fn the_pods_command_is_what_is_judged() {
    let gpud = FakeGpud {
        answers: vec![("rocm/pytorch".into(), found(Found::Static))],
        ..FakeGpud::default()
    };
    let mut with_command = pod(&[("main", "rocm/pytorch", 1)]);
    let main = &mut with_command.spec.as_mut().unwrap().containers[0];
    main.command = Some(vec!["/opt/static".to_owned()]);
    main.args = Some(vec!["--serve".to_owned()]);
    let (check, gpud) = checker(gpud, with_command);
    allocated(&check, &ids(), true);
    let err = pre_start(&check, &ids(), false).await.unwrap_err();
    assert!(err.to_string().contains("a static binary"), "{err}");
    let runs = gpud.runs.lock().unwrap().clone();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].command, ["/opt/static"]);
    assert_eq!(runs[0].args, ["--serve"]);

    let mut from_secret = pod(&[("main", "rocm/pytorch", 1)]);
    let main = &mut from_secret.spec.as_mut().unwrap().containers[0];
    main.command = Some(vec!["$(BIN)".to_owned()]);
    main.env = Some(vec![
        serde_json::from_value(json!({
            "name": "BIN",
            "valueFrom": { "secretKeyRef": { "name": "s", "key": "bin" } },
        }))
        .unwrap(),
    ]);
    let (check, gpud) = checker(FakeGpud::default(), from_secret);
    allocated(&check, &ids(), true);
    let err = pre_start(&check, &ids(), false).await.unwrap_err();
    assert!(matches!(err, LoaderError::Refused { .. }), "{err}");
    assert!(err.to_string().contains("refers to $(BIN)"), "{err}");
    assert!(
        gpud.inspected.lock().unwrap().is_empty(),
        "amd-gpud not asked"
    );
    assert!(
        pre_start(&check, &ids(), true).await.unwrap(),
        "capped: no hook"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn whole_gpus_are_not_checked_and_the_gpu_container_is_the_one_looked_at() {
    let (check, gpud) = checker(FakeGpud::default(), pod(&[("main", "alpine", 1)]));
    allocated(&check, &ids(), false);
    assert!(!pre_start(&check, &ids(), false).await.unwrap());
    assert!(
        gpud.inspected.lock().unwrap().is_empty(),
        "no hook was mounted"
    );

    let gpud = FakeGpud {
        answers: vec![(
            "app:2".into(),
            found(Found::Glibc {
                major: 2,
                minor: 39,
            }),
        )],
        ..FakeGpud::default()
    };
    let (check, gpud) = checker(gpud, pod(&[("sidecar", "alpine", 0), ("main", "app:2", 1)]));
    allocated(&check, &ids(), true);
    pre_start(&check, &ids(), false).await.unwrap();
    assert_eq!(*gpud.inspected.lock().unwrap(), ["app:2"]);

    // Two GPU containers and no pod-resources API: which one is unknown.
    let (check, _) = checker(FakeGpud::default(), pod(&[("a", "x", 1), ("b", "y", 1)]));
    allocated(&check, &ids(), true);
    let err = pre_start(&check, &ids(), true).await.unwrap_err();
    assert!(
        err.to_string().contains("cannot tell which container"),
        "{err}"
    );
}
