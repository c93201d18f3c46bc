//! Whether a plugin can take STATUS or GC at the version a network is run at.
//!
//! libcni sends STATUS and GC only to networks whose `cniVersion` is 1.1.0 or later, and sends
//! them to every plugin of the list as written. A plugin built before 1.1.0 (Debian's plugins,
//! calico) does not know either verb and answers with whatever its argument parser trips on
//! first (`missing containerID` from portmap): a wrong hint. Plexus asks such a plugin its
//! VERSION first and, when the network's version is not in the answer, reports that instead,
//! naming the network, the plugin, its versions and the verb. A network run at a version from
//! `cniVersions` was already negotiated against every plugin, so it needs no second question.

use crate::chain::Runtime;
use crate::exec::Verb;
use plexus_conf::error::{code, CniError};
use plexus_conf::netconf::NetConfList;
use plexus_conf::version::CniVersion;

/// `Ok` when plugin `index` of `list` lists `ver` among its supported versions (or the version
/// was negotiated with every plugin); otherwise a code 1 error that says why `verb` cannot be
/// sent to it and what to change.
pub fn require(
    rt: &Runtime,
    list: &NetConfList,
    index: usize,
    ver: CniVersion,
    verb: Verb,
) -> Result<(), CniError> {
    if !list.cni_versions.is_empty() {
        return Ok(());
    }
    let plugin = list.plugins[index].plugin_type();
    let versions = rt
        .plugin_versions(plugin)
        .map_err(|e| e.context(format!("network {:?}: plugin {plugin} VERSION", list.name)))?;
    if versions.iter().any(|v| v == ver.as_str()) {
        return Ok(());
    }
    Err(CniError::new(
        code::INCOMPATIBLE_VERSION,
        format!(
            "network {:?}: plugin {plugin} does not support cniVersion {ver}, so it cannot take {}",
            list.name,
            verb.as_str()
        ),
        format!(
            "plugin {plugin} supports {}; {} needs cniVersion 1.1.0 or later in the network and the plugin. \
             Write the network at a version the plugin supports (it is then not sent {}), or add \
             cniVersions so plexus picks one every plugin supports",
            versions.join(", "),
            verb.as_str(),
            verb.as_str()
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::require;
    use crate::chain::Runtime;
    use crate::exec::Verb;
    use plexus_conf::netconf::NetConfList;
    use plexus_conf::version::CniVersion;
    use serde_json::json;
    use std::os::unix::fs::PermissionsExt;
    use std::time::Duration;

    fn plugin(dir: &std::path::Path, name: &str, versions: &str) {
        let path = dir.join(name);
        let body = format!(
            "#!/bin/sh\ncat >/dev/null\n[ \"$CNI_COMMAND\" = VERSION ] && echo '{{\"cniVersion\":\"1.0.0\",\"supportedVersions\":[{versions}]}}'\nexit 0\n"
        );
        std::fs::write(&path, body).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn runtime(dir: &std::path::Path) -> Runtime {
        Runtime {
            search_path: vec![dir.to_path_buf()],
            timeout: Duration::from_secs(5),
            cache: None,
        }
    }

    #[test]
    fn a_plugin_without_the_version_is_named_with_its_versions_and_the_verb() {
        let tmp = tempfile::tempdir().unwrap();
        plugin(tmp.path(), "new", r#""1.0.0","1.1.0""#);
        plugin(tmp.path(), "old", r#""0.4.0","1.0.0""#);
        let rt = runtime(tmp.path());
        let list = NetConfList::from_value(
            json!({"cniVersion":"1.1.0","name":"mix","plugins":[{"type":"new"},{"type":"old"}]}),
        )
        .unwrap();
        require(&rt, &list, 0, CniVersion::V110, Verb::Status).unwrap();
        let e = require(&rt, &list, 1, CniVersion::V110, Verb::Gc).unwrap_err();
        assert_eq!(e.code, 1, "{e}");
        assert!(
            e.msg.contains("\"mix\"") && e.msg.contains("plugin old") && e.msg.contains("GC"),
            "{e}"
        );
        assert!(e.details.contains("0.4.0, 1.0.0"), "{e}");
    }

    #[test]
    fn a_negotiated_list_is_not_asked_again_and_a_silent_plugin_is_0_1_0() {
        let tmp = tempfile::tempdir().unwrap();
        plugin(tmp.path(), "old", r#""1.0.0""#);
        // No VERSION answer at all: the spec's 0.1.0.
        let mute = tmp.path().join("mute");
        std::fs::write(&mute, "#!/bin/sh\ncat >/dev/null\nexit 0\n").unwrap();
        std::fs::set_permissions(&mute, std::fs::Permissions::from_mode(0o755)).unwrap();
        let rt = runtime(tmp.path());
        let negotiated = NetConfList::from_value(json!({"cniVersion":"1.1.0","cniVersions":["1.1.0"],"name":"n","plugins":[{"type":"old"}]})).unwrap();
        require(&rt, &negotiated, 0, CniVersion::V110, Verb::Status).unwrap();
        let silent =
            NetConfList::from_value(json!({"cniVersion":"1.1.0","name":"s","type":"mute"}))
                .unwrap();
        let e = require(&rt, &silent, 0, CniVersion::V110, Verb::Status).unwrap_err();
        assert!(e.details.contains("supports 0.1.0"), "{e}");
        // A plugin that is not there: the lookup error, with the network named.
        let gone = NetConfList::from_value(json!({"cniVersion":"1.1.0","name":"g","type":"gone"}))
            .unwrap();
        let e = require(&rt, &gone, 0, CniVersion::V110, Verb::Status).unwrap_err();
        assert!(e.msg.contains("\"g\""), "{e}");
    }
}
