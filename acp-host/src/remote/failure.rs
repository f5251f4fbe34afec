//! Why the bridge's connection attempt failed, for both of its clients (the SDK's over `http://`
//! in `bridge`, our own WebSocket one in `bridge_ws`): a leaf both point down at.

/// Why a connection attempt failed, before `BridgeError` names the URL.
#[derive(Debug)]
pub(super) enum Failure {
    /// Nothing listens at the address (`ECONNREFUSED`).
    Refused,
    Other(String),
}

/// Whether `err` (or what caused it) is a refused TCP connection.
pub(super) fn refused(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(err);
    while let Some(err) = cause {
        if err
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return true;
        }
        cause = err.source();
    }
    false
}
