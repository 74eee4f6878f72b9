//! How long a ledger connection waits on a silent PostgreSQL: the peer timeout.
//!
//! A network partition does not close a TCP connection. Without this, a statement sent just
//! before PostgreSQL's host went away waits for the kernel to give up on retransmitting, some
//! fifteen minutes, and every API request and worker step on that connection waits with it.
//! So each new connection's socket gets, on this side:
//! - `TCP_USER_TIMEOUT`: data the server has not acknowledged within the peer timeout aborts
//!   the connection;
//! - keepalive probes every second after one idle second, under the same timeout, so a
//!   connection waiting for an answer notices a silent server too. A server that is busy
//!   computing still answers probes: only silence counts, never a slow statement.
//!
//! The aborted statement fails with an I/O error, which is `ledger_unavailable` (503 with
//! `Retry-After`). Its outcome is unknown when the statement was a `COMMIT`; resending the same
//! document is then a `duplicate`, never a second revision. PostgreSQL is asked to do the same
//! from its side (`tcp_keepalives_*`, `tcp_user_timeout`), so a transaction whose client
//! vanished is rolled back and its source locks released within seconds, not hours.
//!
//! sqlx does not hand out its sockets, so the socket is found by its addresses: the server says
//! which client address and port it sees, and the process's socket with that local address and
//! the server's port is duplicated (`pidfd_getfd` on this process, which needs no `unsafe`)
//! and configured. Behind a proxy or NAT the addresses differ and nothing matches: then the
//! connection keeps the kernel's defaults and one warning says so.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::PgConnection;

/// The server-side settings that match a peer timeout (sent as startup options).
pub(super) fn server_settings(timeout: Duration) -> Vec<(&'static str, String)> {
    let seconds = timeout.as_secs().max(1);
    vec![
        ("tcp_keepalives_idle", seconds.to_string()),
        ("tcp_keepalives_interval", "1".to_owned()),
        ("tcp_keepalives_count", seconds.max(2).to_string()),
        ("tcp_user_timeout", timeout.as_millis().to_string()),
    ]
}

/// Whether the warning that a connection could not be bounded was already logged.
static WARNED: AtomicBool = AtomicBool::new(false);

/// Bounds the socket of a freshly opened `connection` by `timeout` (see the module docs).
/// A connection whose socket cannot be found or configured keeps the kernel's defaults: that
/// is logged once, and the connection is still used.
pub(super) async fn bound(connection: &mut PgConnection, timeout: Duration) -> sqlx::Result<()> {
    let (client, client_port, server_port): (Option<String>, Option<i32>, Option<i32>) =
        sqlx::query_as("SELECT host(inet_client_addr()), inet_client_port(), inet_server_port()")
            .fetch_one(&mut *connection)
            .await?;
    // A Unix-domain socket has no addresses, and no network to partition.
    let (Some(client), Some(client_port), Some(server_port)) = (client, client_port, server_port)
    else {
        return Ok(());
    };
    let outcome = client
        .parse::<IpAddr>()
        .map_err(|error| format!("the server sees client address {client:?}: {error}"))
        .and_then(|ip| {
            let local = SocketAddr::new(ip, port(client_port)?);
            let server_port = port(server_port)?;
            configure(find(local, server_port)?, timeout)
        });
    if let Err(problem) = outcome {
        if !WARNED.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                %problem,
                "cannot set the peer timeout on ledger connections: a network partition may \
                 hold requests on a connection until the kernel gives up on it (minutes)"
            );
        }
    }
    Ok(())
}

fn port(value: i32) -> Result<u16, String> {
    u16::try_from(value).map_err(|_| format!("port {value} out of range"))
}

/// This process's socket whose local address is `local` and whose peer port is `server_port`,
/// duplicated.
fn find(local: SocketAddr, server_port: u16) -> Result<OwnedFd, String> {
    let me = rustix::process::pidfd_open(
        rustix::process::getpid(),
        rustix::process::PidfdFlags::empty(),
    )
    .map_err(|error| format!("pidfd_open: {error}"))?;
    let entries =
        std::fs::read_dir("/proc/self/fd").map_err(|error| format!("/proc/self/fd: {error}"))?;
    for entry in entries.flatten() {
        let Some(number) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<i32>().ok())
        else {
            continue;
        };
        let is_socket = std::fs::read_link(entry.path())
            .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"));
        if !is_socket {
            continue;
        }
        // The descriptor may have closed since it was listed: then this fails or finds another
        // socket, which the address check sets aside.
        let Ok(socket) =
            rustix::process::pidfd_getfd(&me, number, rustix::process::PidfdGetfdFlags::empty())
        else {
            continue;
        };
        if addresses(&socket) == Some((local, server_port)) {
            return Ok(socket);
        }
    }
    Err(format!(
        "no socket of this process has local address {local} and peer port {server_port} \
         (a proxy or NAT between cairn and PostgreSQL?)"
    ))
}

/// The local address and the peer's port of a connected TCP socket.
fn addresses(socket: &OwnedFd) -> Option<(SocketAddr, u16)> {
    let local = SocketAddr::try_from(rustix::net::getsockname(socket.as_fd()).ok()?).ok()?;
    let peer = SocketAddr::try_from(rustix::net::getpeername(socket.as_fd()).ok()??).ok()?;
    Some((local, peer.port()))
}

fn configure(socket: OwnedFd, timeout: Duration) -> Result<(), String> {
    use rustix::net::sockopt;
    let millis = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
    let failed = |what: &str, error: rustix::io::Errno| format!("setting {what}: {error}");
    sockopt::set_tcp_user_timeout(&socket, millis).map_err(|e| failed("TCP_USER_TIMEOUT", e))?;
    sockopt::set_socket_keepalive(&socket, true).map_err(|e| failed("SO_KEEPALIVE", e))?;
    sockopt::set_tcp_keepidle(&socket, Duration::from_secs(1))
        .map_err(|e| failed("TCP_KEEPIDLE", e))?;
    sockopt::set_tcp_keepintvl(&socket, Duration::from_secs(1))
        .map_err(|e| failed("TCP_KEEPINTVL", e))?;
    let probes = u32::try_from(timeout.as_secs()).unwrap_or(u32::MAX).max(2);
    sockopt::set_tcp_keepcnt(&socket, probes).map_err(|e| failed("TCP_KEEPCNT", e))?;
    Ok(())
}
