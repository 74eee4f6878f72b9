//! Rebuilds the crate when a migration changes (`sqlx::migrate!` embeds them), for either
//! engine.
fn main() {
    println!("cargo:rerun-if-changed=migrations/sqlite");
    println!("cargo:rerun-if-changed=migrations/postgres");
}
