//! The in-memory object store: objects by resource, namespace and name, plus the global
//! resourceVersion counter and system field generation (uid, creationTimestamp).

use std::collections::hash_map::RandomState;
use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use super::resources::Resource;

type Key = (Resource, String, String);

/// All stored objects. Every write bumps one global resourceVersion counter.
#[derive(Debug, Default)]
pub struct Store {
    objects: BTreeMap<Key, Value>,
    rv: u64,
    seq: u64,
}

/// `metadata.<field>` as a string, or "".
pub fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// Sets `metadata.<field>`, creating `metadata` when needed.
pub fn set_meta(obj: &mut Value, field: &str, value: Value) {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    obj["metadata"][field] = value;
}

/// Current time as RFC 3339 with second precision, as Kubernetes writes timestamps.
pub fn now_rfc3339() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since the epoch (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

impl Store {
    /// A fresh 64-bit random value (RandomState is seeded per instance by the OS).
    fn random(&mut self) -> u64 {
        self.seq += 1;
        let mut h = RandomState::new().build_hasher();
        h.write_u64(self.seq);
        h.finish()
    }

    /// A random version-4 style UID.
    pub fn new_uid(&mut self) -> String {
        let a = self.random();
        let b = self.random();
        format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0x0fff,
            0x8000 | ((b >> 48) & 0x3fff),
            b & 0xffff_ffff_ffff
        )
    }

    /// A 5 character suffix for `generateName`, from the apiserver's alphabet.
    pub fn name_suffix(&mut self) -> String {
        const ALPHA: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        let mut r = self.random();
        (0..5)
            .map(|_| {
                let c = ALPHA[(r % ALPHA.len() as u64) as usize] as char;
                r /= ALPHA.len() as u64;
                c
            })
            .collect()
    }

    /// The latest resourceVersion handed out.
    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    fn bump(&mut self) -> String {
        self.rv += 1;
        self.rv.to_string()
    }

    /// Whether namespace `ns` exists.
    pub fn namespace_exists(&self, ns: &str) -> bool {
        self.get(Resource::Namespace, "", ns).is_some()
    }

    /// One object.
    pub fn get(&self, res: Resource, ns: &str, name: &str) -> Option<&Value> {
        self.objects.get(&(res, ns.to_string(), name.to_string()))
    }

    /// Objects of one resource, in one namespace or (with `None`) all, ordered by namespace and name.
    pub fn list(&self, res: Resource, ns: Option<&str>) -> Vec<&Value> {
        self.objects
            .iter()
            .filter(|((r, n, _), _)| *r == res && ns.is_none_or(|ns| ns == n))
            .map(|(_, v)| v)
            .collect()
    }

    /// Stores a new object: sets uid (when absent), creationTimestamp (when absent),
    /// and a new resourceVersion. Returns the stored object.
    pub fn create(&mut self, res: Resource, ns: &str, name: &str, mut obj: Value) -> Value {
        obj["apiVersion"] = json!(res.api_version());
        obj["kind"] = json!(res.kind());
        set_meta(&mut obj, "name", json!(name));
        if res.namespaced() {
            set_meta(&mut obj, "namespace", json!(ns));
        }
        if meta_str(&obj, "uid").is_empty() {
            let uid = self.new_uid();
            set_meta(&mut obj, "uid", json!(uid));
        }
        if meta_str(&obj, "creationTimestamp").is_empty() {
            set_meta(&mut obj, "creationTimestamp", json!(now_rfc3339()));
        }
        let rv = self.bump();
        set_meta(&mut obj, "resourceVersion", json!(rv));
        self.objects
            .insert((res, ns.to_string(), name.to_string()), obj.clone());
        obj
    }

    /// Replaces an existing object with a new resourceVersion. Returns the stored object.
    pub fn update(&mut self, res: Resource, ns: &str, name: &str, mut obj: Value) -> Value {
        let rv = self.bump();
        set_meta(&mut obj, "resourceVersion", json!(rv));
        self.objects
            .insert((res, ns.to_string(), name.to_string()), obj.clone());
        obj
    }

    /// Removes an object, returning it. Counts as a write.
    pub fn delete(&mut self, res: Resource, ns: &str, name: &str) -> Option<Value> {
        let v = self
            .objects
            .remove(&(res, ns.to_string(), name.to_string()))?;
        self.bump();
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_sets_system_fields_and_bumps_rv() {
        let mut s = Store::default();
        let a = s.create(Resource::Pod, "ns", "a", json!({"metadata":{}}));
        let b = s.create(Resource::Pod, "ns", "b", json!({}));
        assert_eq!(meta_str(&a, "resourceVersion"), "1");
        assert_eq!(meta_str(&b, "resourceVersion"), "2");
        assert_eq!(meta_str(&a, "namespace"), "ns");
        assert_eq!(meta_str(&a, "uid").len(), 36);
        assert_ne!(meta_str(&a, "uid"), meta_str(&b, "uid"));
        assert_eq!(a["kind"], "Pod");
        let u = s.update(Resource::Pod, "ns", "a", a.clone());
        assert_eq!(meta_str(&u, "resourceVersion"), "3");
        assert_eq!(s.list(Resource::Pod, Some("ns")).len(), 2);
        assert_eq!(s.list(Resource::Pod, Some("other")).len(), 0);
        assert!(s.delete(Resource::Pod, "ns", "a").is_some());
        assert_eq!(s.resource_version(), 4);
        assert!(s.delete(Resource::Pod, "ns", "a").is_none());
    }

    #[test]
    fn timestamp_shape() {
        let t = now_rfc3339();
        assert_eq!(t.len(), 20, "{t}");
        assert!(t.ends_with('Z') && t.as_bytes()[10] == b'T', "{t}");
        assert!(t.starts_with("20"), "{t}");
    }
}
