//! The networks annotation (`k8s.v1.cni.cncf.io/networks`, comma or JSON form): never panics,
//! errors are code 7 naming the annotation, and what parses re-renders (JSON form) to the same
//! selections.
#![no_main]

use libfuzzer_sys::fuzz_target;
use plexus_conf::k8s::selection::{parse_selections, NETWORKS_ANNOTATION};

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    match parse_selections(s, NETWORKS_ANNOTATION) {
        Ok(list) => {
            let json = serde_json::to_string(&list).expect("selections serialise");
            let again = parse_selections(&json, NETWORKS_ANNOTATION)
                .unwrap_or_else(|e| panic!("re-rendered {json} does not parse: {e}"));
            assert_eq!(again, list, "JSON round trip of {s:?}");
        }
        Err(e) => {
            assert_eq!(e.code, 7, "{e}");
            assert!(e.msg.contains(NETWORKS_ANNOTATION), "{e}");
        }
    }
});
