//! The `acp-host` command line. `src/main.rs` is only the entry point; the rest is a library so
//! that its documentation is built and checked as the other crates' is (a binary named like the
//! `acp_host` library would collide with it in `target/doc`). Nothing outside this package uses
//! it: [`main`] is its one item.

mod cli;

pub use cli::main;
