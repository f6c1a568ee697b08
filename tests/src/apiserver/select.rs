//! Field and label selectors, as the API server parses them from a query string.

use serde_json::Value;

use super::store::Failure;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Test {
    Equals(String),
    NotEquals(String),
    Exists,
    NotExists,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// A dotted path into the object, such as `spec.nodeName`.
    Field(Vec<String>),
    Label(String),
}

/// The conjunction of a `fieldSelector` and a `labelSelector`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Selector {
    terms: Vec<(Target, Test)>,
}

fn split_term(term: &str) -> Option<(&str, bool, &str)> {
    if let Some((k, v)) = term.split_once("!=") {
        return Some((k, false, v));
    }
    term.split_once("==")
        .or_else(|| term.split_once('='))
        .map(|(k, v)| (k, true, v))
}

impl Selector {
    /// Parses `fieldSelector` (`a.b=v`, `a.b==v`, `a.b!=v`, comma-separated) and
    /// `labelSelector` (the same plus `key` and `!key`; set-based forms are rejected).
    pub fn parse(fields: Option<&str>, labels: Option<&str>) -> Result<Self, Failure> {
        let mut terms = Vec::new();
        for term in fields
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
        {
            let (path, equals, value) = split_term(term)
                .ok_or_else(|| Failure::bad_request(format!("invalid field selector: {term:?}")))?;
            let target = Target::Field(path.trim().split('.').map(str::to_owned).collect());
            terms.push((target, test(equals, value.trim())));
        }
        for term in labels
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
        {
            if term.contains('(') || term.contains(' ') {
                return Err(Failure::bad_request(format!(
                    "unsupported label selector (set-based): {term:?}"
                )));
            }
            let parsed = match split_term(term) {
                Some((key, equals, value)) => (key.trim(), test(equals, value.trim())),
                None => match term.strip_prefix('!') {
                    Some(key) => (key, Test::NotExists),
                    None => (term, Test::Exists),
                },
            };
            terms.push((Target::Label(parsed.0.to_owned()), parsed.1));
        }
        Ok(Self { terms })
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.terms.iter().all(|(target, test)| {
            let value = match target {
                Target::Field(path) => Some(
                    path.iter()
                        .try_fold(obj, |v, key| v.get(key))
                        .map_or_else(String::new, |v| match v {
                            Value::String(s) => s.clone(),
                            Value::Null => String::new(),
                            other => other.to_string(),
                        }),
                ),
                Target::Label(key) => obj
                    .pointer("/metadata/labels")
                    .and_then(|labels| labels.get(key))
                    .and_then(Value::as_str)
                    .map(str::to_owned),
            };
            match test {
                Test::Equals(want) => value.as_deref() == Some(want.as_str()),
                Test::NotEquals(want) => value.as_deref() != Some(want.as_str()),
                Test::Exists => value.is_some(),
                Test::NotExists => value.is_none(),
            }
        })
    }
}

fn test(equals: bool, value: &str) -> Test {
    if equals {
        Test::Equals(value.to_owned())
    } else {
        Test::NotEquals(value.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::Selector;

    #[test]
    fn field_and_label_terms() {
        let pod = json!({
            "metadata": {"name": "p", "namespace": "ns", "labels": {"app": "x"}},
            "spec": {"nodeName": "n1"},
            "status": {"phase": "Pending"},
        });
        let yes = [
            (Some("spec.nodeName=n1"), None),
            (Some("spec.nodeName==n1,metadata.name=p"), None),
            (Some("status.phase!=Running"), Some("app=x")),
            (None, Some("app,!other")),
            (Some("spec.schedulerName="), Some("app!=y")),
        ];
        for (fields, labels) in yes {
            let sel = Selector::parse(fields, labels).expect("parses");
            assert!(sel.matches(&pod), "{fields:?} {labels:?} should match");
        }
        let no = [
            (Some("spec.nodeName=n2"), None),
            (Some("metadata.name!=p"), None),
            (None, Some("app=y")),
            (None, Some("!app")),
            (None, Some("other")),
        ];
        for (fields, labels) in no {
            let sel = Selector::parse(fields, labels).expect("parses");
            assert!(!sel.matches(&pod), "{fields:?} {labels:?} should not match");
        }
        assert!(Selector::parse(Some("nonsense"), None).is_err());
        assert!(Selector::parse(None, Some("app in (x,y)")).is_err());
    }
}
