//! Git repositories made by tests, with the `git` binary: one identity and one clock for every
//! commit, so commit times and authors are known to the test.

use std::path::Path;

/// The author and committer of every test commit.
pub const AUTHOR: &str = "Ada Writer <ada@example.org>";

/// The time of every test commit (2026-11-30T10:00:00Z), in seconds since the epoch.
pub const COMMIT_TIME: i64 = 1_796_032_800;

/// Runs `git ARGS` in `repository` and answers its trimmed standard output; panics with git's
/// message when it fails.
pub fn git(repository: &Path, args: &[&str]) -> String {
    let output = std::process::Command::new("git")
        .arg("-C")
        .arg(repository)
        .args(args)
        .env("GIT_AUTHOR_NAME", "Ada Writer")
        .env("GIT_AUTHOR_EMAIL", "ada@example.org")
        .env("GIT_COMMITTER_NAME", "Ada Writer")
        .env("GIT_COMMITTER_EMAIL", "ada@example.org")
        .env("GIT_AUTHOR_DATE", "2026-11-30T10:00:00Z")
        .env("GIT_COMMITTER_DATE", "2026-11-30T10:00:00Z")
        .output()
        .expect("run git");
    assert!(
        output.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// Commits everything in `repository`'s work tree and answers the new commit's id.
pub fn commit(repository: &Path, message: &str) -> String {
    git(repository, &["add", "--all"]);
    git(repository, &["commit", "--quiet", "-m", message]);
    git(repository, &["rev-parse", "HEAD"])
}
