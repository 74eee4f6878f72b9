//! Test hosts: Linux network namespaces on one bridge, made and torn down by the test itself.
//!
//! ## Model
//! - A [`Network`] is a bridge in the test's own namespace with an address of its own (the
//!   harness, as the clients and the oracle, sits there), and one namespace per host, joined
//!   to the bridge by a veth pair, each with its own address on one `/24`.
//! - A host runs programs through `ip netns exec`, which `exec`s them: the PID is the
//!   program's own. Each program starts in its own process group, so stopping the group
//!   stops everything it started.
//! - Faults without netem (this kernel has none):
//!   - [`Network::isolate`] takes the host's veth down on the bridge side: nothing reaches it
//!     and nothing leaves it;
//!   - [`Network::separate`] blackholes, inside a host, the routes to some peers: its packets
//!     to them are dropped, so no connection between them can complete, while the harness
//!     still reaches it;
//!   - [`Network::cut_port`] drops, with nftables inside a host, what arrives on one port
//!     (Debian's `nftables`).
//!
//! ## Invariants
//! - Making a network needs root (CI runs as root). When a step fails, the error names the
//!   command and what it printed; a test never skips quietly.
//! - Names are unique per process and per network (interface names are at most 15 bytes),
//!   and so are the subnets, so tests can run side by side.
//! - Dropping a network deletes its namespaces, veths and bridge, whatever state the faults
//!   left them in.

use std::io;
use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Networks made by this process so far (for unique names and subnets).
static MADE: AtomicU32 = AtomicU32::new(0);

/// One test host: a network namespace with one address on the bridge.
#[derive(Debug, Clone)]
pub struct Host {
    /// The host's name in the test (`q1`, `pg`, ...).
    pub name: String,
    /// The namespace's name (`ip netns`).
    pub namespace: String,
    /// Its address on the bridge.
    pub ip: Ipv4Addr,
    /// The bridge-side end of its veth pair.
    veth: String,
}

/// A bridge and its hosts, torn down on drop.
#[derive(Debug)]
pub struct Network {
    bridge: String,
    /// The harness's own address on the bridge.
    harness: Ipv4Addr,
    hosts: Vec<Host>,
}

/// Runs `ip`-style `program` with `arguments`; an error names the command and its output.
fn run(program: &str, arguments: &[&str]) -> io::Result<()> {
    let output = Command::new(program)
        .args(arguments)
        .output()
        .map_err(|error| {
            io::Error::new(
                error.kind(),
                format!("{program} {}: {error}", arguments.join(" ")),
            )
        })?;
    if output.status.success() {
        return Ok(());
    }
    Err(io::Error::other(format!(
        "`{program} {}` failed ({}): {}{}",
        arguments.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stderr).trim(),
        if not_root() {
            " (network namespaces need root: run the tests as root, as CI does)"
        } else {
            ""
        }
    )))
}

/// Whether this process is not root (the likely cause of a failed `ip` call).
fn not_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|output| String::from_utf8_lossy(&output.stdout).trim() != "0")
        .unwrap_or(false)
}

impl Network {
    /// Makes a bridge and one namespace per name in `hosts`, each with `lo` up and an address
    /// on the bridge. Fails (never skips) when the namespaces cannot be made, saying why.
    pub fn create(hosts: &[&str]) -> io::Result<Network> {
        let serial = MADE.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let tag = format!("{:x}{serial:x}", pid % 0x10_0000);
        // 10.<200-249>.<0-255>.0/24 from the pid and the serial: distinct for tests running
        // side by side, and away from common private ranges.
        let second = 200 + (pid % 50) as u8;
        let third = ((pid / 50 + serial * 37) % 256) as u8;
        let address = |last: u8| Ipv4Addr::new(10, second, third, last);
        let mut network = Network {
            bridge: format!("cb{tag}"),
            harness: address(1),
            hosts: Vec::new(),
        };
        run("ip", &["link", "add", &network.bridge, "type", "bridge"])?;
        run(
            "ip",
            &[
                "addr",
                "add",
                &format!("{}/24", network.harness),
                "dev",
                &network.bridge,
            ],
        )?;
        run("ip", &["link", "set", &network.bridge, "up"])?;
        for (index, name) in hosts.iter().enumerate() {
            let host = Host {
                name: (*name).to_owned(),
                namespace: format!("cairn-{tag}-{name}"),
                ip: address(2 + index as u8),
                veth: format!("cv{tag}{index}"),
            };
            let inner = format!("ci{tag}{index}");
            run("ip", &["netns", "add", &host.namespace])?;
            network.hosts.push(host.clone());
            let inside = |arguments: &[&str]| {
                let mut all = vec!["netns", "exec", &host.namespace, "ip"];
                all.extend_from_slice(arguments);
                run("ip", &all)
            };
            run(
                "ip",
                &[
                    "link", "add", &host.veth, "type", "veth", "peer", "name", &inner,
                ],
            )?;
            run("ip", &["link", "set", &inner, "netns", &host.namespace])?;
            run(
                "ip",
                &["link", "set", &host.veth, "master", &network.bridge],
            )?;
            run("ip", &["link", "set", &host.veth, "up"])?;
            inside(&["link", "set", "lo", "up"])?;
            inside(&["addr", "add", &format!("{}/24", host.ip), "dev", &inner])?;
            inside(&["link", "set", &inner, "up"])?;
        }
        Ok(network)
    }

    /// The host named `name`.
    ///
    /// # Panics
    /// When the network has no such host (a mistake in the test).
    pub fn host(&self, name: &str) -> &Host {
        self.hosts
            .iter()
            .find(|host| host.name == name)
            .unwrap_or_else(|| panic!("no test host {name}"))
    }

    /// The harness's own address on the bridge (where clients and the oracle sit).
    pub fn harness_ip(&self) -> Ipv4Addr {
        self.harness
    }

    /// A command that runs `program` on `host`, in a process group of its own.
    pub fn command(&self, host: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
        use std::os::unix::process::CommandExt;
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &self.host(host).namespace])
            .arg(program)
            .process_group(0);
        command
    }

    /// Takes `host` off the bridge (its veth down on the bridge side): nothing reaches it and
    /// nothing leaves it, the harness included.
    pub fn isolate(&self, host: &str) -> io::Result<()> {
        run("ip", &["link", "set", &self.host(host).veth, "down"])
    }

    /// Puts an isolated `host` back on the bridge.
    pub fn rejoin(&self, host: &str) -> io::Result<()> {
        run("ip", &["link", "set", &self.host(host).veth, "up"])
    }

    /// Inside `host`, blackholes the routes to each of `peers`: no connection between them
    /// can complete, while the harness still reaches `host`.
    pub fn separate(&self, host: &str, peers: &[&str]) -> io::Result<()> {
        for peer in peers {
            let ip = self.host(peer).ip.to_string();
            self.ip_inside(host, &["route", "add", "blackhole", &format!("{ip}/32")])?;
        }
        Ok(())
    }

    /// Undoes [`Network::separate`].
    pub fn reconnect(&self, host: &str, peers: &[&str]) -> io::Result<()> {
        for peer in peers {
            let ip = self.host(peer).ip.to_string();
            self.ip_inside(host, &["route", "del", "blackhole", &format!("{ip}/32")])?;
        }
        Ok(())
    }

    /// Inside `host`, drops every packet that arrives for TCP `port` (nftables), so clients
    /// of that port time out while the host's other ports answer.
    pub fn cut_port(&self, host: &str, port: u16) -> io::Result<()> {
        let namespace = &self.host(host).namespace;
        let rules = format!(
            "table inet cairn_cut {{ chain input {{ type filter hook input priority 0; \
             tcp dport {port} drop; }} }}"
        );
        run("ip", &["netns", "exec", namespace, "nft", &rules])
    }

    /// Undoes every [`Network::cut_port`] on `host`.
    pub fn restore_ports(&self, host: &str) -> io::Result<()> {
        let namespace = &self.host(host).namespace;
        run(
            "ip",
            &[
                "netns",
                "exec",
                namespace,
                "nft",
                "delete",
                "table",
                "inet",
                "cairn_cut",
            ],
        )
    }

    fn ip_inside(&self, host: &str, arguments: &[&str]) -> io::Result<()> {
        let mut all = vec!["netns", "exec", &self.host(host).namespace, "ip"];
        all.extend_from_slice(arguments);
        run("ip", &all)
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        for host in &self.hosts {
            // Whatever still runs in the namespace keeps it alive; the namespace's name goes.
            let _ = run("ip", &["link", "del", &host.veth]);
            let _ = run("ip", &["netns", "del", &host.namespace]);
        }
        let _ = run("ip", &["link", "del", &self.bridge]);
    }
}
