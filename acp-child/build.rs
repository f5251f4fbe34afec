//! Builds on Linux (GNU) link libgcc's unwinder into acp-child (`static_unwinder`): no
//! `libgcc_s.so.1` to load, nor its constructor to run, at every start. acp-child starts once
//! per delegated child, so this is on every delegation's path.

use std::env;
use std::path::Path;
use std::process::Command;

fn main() {
    static_unwinder(linker_chosen());
}

/// Whether something other than the target's default (`cc` with rust-lld) links: the options
/// below are then left to whoever chose it.
fn linker_chosen() -> bool {
    println!("cargo:rerun-if-env-changed=RUSTC_LINKER");
    let flags = env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    env::var_os("RUSTC_LINKER").is_some()
        || ["linker", "link-self-contained", "fuse-ld"]
            .iter()
            .any(|choice| flags.contains(choice))
}

/// Links libgcc's unwinder into the binaries (from `libgcc_eh.a`) instead of loading
/// `libgcc_s.so.1`, as `gcc -static-libgcc` does: rustc asks for `-lgcc_s`, and a linker script
/// of that name, found first, names the static archive instead. Loading `libgcc_s.so.1` runs its
/// constructor, `__cpu_indicator_init`: 13 `cpuid` instructions, each a trap to the hypervisor
/// on a virtual machine (about 6 us on the machine of docs/benchmarks.md, "One unwinder, linked
/// in"), paid by every start. Linux (GNU) builds for the machine they are built on, with the
/// default linker; anywhere else, or without a `libgcc_eh.a` where `cc` looks, nothing changes.
/// The same in acp-host's `build.rs`.
fn static_unwinder(linker_chosen: bool) {
    let cfg = |name: &str| env::var(format!("CARGO_CFG_TARGET_{name}")).unwrap_or_default();
    let native = env::var("TARGET").ok() == env::var("HOST").ok();
    if linker_chosen || !native || cfg("OS") != "linux" || cfg("ENV") != "gnu" {
        return;
    }
    if cfg("FEATURE")
        .split(',')
        .any(|feature| feature == "crt-static")
    {
        return;
    }
    let Some(archive) = Command::new("cc")
        .arg("-print-file-name=libgcc_eh.a")
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        // Without the file, cc prints the bare name back.
        .filter(|path| Path::new(path).is_absolute() && Path::new(path).is_file())
        // A linker script's quoted name has no escapes.
        .filter(|path| !path.contains('"'))
    else {
        return;
    };
    let Some(out) = env::var_os("OUT_DIR") else {
        return;
    };
    let dir = Path::new(&out).join("static-unwinder");
    let script = format!("INPUT(\"{archive}\")\n");
    if std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(dir.join("libgcc_s.so"), script))
        .is_ok()
    {
        println!("cargo:rustc-link-search=native={}", dir.display());
    }
}
