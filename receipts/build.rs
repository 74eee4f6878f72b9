//! Embeds the ledger's migrations: lists `migrations/<engine>/*.sql` in file-name order into
//! `$OUT_DIR/migrations.rs` (one `include_str!` per file, read by `src/migrations.rs`), and
//! rebuilds the crate when a migration is added, changed or removed. This replaces
//! `sqlx::migrate!`, whose macro crate compiles a second copy of sqlx and SQLite for the build
//! host.
use std::{env, fs, path::Path};

fn main() {
    let manifest = env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let out = env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    let mut code = String::new();
    for (constant, engine) in [("SQLITE", "sqlite"), ("POSTGRES", "postgres")] {
        let dir = Path::new(&manifest).join("migrations").join(engine);
        println!("cargo:rerun-if-changed={}", dir.display());
        let mut files: Vec<_> = fs::read_dir(&dir)
            .unwrap_or_else(|error| panic!("reading {}: {error}", dir.display()))
            .map(|entry| entry.expect("a migration directory entry").path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "sql"))
            .collect();
        files.sort();
        code.push_str(&format!(
            "/// The {engine} ledger's migrations: (file name, SQL), in file-name order.\n\
             pub(crate) const {constant}: &[(&str, &str)] = &[\n"
        ));
        for path in files {
            println!("cargo:rerun-if-changed={}", path.display());
            let name = path
                .file_name()
                .and_then(|name| name.to_str())
                .expect("migration file names are UTF-8");
            let path = path.to_str().expect("migration paths are UTF-8");
            code.push_str(&format!("    ({name:?}, include_str!({path:?})),\n"));
        }
        code.push_str("];\n");
    }
    fs::write(Path::new(&out).join("migrations.rs"), code).expect("writing migrations.rs");
}
