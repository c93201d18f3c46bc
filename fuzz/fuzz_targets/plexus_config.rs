//! Plexus' own configuration (stdin of `plexus`, a Multus thin config with `"type": "plexus"`):
//! never panics; errors are code 2, 6 or 7; an accepted config's inline delegates either
//! validate or fail with a named error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use plexus_conf::plexus_config::PlexusConfig;

fuzz_target!(|data: &[u8]| {
    match PlexusConfig::parse(data) {
        Ok(c) => {
            let _ = c.global_namespace_list();
            if let Err(e) = c.delegate_lists() {
                assert!(e.code == 6 || e.code == 7, "{e}");
                assert!(e.msg.contains("delegates["), "{e}");
            }
        }
        Err(e) => assert!(matches!(e.code, 2 | 6 | 7), "{e}"),
    }
});
