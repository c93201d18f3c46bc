//! Running a whole network (a conflist) the way libcni does: version negotiation, `prevResult`
//! chaining on ADD, reverse-order DEL with the cached result, CHECK, STATUS and GC.

use crate::cache::{CachedAttachment, ResultCache};
use crate::exec::{exec_plugin, find_plugin, CniEnv, Verb};
use crate::support;
use plexus_conf::args::CniArgs;
use plexus_conf::error::{code, CniError};
use plexus_conf::netconf::NetConfList;
use plexus_conf::result::CniResult;
use plexus_conf::version::{self, CniVersion};
use serde_json::{json, Map, Value};
use std::path::PathBuf;
use std::time::Duration;

/// Where and how delegates run.
#[derive(Debug, Clone)]
pub struct Runtime {
    /// Directories searched for plugin binaries, in order.
    pub search_path: Vec<PathBuf>,
    /// Deadline for one plugin exec.
    pub timeout: Duration,
    /// Result cache (libcni layout) if results should be cached.
    pub cache: Option<ResultCache>,
}

/// One attachment of a network to a container.
#[derive(Debug, Clone, Default)]
pub struct Attachment {
    /// `CNI_CONTAINERID`
    pub container_id: String,
    /// `CNI_NETNS` (may be empty on DEL).
    pub netns: String,
    /// `CNI_IFNAME`
    pub ifname: String,
    /// `CNI_ARGS`
    pub args: CniArgs,
    /// Capability args offered to plugins that declare them (`runtimeConfig`).
    pub capability_args: Map<String, Value>,
}

impl Runtime {
    fn env(&self, att: &Attachment) -> CniEnv {
        CniEnv {
            container_id: att.container_id.clone(),
            netns: att.netns.clone(),
            ifname: att.ifname.clone(),
            args: att.args.render(),
            path: self.search_path.clone(),
        }
    }

    /// Ask a plugin which spec versions it supports (a plugin that cannot answer supports 0.1.0).
    pub fn plugin_versions(&self, plugin_type: &str) -> Result<Vec<String>, CniError> {
        let bin = find_plugin(plugin_type, &self.search_path)?;
        let stdin = json!({"cniVersion": version::CURRENT}).to_string();
        match exec_plugin(
            &bin,
            Verb::Version,
            &CniEnv::default(),
            stdin.as_bytes(),
            self.timeout,
        ) {
            Ok(Some(v)) => Ok(v
                .get("supportedVersions")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_else(|| vec!["0.1.0".to_string()])),
            Ok(None) => Ok(vec!["0.1.0".to_string()]),
            Err(e) => Err(e),
        }
    }

    /// The version to run `list` at. With only `cniVersion` it is used as written (no extra
    /// exec on the hot path); with `cniVersions` every plugin is asked (VERSION) and the highest
    /// version common to the config, plexus and all plugins wins.
    pub fn negotiate(&self, list: &NetConfList) -> Result<CniVersion, CniError> {
        if list.cni_versions.is_empty() {
            return CniVersion::parse(&list.cni_version)
                .map_err(|e| e.context(format!("network {:?}", list.name)));
        }
        let mut supports = Vec::new();
        for p in &list.plugins {
            supports.push(self.plugin_versions(p.plugin_type())?);
        }
        version::negotiate(&list.cni_version, &list.cni_versions, &supports)
            .map_err(|e| e.context(format!("network {:?}", list.name)))
    }

    fn run_plugin(
        &self,
        list: &NetConfList,
        index: usize,
        verb: Verb,
        ver: CniVersion,
        att: &Attachment,
        prev: Option<&Value>,
    ) -> Result<Option<Value>, CniError> {
        let plugin = &list.plugins[index];
        let bin = find_plugin(plugin.plugin_type(), &self.search_path)
            .map_err(|e| e.context(format!("network {:?}", list.name)))?;
        let req = list.plugin_request(index, ver.as_str(), &att.capability_args, prev);
        let stdin = serde_json::to_vec(&req)
            .map_err(|e| CniError::internal("failed to encode plugin config", e.to_string()))?;
        exec_plugin(&bin, verb, &self.env(att), &stdin, self.timeout)
            .map_err(|e| e.context(format!("network {:?}", list.name)))
    }

    /// ADD the network: each plugin gets the previous one's result as `prevResult`; the first
    /// error stops the chain (the caller runs DEL to clean up). The final result is cached.
    pub fn add(&self, list: &NetConfList, att: &Attachment) -> Result<CniResult, CniError> {
        let ver = self.negotiate(list)?;
        self.add_at(list, att, ver)
    }

    /// [`Runtime::add`] at a version the caller already negotiated ([`Runtime::negotiate`]),
    /// so a caller can tell "no version to run at" (nothing ran, nothing to undo) from a
    /// failure of the chain itself.
    pub fn add_at(
        &self,
        list: &NetConfList,
        att: &Attachment,
        ver: CniVersion,
    ) -> Result<CniResult, CniError> {
        let mut prev: Option<Value> = None;
        for i in 0..list.plugins.len() {
            let out = self.run_plugin(list, i, Verb::Add, ver, att, prev.as_ref())?;
            match out {
                Some(v) => prev = Some(v),
                None => {
                    return Err(CniError::new(
                        code::DELEGATE_FAILED,
                        format!(
                            "network {:?}: plugin {} ADD printed no result",
                            list.name,
                            list.plugins[i].plugin_type()
                        ),
                        "",
                    ))
                }
            }
        }
        let final_value = prev.unwrap_or(Value::Null);
        let result = CniResult::parse_with_version(&final_value, ver.as_str())
            .map_err(|e| e.context(format!("network {:?}", list.name)))?;
        if let Some(cache) = &self.cache {
            let config = serde_json::to_vec(&list.to_value()).unwrap_or_default();
            cache.store(&CachedAttachment {
                kind: "cniCacheV1".into(),
                container_id: att.container_id.clone(),
                config: CachedAttachment::encode_config(&config),
                if_name: att.ifname.clone(),
                network_name: list.name.clone(),
                netns: att.netns.clone(),
                cni_args: att
                    .args
                    .pairs()
                    .iter()
                    .map(|(k, v)| [k.clone(), v.clone()])
                    .collect(),
                capability_args: att.capability_args.clone(),
                result: Some(final_value),
            })?;
        }
        Ok(result)
    }

    fn cached_prev(&self, list: &NetConfList, att: &Attachment, ver: CniVersion) -> Option<Value> {
        let cached = self
            .cache
            .as_ref()?
            .load(&list.name, &att.container_id, &att.ifname)?;
        let raw = cached.result?;
        let parsed = CniResult::parse_with_version(&raw, ver.as_str()).ok()?;
        parsed.to_value(ver.as_str()).ok()
    }

    /// DEL the network: plugins in reverse order, each with the cached ADD result (0.4.0+).
    /// Every plugin is attempted; the errors are combined. The cache entry is removed on success.
    pub fn del(&self, list: &NetConfList, att: &Attachment) -> Result<(), CniError> {
        let ver = self.negotiate(list)?;
        let prev = if ver >= CniVersion::V040 {
            self.cached_prev(list, att, ver)
        } else {
            None
        };
        let mut errors = Vec::new();
        for i in (0..list.plugins.len()).rev() {
            if let Err(e) = self.run_plugin(list, i, Verb::Del, ver, att, prev.as_ref()) {
                tracing::warn!(network = %list.name, error = %e, "delegate DEL failed");
                errors.push(e);
            }
        }
        if let Some(first) = combine(errors) {
            return Err(first);
        }
        // The network is gone: a cache entry that cannot be removed (unwritable state dir) is
        // the caller's bookkeeping problem, not a failed DEL.
        if let Some(cache) = &self.cache {
            if let Err(e) = cache.remove(&list.name, &att.container_id, &att.ifname) {
                tracing::error!(network = %list.name, error = %e, "network deleted, but its cached result stays");
            }
        }
        Ok(())
    }

    /// CHECK the network with the cached ADD result; skipped when `disableCheck`.
    pub fn check(&self, list: &NetConfList, att: &Attachment) -> Result<(), CniError> {
        if list.disable_check {
            return Ok(());
        }
        let ver = self.negotiate(list)?;
        if !ver.has_check() {
            return Err(CniError::new(
                code::INCOMPATIBLE_VERSION,
                format!(
                    "network {:?}: configuration version {ver} does not support the CHECK command",
                    list.name
                ),
                "CHECK needs cniVersion 0.4.0 or later",
            ));
        }
        let prev = self.cached_prev(list, att, ver).ok_or_else(|| {
            CniError::new(
                code::UNKNOWN_CONTAINER,
                format!(
                    "network {:?}: no cached result for {}/{}",
                    list.name, att.container_id, att.ifname
                ),
                "CHECK needs a successful ADD first",
            )
        })?;
        for i in 0..list.plugins.len() {
            self.run_plugin(list, i, Verb::Check, ver, att, Some(&prev))?;
        }
        Ok(())
    }

    /// STATUS of the network (1.1.0+; older versions report ready, as libcni does). A plugin
    /// that does not support the network's version is not sent STATUS: the answer is a code 1
    /// error naming it, its versions and the verb ([`support::require`]).
    pub fn status(&self, list: &NetConfList) -> Result<(), CniError> {
        let ver = self.negotiate(list)?;
        if !ver.has_status_gc() {
            return Ok(());
        }
        for i in 0..list.plugins.len() {
            support::require(self, list, i, ver, Verb::Status)?;
            self.run_plugin(list, i, Verb::Status, ver, &Attachment::default(), None)?;
        }
        Ok(())
    }

    /// GC the network: DEL every cached attachment that is not valid, then send GC with the
    /// valid list to every plugin (1.1.0+). Continues past errors and reports them all; a plugin
    /// that does not support the network's version is not sent GC and is reported as such.
    pub fn gc(&self, list: &NetConfList, valid: &[(String, String)]) -> Result<(), CniError> {
        if list.disable_gc {
            return Ok(());
        }
        let mut errors = Vec::new();
        if let Some(cache) = &self.cache {
            for stale in cache.list_network(&list.name) {
                if valid
                    .iter()
                    .any(|(c, i)| *c == stale.container_id && *i == stale.if_name)
                {
                    continue;
                }
                let att = Attachment {
                    container_id: stale.container_id.clone(),
                    // Use the ADD-time netns while it still exists, so links go too.
                    netns: if !stale.netns.is_empty() && std::path::Path::new(&stale.netns).exists()
                    {
                        stale.netns.clone()
                    } else {
                        String::new()
                    },
                    ifname: stale.if_name.clone(),
                    args: CniArgs::parse(
                        &stale
                            .cni_args
                            .iter()
                            .map(|[k, v]| format!("{k}={v}"))
                            .collect::<Vec<_>>()
                            .join(";"),
                    )
                    .unwrap_or_default(),
                    capability_args: stale.capability_args.clone(),
                };
                if let Err(e) = self.del(list, &att) {
                    errors.push(e);
                }
            }
        }
        let ver = match self.negotiate(list) {
            Ok(v) => v,
            Err(e) => {
                errors.push(e);
                return combine(errors).map_or(Ok(()), Err);
            }
        };
        if ver.has_status_gc() {
            let attachments: Vec<Value> = valid
                .iter()
                .map(|(c, i)| json!({"containerID": c, "ifname": i}))
                .collect();
            for i in 0..list.plugins.len() {
                if let Err(e) = support::require(self, list, i, ver, Verb::Gc) {
                    errors.push(e);
                    continue;
                }
                let mut req = list.plugin_request(i, ver.as_str(), &Map::new(), None);
                req["cni.dev/valid-attachments"] = Value::Array(attachments.clone());
                req["cni.dev/attachments"] = Value::Array(attachments.clone());
                let res =
                    find_plugin(list.plugins[i].plugin_type(), &self.search_path).and_then(|bin| {
                        let stdin = serde_json::to_vec(&req).unwrap_or_default();
                        exec_plugin(
                            &bin,
                            Verb::Gc,
                            &CniEnv {
                                path: self.search_path.clone(),
                                ..CniEnv::default()
                            },
                            &stdin,
                            self.timeout,
                        )
                    });
                if let Err(e) = res {
                    errors.push(e.context(format!("network {:?}", list.name)));
                }
            }
        }
        combine(errors).map_or(Ok(()), Err)
    }
}

/// Combine several errors into one (the first one's code; every message listed).
pub fn combine(mut errors: Vec<CniError>) -> Option<CniError> {
    match errors.len() {
        0 => None,
        1 => errors.pop(),
        _ => {
            let first = errors[0].clone();
            let all: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
            Some(CniError::new(first.code, first.msg, all.join(" / ")))
        }
    }
}
