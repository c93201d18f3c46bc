//! The sriov NetConf (stdin plus `CNI_ARGS`): never panics for either purpose; errors are config
//! (7) or CNI_ARGS (4) errors. The input is `CNI_ARGS` up to the first NUL byte, then stdin.
#![no_main]

use libfuzzer_sys::fuzz_target;
use plexus_conf::error::CniError;
use plexus_sriov::netconf::{parse, Purpose};

fuzz_target!(|data: &[u8]| {
    let (args, stdin) = match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (&b""[..], data),
    };
    let Ok(args) = std::str::from_utf8(args) else {
        return;
    };
    for purpose in [Purpose::Attach, Purpose::Other] {
        if let Err(e) = parse(stdin, args, purpose) {
            let e = CniError::from(e);
            assert!(e.code == 7 || e.code == 4, "{e}");
        }
    }
});
