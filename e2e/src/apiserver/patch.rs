//! JSON merge patch (RFC 7386) and JSON patch (RFC 6902) over `serde_json::Value`.

use serde_json::{Map, Value};

/// Why a JSON patch failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PatchError {
    /// The patch document is malformed (answered as 400).
    #[error("{0}")]
    Decode(String),
    /// A well-formed operation does not apply to the document (answered as 422).
    #[error("{0}")]
    Apply(String),
}

/// Applies an RFC 7386 merge patch in place.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(t) = target {
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// Applies an RFC 6902 JSON patch atomically: on error `doc` is left unchanged.
pub fn json_patch(doc: &mut Value, patch: &Value) -> Result<(), PatchError> {
    let ops = patch.as_array().ok_or_else(|| {
        PatchError::Decode(
            "json: cannot unmarshal object into Go value of type jsonpatch.Patch".into(),
        )
    })?;
    let mut work = doc.clone();
    for op in ops {
        apply_op(&mut work, op)?;
    }
    *doc = work;
    Ok(())
}

fn str_field<'a>(op: &'a Value, field: &str) -> Result<&'a str, PatchError> {
    op.get(field)
        .and_then(Value::as_str)
        .ok_or_else(|| PatchError::Decode(format!("operation missing {field} field")))
}

fn apply_op(doc: &mut Value, op: &Value) -> Result<(), PatchError> {
    let kind = str_field(op, "op")?;
    let path = str_field(op, "path")?;
    let tokens = parse_pointer(path)?;
    let value = || {
        op.get("value")
            .cloned()
            .ok_or_else(|| PatchError::Decode(format!("{kind} operation missing value")))
    };
    match kind {
        "add" => add(doc, &tokens, value()?, kind, path),
        "remove" => remove(doc, &tokens, kind, path).map(|_| ()),
        "replace" => {
            let v = value()?;
            let target = lookup_mut(doc, &tokens).ok_or_else(|| missing(kind, path))?;
            *target = v;
            Ok(())
        }
        "test" => {
            let v = value()?;
            match lookup_mut(doc, &tokens) {
                Some(cur) if *cur == v => Ok(()),
                _ => Err(PatchError::Apply(format!(
                    "testing value {path} failed: test failed"
                ))),
            }
        }
        "move" | "copy" => {
            let from = str_field(op, "from")?;
            let from_tokens = parse_pointer(from)?;
            if kind == "move"
                && tokens.len() > from_tokens.len()
                && tokens.starts_with(&from_tokens)
            {
                return Err(PatchError::Apply(format!(
                    "move operation does not apply: cannot move {from} into its own child {path}"
                )));
            }
            let v = if kind == "move" {
                remove(doc, &from_tokens, kind, from)?
            } else {
                lookup_mut(doc, &from_tokens)
                    .ok_or_else(|| missing(kind, from))?
                    .clone()
            };
            add(doc, &tokens, v, kind, path)
        }
        other => Err(PatchError::Decode(format!("Unexpected kind: {other}"))),
    }
}

fn missing(kind: &str, path: &str) -> PatchError {
    PatchError::Apply(format!(
        "{kind} operation does not apply: doc is missing path: \"{path}\": missing value"
    ))
}

/// Splits a JSON pointer into unescaped tokens (`~1` is `/`, `~0` is `~`).
pub fn parse_pointer(path: &str) -> Result<Vec<String>, PatchError> {
    if path.is_empty() {
        return Ok(Vec::new());
    }
    let rest = path
        .strip_prefix('/')
        .ok_or_else(|| PatchError::Decode(format!("invalid JSON pointer {path:?}")))?;
    Ok(rest
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect())
}

fn index(token: &str, len: usize, allow_end: bool) -> Option<usize> {
    if token.is_empty() || (token.len() > 1 && token.starts_with('0')) {
        return None;
    }
    if !token.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let i: usize = token.parse().ok()?;
    if i < len || (allow_end && i == len) {
        Some(i)
    } else {
        None
    }
}

fn lookup_mut<'a>(doc: &'a mut Value, tokens: &[String]) -> Option<&'a mut Value> {
    let mut cur = doc;
    for t in tokens {
        cur = match cur {
            Value::Object(m) => m.get_mut(t)?,
            Value::Array(a) => {
                let i = index(t, a.len(), false)?;
                a.get_mut(i)?
            }
            _ => return None,
        };
    }
    Some(cur)
}

fn add(
    doc: &mut Value,
    tokens: &[String],
    v: Value,
    kind: &str,
    path: &str,
) -> Result<(), PatchError> {
    let Some((last, parent)) = tokens.split_last() else {
        *doc = v;
        return Ok(());
    };
    match lookup_mut(doc, parent).ok_or_else(|| missing(kind, path))? {
        Value::Object(m) => {
            m.insert(last.clone(), v);
            Ok(())
        }
        Value::Array(a) => {
            let i = if last == "-" {
                a.len()
            } else {
                index(last, a.len(), true).ok_or_else(|| {
                    PatchError::Apply(format!(
                        "{kind} operation does not apply: index out of bounds: {path}"
                    ))
                })?
            };
            a.insert(i, v);
            Ok(())
        }
        _ => Err(missing(kind, path)),
    }
}

fn remove(doc: &mut Value, tokens: &[String], kind: &str, path: &str) -> Result<Value, PatchError> {
    let Some((last, parent)) = tokens.split_last() else {
        return Err(PatchError::Apply(format!(
            "{kind} operation does not apply: cannot remove the whole document"
        )));
    };
    match lookup_mut(doc, parent).ok_or_else(|| missing(kind, path))? {
        Value::Object(m) => m.remove(last).ok_or_else(|| missing(kind, path)),
        Value::Array(a) => {
            let i = index(last, a.len(), false).ok_or_else(|| missing(kind, path))?;
            Ok(a.remove(i))
        }
        _ => Err(missing(kind, path)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_rfc7386_examples() {
        let mut doc = json!({"a":"b","c":{"d":"e","f":"g"}});
        merge_patch(&mut doc, &json!({"a":"z","c":{"f":null}}));
        assert_eq!(doc, json!({"a":"z","c":{"d":"e"}}));
        let mut doc = json!({"a":[1,2]});
        merge_patch(&mut doc, &json!({"a":[3]}));
        assert_eq!(doc, json!({"a":[3]}));
        let mut doc = json!({"a":"b"});
        merge_patch(&mut doc, &json!({"a":{"b":"c"}}));
        assert_eq!(doc, json!({"a":{"b":"c"}}));
    }

    #[test]
    fn json_patch_all_ops_and_escapes() {
        let mut doc =
            json!({"metadata":{"annotations":{"k8s.v1.cni.cncf.io/networks":"a"}},"l":[1,2,3]});
        json_patch(
            &mut doc,
            &json!([
                {"op":"test","path":"/metadata/annotations/k8s.v1.cni.cncf.io~1networks","value":"a"},
                {"op":"replace","path":"/metadata/annotations/k8s.v1.cni.cncf.io~1networks","value":"b"},
                {"op":"add","path":"/metadata/annotations/a~0b","value":"t"},
                {"op":"add","path":"/l/-","value":4},
                {"op":"add","path":"/l/0","value":0},
                {"op":"remove","path":"/l/1"},
                {"op":"copy","from":"/l","path":"/m"},
                {"op":"move","from":"/m","path":"/n"}
            ]),
        )
        .unwrap();
        assert_eq!(
            doc,
            json!({"metadata":{"annotations":{"k8s.v1.cni.cncf.io/networks":"b","a~b":"t"}},"l":[0,2,3,4],"n":[0,2,3,4]})
        );
    }

    #[test]
    fn json_patch_failures_leave_doc_unchanged() {
        let orig = json!({"a":1});
        let mut doc = orig.clone();
        let err = json_patch(
            &mut doc,
            &json!([{"op":"replace","path":"/a","value":2},{"op":"test","path":"/a","value":1}]),
        )
        .unwrap_err();
        assert!(
            matches!(err, PatchError::Apply(ref m) if m.contains("test failed")),
            "{err:?}"
        );
        assert_eq!(doc, orig);
        assert!(matches!(
            json_patch(&mut doc, &json!([{"op":"remove","path":"/zz"}])),
            Err(PatchError::Apply(_))
        ));
        assert!(matches!(
            json_patch(&mut doc, &json!([{"op":"nope","path":"/a"}])),
            Err(PatchError::Decode(_))
        ));
        assert!(matches!(
            json_patch(&mut doc, &json!({"op":"add"})),
            Err(PatchError::Decode(_))
        ));
        assert!(matches!(
            json_patch(&mut doc, &json!([{"op":"add","path":"a","value":1}])),
            Err(PatchError::Decode(_))
        ));
    }
}
