//! Memory servers a program starts for itself when it uses the explicit API with no
//! `RMEM_SERVERS` ([`rmem_client::own_servers`]: `rmem launch --detach`, from the hosts file
//! named by `RMEM_HOSTFILE`, else `./dlm_hosts` when it exists, else two on loopback). They
//! are finalized at `rmem_exit`, or when the process ends, however it ends.

use rmem_client::config::OwnServers;
use rmem_client::own_servers::{hostfile_from_env, Helper};
use std::sync::Mutex;

/// The running helper and its servers, if this process started them.
static HELPER: Mutex<Option<(Helper, OwnServers)>> = Mutex::new(None);

/// Start the servers and return where they are; servers already started (by the runtime or
/// a direct region: both use the same ones) are returned as they are. On failure the helper
/// has said why on stderr; the error says what was run.
pub(crate) fn start() -> Result<OwnServers, String> {
    let mut h = HELPER.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, own)) = &*h {
        return Ok(own.clone());
    }
    let (helper, own) = Helper::start(hostfile_from_env().as_deref())?;
    *h = Some((helper, own.clone()));
    Ok(own)
}

/// Finalize the servers `start` started, if any, and wait until they are gone.
pub(crate) fn stop() {
    if let Some((h, _)) = HELPER.lock().unwrap_or_else(|e| e.into_inner()).take() {
        h.stop();
    }
}
