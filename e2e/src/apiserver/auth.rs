//! Bearer-token authentication and a tiny verb-level authorizer.

use std::collections::HashMap;

/// What a token may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Every verb on every served resource.
    Full,
    /// `get`, `list` and `watch` only.
    ReadOnly,
    /// Authenticated, but no verb on any resource (discovery still works).
    None,
}

impl Access {
    /// Whether this access level allows `verb`.
    pub fn allows(self, verb: &str) -> bool {
        match self {
            Access::Full => true,
            Access::ReadOnly => matches!(verb, "get" | "list" | "watch"),
            Access::None => false,
        }
    }
}

/// The authenticated user behind a token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// User name as shown in Forbidden messages.
    pub user: String,
    /// What the user may do.
    pub access: Access,
}

/// Registered tokens. Tokens are never logged; no `Debug` on purpose.
#[derive(Default)]
pub struct Tokens {
    by_token: HashMap<String, Identity>,
}

impl Tokens {
    /// Registers (or re-registers) a token.
    pub fn add(&mut self, token: &str, user: &str, access: Access) {
        self.by_token.insert(
            token.to_string(),
            Identity {
                user: user.to_string(),
                access,
            },
        );
    }

    /// Unregisters a token.
    pub fn remove(&mut self, token: &str) {
        self.by_token.remove(token);
    }

    /// The identity for an `Authorization` header value, if it carries a known bearer token.
    pub fn authenticate(&self, authorization: Option<&str>) -> Option<Identity> {
        let token = bearer(authorization?)?;
        self.by_token.get(token).cloned()
    }
}

/// The token of a `Bearer <token>` header value.
pub fn bearer(authorization: &str) -> Option<&str> {
    let (scheme, token) = authorization.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authenticates_only_known_bearer_tokens() {
        let mut t = Tokens::default();
        t.add("s3cret", "alice", Access::ReadOnly);
        assert_eq!(
            t.authenticate(Some("Bearer s3cret")).map(|i| i.user),
            Some("alice".to_string())
        );
        assert!(t.authenticate(Some("Bearer other")).is_none());
        assert!(t.authenticate(Some("Basic s3cret")).is_none());
        assert!(t.authenticate(None).is_none());
        t.remove("s3cret");
        assert!(t.authenticate(Some("Bearer s3cret")).is_none());
        assert!(Access::ReadOnly.allows("list") && !Access::ReadOnly.allows("patch"));
        assert!(!Access::None.allows("get") && Access::Full.allows("delete"));
    }
}
