//! A swap file for tests that need the kernel to swap (root only), shared by the test crates
//! through `#[path]`.

use std::path::PathBuf;
use std::process::Command;

/// A swap file of the test's own in /var/tmp, turned off and removed on drop.
pub struct SwapFile(PathBuf);

impl SwapFile {
    pub fn on(bytes: usize) -> SwapFile {
        let path = PathBuf::from(format!("/var/tmp/rmem-test-{}.swap", std::process::id()));
        std::fs::write(&path, vec![0u8; bytes]).unwrap();
        let swap = SwapFile(path.clone());
        let p = path.to_str().unwrap();
        for (tool, args) in [
            ("chmod", &["600", p][..]),
            ("mkswap", &[p]),
            ("swapon", &[p]),
        ] {
            let out = Command::new(tool).args(args).output().unwrap();
            assert!(
                out.status.success(),
                "{tool} {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        swap
    }
}

impl Drop for SwapFile {
    fn drop(&mut self) {
        let _ = Command::new("swapoff").arg(&self.0).status();
        let _ = std::fs::remove_file(&self.0);
    }
}
