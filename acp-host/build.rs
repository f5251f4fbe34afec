//! Links the `acp-host` binary as a position-dependent executable on Linux (glibc).
//!
//! Why: a position-independent executable of this size carries about 15,000 relative
//! relocations, which the loader applies at every start, writing (and so copying) about 70 pages
//! of the binary's data; those pages are then copied again by the watchdog's fork. Linked at a
//! fixed address the pointers are resolved by the linker: a one-shot run starts measurably faster
//! (docs/benchmarks.md). The libraries, the heap and the stack keep their randomized addresses.
//! Only the binary is affected: the library and the test builds are unchanged.

fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        println!("cargo:rustc-link-arg-bin=acp-host=-no-pie");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
