//! The daemon's TOML configuration: parsing never panics, and a config it
//! accepted, written out as TOML, parses again to the same config.
#![no_main]
use libfuzzer_sys::fuzz_target;
use switchyard::config::Config;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(c) = Config::parse(s) else {
        return;
    };
    let text = toml::to_string(&c).expect("an accepted config writes out");
    let again = Config::parse(&text).unwrap_or_else(|e| panic!("{text}\n{e}"));
    assert_eq!(toml::to_string(&again).unwrap(), text);
});
