//! Loading and validation, from flags, environment and file.

use std::collections::HashMap;
use std::path::PathBuf;

use receipts::{policy, Backend};

use super::{Config, Overrides, DEFAULT_BIND};

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn a_qdrant_server_from_the_environment_with_its_key_kept_out_of_sight() {
    let config = Config::load(&Overrides::default(), &HashMap::new()).expect("config");
    assert_eq!(config.vectors, None, "qdrant-edge by default");
    let config = Config::load(
        &Overrides::default(),
        &env(&[
            ("CAIRN_VECTORS_URL", "http://10.0.0.5:6334"),
            ("CAIRN_VECTORS_API_KEY", "k3y-never-shown"),
        ]),
    )
    .expect("config");
    let vectors = config.vectors.clone().expect("server");
    assert_eq!(vectors.urls, ["http://10.0.0.5:6334"]);
    assert_eq!(vectors.api_key.as_deref(), Some("k3y-never-shown"));
    assert!(!format!("{config:?}").contains("k3y-never-shown"));
    assert!(!config.vectors_description().contains("k3y-never-shown"));
    // The flag beats the environment.
    let config = Config::load(
        &Overrides {
            vectors_url: Some("https://q.example:6334".to_owned()),
            ..Overrides::default()
        },
        &env(&[("CAIRN_VECTORS_URL", "http://10.0.0.5:6334")]),
    )
    .expect("config");
    assert_eq!(
        config.vectors.expect("server").urls,
        ["https://q.example:6334"]
    );
}

#[test]
fn a_cluster_lists_its_nodes_and_lays_out_its_collection_in_the_generation() {
    let directory = tempfile::tempdir().expect("tempdir");
    let path = directory.path().join("cairn.toml");
    std::fs::write(
        &path,
        "[vectors]\nurls = [\"http://10.0.0.1:6334\", \"http://10.0.0.2:6334\"]\n\
         shards = 6\nreplication_factor = 3\nwrite_consistency_factor = 2\n",
    )
    .expect("write");
    let overrides = Overrides {
        config_file: Some(path),
        ..Overrides::default()
    };
    let config = Config::load(&overrides, &HashMap::new()).expect("config");
    let vectors = config.vectors.clone().expect("cluster");
    assert_eq!(
        vectors.urls,
        ["http://10.0.0.1:6334", "http://10.0.0.2:6334"]
    );
    assert_eq!(
        vectors.layout.fingerprint(),
        "shards=6,replication=3,write_consistency=2"
    );
    assert!(config.vectors_description().contains("cluster"));
    // The layout is part of the generation: the same settings on one server are another.
    let clustered = crate::projection::generation(&config);
    assert_eq!(clustered.vector_layout, vectors.layout.fingerprint());
    let single = Config::load(
        &Overrides {
            vectors_url: Some("http://10.0.0.1:6334".to_owned()),
            ..Overrides::default()
        },
        &HashMap::new(),
    )
    .expect("config");
    let plain = crate::projection::generation(&single);
    assert_ne!(plain.id, clustered.id);
    assert_eq!(plain.vector_layout, "");
    // Without a layout the id is what it always was (qdrant-edge's generation).
    let edge = Config::load(&Overrides::default(), &HashMap::new()).expect("config");
    assert_eq!(crate::projection::generation(&edge).id, plain.id);
    // The flag and the environment take a comma-separated list.
    let listed = Config::load(
        &Overrides::default(),
        &env(&[(
            "CAIRN_VECTORS_URL",
            "http://a:6334, http://b:6334,http://c:6334",
        )]),
    )
    .expect("config");
    assert_eq!(
        listed.vectors.expect("cluster").urls,
        ["http://a:6334", "http://b:6334", "http://c:6334"]
    );
}

#[test]
fn an_embedding_server_with_its_key_kept_out_of_sight_and_its_model_resolved() {
    let config = Config::load(&Overrides::default(), &HashMap::new()).expect("config");
    assert_eq!(config.embeddings, None);
    assert_eq!(config.projection.model, gateways::embedder::MODEL_ID);
    let remote = [
        ("CAIRN_EMBEDDINGS_URL", "http://gpu-1:8080/v1/"),
        ("CAIRN_EMBEDDINGS_MODEL", "bge-small"),
        ("CAIRN_EMBEDDINGS_DIMENSIONS", "384"),
        ("CAIRN_EMBEDDINGS_KEY", "s3cret-never-shown"),
        ("CAIRN_MODEL", "remote"),
    ];
    let config = Config::load(&Overrides::default(), &env(&remote)).expect("config");
    let server = config.embeddings.clone().expect("server");
    assert_eq!(server.options.url, "http://gpu-1:8080/v1");
    assert_eq!(server.options.key.as_deref(), Some("s3cret-never-shown"));
    assert_eq!(server.options.batch, super::DEFAULT_REMOTE_BATCH);
    assert_eq!(
        config.projection.model,
        "openai:bge-small@http://gpu-1:8080/v1"
    );
    assert!(!format!("{config:?}").contains("s3cret-never-shown"));
    // The int8 model by id.
    let config = Config::load(
        &Overrides::default(),
        &env(&[("CAIRN_MODEL", gateways::embedder::MINILM_INT8.id)]),
    )
    .expect("config");
    assert_eq!(config.projection.model, gateways::embedder::MINILM_INT8.id);
    // What cannot work is refused at start, and says why.
    for (pairs, expected) in [
        (vec![("CAIRN_MODEL", "remote")], "no embedding server"),
        (
            vec![("CAIRN_MODEL", "bge-large")],
            "not a model this process can run",
        ),
        (
            vec![("CAIRN_EMBEDDINGS_URL", "http://gpu-1:8080/v1")],
            "embeddings.model",
        ),
        (
            vec![
                ("CAIRN_EMBEDDINGS_URL", "http://gpu-1:8080/v1"),
                ("CAIRN_EMBEDDINGS_MODEL", "m"),
            ],
            "embeddings.dimensions",
        ),
        (
            vec![
                ("CAIRN_EMBEDDINGS_URL", "gpu-1:8080"),
                ("CAIRN_EMBEDDINGS_MODEL", "m"),
                ("CAIRN_EMBEDDINGS_DIMENSIONS", "8"),
            ],
            "not an http(s) URL",
        ),
        (
            vec![
                ("CAIRN_EMBEDDINGS_URL", "https://user:s3cret@gpu-1:8080/v1"),
                ("CAIRN_EMBEDDINGS_MODEL", "m"),
                ("CAIRN_EMBEDDINGS_DIMENSIONS", "8"),
            ],
            "must not carry credentials",
        ),
        (
            vec![
                (
                    "CAIRN_EMBEDDINGS_URL",
                    "https://gpu-1:8080/v1?api-key=s3cret",
                ),
                ("CAIRN_EMBEDDINGS_MODEL", "m"),
                ("CAIRN_EMBEDDINGS_DIMENSIONS", "8"),
            ],
            "must not carry credentials",
        ),
        (
            vec![
                ("CAIRN_EMBEDDINGS_URL", "http://gpu-1:8080/v1"),
                ("CAIRN_EMBEDDINGS_MODEL", "m"),
                ("CAIRN_EMBEDDINGS_DIMENSIONS", "8"),
                ("CAIRN_EMBEDDINGS_BATCH", "0"),
            ],
            "embeddings.batch",
        ),
    ] {
        let error = Config::load(&Overrides::default(), &env(&pairs))
            .expect_err("refused")
            .to_string();
        assert!(error.contains(expected), "{pairs:?}: {error}");
    }
}

#[test]
fn a_graph_from_the_environment_turns_the_graph_backend_on() {
    let config = Config::load(
        &Overrides::default(),
        &env(&[
            ("CAIRN_GRAPH_URL", "bolt://10.0.0.7:7687"),
            ("CAIRN_GRAPH_USER", "root"),
            ("CAIRN_GRAPH_PASSWORD", "gr4ph-secret"),
            ("CAIRN_GRAPH_DATABASE", "cairn"),
        ]),
    )
    .expect("config");
    let graph = config.graph.clone().expect("graph");
    assert_eq!(
        (
            graph.url.as_str(),
            graph.user.as_str(),
            graph.database.as_str()
        ),
        ("bolt://10.0.0.7:7687", "root", "cairn")
    );
    assert!(config.backends.contains(&Backend::Graph));
    assert!(!format!("{config:?}").contains("gr4ph-secret"));
    assert!(!config.graph_description().contains("gr4ph-secret"));
    // The graph backend without a graph cannot work.
    let error = Config::load(
        &Overrides::default(),
        &env(&[("CAIRN_BACKENDS", "relational,vector,graph")]),
    )
    .expect_err("no graph");
    assert!(format!("{error:#}").contains("graph.url"), "{error:#}");
}

#[test]
fn qdrant_settings_that_cannot_work_are_refused() {
    for (url, file, wanted) in [
        ("127.0.0.1:6334", "", "not a Qdrant gRPC URL"),
        (
            "http://q:6334",
            "[vectors]\ncollection_prefix = \"a/b\"\n",
            "collection_prefix",
        ),
        (
            "http://q:6334",
            "[jobs]\nlease_ms = 4000\n[vectors]\nretry_ms = 3000\n",
            "half the shortest job lease",
        ),
        ("http://q:6334", "[vectors]\ntimeout_ms = 0\n", "timeout_ms"),
        (
            "",
            "[vectors]\nurl = \"http://a:6334\"\nurls = [\"http://b:6334\"]\n",
            "both set",
        ),
        ("", "[vectors]\nshards = 6\n", "no server is configured"),
        ("http://a:6334,http://a:6334", "", "names a node twice"),
        (
            "http://q:6334",
            "[vectors]\nshards = 0\n",
            "vectors.shards must be",
        ),
        (
            "http://q:6334",
            "[vectors]\nreplication_factor = 2\nwrite_consistency_factor = 3\n",
            "above the replication factor",
        ),
    ] {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("cairn.toml");
        std::fs::write(&path, file).expect("write");
        let error = Config::load(
            &Overrides {
                config_file: Some(path),
                vectors_url: Some(url.to_owned()),
                ..Overrides::default()
            },
            &HashMap::new(),
        )
        .expect_err("refused");
        assert!(
            format!("{error:#}").contains(wanted),
            "{url} {file}: {error:#}"
        );
    }
}

#[test]
fn defaults_without_anything() {
    let config = Config::load(&Overrides::default(), &HashMap::new()).expect("config");
    assert_eq!(config.bind.to_string(), DEFAULT_BIND);
    assert_eq!(config.backends, policy::DEFAULT_BACKENDS.to_vec());
    assert_eq!(
        config.acceptor.max_batch_items,
        policy::DEFAULT_MAX_BATCH_ITEMS
    );
}

#[test]
fn flags_beat_env_beat_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("cairn.toml");
    std::fs::write(&file, "bind = \"127.0.0.1:1\"\ndata_dir = \"/file\"\n[limits]\nmax_batch_items = 7\n[ledger]\nbackends = [\"relational\", \"vector\", \"graph\"]\n[graph]\nurl = \"bolt://127.0.0.1:7687\"\n").expect("write");
    let overrides = Overrides {
        config_file: Some(file),
        bind: Some("127.0.0.1:3".into()),
        ..Overrides::default()
    };
    let config = Config::load(
        &overrides,
        &env(&[("CAIRN_BIND", "127.0.0.1:2"), ("CAIRN_DATA_DIR", "/env")]),
    )
    .expect("config");
    assert_eq!(config.bind.port(), 3);
    assert_eq!(config.data_dir, PathBuf::from("/env"));
    assert_eq!(config.acceptor.max_batch_items, 7);
    assert_eq!(config.backends.len(), 3);
}

#[test]
fn job_policy_per_kind_env_beats_kind_beats_every_kind() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("cairn.toml");
    std::fs::write(
        &file,
        "[jobs]\nmax_attempts = 7\nlease_ms = 5000\n[jobs.tombstone]\nmax_attempts = 2\nbackoff_base_ms = 10\n",
    )
    .expect("write");
    let overrides = Overrides {
        config_file: Some(file),
        ..Overrides::default()
    };
    let config = Config::load(&overrides, &env(&[("CAIRN_LEASE_MS", "2000")])).expect("config");
    let project = config.job_policies.project;
    let tombstone = config.job_policies.tombstone;
    assert_eq!(project.max_attempts, 7);
    assert_eq!(tombstone.max_attempts, 2);
    assert_eq!(project.lease_micros, 2_000_000);
    assert_eq!(tombstone.lease_micros, 2_000_000);
    assert_eq!(tombstone.backoff_base_micros, 10_000);
    assert_eq!(
        project.backoff_base_micros,
        policy::DEFAULT_BACKOFF_BASE_MICROS
    );
    let error = Config::load(
        &Overrides::default(),
        &env(&[("CAIRN_LEASE_MS", "2000"), ("CAIRN_MAX_RUN_MS", "1000")]),
    )
    .expect_err("max run below lease");
    assert!(format!("{error:#}").contains("jobs.project"), "{error:#}");
}

#[test]
fn unknown_keys_and_bad_values_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("cairn.toml");
    std::fs::write(&file, "bnd = \"x\"\n").expect("write");
    let overrides = Overrides {
        config_file: Some(file),
        ..Overrides::default()
    };
    let error = Config::load(&overrides, &HashMap::new()).expect_err("unknown key");
    assert!(
        format!("{error:#}").contains("unknown field `bnd`"),
        "{error:#}"
    );
    let error = Config::load(
        &Overrides::default(),
        &env(&[("CAIRN_BACKENDS", "vector,elastic")]),
    )
    .expect_err("bad backend");
    assert!(format!("{error:#}").contains("elastic"));
    let error = Config::load(
        &Overrides::default(),
        &env(&[("CAIRN_MAX_BATCH_ITEMS", "lots")]),
    )
    .expect_err("bad number");
    assert!(format!("{error:#}").contains("CAIRN_MAX_BATCH_ITEMS"));
}

/// The rows of the tables in `docs/configuration.md`: (file key, environment variable), `—`
/// or empty for none.
fn documented_settings() -> Vec<(Option<String>, Option<String>)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md");
    let text = std::fs::read_to_string(path).expect("docs/configuration.md");
    let cell = |text: &str| {
        let text = text.trim().trim_matches('`');
        (!text.is_empty() && text != "—").then(|| text.to_owned())
    };
    text.lines()
        .filter(|line| line.starts_with("| `") || line.starts_with("| —"))
        .map(|line| {
            let cells: Vec<&str> = line.trim_matches('|').split('|').collect();
            (cell(cells[0]), cells.get(1).and_then(|text| cell(text)))
        })
        .collect()
}

/// The names in backticks after "expected" in a serde error about an unknown field.
fn expected_fields(message: &str) -> Vec<String> {
    let Some((_, expected)) = message.split_once("expected") else {
        return Vec::new();
    };
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// Every leaf key the file's schema accepts, found by asking the real parser: a section
/// refuses an unknown key by listing the ones it knows, and a key is a table when a key
/// inside it is refused as unknown too.
fn file_keys(prefix: &[String]) -> Vec<String> {
    let probe = |path: &[String]| {
        let mut table = toml::Table::new();
        table.insert("zz_not_a_setting".to_owned(), toml::Value::Integer(1));
        for segment in path.iter().rev() {
            let mut outer = toml::Table::new();
            outer.insert(segment.clone(), toml::Value::Table(table));
            table = outer;
        }
        let text = toml::to_string(&table).expect("probe");
        match toml::from_str::<super::file::FileConfig>(&text) {
            Ok(_) => None,
            Err(error) => Some(error.to_string()),
        }
    };
    let Some(message) = probe(prefix) else {
        return Vec::new();
    };
    if !message.contains("unknown field `zz_not_a_setting`") {
        return Vec::new();
    }
    let mut keys = Vec::new();
    for field in expected_fields(&message) {
        let mut path = prefix.to_vec();
        path.push(field);
        match probe(&path) {
            Some(inner) if inner.contains("unknown field `zz_not_a_setting`") => {
                keys.extend(file_keys(&path));
            }
            _ => keys.push(path.join(".")),
        }
    }
    keys
}

#[test]
fn the_configuration_table_lists_every_setting_the_code_reads() {
    use std::collections::BTreeSet;
    let rows = documented_settings();
    assert!(rows.len() > 40, "the table was not found: {rows:?}");

    // File keys: the schema's, with `KIND` in the table standing for each job kind.
    let from_code: BTreeSet<String> = file_keys(&[]).into_iter().collect();
    let kinds: BTreeSet<String> = from_code
        .iter()
        .filter_map(|key| {
            let parts: Vec<&str> = key.split('.').collect();
            (parts.len() == 3 && parts[0] == "jobs").then(|| parts[1].to_owned())
        })
        .collect();
    assert!(kinds.contains("project"), "job kinds: {kinds:?}");
    let documented: BTreeSet<String> = rows
        .iter()
        .filter_map(|(key, _)| key.clone())
        .flat_map(|key| {
            if key.contains(".KIND.") {
                kinds.iter().map(|kind| key.replace("KIND", kind)).collect()
            } else if let Some((map, _)) = key.split_once(".<d>.") {
                // A table of named tables (`[datasets.<name>]`): the probe sees its name only;
                // its keys are checked by the loading tests.
                vec![map.to_owned()]
            } else {
                vec![key]
            }
        })
        .collect();
    let undocumented: Vec<_> = from_code.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&from_code).collect();
    assert!(
        undocumented.is_empty(),
        "file keys missing from docs/configuration.md: {undocumented:?}"
    );
    assert!(
        unknown.is_empty(),
        "docs/configuration.md lists file keys the code does not know: {unknown:?}"
    );

    // Environment variables: those the loader reads (with a Qdrant server and a graph, so
    // that their keys and passwords are read too), and those the command line reads.
    let map = env(&[
        ("CAIRN_VECTORS_URL", "http://127.0.0.1:6334"),
        ("CAIRN_GRAPH_URL", "bolt://127.0.0.1:7687"),
    ]);
    let recording = super::load::Env::new(&map);
    Config::load_from(&Overrides::default(), &recording).expect("config");
    let read = recording.names_read();
    let documented: BTreeSet<String> = rows.iter().filter_map(|(_, env)| env.clone()).collect();
    let undocumented: Vec<_> = read.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "variables the loader reads, missing from docs/configuration.md: {undocumented:?}"
    );
    // Every documented variable is one the production code names, and every `CAIRN_*` name
    // in the production code is documented.
    let mut in_code = BTreeSet::new();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for crate_dir in [
        "src",
        "acceptor/src",
        "worker/src",
        "gateways/src",
        "search/src",
        "ops/src",
        "receipts/src",
        "extract/src",
    ] {
        for entry in walkdir::WalkDir::new(root.join(crate_dir)) {
            let entry = entry.expect("walk");
            if entry.path().extension().is_some_and(|ext| ext == "rs")
                && !entry.path().ends_with("config/tests.rs")
            {
                let text = std::fs::read_to_string(entry.path()).expect("read");
                for piece in text.split('"').skip(1).step_by(2) {
                    if piece.starts_with("CAIRN_")
                        && piece
                            .chars()
                            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
                    {
                        in_code.insert(piece.to_owned());
                    }
                }
            }
        }
    }
    assert!(read.is_subset(&in_code));
    let undocumented: Vec<_> = in_code.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&in_code).collect();
    assert!(
        undocumented.is_empty(),
        "variables in the code, missing from docs/configuration.md: {undocumented:?}"
    );
    assert!(
        unknown.is_empty(),
        "docs/configuration.md lists variables no code reads: {unknown:?}"
    );
}

/// Loads `text` as the configuration file (written into `directory`), with no environment.
fn load_text(directory: &std::path::Path, text: &str) -> anyhow::Result<Config> {
    let path = directory.join("cairn.toml");
    std::fs::write(&path, text).expect("write");
    Config::load(
        &Overrides {
            config_file: Some(path),
            ..Overrides::default()
        },
        &HashMap::new(),
    )
}

#[test]
fn a_dataset_names_its_default_access() {
    let directory = tempfile::tempdir().expect("tempdir");
    let load = |text: &str| load_text(directory.path(), text);
    let config = load(
        "[datasets.hr]\ndefault_access = \"nobody\"\n[datasets.wiki]\ndefault_access = \"everyone\"\n",
    )
    .expect("config");
    assert_eq!(
        config.default_access.into_iter().collect::<Vec<_>>(),
        [
            ("hr".to_owned(), receipts::access::DefaultAccess::Nobody),
            ("wiki".to_owned(), receipts::access::DefaultAccess::Everyone)
        ]
    );
    let wrong = load("[datasets.hr]\ndefault_access = \"some\"\n").expect_err("refused");
    assert!(
        format!("{wrong:#}").contains("datasets.hr.default_access"),
        "{wrong:#}"
    );
    let misspelt = load("[datasets.hr]\ndefault = \"nobody\"\n").expect_err("refused");
    assert!(format!("{misspelt:#}").contains("default"), "{misspelt:#}");
    assert!(load("[datasets.\"a/b\"]\ndefault_access = \"nobody\"\n").is_err());
}

#[test]
fn oauth_issuers_are_read_and_checked() {
    let directory = tempfile::tempdir().expect("tempdir");
    let load = |text: &str| load_text(directory.path(), text);
    assert_eq!(load("").expect("config").oauth, None);
    let config = load(
        "[oauth]\nresource = \"https://cairn.example.com\"\ncairn_tokens = false\n\
         [[oauth.issuers]]\nissuer = \"https://id.example.com\"\nalgorithms = [\"EdDSA\"]\n\
         groups_claim = \"groups\"\nskew_seconds = 30\n\
         scopes = { \"cairn.search\" = [\"search\"], \"cairn.admin\" = [\"admin\"] }\n",
    )
    .expect("config");
    let settings = config.oauth.expect("oauth");
    assert!(!settings.cairn_tokens);
    let issuer = &settings.resource.issuers[0];
    assert_eq!(issuer.issuer, "https://id.example.com");
    assert_eq!(issuer.algorithms, vec!["EdDSA".to_owned()]);
    assert_eq!(issuer.groups_claim.as_deref(), Some("groups"));
    assert_eq!(issuer.skew, std::time::Duration::from_secs(30));
    assert_eq!(
        issuer.scopes.get("cairn.search"),
        Some(&vec![receipts::Scope::Search])
    );
    let refused = |text: &str, needle: &str| {
        let error = load(text).expect_err(needle);
        assert!(format!("{error:#}").contains(needle), "{error:#}");
    };
    refused(
        "[[oauth.issuers]]\nissuer = \"https://id.example.com\"\n",
        "oauth.resource",
    );
    refused(
        "[oauth]\nresource = \"https://cairn.example.com\"\n[[oauth.issuers]]\n\
         issuer = \"https://id.example.com\"\nalgorithms = [\"HS256\"]\n",
        "HS256",
    );
    refused(
        "[oauth]\nresource = \"https://cairn.example.com\"\n[[oauth.issuers]]\n\
         issuer = \"http://id.example.com\"\n",
        "https",
    );
    refused(
        "[oauth]\nresource = \"https://cairn.example.com\"\n[[oauth.issuers]]\n\
         issuer = \"https://id.example.com\"\nscopes = { x = [\"everything\"] }\n",
        "oauth.issuers[0].scopes.x",
    );
    refused(
        "[oauth]\nresource = \"https://cairn.example.com\"\n",
        "at least one issuer",
    );

    // Introspection: the secret from a file (never from the configuration itself).
    let secret = directory.path().join("introspection.secret");
    std::fs::write(&secret, "s3cret\n").expect("secret");
    let introspecting = format!(
        "[oauth]\nresource = \"https://cairn.example.com\"\n[[oauth.issuers]]\n\
         issuer = \"https://id.example.com\"\n[oauth.issuers.introspection]\n\
         client_id = \"cairn\"\nclient_secret_file = \"{}\"\ncache_seconds = 5\njwts = true\n",
        secret.display()
    );
    let config = load(&introspecting).expect("config");
    let introspection = config.oauth.expect("oauth").resource.issuers[0]
        .introspection
        .clone()
        .expect("introspection");
    assert_eq!(introspection.client_id, "cairn");
    assert_eq!(
        introspection.client_secret,
        oauth::Secret("s3cret".to_owned())
    );
    assert_eq!(introspection.cache, std::time::Duration::from_secs(5));
    assert!(introspection.jwts);
    assert_eq!(
        introspection.endpoint, None,
        "found in the issuer's metadata"
    );
    assert!(!format!("{introspection:?}").contains("s3cret"));
    refused(
        "[oauth]\nresource = \"https://cairn.example.com\"\n[[oauth.issuers]]\n\
         issuer = \"https://id.example.com\"\n[oauth.issuers.introspection]\nclient_id = \"cairn\"\n",
        "client_secret_file or client_secret_env",
    );
    refused(
        "[oauth]\nresource = \"https://cairn.example.com\"\n[[oauth.issuers]]\n\
         issuer = \"https://id.example.com\"\n[oauth.issuers.introspection]\nclient_id = \"cairn\"\n\
         client_secret_env = \"NOT_SET_ANYWHERE_1\"\n",
        "NOT_SET_ANYWHERE_1 is not set",
    );
    refused(
        &introspecting.replace("cache_seconds = 5", "cache_seconds = 3600"),
        "revoked tokens",
    );
}
