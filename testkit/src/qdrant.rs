//! A real Qdrant server for tests: the official Qdrant v1.18.3 binary from `../shared/qdrant/`
//! (`CAIRN_QDRANT_SERVER` overrides the path), on free loopback ports with a temporary
//! directory, ready once its readiness endpoint says so, stopped by PID. The launcher `exec`s
//! the server, so the PID held here is the server's own; tests may also pause it (`SIGSTOP`)
//! and resume it to play a hung server.
//!
//! [`QdrantCluster`] starts several such servers in Qdrant's distributed mode (Raft consensus
//! over a peer-to-peer port each), the first bootstrapping the cluster and the others joining
//! it; each node can be killed, restarted, paused and resumed on its own.

use std::io;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::ports::{
    answers_at, free_ports, get_json, kill_child, listens_at, signal, stop_child, LOOPBACK,
};

/// A Qdrant server owned by a test. Dropping it stops the server and removes its storage.
#[derive(Debug)]
pub struct QdrantServer {
    directory: tempfile::TempDir,
    http_port: u16,
    grpc_port: u16,
    api_key: Option<String>,
    /// Where it listens: loopback, or its test host's address.
    ip: std::net::Ipv4Addr,
    /// The test host (network namespace) it runs in, if any.
    namespace: Option<String>,
    /// In a cluster: the peer-to-peer port and the arguments that place the node (`--uri`,
    /// and `--bootstrap` for a joining node).
    cluster: Option<(u16, Vec<String>)>,
    child: Option<Child>,
}

/// Where the launcher is: `CAIRN_QDRANT_SERVER`, else `shared/qdrant/qdrant-server` beside or
/// inside the repository.
pub fn server_binary() -> io::Result<PathBuf> {
    if let Some(path) = std::env::var_os("CAIRN_QDRANT_SERVER") {
        return Ok(PathBuf::from(path));
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    [
        root.join("../shared/qdrant/qdrant-server"),
        root.join("shared/qdrant/qdrant-server"),
    ]
    .into_iter()
    .find(|path| path.is_file())
    .ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            "the Qdrant server launcher is not at ../shared/qdrant/qdrant-server; set \
             CAIRN_QDRANT_SERVER",
        )
    })
}

impl QdrantServer {
    /// Starts a server; returns once it is ready.
    pub fn start() -> io::Result<QdrantServer> {
        Self::start_with_key(None)
    }

    /// Starts a server that requires `api_key` (when given).
    pub fn start_with_key(api_key: Option<&str>) -> io::Result<QdrantServer> {
        Self::start_node(api_key, None)
    }

    /// Starts a server, a cluster node when `bootstrap` is given (`Some(None)`: the first
    /// node, which starts the cluster; `Some(Some(uri))`: a node joining the peer at `uri`).
    fn start_node(
        api_key: Option<&str>,
        bootstrap: Option<Option<String>>,
    ) -> io::Result<QdrantServer> {
        Self::start_placed(api_key, bootstrap, None)
    }

    /// [`QdrantServer::start_node`] on a test host (`(namespace, address)`: Qdrant's own
    /// ports there, 6333 to 6335), or on free loopback ports.
    fn start_placed(
        api_key: Option<&str>,
        bootstrap: Option<Option<String>>,
        host: Option<(&str, std::net::Ipv4Addr)>,
    ) -> io::Result<QdrantServer> {
        let directory = tempfile::Builder::new().prefix("cairn-qdrant-").tempdir()?;
        let ([http_port, grpc_port, p2p_port], ip) = match host {
            Some((_, ip)) => ([6333, 6334, 6335], ip),
            None => (free_ports()?, LOOPBACK),
        };
        let cluster = bootstrap.map(|bootstrap| {
            let mut arguments = vec!["--uri".to_owned(), format!("http://{ip}:{p2p_port}")];
            if let Some(peer) = bootstrap {
                arguments.extend(["--bootstrap".to_owned(), peer]);
            }
            (p2p_port, arguments)
        });
        let mut server = QdrantServer {
            directory,
            http_port,
            grpc_port,
            api_key: api_key.map(str::to_owned),
            ip,
            namespace: host.map(|(namespace, _)| namespace.to_owned()),
            cluster,
            child: None,
        };
        // A free port can be taken by another process (a server another test starts) before
        // qdrant binds it: qdrant then serves HTTP without gRPC. Start again on new ports.
        let mut attempts = 0;
        loop {
            match server.start_again() {
                Err(error) if error.kind() == io::ErrorKind::AddrInUse && attempts < 4 => {
                    attempts += 1;
                    [server.http_port, server.grpc_port] = free_ports()?;
                }
                result => return result.map(|()| server),
            }
        }
    }

    /// Starts the server again on the same ports and storage (after [`QdrantServer::stop`] or
    /// [`QdrantServer::kill`]); returns once it is ready.
    pub fn start_again(&mut self) -> io::Result<()> {
        let root = self.directory.path();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(root.join("qdrant.log"))?;
        // What this start writes to the log comes after what earlier starts wrote.
        let logged_before = log.metadata()?.len();
        let mut command = match &self.namespace {
            Some(namespace) => {
                use std::os::unix::process::CommandExt;
                let mut command = Command::new("ip");
                command
                    .args(["netns", "exec", namespace])
                    .arg(server_binary()?)
                    .process_group(0);
                command
            }
            None => Command::new(server_binary()?),
        };
        command
            .current_dir(root)
            .env("QDRANT__STORAGE__STORAGE_PATH", root.join("storage"))
            .env("QDRANT__STORAGE__SNAPSHOTS_PATH", root.join("snapshots"))
            .env("QDRANT__SERVICE__HOST", self.ip.to_string())
            .env("QDRANT__SERVICE__HTTP_PORT", self.http_port.to_string())
            .env("QDRANT__SERVICE__GRPC_PORT", self.grpc_port.to_string())
            .env("QDRANT__TELEMETRY_DISABLED", "true")
            .env("QDRANT__LOG_LEVEL", "WARN")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        if let Some(key) = &self.api_key {
            command.env("QDRANT__SERVICE__API_KEY", key);
        }
        if let Some((p2p_port, arguments)) = &self.cluster {
            // Calls between peers give up after 1 s (connections after 1 s too), well inside
            // the client's own timeout: a write that cannot reach a replica fails or marks it
            // dead in time for the client to see an answer, not a cancelled call. The
            // deployment guide recommends the same.
            command
                .env("QDRANT__CLUSTER__ENABLED", "true")
                .env("QDRANT__CLUSTER__GRPC_TIMEOUT_MS", "1000")
                .env("QDRANT__CLUSTER__CONNECTION_TIMEOUT_MS", "1000")
                .env("QDRANT__CLUSTER__P2P__PORT", p2p_port.to_string())
                .args(arguments);
        }
        self.child = Some(command.spawn()?);
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(60) {
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    self.child = None;
                    return Err(io::Error::other(format!(
                        "qdrant exited at start ({status}): {}",
                        self.log()
                    )));
                }
            }
            if self.ready() {
                return Ok(());
            }
            if self
                .log_since(logged_before)
                .contains("Error while starting gRPC server")
            {
                self.kill();
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("qdrant could not serve gRPC on port {}", self.grpc_port),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(io::Error::other(format!(
            "qdrant did not become ready in 60 s: {}",
            self.log()
        )))
    }

    /// Whether `GET /readyz` answers 200 and the gRPC port (the one the store uses) accepts
    /// connections.
    pub fn ready(&self) -> bool {
        answers_at(self.ip, self.http_port, "/readyz", 200) && listens_at(self.ip, self.grpc_port)
    }

    /// Stops the server by PID (`SIGTERM`, a clean stop; `SIGKILL` after 20 s) and waits.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop_child(&mut child, "TERM");
        }
    }

    /// Kills the server (`SIGKILL`) and waits: a crash.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_child(&mut child);
        }
    }

    /// Pauses the server (`SIGSTOP`): connections stay open and nothing answers.
    pub fn pause(&self) {
        if let Some(pid) = self.pid() {
            signal(pid, "STOP");
        }
    }

    /// Resumes a paused server (`SIGCONT`).
    pub fn resume(&self) {
        if let Some(pid) = self.pid() {
            signal(pid, "CONT");
        }
    }

    /// The server's PID, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The gRPC URL (what `qdrant-client` and `vectors.url` take).
    pub fn grpc_url(&self) -> String {
        format!("http://{}:{}", self.ip, self.grpc_port)
    }

    /// The address it listens on.
    pub fn ip(&self) -> std::net::Ipv4Addr {
        self.ip
    }

    /// The REST port.
    pub fn http_port(&self) -> u16 {
        self.http_port
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        self.log_since(0)
    }

    /// The server's log from byte `offset` on.
    fn log_since(&self, offset: u64) -> String {
        let bytes = std::fs::read(self.directory.path().join("qdrant.log")).unwrap_or_default();
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(bytes.len());
        String::from_utf8_lossy(&bytes[start..]).into_owned()
    }
}

/// Several Qdrant servers in one cluster, owned by a test; dropping it stops every node.
#[derive(Debug)]
pub struct QdrantCluster {
    nodes: Vec<QdrantServer>,
}

impl QdrantCluster {
    /// Starts `size` nodes (the first bootstraps the cluster, the others join it); returns
    /// once every node is ready and sees all `size` peers.
    pub fn start(size: usize) -> io::Result<QdrantCluster> {
        Self::start_placed(&vec![None; size])
    }

    /// Starts one node on each of `hosts` of `network` (in that order), as
    /// [`QdrantCluster::start`] does on loopback.
    pub fn start_on(network: &crate::netns::Network, hosts: &[&str]) -> io::Result<QdrantCluster> {
        let placed: Vec<Option<(&str, std::net::Ipv4Addr)>> = hosts
            .iter()
            .map(|name| {
                let host = network.host(name);
                Some((host.namespace.as_str(), host.ip))
            })
            .collect();
        Self::start_placed(&placed)
    }

    fn start_placed(hosts: &[Option<(&str, std::net::Ipv4Addr)>]) -> io::Result<QdrantCluster> {
        let Some((first_host, others)) = hosts.split_first() else {
            return Err(io::Error::other("a cluster needs at least one node"));
        };
        let first = QdrantServer::start_placed(None, Some(None), *first_host)?;
        let peer = first
            .cluster
            .as_ref()
            .map(|(port, _)| format!("http://{}:{port}", first.ip))
            .ok_or_else(|| io::Error::other("the first node has no peer port"))?;
        let mut nodes = vec![first];
        for host in others {
            nodes.push(QdrantServer::start_placed(
                None,
                Some(Some(peer.clone())),
                *host,
            )?);
        }
        let cluster = QdrantCluster { nodes };
        cluster.await_peers(Duration::from_secs(60))?;
        Ok(cluster)
    }

    /// Waits until every running node sees every node as a peer.
    pub fn await_peers(&self, limit: Duration) -> io::Result<()> {
        let started = Instant::now();
        loop {
            let seen: Vec<usize> = self
                .nodes
                .iter()
                .filter(|node| node.pid().is_some())
                .map(|node| node.peers())
                .collect();
            if seen.iter().all(|peers| *peers == self.nodes.len()) {
                return Ok(());
            }
            if started.elapsed() > limit {
                return Err(io::Error::other(format!(
                    "the Qdrant cluster did not form in {limit:?}: peers seen per node {seen:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The nodes, in start order.
    pub fn nodes(&self) -> &[QdrantServer] {
        &self.nodes
    }

    /// One node, to kill, restart, pause or resume.
    pub fn node(&mut self, index: usize) -> &mut QdrantServer {
        &mut self.nodes[index]
    }

    /// Every node's gRPC URL, in start order (what `vectors.urls` takes).
    pub fn grpc_urls(&self) -> Vec<String> {
        self.nodes.iter().map(QdrantServer::grpc_url).collect()
    }

    /// What every running node holds of `collection`, shard by shard:
    /// `(node index, shard id, points, state)` for each local replica, from each node's own
    /// `GET /collections/{collection}/cluster`. A direct count against every node.
    pub fn replicas(&self, collection: &str) -> Vec<(usize, u64, u64, String)> {
        let mut replicas = Vec::new();
        for (index, node) in self.nodes.iter().enumerate() {
            if node.pid().is_none() {
                continue;
            }
            let Some(answer) = get_json(
                node.ip,
                node.http_port,
                &format!("/collections/{collection}/cluster"),
            ) else {
                continue;
            };
            let shards = answer["result"]["local_shards"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            for shard in shards {
                replicas.push((
                    index,
                    shard["shard_id"].as_u64().unwrap_or(u64::MAX),
                    shard["points_count"].as_u64().unwrap_or(u64::MAX),
                    shard["state"].as_str().unwrap_or("?").to_owned(),
                ));
            }
        }
        replicas
    }

    /// Waits until `collection` has `shards` shards, each with `replicas` replicas active on
    /// running nodes and holding the same number of points; returns the replicas seen (as
    /// [`QdrantCluster::replicas`]), or says what it saw last when `limit` passes.
    pub fn await_converged(
        &self,
        collection: &str,
        shards: usize,
        replicas: usize,
        limit: Duration,
    ) -> io::Result<Vec<(usize, u64, u64, String)>> {
        self.await_replicas(collection, shards, replicas, true, limit)
    }

    /// Waits until every replica of `collection`'s `shards` shards is active on a running
    /// node, whatever it holds (writes may still be arriving).
    pub fn await_active(
        &self,
        collection: &str,
        shards: usize,
        replicas: usize,
        limit: Duration,
    ) -> io::Result<Vec<(usize, u64, u64, String)>> {
        self.await_replicas(collection, shards, replicas, false, limit)
    }

    fn await_replicas(
        &self,
        collection: &str,
        shards: usize,
        replicas: usize,
        equal: bool,
        limit: Duration,
    ) -> io::Result<Vec<(usize, u64, u64, String)>> {
        let started = std::time::Instant::now();
        loop {
            let seen = self.replicas(collection);
            let mut by_shard: std::collections::BTreeMap<u64, Vec<(u64, &str)>> =
                std::collections::BTreeMap::new();
            for (_, shard, points, state) in &seen {
                by_shard
                    .entry(*shard)
                    .or_default()
                    .push((*points, state.as_str()));
            }
            let converged = by_shard.len() == shards
                && by_shard.values().all(|copies| {
                    copies.len() == replicas
                        && copies.iter().all(|(_, state)| *state == "Active")
                        && (!equal || copies.iter().all(|(points, _)| *points == copies[0].0))
                });
            if converged {
                return Ok(seen);
            }
            if started.elapsed() >= limit {
                return Err(io::Error::other(format!(
                    "the replicas of {collection} did not {} in {limit:?}: {seen:?}",
                    if equal {
                        "converge"
                    } else {
                        "all become active"
                    }
                )));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl QdrantServer {
    /// The peers this node's consensus knows (0 when it does not answer or is not a cluster
    /// node).
    pub fn peers(&self) -> usize {
        get_json(self.ip, self.http_port, "/cluster")
            .and_then(|answer| {
                answer["result"]["peers"]
                    .as_object()
                    .map(|peers| peers.len())
            })
            .unwrap_or(0)
    }
}

impl Drop for QdrantServer {
    fn drop(&mut self) {
        self.stop();
    }
}
