//! The daemon's TOML configuration.
#![no_main]
use libfuzzer_sys::fuzz_target;
use switchyard::config::Config;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = Config::parse(s);
    }
});
