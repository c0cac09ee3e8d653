//! Label and field selectors, as list and watch requests carry them.

use serde_json::Value;

#[derive(Clone, Debug, PartialEq)]
enum Term {
    Exists(String),
    NotExists(String),
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// A parsed selector; the empty selector matches everything.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Selector {
    labels: Vec<Term>,
    fields: Vec<(String, bool, String)>,
}

/// Splits on commas outside parentheses.
fn split_terms(s: &str) -> Vec<&str> {
    let (mut depth, mut start, mut out) = (0, 0, Vec::new());
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(s[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(s[start..].trim());
    out.into_iter().filter(|t| !t.is_empty()).collect()
}

fn set(values: &str) -> Result<Vec<String>, String> {
    let inner = values
        .trim()
        .strip_prefix('(')
        .and_then(|v| v.strip_suffix(')'))
        .ok_or_else(|| format!("{values:?}: expected (a,b)"))?;
    Ok(inner.split(',').map(|v| v.trim().to_owned()).collect())
}

fn label_term(t: &str) -> Result<Term, String> {
    if let Some((k, v)) = t.split_once(" notin ") {
        return Ok(Term::NotIn(k.trim().into(), set(v)?));
    }
    if let Some((k, v)) = t.split_once(" in ") {
        return Ok(Term::In(k.trim().into(), set(v)?));
    }
    if let Some((k, v)) = t.split_once("!=") {
        return Ok(Term::NotEquals(k.trim().into(), v.trim().into()));
    }
    if let Some((k, v)) = t.split_once("==").or_else(|| t.split_once('=')) {
        return Ok(Term::Equals(k.trim().into(), v.trim().into()));
    }
    if let Some(k) = t.strip_prefix('!') {
        return Ok(Term::NotExists(k.trim().into()));
    }
    if t.contains(char::is_whitespace) {
        return Err(format!("unable to parse requirement {t:?}"));
    }
    Ok(Term::Exists(t.into()))
}

impl Selector {
    /// Parses a `labelSelector` and a `fieldSelector`.
    pub fn parse(labels: Option<&str>, fields: Option<&str>) -> Result<Self, String> {
        let labels = split_terms(labels.unwrap_or_default())
            .into_iter()
            .map(label_term)
            .collect::<Result<_, _>>()?;
        let fields = split_terms(fields.unwrap_or_default())
            .into_iter()
            .map(|t| {
                if let Some((k, v)) = t.split_once("!=") {
                    Ok((k.trim().to_owned(), false, v.trim().to_owned()))
                } else if let Some((k, v)) = t.split_once("==").or_else(|| t.split_once('=')) {
                    Ok((k.trim().to_owned(), true, v.trim().to_owned()))
                } else {
                    Err(format!("invalid field selector {t:?}"))
                }
            })
            .collect::<Result<_, String>>()?;
        Ok(Self { labels, fields })
    }

    /// Whether `object` matches.
    pub fn matches(&self, object: &Value) -> bool {
        // Read in place: this runs for every object a list or a watch
        // passes, 10,000 times for a list of Nodes.
        let labels = object["metadata"]["labels"].as_object();
        let get = |k: &str| labels.and_then(|m| m.get(k)).and_then(Value::as_str);
        let label_ok = self.labels.iter().all(|term| match term {
            Term::Exists(k) => get(k).is_some(),
            Term::NotExists(k) => get(k).is_none(),
            Term::Equals(k, v) => get(k) == Some(v.as_str()),
            Term::NotEquals(k, v) => get(k) != Some(v.as_str()),
            Term::In(k, vs) => get(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Term::NotIn(k, vs) => get(k).is_none_or(|l| vs.iter().all(|v| v != l)),
        });
        label_ok
            && self.fields.iter().all(|(path, equal, want)| {
                let mut value = object;
                for part in path.split('.') {
                    value = &value[part];
                }
                let have = match value {
                    Value::Null => String::new(),
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                (have == *want) == *equal
            })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn label_and_field_selectors_match_as_kubernetes_does() {
        let obj = json!({"metadata": {"name": "web", "labels": {"app": "web", "tier": "front"}}, "spec": {"type": "LoadBalancer"}});
        let cases = [
            ("app=web", "", true),
            ("app==web,tier", "", true),
            ("app!=web", "", false),
            ("!missing", "", true),
            ("tier in (front, back)", "", true),
            ("tier notin (front)", "", false),
            ("missing notin (x)", "", true),
            ("", "metadata.name=web", true),
            ("", "spec.type=ClusterIP", false),
            ("", "spec.type!=ClusterIP", true),
            ("app=web", "metadata.name=other", false),
        ];
        for (labels, fields, want) in cases {
            let s = Selector::parse(Some(labels), Some(fields)).unwrap();
            assert_eq!(s.matches(&obj), want, "{labels} / {fields}");
        }
        assert!(Selector::parse(Some("a in b"), None).is_err());
    }
}
