//! Seeding and inspecting objects directly from Rust, and loading seed files.

use std::path::Path;

use serde_json::{json, Value};

use super::handlers::apply_create_defaults;
use super::resources::Resource;
use super::server::lock;
use super::store::{meta_str, set_meta};
use super::{validate, ApiServerError, TestApiServer};

impl TestApiServer {
    /// Creates or replaces an object given with `apiVersion` and `kind` (Namespace, Pod,
    /// NetworkAttachmentDefinition, Event). Namespaced objects default to namespace `default`;
    /// a missing namespace is created. Returns the stored object.
    pub fn put_object(&self, mut obj: Value) -> Result<Value, ApiServerError> {
        let av = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
        let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
        let res = Resource::from_kind(av, kind).ok_or_else(|| {
            ApiServerError::InvalidObject(format!("unsupported apiVersion/kind {av:?}/{kind:?}"))
        })?;
        let name = meta_str(&obj, "name").to_string();
        validate::name(res, &name).map_err(|e| ApiServerError::InvalidObject(e.message))?;
        let ns = if res.namespaced() {
            let ns = meta_str(&obj, "namespace");
            if ns.is_empty() { "default" } else { ns }.to_string()
        } else {
            String::new()
        };
        if res.namespaced() {
            validate::name(Resource::Namespace, &ns)
                .map_err(|e| ApiServerError::InvalidObject(e.message))?;
        }
        let mut store = lock(&self.shared.store);
        if res.namespaced() && !store.namespace_exists(&ns) {
            let mut nsobj = json!({ "metadata": { "name": ns } });
            apply_create_defaults(Resource::Namespace, &ns, &mut nsobj);
            store.create(Resource::Namespace, "", &ns, nsobj);
        }
        if let Some(old) = store.get(res, &ns, &name).cloned() {
            for keep in ["uid", "creationTimestamp"] {
                if meta_str(&obj, keep).is_empty() {
                    set_meta(&mut obj, keep, old["metadata"][keep].clone());
                }
            }
            set_meta(&mut obj, "namespace", json!(ns));
            Ok(store.update(res, &ns, &name, obj))
        } else {
            match res {
                Resource::Namespace => apply_create_defaults(res, &name, &mut obj),
                Resource::Nad => set_meta(&mut obj, "generation", json!(1)),
                _ => {}
            }
            Ok(store.create(res, &ns, &name, obj))
        }
    }

    /// Creates namespace `name` if it does not exist; returns it.
    pub fn put_namespace(&self, name: &str) -> Result<Value, ApiServerError> {
        if let Some(ns) = lock(&self.shared.store).get(Resource::Namespace, "", name) {
            return Ok(ns.clone());
        }
        self.put_object(
            json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": name } }),
        )
    }

    /// Creates or replaces a pod (`apiVersion`/`kind` may be omitted). Status is stored as given.
    pub fn put_pod(&self, mut pod: Value) -> Result<Value, ApiServerError> {
        if !pod.is_object() {
            return Err(ApiServerError::InvalidObject(
                "a pod must be a JSON object".into(),
            ));
        }
        pod["apiVersion"] = json!("v1");
        pod["kind"] = json!("Pod");
        self.put_object(pod)
    }

    /// Creates or replaces a NetworkAttachmentDefinition with `spec.config = config` and
    /// the given annotations (e.g. `k8s.v1.cni.cncf.io/resourceName`).
    pub fn put_nad(
        &self,
        ns: &str,
        name: &str,
        config: &str,
        annotations: &[(&str, &str)],
    ) -> Result<Value, ApiServerError> {
        let annotations: serde_json::Map<String, Value> = annotations
            .iter()
            .map(|(k, v)| ((*k).to_string(), json!(v)))
            .collect();
        let mut meta = json!({ "name": name, "namespace": ns });
        if !annotations.is_empty() {
            meta["annotations"] = Value::Object(annotations);
        }
        self.put_object(json!({
            "apiVersion": "k8s.cni.cncf.io/v1",
            "kind": "NetworkAttachmentDefinition",
            "metadata": meta,
            "spec": { "config": config },
        }))
    }

    /// A stored object.
    pub fn get_object(&self, res: Resource, ns: &str, name: &str) -> Option<Value> {
        lock(&self.shared.store).get(res, ns, name).cloned()
    }

    /// A stored pod.
    pub fn get_pod(&self, ns: &str, name: &str) -> Option<Value> {
        self.get_object(Resource::Pod, ns, name)
    }

    /// A stored NetworkAttachmentDefinition.
    pub fn get_nad(&self, ns: &str, name: &str) -> Option<Value> {
        self.get_object(Resource::Nad, ns, name)
    }

    /// Deletes a pod; whether it existed.
    pub fn delete_pod(&self, ns: &str, name: &str) -> bool {
        lock(&self.shared.store)
            .delete(Resource::Pod, ns, name)
            .is_some()
    }

    /// Deletes a NetworkAttachmentDefinition; whether it existed.
    pub fn delete_nad(&self, ns: &str, name: &str) -> bool {
        lock(&self.shared.store)
            .delete(Resource::Nad, ns, name)
            .is_some()
    }

    /// Events in `ns` from both core/v1 and events.k8s.io/v1, oldest first (by resourceVersion).
    pub fn events(&self, ns: &str) -> Vec<Value> {
        let store = lock(&self.shared.store);
        let mut evs: Vec<Value> = [Resource::CoreEvent, Resource::Event]
            .into_iter()
            .flat_map(|r| store.list(r, Some(ns)))
            .cloned()
            .collect();
        evs.sort_by_key(|e| meta_str(e, "resourceVersion").parse::<u64>().unwrap_or(0));
        evs
    }

    /// The latest resourceVersion handed out.
    pub fn resource_version(&self) -> u64 {
        lock(&self.shared.store).resource_version()
    }

    /// Loads every `*.json` file in `dir` (sorted by name): single objects or `kind: List`.
    /// Returns the number of objects stored.
    pub fn load_dir(&self, dir: &Path) -> Result<usize, ApiServerError> {
        let io = |source| ApiServerError::Io {
            path: dir.to_path_buf(),
            source,
        };
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .map_err(io)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(io)?
            .into_iter()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .collect();
        files.sort();
        let mut objects = Vec::new();
        for path in files {
            let text = std::fs::read(&path).map_err(|source| ApiServerError::Io {
                path: path.clone(),
                source,
            })?;
            let v: Value =
                serde_json::from_slice(&text).map_err(|source| ApiServerError::Json {
                    path: path.clone(),
                    source,
                })?;
            match v.get("kind").and_then(Value::as_str) {
                Some("List") => objects.extend(v["items"].as_array().cloned().unwrap_or_default()),
                _ => objects.push(v),
            }
        }
        // Namespaces first so their own labels win over auto-created ones.
        objects.sort_by_key(|o| o.get("kind").and_then(Value::as_str) != Some("Namespace"));
        let n = objects.len();
        for o in objects {
            self.put_object(o)?;
        }
        Ok(n)
    }
}
