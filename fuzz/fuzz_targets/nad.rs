//! A NetworkAttachmentDefinition's `spec.config`: never panics, errors are code 7 and name the
//! network.
#![no_main]

use libfuzzer_sys::fuzz_target;
use plexus_conf::k8s::nad::config_from_spec;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = config_from_spec("ns", "nad", s) {
        assert_eq!(e.code, 7, "{e}");
        assert!(e.msg.contains("ns/nad"), "{e}");
    }
});
