//! Network configurations: single-plugin configs and conflists, with every spec key, unknown keys
//! kept verbatim, and the per-plugin request config a runtime builds (name, version,
//! capability-filtered `runtimeConfig`, `prevResult`).

use crate::error::CniError;
use crate::validate;
use serde_json::{Map, Value};

/// One plugin object of a conflist (or a whole single-plugin config), kept verbatim.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginConf {
    /// The object exactly as written, unknown keys included.
    pub raw: Map<String, Value>,
}

impl PluginConf {
    /// The plugin binary name (`type`).
    pub fn plugin_type(&self) -> &str {
        self.raw.get("type").and_then(Value::as_str).unwrap_or("")
    }

    /// Capabilities the plugin declares `true`.
    pub fn capabilities(&self) -> Vec<&str> {
        self.raw
            .get("capabilities")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter(|(_, v)| v.as_bool() == Some(true))
                    .map(|(k, _)| k.as_str())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Whether the plugin declares a capability.
    pub fn has_capability(&self, cap: &str) -> bool {
        self.capabilities().contains(&cap)
    }

    /// The IPAM plugin type, if any.
    pub fn ipam_type(&self) -> Option<&str> {
        self.raw
            .get("ipam")
            .and_then(|i| i.get("type"))
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
    }
}

/// A network configuration list (a single-plugin config is up-converted, as libcni does).
#[derive(Debug, Clone, PartialEq)]
pub struct NetConfList {
    /// `cniVersion`.
    pub cni_version: String,
    /// `cniVersions` (1.1.0).
    pub cni_versions: Vec<String>,
    /// `name`; for a config without one, the type of its first plugin (see
    /// [`NetConfList::name_derived`]).
    pub name: String,
    /// True when the config has no `name` and [`NetConfList::name`] was derived from the first
    /// plugin's `type`. Multus accepts such configs (libcni needs no name for a single plugin);
    /// plexus keys its cache, plan and network-status entry on the derived name.
    pub name_derived: bool,
    /// `disableCheck`.
    pub disable_check: bool,
    /// `disableGC`.
    pub disable_gc: bool,
    /// `loadOnlyInlinedPlugins`.
    pub load_only_inlined_plugins: bool,
    /// The plugins, in order.
    pub plugins: Vec<PluginConf>,
    /// True when parsed from a single-plugin config (no `plugins` key).
    pub single: bool,
    /// The top-level object as written.
    pub raw: Map<String, Value>,
}

fn flag(obj: &Map<String, Value>, key: &str) -> Result<bool, CniError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        // libcni also accepts the strings "true"/"false".
        Some(Value::String(s)) if s.eq_ignore_ascii_case("true") => Ok(true),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("false") => Ok(false),
        Some(other) => Err(CniError::invalid_config(
            format!("invalid value for {key:?}"),
            format!("expected a boolean, got {other}"),
        )),
    }
}

fn string(obj: &Map<String, Value>, key: &str) -> Result<String, CniError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(CniError::invalid_config(
            format!("invalid value for {key:?}"),
            format!("expected a string, got {other}"),
        )),
    }
}

impl NetConfList {
    /// Parse a conflist or single-plugin config from JSON bytes and validate it.
    pub fn parse(bytes: &[u8]) -> Result<Self, CniError> {
        let value: Value = serde_json::from_slice(bytes).map_err(|e| {
            CniError::decode("failed to parse network configuration", e.to_string())
        })?;
        Self::from_value(value)
    }

    /// Parse from a JSON value and validate it.
    pub fn from_value(value: Value) -> Result<Self, CniError> {
        let Value::Object(raw) = value else {
            return Err(CniError::decode(
                "failed to parse network configuration",
                "not a JSON object",
            ));
        };
        let name = string(&raw, "name")?;
        let cni_version = string(&raw, "cniVersion")?;
        let cni_versions = match raw.get("cniVersions") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_str().map(str::to_string).ok_or_else(|| {
                        CniError::invalid_config("invalid cniVersions", "entries must be strings")
                    })
                })
                .collect::<Result<_, _>>()?,
            Some(_) => {
                return Err(CniError::invalid_config(
                    "invalid cniVersions",
                    "must be a list of strings",
                ))
            }
        };
        let single = !raw.contains_key("plugins");
        let plugins = if single {
            vec![PluginConf { raw: raw.clone() }]
        } else {
            match raw.get("plugins") {
                Some(Value::Array(list)) => list
                    .iter()
                    .enumerate()
                    .map(|(i, p)| match p {
                        Value::Object(m) => Ok(PluginConf { raw: m.clone() }),
                        _ => Err(CniError::invalid_config(
                            format!("network {name:?}: plugin {i} is not an object"),
                            "",
                        )),
                    })
                    .collect::<Result<_, _>>()?,
                _ => {
                    return Err(CniError::invalid_config(
                        format!("network {name:?}: 'plugins' must be a list"),
                        "",
                    ))
                }
            }
        };
        // A nameless config (Multus accepts `{"type":"weave-net"}` as a delegate) is named after
        // its first plugin's type, which is validated like any name below.
        let name_derived = name.is_empty();
        let name = if name_derived {
            plugins
                .first()
                .map(|p| p.plugin_type().to_string())
                .unwrap_or_default()
        } else {
            name
        };
        let list = NetConfList {
            name_derived,
            disable_check: flag(&raw, "disableCheck")?,
            disable_gc: flag(&raw, "disableGC")?,
            load_only_inlined_plugins: flag(&raw, "loadOnlyInlinedPlugins")?,
            cni_version,
            cni_versions,
            name,
            plugins,
            single,
            raw,
        };
        list.validate()?;
        Ok(list)
    }

    fn validate(&self) -> Result<(), CniError> {
        if self.name.is_empty() {
            return Err(CniError::invalid_config(
                "missing network name",
                "the configuration has no 'name' and its first plugin no 'type' to name it after",
            ));
        }
        validate::network_name(&self.name)?;
        if self.plugins.is_empty() {
            return Err(CniError::invalid_config(
                format!("network {:?}: no plugins in list", self.name),
                "",
            ));
        }
        for (i, p) in self.plugins.iter().enumerate() {
            validate::plugin_type(p.plugin_type())
                .map_err(|e| e.context(format!("network {:?} plugin {i}", self.name)))?;
            if let Some(ipam) = p.ipam_type() {
                validate::plugin_type(ipam)
                    .map_err(|e| e.context(format!("network {:?} plugin {i} ipam", self.name)))?;
            }
        }
        Ok(())
    }

    /// The union of the capabilities the plugins declare.
    pub fn capabilities(&self) -> Vec<&str> {
        let mut caps: Vec<&str> = self.plugins.iter().flat_map(|p| p.capabilities()).collect();
        caps.sort_unstable();
        caps.dedup();
        caps
    }

    /// Serialize back to JSON (the original top level, with the plugin list as held now).
    pub fn to_value(&self) -> Value {
        if self.single {
            return Value::Object(self.plugins[0].raw.clone());
        }
        let mut top = self.raw.clone();
        top.insert(
            "plugins".into(),
            Value::Array(
                self.plugins
                    .iter()
                    .map(|p| Value::Object(p.raw.clone()))
                    .collect(),
            ),
        );
        Value::Object(top)
    }

    /// The config sent to plugin `index`: the plugin object plus `name`, `cniVersion`, the
    /// capability args the plugin declares as `runtimeConfig`, and `prevResult` when given.
    pub fn plugin_request(
        &self,
        index: usize,
        version: &str,
        capability_args: &Map<String, Value>,
        prev_result: Option<&Value>,
    ) -> Value {
        let plugin = &self.plugins[index];
        let mut out = plugin.raw.clone();
        out.insert("cniVersion".into(), Value::String(version.to_string()));
        out.insert("name".into(), Value::String(self.name.clone()));
        let caps = plugin.capabilities();
        let rc: Map<String, Value> = capability_args
            .iter()
            .filter(|(k, _)| caps.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        // Like libcni: runtimeConfig is replaced only when some capability applies; a
        // runtimeConfig written in the config itself is otherwise passed through.
        if !rc.is_empty() {
            out.insert("runtimeConfig".into(), Value::Object(rc));
        }
        match prev_result {
            Some(p) => {
                out.insert("prevResult".into(), p.clone());
            }
            None => {
                out.remove("prevResult");
            }
        }
        Value::Object(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const CHAIN: &str = r#"{"cniVersion":"1.0.0","name":"brchain","disableCheck":"true","x-vendor":{"keep":[1,2]},"plugins":[
      {"type":"bridge","bridge":"cnitestbr1","isGateway":true,"ipam":{"type":"host-local","ranges":[[{"subnet":"10.90.0.0/24"}]]}},
      {"type":"tuning","sysctl":{"net.core.somaxconn":"500"}},
      {"type":"bandwidth","capabilities":{"bandwidth":true}},
      {"type":"portmap","capabilities":{"portMappings":true,"other":false},"snat":true}]}"#;

    #[test]
    fn parses_conflist_keeping_unknown_keys() {
        let l = NetConfList::parse(CHAIN.as_bytes()).unwrap();
        assert_eq!(l.name, "brchain");
        assert!(l.disable_check);
        assert!(!l.single);
        assert_eq!(l.plugins.len(), 4);
        assert_eq!(l.plugins[0].ipam_type(), Some("host-local"));
        assert_eq!(l.capabilities(), vec!["bandwidth", "portMappings"]);
        assert_eq!(l.to_value()["x-vendor"], json!({"keep":[1,2]}));
        assert_eq!(
            l.to_value(),
            serde_json::from_str::<Value>(CHAIN).unwrap(),
            "round trip keeps meaning"
        );
    }

    #[test]
    fn request_config_filters_runtime_config_by_capability() {
        let l = NetConfList::parse(CHAIN.as_bytes()).unwrap();
        let caps = json!({"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}],
                          "bandwidth":{"ingressRate":1},"mac":"02:00:00:00:00:01"});
        let caps = caps.as_object().unwrap();
        let prev = json!({"cniVersion":"1.0.0","ips":[]});
        let r0 = l.plugin_request(0, "1.0.0", caps, None);
        assert!(r0.get("runtimeConfig").is_none());
        assert!(r0.get("prevResult").is_none());
        assert_eq!(r0["name"], "brchain");
        assert_eq!(r0["bridge"], "cnitestbr1");
        let r3 = l.plugin_request(3, "1.0.0", caps, Some(&prev));
        assert_eq!(
            r3["runtimeConfig"],
            json!({"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}]})
        );
        assert_eq!(r3["prevResult"], prev);
        assert_eq!(r3["cniVersion"], "1.0.0");
    }

    #[test]
    fn nameless_configs_are_named_after_their_first_plugin() {
        let l = NetConfList::parse(br#"{"type":"weave-net"}"#).unwrap();
        assert_eq!((l.name.as_str(), l.name_derived), ("weave-net", true));
        // The plugin is told the name its network is known by.
        assert_eq!(
            l.plugin_request(0, "1.0.0", &Map::new(), None)["name"],
            "weave-net"
        );
        // Serialised back, the config stays as written (no name added).
        assert!(l.to_value().get("name").is_none());
        let l = NetConfList::parse(
            br#"{"cniVersion":"1.0.0","plugins":[{"type":"bridge"},{"type":"portmap"}]}"#,
        )
        .unwrap();
        assert_eq!((l.name.as_str(), l.name_derived), ("bridge", true));
        let named = NetConfList::parse(br#"{"name":"cbr0","type":"bridge"}"#).unwrap();
        assert!(!named.name_derived);
    }

    #[test]
    fn single_config_is_up_converted() {
        let l = NetConfList::parse(br#"{"cniVersion":"0.4.0","name":"mv","type":"macvlan","master":"m0","ipam":{"type":"static"}}"#).unwrap();
        assert!(l.single);
        assert_eq!(l.plugins[0].plugin_type(), "macvlan");
        assert_eq!(l.cni_version, "0.4.0");
    }

    #[test]
    fn invalid_configs_name_the_cause() {
        let cases: &[(&str, u32, &str)] = &[
            ("not json", 6, ""),
            ("[]", 6, ""),
            (r#"{"plugins":[]}"#, 7, "name"),
            (r#"{"plugins":[{"bridge":"b"}]}"#, 7, "name"),
            (r#"{"name":"x","plugins":[]}"#, 7, "no plugins"),
            (r#"{"name":"x","plugins":{}}"#, 7, "list"),
            (r#"{"name":"x","plugins":[{"bridge":"b"}]}"#, 7, "type"),
            (r#"{"name":"x","type":"../../bin/sh"}"#, 7, "type"),
            (
                r#"{"name":"x","type":"bridge","ipam":{"type":"/tmp/evil"}}"#,
                7,
                "ipam",
            ),
            (
                r#"{"name":"x","type":"bridge","disableCheck":3}"#,
                7,
                "disableCheck",
            ),
            (
                r#"{"name":"x","type":"bridge","cniVersions":"1.0.0"}"#,
                7,
                "cniVersions",
            ),
        ];
        for (src, code, needle) in cases {
            let e = NetConfList::parse(src.as_bytes()).unwrap_err();
            assert_eq!(e.code, *code, "{src}");
            assert!(e.to_string().contains(needle), "{src}: {e}");
        }
    }
}
