//! The data dir: where `serve` keeps its SQLite file and the secrets it generates on first start.

use std::fs;
use std::io::Write;
use std::path::Path;

use recovea_control::random;

pub(crate) const ADMIN_TOKEN_FILE: &str = "admin-token";
const MASTER_KEY_FILE: &str = "master.key";
const NODE_ID_FILE: &str = "node-id";
const ALERT_SECRET_FILE: &str = "alert-signing-secret";

/// A secret read from the data dir, or generated there now.
pub(crate) struct Secret {
    pub(crate) value: String,
    pub(crate) generated: bool,
}

/// Every file and directory the process creates is its owner's alone (`0600`, `0700`): the data
/// directory holds sealed provider keys, the ledger, receipts and the state's secrets.
pub(crate) fn private_files() {
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
}

/// Creates the data directory, or closes an existing one to all but its owner (`0700`): files an
/// older version left readable (`0644`) are then out of others' reach too.
pub(crate) fn create(dir: &Path) -> Result<(), recovea_core::ConfigError> {
    use std::os::unix::fs::PermissionsExt;
    fs::create_dir_all(dir)
        .and_then(|()| fs::set_permissions(dir, fs::Permissions::from_mode(0o700)))
        .map_err(|e| recovea_core::ConfigError::flag("data-dir", format!("{}: {e}", dir.display())))
}

pub(crate) fn admin_token(dir: &Path) -> Result<Secret, String> {
    read_or_generate(dir, ADMIN_TOKEN_FILE, || random::token("rat_", 43).map_err(|e| e.to_string()))
}

pub(crate) fn master_key(dir: &Path) -> Result<Secret, String> {
    read_or_generate(dir, MASTER_KEY_FILE, || {
        let bytes = random::bytes::<32>().map_err(|e| e.to_string())?;
        Ok(recovea_core::crypto::MasterKey::from_bytes(bytes).to_hex())
    })
}

/// The key that signs alert webhooks, generated on first start; receivers verify with it.
pub(crate) fn alert_signing_secret(dir: &Path) -> Result<String, String> {
    read_or_generate(dir, ALERT_SECRET_FILE, || random::token("whsec_", 43).map_err(|e| e.to_string()))
        .map(|s| s.value)
}

/// This node's id, generated on first start: receipts name the node that made them.
pub(crate) fn node_id(dir: &Path) -> Result<String, String> {
    read_or_generate(dir, NODE_ID_FILE, || random::token("node_", 12).map_err(|e| e.to_string()))
        .map(|s| s.value)
}

/// The admin token saved in `dir`, if any: lets `recovea admin` work next to a local `serve`.
pub(crate) fn saved_admin_token(dir: &Path) -> Option<String> {
    fs::read_to_string(dir.join(ADMIN_TOKEN_FILE)).ok().map(|s| s.trim().to_owned()).filter(|s| !s.is_empty())
}

fn read_or_generate(
    dir: &Path,
    file: &str,
    generate: impl FnOnce() -> Result<String, String>,
) -> Result<Secret, String> {
    let path = dir.join(file);
    match fs::read_to_string(&path) {
        Ok(value) if value.trim().is_empty() => Err(format!(
            "{} is empty: delete it to generate a new one, or write the value in it",
            path.display()
        )),
        Ok(value) => Ok(Secret { value: value.trim().to_owned(), generated: false }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let value = generate()?;
            write_private(&path, &value).map_err(|e| format!("{}: {e}", path.display()))?;
            Ok(Secret { value, generated: true })
        }
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// Writes a file only its owner can read: it holds a secret.
fn write_private(path: &Path, value: &str) -> std::io::Result<()> {
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path)?;
    file.write_all(value.as_bytes())?;
    file.write_all(b"\n")?;
    file.sync_all()
}
