//! `switchyard-cni`: the CNI plugin (see issue: not implemented yet).

fn main() {
    eprintln!("switchyard-cni: not implemented yet");
    std::process::exit(1);
}
