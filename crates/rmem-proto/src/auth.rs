//! The handshake's proofs: both sides show they know the shared token without sending it.
//!
//! ```text
//! client                                   server
//! Hello { version, page_size, nonce_c } ─►
//!                                       ◄─ Challenge { nonce_s }        (fresh per connection)
//! Auth { HMAC(token, "client" | c | s) } ─►   checked: else Error Unauthorized
//!                                       ◄─ Welcome { ..., HMAC(token, "server" | c | s) }
//! ```
//!
//! The MAC is HMAC-SHA-256 over a label naming the prover's role, both nonces, the protocol
//! version and the page size, so a proof is good for one connection and one direction only:
//! an observer learns no proof it can use again (the server's nonce is new each time), and a
//! server's proof cannot be reflected back as a client's. The handshake authenticates the
//! peers, not the traffic after it: someone who can rewrite packets on the path can still
//! take over an authenticated connection (no encryption, no per-frame MAC).

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Bytes in a nonce.
pub const NONCE_LEN: usize = 32;
/// Bytes in a proof (an HMAC-SHA-256).
pub const PROOF_LEN: usize = 32;

pub type Nonce = [u8; NONCE_LEN];
pub type Proof = [u8; PROOF_LEN];

/// Who proves knowledge of the token; part of the MAC input so that a proof made by one side
/// is never valid for the other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Client,
    Server,
}

impl Role {
    fn label(self) -> &'static [u8] {
        match self {
            Role::Client => b"rmem handshake v2: client proof",
            Role::Server => b"rmem handshake v2: server proof",
        }
    }
}

/// What both sides put in a proof: everything the handshake agreed on.
#[derive(Clone, Copy, Debug)]
pub struct Transcript {
    pub client_nonce: Nonce,
    pub server_nonce: Nonce,
    pub version: u16,
    pub page_size: u32,
}

impl Transcript {
    fn mac(&self, token: &[u8], role: Role) -> Hmac<Sha256> {
        // HMAC takes a key of any length.
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(token).expect("HMAC takes any key");
        m.update(role.label());
        m.update(&self.client_nonce);
        m.update(&self.server_nonce);
        m.update(&self.version.to_le_bytes());
        m.update(&self.page_size.to_le_bytes());
        m
    }

    /// `role`'s proof that it knows `token`.
    pub fn proof(&self, token: &[u8], role: Role) -> Proof {
        self.mac(token, role).finalize().into_bytes().into()
    }

    /// Whether `proof` is `role`'s proof with `token`. Constant time in the proof's contents.
    pub fn verify(&self, token: &[u8], role: Role, proof: &[u8]) -> bool {
        self.mac(token, role).verify_slice(proof).is_ok()
    }
}

/// A fresh nonce from the operating system's random source.
pub fn nonce() -> Result<Nonce, std::io::Error> {
    let mut n = [0u8; NONCE_LEN];
    getrandom::getrandom(&mut n).map_err(std::io::Error::from)?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transcript() -> Transcript {
        Transcript {
            client_nonce: [1; NONCE_LEN],
            server_nonce: [2; NONCE_LEN],
            version: 2,
            page_size: 4096,
        }
    }

    #[test]
    fn a_proof_verifies_only_with_its_token_role_and_nonces() {
        let t = transcript();
        let p = t.proof(b"token", Role::Client);
        assert!(t.verify(b"token", Role::Client, &p));
        assert!(!t.verify(b"tokeN", Role::Client, &p));
        assert!(!t.verify(b"token", Role::Server, &p), "reflected");
        assert!(!t.verify(b"token", Role::Client, &p[..31]), "short");
        let fresh = Transcript {
            server_nonce: [3; NONCE_LEN],
            ..t
        };
        assert!(!fresh.verify(b"token", Role::Client, &p), "replayed");
        let other_page = Transcript {
            page_size: 8192,
            ..t
        };
        assert!(!other_page.verify(b"token", Role::Client, &p));
    }

    #[test]
    fn nonces_differ() {
        assert_ne!(nonce().unwrap(), nonce().unwrap());
    }
}
