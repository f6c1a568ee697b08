//! How a container's pod spec starts it (issue 38, F8): `command`, `args`,
//! `workingDir` and the `PATH` of its environment, which replace the
//! image's `Entrypoint`, `Cmd`, `WorkingDir` and `PATH`. amd-gpud judges the
//! program they name (`InspectContainer`) rather than the image's own
//! entrypoint.
//!
//! Kubelet expands `$(NAME)` in `command`, `args` and env values before the
//! container starts (Kubernetes' "Define Dependent Environment Variables";
//! `kubernetes/kubernetes:third_party/forked/golang/expansion/expand.go`):
//! `$$` is a literal `$`, `$(NAME)` the variable's value when it is defined
//! and left as written when not, any other `$` kept. The same is done here
//! with the values the pod spec writes out; a reference to a variable whose
//! value comes from elsewhere (`valueFrom`, `envFrom`, a Service's link
//! variables) cannot be expanded here, and the container is then judged
//! unknown (docs/loader-check.md), as is a program looked up in a `PATH`
//! that may come from elsewhere.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Container;

/// What the pod spec says; every field empty: as the image says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ContainerRun {
    pub(crate) command: Vec<String>,
    pub(crate) args: Vec<String>,
    pub(crate) working_dir: String,
    pub(crate) path: String,
    /// `PATH` comes from a source the plugin cannot read.
    pub(crate) path_unknown: bool,
}

/// A variable's value: written in the pod spec, or from elsewhere.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Value {
    Known(String),
    Unknown(&'static str),
}

/// The container's variables as kubelet builds them, in order; whether
/// any name not among them may still be set (an `envFrom` source).
struct Env {
    vars: HashMap<String, Value>,
    others_unknown: bool,
}

/// Whether `name` may be one of the variables kubelet adds for the
/// namespace's Services (`<SVC>_SERVICE_HOST`, `<SVC>_PORT_<N>_TCP`, ...,
/// `KUBERNETES_SERVICE_HOST` in every pod), whose values it cannot know.
fn may_be_service_link(name: &str) -> bool {
    name.contains("_SERVICE_") || name.contains("_PORT")
}

impl Env {
    fn of(container: &Container) -> Self {
        let mut env = Self {
            vars: HashMap::new(),
            others_unknown: container.env_from.as_ref().is_some_and(|f| !f.is_empty()),
        };
        for var in container.env.iter().flatten() {
            let value = match (&var.value, &var.value_from) {
                (_, Some(_)) => Value::Unknown("valueFrom"),
                (Some(text), None) => match env.expand(text) {
                    Ok(text) => Value::Known(text),
                    Err(_) => Value::Unknown("a reference to an unknown variable"),
                },
                (None, None) => Value::Known(String::new()),
            };
            env.vars.insert(var.name.clone(), value);
        }
        env
    }

    /// `text` with its `$(NAME)` references expanded, or the name of the
    /// first one whose value is not known here.
    fn expand(&self, text: &str) -> Result<String, String> {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(at) = rest.find('$') {
            out.push_str(&rest[..at]);
            let after = &rest[at + 1..];
            if let Some(tail) = after.strip_prefix('$') {
                out.push('$');
                rest = tail;
            } else if let Some((name, tail)) = after
                .strip_prefix('(')
                .and_then(|inner| inner.split_once(')'))
            {
                match self.vars.get(name) {
                    Some(Value::Known(value)) => out.push_str(value),
                    Some(Value::Unknown(_)) => return Err(name.to_owned()),
                    None if self.others_unknown || may_be_service_link(name) => {
                        return Err(name.to_owned());
                    }
                    None => {
                        out.push_str("$(");
                        out.push_str(name);
                        out.push(')');
                    }
                }
                rest = tail;
            } else {
                out.push('$');
                rest = after;
            }
        }
        out.push_str(rest);
        Ok(out)
    }
}

impl ContainerRun {
    /// How `container` starts, or why that cannot be told here.
    ///
    /// # Errors
    /// A sentence naming the field and the variable whose value the plugin
    /// cannot read.
    pub(crate) fn of(container: &Container) -> Result<Self, String> {
        let env = Env::of(container);
        let expand = |field: &str, list: &Option<Vec<String>>| {
            list.iter()
                .flatten()
                .map(|item| {
                    env.expand(item).map_err(|name| {
                        format!(
                            "the pod's {field} refers to $({name}), whose value comes from a \
                             source the plugin cannot read (valueFrom, envFrom or a Service), so \
                             the program the container runs cannot be told"
                        )
                    })
                })
                .collect::<Result<Vec<_>, _>>()
        };
        let command = expand("command", &container.command)?;
        let args = expand("args", &container.args)?;
        let (path, path_unknown) = match env.vars.get("PATH") {
            Some(Value::Known(path)) => (path.clone(), false),
            Some(Value::Unknown(_)) => (String::new(), true),
            // The image's PATH, unless an envFrom source may replace it.
            None => (String::new(), env.others_unknown),
        };
        Ok(Self {
            command,
            args,
            working_dir: container.working_dir.clone().unwrap_or_default(),
            path,
            path_unknown,
        })
    }

    /// Whether the pod says nothing the image does not.
    pub(crate) fn is_image_default(&self) -> bool {
        *self == Self::default()
    }
}

#[cfg(test)]
mod tests;
