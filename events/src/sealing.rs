//! Signing secrets at rest. A delivery must be signed with the secret itself, so the ledger
//! cannot keep only a digest as it does for tokens; it keeps the secret sealed (AES-256-GCM)
//! under a key that lives beside the process, in a file only its owner can read
//! (`webhooks.secret_key_file`, by default `<data dir>/webhooks.key`, created on first use
//! with mode 0600). A copy of the ledger alone, a backup or a replica, reveals no secret.
//! Each sealed secret is bound to its subscription's id (the additional data), so it cannot
//! be moved to another subscription. Every process that delivers for a shared ledger needs
//! the same key file.

use std::io::Write as _;
use std::path::Path;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};

use crate::signing::Secret;

/// The version prefix of a sealed secret's text.
const VERSION: &str = "v1.";
/// Bytes in the key.
const KEY_BYTES: usize = 32;

/// Seals and opens signing secrets with one key.
pub struct Sealer {
    key: LessSafeKey,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("Sealer(..)")
    }
}

impl Sealer {
    /// The sealer whose key is in `path`, creating the file (0600, 32 random bytes) when it
    /// does not exist. A file of another size, or one others may read, is refused.
    pub fn open_or_create(path: &Path) -> Result<Sealer, String> {
        let bytes = match std::fs::read(path) {
            Ok(bytes) => {
                check_private(path)?;
                bytes
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => create(path)?,
            Err(error) => {
                return Err(format!(
                    "the webhook secrets key {} cannot be read: {error}",
                    path.display()
                ))
            }
        };
        Sealer::from_key(&bytes).map_err(|error| format!("{}: {error}", path.display()))
    }

    /// A sealer with `key` (32 bytes).
    pub fn from_key(key: &[u8]) -> Result<Sealer, String> {
        if key.len() != KEY_BYTES {
            return Err(format!(
                "a webhook secrets key has {KEY_BYTES} bytes, not {}",
                key.len()
            ));
        }
        let key = UnboundKey::new(&AES_256_GCM, key)
            .map_err(|_| "the webhook secrets key is unusable".to_owned())?;
        Ok(Sealer {
            key: LessSafeKey::new(key),
        })
    }

    /// `secret` sealed for the subscription `owner`.
    pub fn seal(&self, owner: &str, secret: &Secret) -> Result<String, String> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| "the system's random source failed".to_owned())?;
        let mut sealed = secret.text().into_bytes();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(owner.as_bytes()),
                &mut sealed,
            )
            .map_err(|_| "sealing the secret failed".to_owned())?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&sealed);
        Ok(format!("{VERSION}{}", URL_SAFE_NO_PAD.encode(out)))
    }

    /// The secret `sealed` holds for the subscription `owner`; an error when it was sealed
    /// under another key or for another subscription, or was altered.
    pub fn open(&self, owner: &str, sealed: &str) -> Result<Secret, String> {
        let refused = || {
            "a webhook secret cannot be opened: it was sealed under another key (webhooks.secret_key_file) or altered".to_owned()
        };
        let encoded = sealed.strip_prefix(VERSION).ok_or_else(refused)?;
        let mut bytes = URL_SAFE_NO_PAD.decode(encoded).map_err(|_| refused())?;
        if bytes.len() < NONCE_LEN {
            return Err(refused());
        }
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&bytes[..NONCE_LEN]);
        let opened = self
            .key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(owner.as_bytes()),
                &mut bytes[NONCE_LEN..],
            )
            .map_err(|_| refused())?;
        let text = std::str::from_utf8(opened).map_err(|_| refused())?;
        Secret::parse(text)
    }
}

fn create(path: &Path) -> Result<Vec<u8>, String> {
    let mut key = vec![0u8; KEY_BYTES];
    SystemRandom::new()
        .fill(&mut key)
        .map_err(|_| "the system's random source failed".to_owned())?;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|error| format!("creating {}: {error}", parent.display()))?;
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    match options.open(path) {
        Ok(mut file) => {
            file.write_all(&key)
                .and_then(|()| file.sync_all())
                .map_err(|error| format!("writing {}: {error}", path.display()))?;
            tracing::info!(path = %path.display(), "created the webhook secrets key");
            Ok(key)
        }
        // Another process created it first: use theirs.
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::read(path).map_err(|error| format!("reading {}: {error}", path.display()))
        }
        Err(error) => Err(format!("creating {}: {error}", path.display())),
    }
}

#[cfg(unix)]
fn check_private(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(path)
        .map_err(|error| format!("{}: {error}", path.display()))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        return Err(format!(
            "the webhook secrets key {} may be read by others (mode {:o}); chmod 600 it",
            path.display(),
            mode & 0o777
        ));
    }
    Ok(())
}

#[cfg(not(unix))]
fn check_private(_path: &Path) -> Result<(), String> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_secret_opens_only_with_its_key_and_owner() {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("webhooks.key");
        let sealer = Sealer::open_or_create(&path).expect("created");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let secret = Secret::generate().expect("secret");
        let sealed = sealer.seal("hook-1", &secret).expect("sealed");
        assert!(!sealed.contains(&secret.text()));
        assert_eq!(sealer.open("hook-1", &sealed).expect("opens"), secret);
        assert!(
            sealer.open("hook-2", &sealed).is_err(),
            "bound to its owner"
        );
        let again = Sealer::open_or_create(&path).expect("the same key");
        assert_eq!(again.open("hook-1", &sealed).expect("opens"), secret);
        let other = Sealer::from_key(&[7u8; 32]).expect("key");
        assert!(other.open("hook-1", &sealed).is_err(), "another key");
        let mut altered = sealed.clone();
        altered.pop();
        altered.push(if sealed.ends_with('A') { 'B' } else { 'A' });
        assert!(sealer.open("hook-1", &altered).is_err(), "altered");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
            let refused = Sealer::open_or_create(&path).expect_err("readable by others");
            assert!(refused.contains("chmod 600"), "{refused}");
        }
    }
}
