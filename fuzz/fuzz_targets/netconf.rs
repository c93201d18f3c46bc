//! Network configs and conflists (stdin, config files): never panics, errors are code 6 or 7,
//! what parses round-trips through `to_value` and builds every plugin's request config.
#![no_main]

use libfuzzer_sys::fuzz_target;
use plexus_conf::netconf::NetConfList;
use serde_json::Map;

fuzz_target!(|data: &[u8]| {
    match NetConfList::parse(data) {
        Ok(l) => {
            let back = NetConfList::from_value(l.to_value()).expect("to_value parses back");
            assert_eq!(back, l);
            let _ = l.capabilities();
            for i in 0..l.plugins.len() {
                let _ = l.plugin_request(i, "1.1.0", &Map::new(), None);
            }
        }
        Err(e) => assert!(e.code == 6 || e.code == 7, "{e}"),
    }
});
