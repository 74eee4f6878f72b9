//! What every test server here shares: free loopback ports, readiness probes, signals, and
//! stopping a server by PID (by its process group when it leads one, as on a test host).

use std::io::{self, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `N` free loopback ports, all different: the listeners are held until every port is picked
/// (ports picked one at a time, each listener dropped before the next bind, can come back
/// equal, and a server given the same port twice answers on one of them only). Another
/// process can still take one before the server binds it, so the servers here start again on
/// new ports when that happens.
pub fn free_ports<const N: usize>() -> io::Result<[u16; N]> {
    let listeners = (0..N)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<io::Result<Vec<_>>>()?;
    let mut ports = [0; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener.local_addr()?.port();
    }
    Ok(ports)
}

/// Stops a test server by PID (its process group when it leads one, as on a test host): sends
/// `name` (`INT`, `TERM`; a paused process is resumed first so that it can act on it), waits
/// up to 20 s for it to exit, then kills it.
pub fn stop_child(child: &mut Child, name: &str) {
    let pid = child.id();
    signal(pid, "CONT");
    signal(pid, name);
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(20) {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    signal(pid, "KILL");
    let _ = child.kill();
    let _ = child.wait();
}

/// Kills a test server (`SIGKILL`, a crash) and waits for it.
pub fn kill_child(child: &mut Child) {
    signal(child.id(), "KILL");
    let _ = child.kill();
    let _ = child.wait();
}

/// Whether `pid` leads a process group of its own (a server on a test host does).
fn leads_group(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // After the command name in parentheses: state, parent, process group.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(2))
        .is_some_and(|group| group == pid.to_string())
}

/// Loopback, where the test servers listen unless a test host (a network namespace) holds them.
pub const LOOPBACK: std::net::Ipv4Addr = std::net::Ipv4Addr::LOCALHOST;

/// Whether something accepts TCP connections on the loopback `port`.
pub fn listens(port: u16) -> bool {
    listens_at(LOOPBACK, port)
}

/// Whether something accepts TCP connections at `ip`:`port`.
pub fn listens_at(ip: std::net::Ipv4Addr, port: u16) -> bool {
    let address = std::net::SocketAddr::from((ip, port));
    std::net::TcpStream::connect_timeout(&address, Duration::from_millis(500)).is_ok()
}

/// Whether `GET http://127.0.0.1:port/path` answers `status`.
pub fn answers(port: u16, path: &str, status: u16) -> bool {
    answers_at(LOOPBACK, port, path, status)
}

/// Whether `GET http://ip:port/path` answers `status`.
pub fn answers_at(ip: std::net::Ipv4Addr, port: u16, path: &str, status: u16) -> bool {
    let address = std::net::SocketAddr::from((ip, port));
    let Ok(mut stream) = std::net::TcpStream::connect_timeout(&address, Duration::from_millis(500))
    else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let request = format!("GET {path} HTTP/1.0\r\nHost: {ip}\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    answer.starts_with(format!("HTTP/1.1 {status}").as_bytes())
        || answer.starts_with(format!("HTTP/1.0 {status}").as_bytes())
}

/// `GET http://ip:port/path` as JSON, when it answers 200 with a JSON body.
pub fn get_json(ip: std::net::Ipv4Addr, port: u16, path: &str) -> Option<serde_json::Value> {
    let address = std::net::SocketAddr::from((ip, port));
    let mut stream =
        std::net::TcpStream::connect_timeout(&address, Duration::from_millis(500)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: {ip}\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).ok()?;
    if !(answer.starts_with(b"HTTP/1.1 200") || answer.starts_with(b"HTTP/1.0 200")) {
        return None;
    }
    let body = answer.windows(4).position(|window| window == b"\r\n\r\n")? + 4;
    serde_json::from_slice(&answer[body..]).ok()
}

/// Sends the signal `name` (`STOP`, `CONT`, ...) to the process `pid`, or to its process
/// group when it leads one.
pub fn signal(pid: u32, name: &str) {
    // A server that leads its own process group (on a test host) is signalled as a group, so
    // whatever it started goes with it.
    let target = if leads_group(pid) {
        format!("-{pid}")
    } else {
        pid.to_string()
    };
    let _ = Command::new("kill")
        .args([&format!("-{name}"), "--", &target])
        .status();
}

/// Waits up to `limit` until `ready` says the server `child` runs is ready, checking every
/// `poll`. An error when the server exits first (then `child` is emptied) or when time runs
/// out; both carry what `log` returns.
pub fn await_ready(
    child: &mut Option<Child>,
    what: &str,
    limit: Duration,
    poll: Duration,
    mut ready: impl FnMut() -> bool,
    log: impl Fn() -> String,
) -> io::Result<()> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if let Some(running) = child.as_mut() {
            if let Some(status) = running.try_wait()? {
                *child = None;
                return Err(io::Error::other(format!(
                    "{what} exited at start ({status}): {}",
                    log()
                )));
            }
        }
        if ready() {
            return Ok(());
        }
        std::thread::sleep(poll);
    }
    Err(io::Error::other(format!(
        "{what} did not become ready in {} s: {}",
        limit.as_secs(),
        log()
    )))
}

/// Starts a test server's `command` with no input and its output appended to `log` (kept
/// across restarts, so a failure shows every start).
pub fn spawn_logged(command: &mut Command, log: &std::path::Path) -> io::Result<Child> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    command
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
}
