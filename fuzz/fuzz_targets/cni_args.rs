//! `CNI_ARGS`: never panics, errors are code 4, and what parses renders back to the same pairs.
#![no_main]

use libfuzzer_sys::fuzz_target;
use plexus_conf::args::CniArgs;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    match CniArgs::parse(s) {
        Ok(a) => assert_eq!(CniArgs::parse(&a.render()).expect("rendered parses"), a),
        Err(e) => assert_eq!(e.code, 4, "{e}"),
    }
});
