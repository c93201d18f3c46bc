//! Request path parsing into API routes, and query parameters.

use super::resources::Resource;

/// What a request path addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// `/version`.
    Version,
    /// `/api`.
    CoreVersions,
    /// `/apis`.
    Groups,
    /// `/api/v1` or `/apis/{group}/{version}`.
    ResourceList {
        /// API group ("" for core).
        group: String,
    },
    /// A collection: `.../pods` (namespace `None` = all namespaces, or a cluster-scoped resource).
    Collection {
        /// The resource.
        res: Resource,
        /// The namespace, if the path names one.
        ns: Option<String>,
    },
    /// One object, optionally its `status` subresource.
    Object {
        /// The resource.
        res: Resource,
        /// The namespace ("" for cluster-scoped resources).
        ns: String,
        /// The object name.
        name: String,
        /// Whether the path addresses the `status` subresource.
        status: bool,
    },
    /// Nothing the server serves.
    Unknown,
}

const GROUPS: [(&str, &str); 3] = [
    ("", "v1"),
    ("events.k8s.io", "v1"),
    ("k8s.cni.cncf.io", "v1"),
];

/// Parses a request path.
pub fn parse(path: &str) -> Route {
    let segs: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    let (group, version, rest) = match segs.as_slice() {
        ["version"] => return Route::Version,
        ["api"] => return Route::CoreVersions,
        ["apis"] => return Route::Groups,
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Route::Unknown,
    };
    if !GROUPS.contains(&(group, version)) {
        return Route::Unknown;
    }
    let res = |plural: &str| Resource::from_path(group, version, plural);
    let route = match rest {
        [] => Some(Route::ResourceList {
            group: group.to_string(),
        }),
        [plural] => res(plural).map(|res| Route::Collection { res, ns: None }),
        [plural, name] => res(plural)
            .filter(|r| !r.namespaced())
            .map(|res| Route::Object {
                res,
                ns: String::new(),
                name: name.to_string(),
                status: false,
            }),
        ["namespaces", ns, plural] => {
            res(plural)
                .filter(|r| r.namespaced())
                .map(|res| Route::Collection {
                    res,
                    ns: Some(ns.to_string()),
                })
        }
        ["namespaces", ns, plural, name] => {
            res(plural)
                .filter(|r| r.namespaced())
                .map(|res| Route::Object {
                    res,
                    ns: ns.to_string(),
                    name: name.to_string(),
                    status: false,
                })
        }
        ["namespaces", ns, plural, name, "status"] => res(plural)
            .filter(|r| r.namespaced() && r.has_status())
            .map(|res| Route::Object {
                res,
                ns: ns.to_string(),
                name: name.to_string(),
                status: true,
            }),
        _ => None,
    };
    route.unwrap_or(Route::Unknown)
}

/// Decoded query parameters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Query {
    pairs: Vec<(String, String)>,
}

impl Query {
    /// Parses a raw query string.
    pub fn parse(raw: Option<&str>) -> Query {
        Query {
            pairs: raw
                .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
                .unwrap_or_default(),
        }
    }

    /// The first value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Whether `key` is present with a true-ish value (`true` or `1`).
    pub fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(res: Resource, ns: &str, name: &str, status: bool) -> Route {
        Route::Object {
            res,
            ns: ns.into(),
            name: name.into(),
            status,
        }
    }

    #[test]
    fn parses_real_paths() {
        assert_eq!(
            parse("/api/v1/namespaces/a/pods/p"),
            obj(Resource::Pod, "a", "p", false)
        );
        assert_eq!(
            parse("/api/v1/namespaces/a/pods/p/status"),
            obj(Resource::Pod, "a", "p", true)
        );
        assert_eq!(
            parse("/api/v1/namespaces/a"),
            obj(Resource::Namespace, "", "a", false)
        );
        assert_eq!(
            parse("/api/v1/namespaces"),
            Route::Collection {
                res: Resource::Namespace,
                ns: None
            }
        );
        assert_eq!(
            parse("/api/v1/pods"),
            Route::Collection {
                res: Resource::Pod,
                ns: None
            }
        );
        assert_eq!(
            parse("/apis/k8s.cni.cncf.io/v1/namespaces/a/network-attachment-definitions"),
            Route::Collection {
                res: Resource::Nad,
                ns: Some("a".into())
            }
        );
        assert_eq!(
            parse("/apis/k8s.cni.cncf.io/v1/namespaces/a/network-attachment-definitions/n"),
            obj(Resource::Nad, "a", "n", false)
        );
        assert_eq!(
            parse("/apis/events.k8s.io/v1/namespaces/a/events"),
            Route::Collection {
                res: Resource::Event,
                ns: Some("a".into())
            }
        );
        assert_eq!(
            parse("/apis/k8s.cni.cncf.io/v1"),
            Route::ResourceList {
                group: "k8s.cni.cncf.io".into()
            }
        );
        assert_eq!(parse("/api/v1/namespaces/a/services"), Route::Unknown);
        assert_eq!(parse("/api/v2/namespaces/a/pods"), Route::Unknown);
        assert_eq!(
            parse("/apis/k8s.cni.cncf.io/v1/namespaces/a/network-attachment-definitions/n/status"),
            Route::Unknown
        );
        assert_eq!(parse("/api/v1/pods/p"), Route::Unknown);
        assert_eq!(parse("/healthz"), Route::Unknown);
    }

    #[test]
    fn query_decoding() {
        let q = Query::parse(Some("labelSelector=app%3Dx%2Cb&watch=1"));
        assert_eq!(q.get("labelSelector"), Some("app=x,b"));
        assert!(q.flag("watch"));
        assert!(!q.flag("missing"));
    }
}
