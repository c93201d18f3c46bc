//! The resource types the test API server serves, and their naming facts.

/// A resource type served by the test API server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resource {
    /// core/v1 `namespaces` (cluster scoped).
    Namespace,
    /// core/v1 `pods`.
    Pod,
    /// core/v1 `events`.
    CoreEvent,
    /// `events.k8s.io/v1` `events`.
    Event,
    /// `k8s.cni.cncf.io/v1` `network-attachment-definitions`.
    Nad,
}

impl Resource {
    /// Every served resource.
    pub const ALL: [Resource; 5] = [
        Resource::Namespace,
        Resource::Pod,
        Resource::CoreEvent,
        Resource::Event,
        Resource::Nad,
    ];

    /// API group ("" for core).
    pub fn group(self) -> &'static str {
        match self {
            Resource::Namespace | Resource::Pod | Resource::CoreEvent => "",
            Resource::Event => "events.k8s.io",
            Resource::Nad => "k8s.cni.cncf.io",
        }
    }

    /// API version within the group.
    pub fn version(self) -> &'static str {
        "v1"
    }

    /// `apiVersion` field value (`v1` or `group/v1`).
    pub fn api_version(self) -> String {
        match self.group() {
            "" => self.version().to_string(),
            g => format!("{g}/{}", self.version()),
        }
    }

    /// Plural resource name used in paths.
    pub fn plural(self) -> &'static str {
        match self {
            Resource::Namespace => "namespaces",
            Resource::Pod => "pods",
            Resource::CoreEvent | Resource::Event => "events",
            Resource::Nad => "network-attachment-definitions",
        }
    }

    /// Singular name used in discovery.
    pub fn singular(self) -> &'static str {
        match self {
            Resource::Namespace => "namespace",
            Resource::Pod => "pod",
            Resource::CoreEvent | Resource::Event => "event",
            Resource::Nad => "network-attachment-definition",
        }
    }

    /// Object kind.
    pub fn kind(self) -> &'static str {
        match self {
            Resource::Namespace => "Namespace",
            Resource::Pod => "Pod",
            Resource::CoreEvent | Resource::Event => "Event",
            Resource::Nad => "NetworkAttachmentDefinition",
        }
    }

    /// Whether objects live in a namespace.
    pub fn namespaced(self) -> bool {
        !matches!(self, Resource::Namespace)
    }

    /// Whether the resource has a `status` subresource.
    pub fn has_status(self) -> bool {
        matches!(self, Resource::Pod)
    }

    /// Built-in types list their items without `kind`/`apiVersion`; custom resources keep them.
    pub fn builtin(self) -> bool {
        !matches!(self, Resource::Nad)
    }

    /// Whether a PUT without `metadata.resourceVersion` is accepted (true for built-in types,
    /// false for custom resources, as in the real apiserver).
    pub fn allows_unconditional_update(self) -> bool {
        self.builtin()
    }

    /// Qualified resource as used in error messages: `pods`, `network-attachment-definitions.k8s.cni.cncf.io`.
    pub fn qualified(self) -> String {
        match self.group() {
            "" => self.plural().to_string(),
            g => format!("{}.{g}", self.plural()),
        }
    }

    /// Qualified kind as used in `Invalid` messages: `Pod`, `NetworkAttachmentDefinition.k8s.cni.cncf.io`.
    pub fn qualified_kind(self) -> String {
        match self.group() {
            "" => self.kind().to_string(),
            g => format!("{}.{g}", self.kind()),
        }
    }

    /// Resource for a group, version and plural from a request path.
    pub fn from_path(group: &str, version: &str, plural: &str) -> Option<Resource> {
        Resource::ALL
            .into_iter()
            .find(|r| r.group() == group && r.version() == version && r.plural() == plural)
    }

    /// Resource for an object's `apiVersion` and `kind`.
    pub fn from_kind(api_version: &str, kind: &str) -> Option<Resource> {
        Resource::ALL
            .into_iter()
            .find(|r| r.api_version() == api_version && r.kind() == kind)
    }

    /// Short names advertised in discovery.
    pub fn short_names(self) -> &'static [&'static str] {
        match self {
            Resource::Namespace => &["ns"],
            Resource::Pod => &["po"],
            Resource::CoreEvent => &["ev"],
            Resource::Event => &["ev"],
            Resource::Nad => &["net-attach-def"],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_round_trip() {
        for r in Resource::ALL {
            assert_eq!(
                Resource::from_path(r.group(), r.version(), r.plural()),
                Some(r)
            );
            assert_eq!(Resource::from_kind(&r.api_version(), r.kind()), Some(r));
        }
        assert_eq!(
            Resource::Nad.qualified(),
            "network-attachment-definitions.k8s.cni.cncf.io"
        );
        assert_eq!(Resource::Pod.qualified_kind(), "Pod");
        assert_eq!(Resource::from_path("", "v1", "services"), None);
    }
}
