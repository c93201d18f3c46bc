//! CNI results (a delegate's stdout, cached results): parsing never panics (code 6 on error),
//! converting to every supported version never panics (only code 1 on error), and 1.x output
//! parses back to the same result.
#![no_main]

use libfuzzer_sys::fuzz_target;
use plexus_conf::result::CniResult;
use plexus_conf::version::SUPPORTED;

fuzz_target!(|data: &[u8]| {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let r = match CniResult::parse_with_version(&v, "1.0.0") {
        Ok(r) => r,
        Err(e) => {
            assert_eq!(e.code, 6, "{e}");
            return;
        }
    };
    for ver in SUPPORTED {
        match r.to_value(ver) {
            Ok(out) => {
                let back = CniResult::parse(&out).expect("converted result parses back");
                if ver.starts_with('1') {
                    let mut want = r.clone();
                    want.cni_version = ver.to_string();
                    assert_eq!(back, want, "{ver} is lossless");
                }
            }
            Err(e) => assert_eq!(e.code, 1, "{e}"),
        }
    }
});
