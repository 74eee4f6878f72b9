//! A real Qdrant server for tests: the official Qdrant v1.18.3 binary from `../shared/qdrant/`
//! (`CAIRN_QDRANT_SERVER` overrides the path), on free loopback ports with a temporary
//! directory, ready once its readiness endpoint says so, stopped by PID. The launcher `exec`s
//! the server, so the PID held here is the server's own; tests may also pause it (`SIGSTOP`)
//! and resume it to play a hung server.
//!
//! [`QdrantCluster`] starts several such servers in Qdrant's distributed mode (Raft consensus
//! over a peer-to-peer port each), the first bootstrapping the cluster and the others joining
//! it; each node can be killed, restarted, paused and resumed on its own.

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use uuid::Uuid;

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
            // deployment guide recommends the same. A node that comes back recovers its dead
            // replicas by shard transfers, one at a time by default; on a loaded two-core CI
            // machine six sequential transfers ran past 90 s, so a node takes up to three at
            // once each way (storage.performance.*_shard_transfers_limit).
            command
                .env("QDRANT__CLUSTER__ENABLED", "true")
                .env(
                    "QDRANT__STORAGE__PERFORMANCE__INCOMING_SHARD_TRANSFERS_LIMIT",
                    "3",
                )
                .env(
                    "QDRANT__STORAGE__PERFORMANCE__OUTGOING_SHARD_TRANSFERS_LIMIT",
                    "3",
                )
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
    /// running nodes and holding the same points, with the same `is_current` and `head_at` (read
    /// as [`QdrantCluster::replica_contents`] once the counts agree); returns the replicas seen (as
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

    /// What every active local replica of `collection` on a running node holds, point by
    /// point. Qdrant has no read of one replica, so each node streams a snapshot of each of its
    /// local shards, which is opened as an embedded store and scrolled to the end.
    pub fn replica_contents(&self, collection: &str) -> io::Result<Vec<ReplicaContent>> {
        let replicas = self.replicas(collection);
        on_own_runtime(async {
            let mut contents = Vec::new();
            for (index, shard, _, state) in replicas {
                if state != "Active" {
                    continue;
                }
                let node = &self.nodes[index];
                let snapshot = node.shard_snapshot(collection, shard).await?;
                let points = read_snapshot(&snapshot, node.dimension(collection).await?).await?;
                contents.push(ReplicaContent {
                    node: index,
                    shard,
                    points,
                });
            }
            Ok(contents)
        })
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
        // What the last content comparison found, once the counts agreed.
        let mut disagreement = String::new();
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
            if converged && equal {
                // Equal counts are not equal contents: a replica holding every point with a
                // stale `is_current` counts the same. Compare point by point.
                disagreement = match self.replica_contents(collection) {
                    Ok(contents) => disagreements(&contents).join("; "),
                    Err(error) => format!("reading the replicas failed: {error}"),
                };
                if disagreement.is_empty() {
                    return Ok(seen);
                }
            } else if converged {
                return Ok(seen);
            }
            if started.elapsed() >= limit {
                return Err(io::Error::other(format!(
                    "the replicas of {collection} did not {} in {limit:?}: {seen:?}{}{disagreement}",
                    if equal {
                        "converge"
                    } else {
                        "all become active"
                    },
                    if disagreement.is_empty() { "" } else { "; " }
                )));
            }
            let pause = if disagreement.is_empty() { 250 } else { 1000 };
            std::thread::sleep(Duration::from_millis(pause));
        }
    }
}

/// What one replica of one shard holds: each point's id with its `is_current` flag and its
/// `head_at` (`None` where the payload lacks one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaContent {
    /// The node's index, in start order.
    pub node: usize,
    /// The shard id.
    pub shard: u64,
    /// Point id -> (`is_current`, `head_at`).
    pub points: BTreeMap<Uuid, (Option<bool>, Option<i64>)>,
}

/// Where replicas of one shard disagree, one line per shard: the points some replica lacks
/// or holds with another `is_current` or `head_at`, the first few named. Empty when every
/// replica of every shard holds the same.
pub fn disagreements(contents: &[ReplicaContent]) -> Vec<String> {
    let mut by_shard: BTreeMap<u64, Vec<&ReplicaContent>> = BTreeMap::new();
    for content in contents {
        by_shard.entry(content.shard).or_default().push(content);
    }
    let mut lines = Vec::new();
    for (shard, copies) in by_shard {
        let ids: std::collections::BTreeSet<&Uuid> =
            copies.iter().flat_map(|copy| copy.points.keys()).collect();
        let differing: Vec<String> = ids
            .into_iter()
            .filter(|id| {
                let first = copies[0].points.get(id);
                copies.iter().any(|copy| copy.points.get(id) != first)
            })
            .map(|id| {
                let held: Vec<String> = copies
                    .iter()
                    .map(|copy| match copy.points.get(id) {
                        Some((current, head_at)) => format!(
                            "node {}: is_current {current:?} head_at {head_at:?}",
                            copy.node
                        ),
                        None => format!("node {}: missing", copy.node),
                    })
                    .collect();
                format!("{id} ({})", held.join(", "))
            })
            .collect();
        if !differing.is_empty() {
            lines.push(format!(
                "shard {shard}: {} points differ across replicas, e.g. {}",
                differing.len(),
                differing
                    .iter()
                    .take(3)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("; ")
            ));
        }
    }
    lines
}

/// Runs `work` to completion on a runtime of its own, on a thread of its own, so that
/// callers inside and outside a tokio runtime can block on it.
fn on_own_runtime<T: Send>(
    work: impl std::future::Future<Output = io::Result<T>> + Send,
) -> io::Result<T> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?
                    .block_on(work)
            })
            .join()
            .map_err(|_| io::Error::other("the replica reader panicked"))?
    })
}

/// Every point a streamed shard snapshot holds, opened as an embedded store in a temporary
/// folder and scrolled to the end.
async fn read_snapshot(
    snapshot: &[u8],
    dimension: usize,
) -> io::Result<BTreeMap<Uuid, (Option<bool>, Option<i64>)>> {
    use gateways::VectorStore;
    let scratch = tempfile::tempdir()?;
    let file = scratch.path().join("shard.snapshot");
    std::fs::write(&file, snapshot)?;
    let store =
        gateways::EdgeVectorStore::open_snapshot(&file, &scratch.path().join("shard"), dimension)
            .map_err(io::Error::other)?;
    let mut points = BTreeMap::new();
    let mut after = None;
    loop {
        let (page, next) = store
            .scroll_all(after, 512)
            .await
            .map_err(io::Error::other)?;
        for point in page {
            points.insert(
                point.id,
                (
                    point
                        .payload
                        .get("is_current")
                        .and_then(|value| value.as_bool()),
                    point
                        .payload
                        .get("head_at")
                        .and_then(|value| value.as_i64()),
                ),
            );
        }
        match next {
            Some(id) => after = Some(id),
            None => return Ok(points),
        }
    }
}

impl QdrantServer {
    /// This node's HTTP base URL.
    fn http_base(&self) -> String {
        format!("http://{}:{}", self.ip, self.http_port)
    }

    /// The vector dimension of `collection`, as this node describes it.
    async fn dimension(&self, collection: &str) -> io::Result<usize> {
        let answer: serde_json::Value = reqwest::Client::new()
            .get(format!("{}/collections/{collection}", self.http_base()))
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(io::Error::other)?
            .json()
            .await
            .map_err(io::Error::other)?;
        answer["result"]["config"]["params"]["vectors"]["size"]
            .as_u64()
            .and_then(|size| usize::try_from(size).ok())
            .ok_or_else(|| io::Error::other(format!("no vector size in {answer}")))
    }

    /// A snapshot of this node's own replica of `shard` of `collection`, as the node streams
    /// it (`GET /collections/{collection}/shards/{shard}/snapshot`).
    pub async fn shard_snapshot(&self, collection: &str, shard: u64) -> io::Result<Vec<u8>> {
        let answer = reqwest::Client::new()
            .get(format!(
                "{}/collections/{collection}/shards/{shard}/snapshot",
                self.http_base()
            ))
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(io::Error::other)?;
        Ok(answer.bytes().await.map_err(io::Error::other)?.to_vec())
    }

    /// Fault injection: replaces this node's own replica of `shard` with `snapshot`, telling
    /// Qdrant not to sync it with the other replicas (priority `no_sync`), so the replica holds
    /// what the snapshot held, behind the cluster's back.
    pub async fn recover_shard_unsynced(
        &self,
        collection: &str,
        shard: u64,
        snapshot: &[u8],
    ) -> io::Result<()> {
        let boundary = format!("cairn-{}", Uuid::now_v7().simple());
        let mut body = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"snapshot\"; \
             filename=\"shard.snapshot\"\r\nContent-Type: application/octet-stream\r\n\r\n"
        )
        .into_bytes();
        body.extend_from_slice(snapshot);
        body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        let answer = reqwest::Client::new()
            .post(format!(
                "{}/collections/{collection}/shards/{shard}/snapshots/upload?wait=true&priority=no_sync",
                self.http_base()
            ))
            .header(
                "content-type",
                format!("multipart/form-data; boundary={boundary}"),
            )
            .body(body)
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .map_err(io::Error::other)?;
        let status = answer.status();
        if !status.is_success() {
            let text = answer.text().await.unwrap_or_default();
            return Err(io::Error::other(format!(
                "recovering shard {shard} of {collection}: {status} {text}"
            )));
        }
        Ok(())
    }

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
