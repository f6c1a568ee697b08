use serde_json::json;

use super::*;

fn container(spec: serde_json::Value) -> Container {
    let mut c = json!({ "name": "main", "image": "x" });
    if let (Some(c), Some(extra)) = (c.as_object_mut(), spec.as_object()) {
        c.extend(extra.clone());
    }
    serde_json::from_value(c).unwrap()
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn a_container_without_overrides_is_the_images_default() {
    let run = ContainerRun::of(&container(json!({}))).unwrap();
    assert!(run.is_image_default(), "{run:?}");
    let env_only = container(json!({ "env": [{ "name": "A", "value": "1" }] }));
    assert!(ContainerRun::of(&env_only).unwrap().is_image_default());
}

#[test]
fn command_args_dir_and_path_are_taken_as_kubelet_expands_them() {
    let c = container(json!({
        "command": ["$(BIN)", "--mode=$(MODE)"],
        "args": ["$$(LITERAL)", "$(UNSET)", "cost $5", "$(open"],
        "workingDir": "/srv",
        "env": [
            { "name": "ROOT", "value": "/opt" },
            { "name": "BIN", "value": "$(ROOT)/static" },
            { "name": "MODE", "value": "fast" },
            { "name": "PATH", "value": "$(ROOT)/bin:/usr/bin" },
        ],
    }));
    let run = ContainerRun::of(&c).unwrap();
    assert_eq!(run.command, strings(&["/opt/static", "--mode=fast"]));
    assert_eq!(
        run.args,
        strings(&["$(LITERAL)", "$(UNSET)", "cost $5", "$(open"])
    );
    assert_eq!(run.working_dir, "/srv");
    assert_eq!(
        (run.path.as_str(), run.path_unknown),
        ("/opt/bin:/usr/bin", false)
    );
}

#[test]
fn values_the_plugin_cannot_read_make_the_container_unknown() {
    let secret = json!({ "secretKeyRef": { "name": "s", "key": "k" } });
    let cases = [
        json!({ "command": ["$(BIN)"], "env": [{ "name": "BIN", "valueFrom": secret }] }),
        json!({ "command": ["$(BIN)"], "envFrom": [{ "configMapRef": { "name": "c" } }] }),
        json!({ "args": ["$(DB_SERVICE_HOST)"] }),
        json!({
            "command": ["$(B)"],
            "env": [{ "name": "A", "valueFrom": secret }, { "name": "B", "value": "$(A)/x" }],
        }),
    ];
    for spec in cases {
        let why = ContainerRun::of(&container(spec.clone())).unwrap_err();
        assert!(why.contains("cannot be told"), "{spec}: {why}");
        assert!(why.contains("refers to $("), "{spec}: {why}");
    }
}

#[test]
fn a_path_from_elsewhere_is_marked_unknown() {
    let from_secret = container(json!({
        "env": [{ "name": "PATH", "valueFrom": { "secretKeyRef": { "name": "s", "key": "k" } } }],
    }));
    let run = ContainerRun::of(&from_secret).unwrap();
    assert!(run.path_unknown && run.path.is_empty(), "{run:?}");
    let from_config_map = container(json!({ "envFrom": [{ "configMapRef": { "name": "c" } }] }));
    assert!(ContainerRun::of(&from_config_map).unwrap().path_unknown);
    // A PATH written in env wins over any envFrom source.
    let written = container(json!({
        "envFrom": [{ "configMapRef": { "name": "c" } }],
        "env": [{ "name": "PATH", "value": "/bin" }],
    }));
    let run = ContainerRun::of(&written).unwrap();
    assert_eq!((run.path.as_str(), run.path_unknown), ("/bin", false));
}
