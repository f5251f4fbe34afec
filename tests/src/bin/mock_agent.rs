//! The scripted mock ACP agent (in progress).

fn main() {}
