//! `switchyard-cni`: installed as `/opt/cni/bin/switchyard`.

use std::process::ExitCode;

fn main() -> ExitCode {
    let env = switchyard_cni::plugin::Env::from_process();
    let stdin = if env.command == "VERSION" && atty_stdin() {
        Vec::new()
    } else {
        switchyard_cni::read_stdin().unwrap_or_default()
    };
    let (out, ok) = switchyard_cni::run(&env, &stdin);
    if let Some(v) = out {
        println!("{v}");
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// True when stdin is a terminal (someone ran `CNI_COMMAND=VERSION` by hand).
fn atty_stdin() -> bool {
    use std::io::IsTerminal;
    std::io::stdin().is_terminal()
}
